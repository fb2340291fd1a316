"""Node blame across attempts and jobs (issue 4): a node that keeps hurting jobs is isolated.

Every decision whose root cause is a real error on a node (class ``hardware_node``,
``retryable_infra`` or ``hang``; never ``user_code``, ``oom``, fallout alone, or a user-input NPU
code) adds one *blame* to that node: once per job attempt. Blames decay: only those within
``window`` seconds count. When a node has ``threshold`` blames in the window, the decision
isolates it (a one-off never does). After a blame isolation the node's count starts from zero,
and for ``cooldown`` seconds it is not isolated by blame again (it has just been drained; an
isolation storm helps no one).

The blames live in one file for all jobs, ``<state_dir>/blame/nodes.json`` (a node hurts jobs,
not one job), written atomically; ``ftwatch explain`` shows them with the decision's clause.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftwatch.events import FailureClass, Finding
from ftwatch.policy.escalation import IMPLICIT_NODES, is_npu, npu_code
from ftwatch.rules.faultcodes import USER_INPUT_CODES
from ftwatch.policy.statefile import read_state, write_state

_FORMAT, _VERSION = "ftwatch-node-blame", 1
BLAMED_CLASSES = frozenset({FailureClass.HARDWARE_NODE, FailureClass.RETRYABLE_INFRA, FailureClass.HANG})


@dataclass(frozen=True)
class Blame:
    """A node's standing after a blame was counted.

    Attributes:
        node: the node.
        count: blames within the window, this one included.
        isolate: True when this blame crossed the threshold (outside a cooldown).
        clause: one sentence for the decision's policy clause.
    """

    node: str
    count: int
    isolate: bool
    clause: str


def blameable(f: Finding) -> bool:
    """True when ``f`` as a root cause counts against its node (see the module docstring); never
    when the node is unknown (None) or implicit (``IMPLICIT_NODES``)."""
    if f.origin.node is None or f.origin.node in IMPLICIT_NODES:
        return False
    if f.failure_class not in BLAMED_CLASSES:
        return False
    return not (is_npu(f) and npu_code(f) in USER_INPUT_CODES)


class BlameStore:
    """The blames of every node (see the module docstring).

    Args:
        path: the JSON file, or None to keep blames in memory.
        threshold: blames within ``window`` that isolate a node (>= 2: a one-off never isolates).
        window: seconds a blame counts.
        cooldown: seconds after a blame isolation during which the node is not isolated again.

    Raises:
        ConfigError: the file exists but is not a blame file.
        ValueError: threshold < 2.
    """

    def __init__(self, path: Path | None, threshold: int = 3, window: float = 86_400.0, cooldown: float = 86_400.0):
        if threshold < 2:
            raise ValueError("threshold must be >= 2: a one-off does not isolate a node")
        self.path = Path(path) if path else None
        self.threshold, self.window, self.cooldown = threshold, window, cooldown
        data = read_state(self.path, _FORMAT, _VERSION) if self.path else None
        self._data: dict[str, Any] = data or {"format": _FORMAT, "version": _VERSION, "nodes": {}}

    @classmethod
    def for_state(cls, state_dir: Path | None, **kwargs: Any) -> "BlameStore":
        """The store at ``<state_dir>/blame/nodes.json`` (in memory when state_dir is None)."""
        return cls(Path(state_dir) / "blame" / "nodes.json" if state_dir else None, **kwargs)

    def count(self, node: str, now: float) -> int:
        """Blames of ``node`` within the window ending at ``now``."""
        entry = self._data["nodes"].get(node, {})
        return sum(1 for b in entry.get("blames", ()) if now - self.window < b["t"] <= now)

    def blames(self, node: str) -> list[dict[str, Any]]:
        """Every kept blame of ``node``: ``{"t", "job", "occ", "rule"}``, oldest first."""
        return [dict(b) for b in self._data["nodes"].get(node, {}).get("blames", ())]

    def nodes(self) -> dict[str, dict[str, Any]]:
        """A copy of every node's entry (``blames``, ``isolated_at``)."""
        return {n: {"blames": [dict(b) for b in e.get("blames", ())], "isolated_at": e.get("isolated_at")}
                for n, e in self._data["nodes"].items()}

    def report(self, now: float) -> str:
        """Text for ``ftwatch explain``: each node's blames in the window at ``now`` and the rules."""
        lines = ["Node blame"]
        for node, entry in sorted(self._data["nodes"].items()):
            live = [b for b in entry.get("blames", ()) if now - self.window < b["t"] <= now]
            iso = entry.get("isolated_at")
            rules = ", ".join(sorted({f"{b['rule']} ({b['job']})" for b in live})) or "-"
            lines.append(f"  {node}: {len(live)}/{self.threshold} in {self.window / 3600:g} h: {rules}"
                         + (f"; isolated by blame {now - iso:.0f} s ago" if iso is not None else ""))
        return "\n".join(lines if len(lines) > 1 else lines + ["  (no node blamed)"])

    def blame(self, node: str, job: str, occurrence: str, rule: str, now: float) -> Blame:
        """Count one blame of ``node`` for ``job`` (once per ``occurrence``) and judge it.

        Returns:
            The node's standing; ``isolate`` is True once per crossing (the count then restarts).
        """
        entry = self._data["nodes"].setdefault(node, {"blames": [], "isolated_at": None})
        entry["blames"] = [b for b in entry["blames"] if b["t"] > now - self.window]
        if not any(b["job"] == job and b["occ"] == occurrence for b in entry["blames"]):
            entry["blames"].append({"t": now, "job": job, "occ": occurrence, "rule": rule})
        n = len(entry["blames"])
        since = entry.get("isolated_at")
        cooling = since is not None and now - since < self.cooldown
        hours = self.window / 3600
        if n >= self.threshold and not cooling:
            entry["isolated_at"] = now
            entry["blames"] = []
            clause = (f"blame: node {node} was the root cause {n} times in {hours:g} h "
                      f"(>= {self.threshold}) → isolate_node")
            result = Blame(node, n, True, clause)
        else:
            tail = (f", cooling down after its blame isolation {now - since:.0f} s ago" if cooling else "")
            result = Blame(node, n, False, f"blame: node {node} {n}/{self.threshold} in {hours:g} h{tail}")
        self._save()
        return result

    def _save(self) -> None:
        if self.path is not None:
            write_state(self.path, self._data)
