"""NPU fault escalation, and repeated device faults, across attempts and ftwatch restarts (SPEC R3, D4).

MindCluster grades a chip fault more severely when it keeps coming back (fault-tables README,
"Escalation rules (defaults)", from ``faultCustomization.json`` at mind-cluster@22bb3d98):

* frequency: 41 ECC / module-fault codes seen **2** times in 24 h, ``80E18005`` (HBMC parity)
  **3** times in 24 h, ``81078603`` (RoCE link down) **5** times in 24 h -> ``ManuallySeparateNPU``:
  the chip is isolated (ftwatch: isolate_node) until an operator releases it; the link-down
  isolation is released after 48 h without a recurrence;
* duration: ``81078603`` lasting more than **20 s** -> ``PreSeparateNPU`` (the running job is left
  alone, nothing new is placed on the chip): ftwatch adds a note to the decision's clause and
  leaves its action as it is.

User-input codes (80C98002, 80CB8002) are never escalated to an isolation (SPEC R3): at most a
reschedule (restart_job).

Device faults that are not chip codes (issue 12, "the same device failing again"): a finding of
class ``hardware_node`` graded below isolation (``restart_in_place`` / ``restart_job``: an Xid 94
contained ECC error, torch_npu's ``UCE ERROR``, ACL's 507053/507054 memory errors), or a CUDA /
cuBLAS / cuDNN error the catalogs grade "relaunch once" (``unspecified launch failure``,
``CUBLAS_STATUS_EXECUTION_FAILED`` ...: the program first, the system second), seen on the same
node and device (:func:`device_of`: an Xid's GPU, else the chip or rank) in **2** attempts within
**24 h** (``DEVICE_REPEAT``) -> isolate_node (class hardware_node), the GPU analogue of
MindCluster's 2-in-24-h ECC rule above. For the ambiguous errors the relaunch in place is the test
the grade asks for: the same error on the same device again points at the device (NVIDIA's GPU
debug guidelines: a fault that stays with one GPU is triaged as that GPU's; an application bug
follows the application to other GPUs); on another device it is no repeat. Why
a repeat is the device's: NVIDIA's GPU memory error management guide (docs.nvidia.com/deploy/
a100-gpu-mem-error-mgmt, "Row Remapping"; Xid 63/94 "reset GPU to activate") says a contained or
uncorrectable memory error is remapped only at the next GPU reset, so a restart in place leaves the
bad memory in service and the same fault on the same GPU in the next attempt says it needs the reset
(and the diagnostics) that only draining the node gives; the Xid catalog's "repeated on one GPU ->
hardware" reading of its investigatory workflows says the same of recurring faults.

A *hit* is one occurrence of (node, chip, code) in one attempt of one job: a code printed by
several lines of one attempt counts once (each occurrence of a fault ends the attempt it happens
in). MindCluster counts per chip, whatever job runs on it, so the hits of every job are kept in one
file, ``<state_dir>/escalation/chips.json`` (``FaultHistory``), keyed ``node|chip|code``: counts
survive new attempts, other jobs on the same chip and a restart of ftwatch; hits older than the
longest window are dropped when the file is written. (Before, each job had its own
``escalation/<job>.json``; those files are no longer read.)
Only findings that reach the policy count (an incident's findings): a link down in an attempt that
never fails is not seen here.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity
from ftwatch.rules.faultcodes import USER_INPUT_CODES
from ftwatch.policy.statefile import read_state, write_state

DAY = 86_400.0
_SOURCE = "Ascend/mind-cluster@22bb3d98 faultCustomization.json (fault-tables README, Escalation rules)"
#: The 41 ECC / module-fault codes of the 2-in-24-h rule (fault-tables README, verbatim list).
ECC_CODES = frozenset("""
80C98000 80B78000 80B58000 80A18008 80A38008 80A58008 80B98000 80B98008 80BB8000 80BB8008 80BD8000
80BD8008 80C78008 80C98008 80CB8008 80CD8008 80CF8008 80D98008 80DF8008 80DE1801 80E01801 80E18008
80E38008 80E39200 80E3A202 80E3A203 80E78000 80E78008 80F18000 80F18008 80F38008 80F78008 81318008
81338008 813B8008 81478008 81578008 815F8008 81938008 81958008 81978008""".split())
LINK_DOWN = "81078603"
LINK_DOWN_LIMIT_S = 20.0      # lasting longer -> PreSeparateNPU
_FORMAT, _VERSION = "ftwatch-fault-history", 1
#: Node names ftwatch makes up when a line names none (``watch`` on stdin: ``localhost``;
#: ``replay``: ``replay``): no machine to isolate, and counting them would join every job's devices.
IMPLICIT_NODES = frozenset({"", "localhost", "replay"})


@dataclass(frozen=True)
class FrequencyRule:
    """``times`` hits of one of ``codes`` on one chip within ``window_s`` seconds -> ``level``.

    Attributes:
        release_after_s: the escalation lapses after this many seconds without a hit (None: it
            stays until an operator deletes the fault history).
    """

    codes: frozenset[str]
    times: int
    window_s: float
    level: str = "ManuallySeparateNPU"
    release_after_s: float | None = None
    source: str = _SOURCE


FREQUENCY_RULES: tuple[FrequencyRule, ...] = (
    FrequencyRule(ECC_CODES, 2, DAY),
    FrequencyRule(frozenset({"80E18005"}), 3, DAY),
    FrequencyRule(frozenset({LINK_DOWN}), 5, DAY, release_after_s=2 * DAY),
)
#: Rule families of the ambiguous device errors ``DEVICE_REPEAT`` also counts.
AMBIGUOUS_FAMILIES = ("cuda.", "cudnn.", "cublas.")
#: The same device fault (not a chip code) on one device in 2 attempts within 24 h (module docstring).
DEVICE_REPEAT = FrequencyRule(frozenset(), 2, DAY, source=(
    "NVIDIA GPU memory error management (row remapping takes effect at the next GPU reset); "
    "MindCluster's 2-in-24-h ECC rule (faultCustomization.json) as the template"))

# "device 3", "chip_id=3", "npu:3", "logic_id 3", "phy id: 3", "card 3" (a small integer).
_CHIP = re.compile(r"(?i)\b(?:device|dev|chip|npu|card|logic|phy)[ _-]?(?:id)?\s*[:=#]?\s*(\d{1,3})\b")


def is_npu(f: Finding) -> bool:
    """True for an NPU fault-code finding (``npu.<code>``)."""
    return f.kind == "fault_code" and f.rule_id.startswith("npu.")


def npu_code(f: Finding) -> str:
    """The normalised code of an NPU finding (``npu.80E01801`` -> ``80E01801``)."""
    return f.rule_id.partition(".")[2]


def chip_of(f: Finding) -> str:
    """The chip a finding is about: its ``chip`` field, else a device number on the line
    (``device 3``, ``chip_id=3``, ``logic_id: 3``), else its rank (one process drives one chip),
    else its instance."""
    if f.fields.get("chip") is not None:
        return str(f.fields["chip"])
    m = _CHIP.search(f.line)
    if m:
        return m.group(1)
    return f"rank{f.rank}" if f.rank is not None else f.origin.instance


def chip_key(f: Finding) -> str:
    """``node|chip|code``: what "the same node, chip and code" means (SPEC D4), for every job."""
    return f"{f.origin.node}|{chip_of(f)}|{npu_code(f)}"


def fault_key(f: Finding) -> str:
    """``node|device|fault`` of any hardware fault: ``chip_key`` for an NPU code, else the node,
    the device (``chip_of``) and the rule id (``xid.94`` ...)."""
    return chip_key(f) if is_npu(f) else f"{f.origin.node}|{chip_of(f)}|{f.rule_id}"


def device_of(f: Finding) -> str:
    """The device a fault is about: an Xid's GPU (its ``pci`` field, lower case), else ``chip_of``."""
    pci = f.fields.get("pci")
    return str(pci).lower() if pci else chip_of(f)


def device_key(f: Finding) -> str:
    """``node|device|rule``: what ``DEVICE_REPEAT`` counts as "the same fault on one device"."""
    return f"{f.origin.node}|{device_of(f)}|{f.rule_id}"


def ambiguous_device_error(f: Finding) -> bool:
    """True for a CUDA runtime, cuBLAS or cuDNN error the catalogs grade "relaunch once" (user_code,
    restart_in_place: ``cuda_errors.tsv``'s sticky_ambiguous ``cudaErrorLaunchFailure``, whose
    source names "system specific" causes after program faults; ``cudalib_vocab.tsv``'s execution,
    internal, mapping and initialisation failures)."""
    return (f.rule_id.startswith(AMBIGUOUS_FAMILIES) and f.failure_class is FailureClass.USER_CODE
            and f.action is Action.RESTART_IN_PLACE)


def device_repeatable(f: Finding) -> bool:
    """True for a device fault that ``DEVICE_REPEAT`` counts: not a chip code (those have their
    own rules), class ``hardware_node`` graded below isolating the node, or an ambiguous device
    error (:func:`ambiguous_device_error`); not a recovery; on a named node (not ``IMPLICIT_NODES``)."""
    fault = (f.failure_class is FailureClass.HARDWARE_NODE
             and Action.RESTART_INSTANCE <= f.action < Action.ISOLATE_NODE) or ambiguous_device_error(f)
    return (not is_npu(f) and fault and not is_recovery(f)
            and f.origin.node is not None and f.origin.node not in IMPLICIT_NODES)


def is_recovery(f: Finding) -> bool:
    """True when the line reports the fault's recovery (assertion ``recover``), not an occurrence."""
    return f.fields.get("assertion") == "recover"


class FaultHistory:
    """The hits of chip faults of every job, persisted (see the module docstring).

    Args:
        path: the JSON file, or None to keep the history in memory only (tests, replays).
        job: unused, kept for callers of the per-job history (occurrences name their job).
        keep_s: hits older than this (seconds, relative to the newest hit recorded) are dropped.

    Raises:
        ConfigError: the file exists but is not a fault history (it is left alone).
    """

    def __init__(self, path: Path | None, job: str = "", keep_s: float = 2 * DAY):
        self.path, self.job, self.keep_s = (Path(path) if path else None), job, keep_s
        self._data: dict[str, Any] = {"format": _FORMAT, "version": _VERSION, "hits": {}, "escalated": {}}
        self._reload()

    @classmethod
    def for_state(cls, state_dir: Path | None, keep_s: float = 2 * DAY) -> "FaultHistory":
        """The history at ``<state_dir>/escalation/chips.json`` (in memory when state_dir is None)."""
        return cls(Path(state_dir) / "escalation" / "chips.json" if state_dir is not None else None, "", keep_s)

    @classmethod
    def for_job(cls, state_dir: Path | None, job: str, keep_s: float = 2 * DAY) -> "FaultHistory":
        """The shared history (``for_state``); the job no longer picks a file."""
        return cls.for_state(state_dir, keep_s)

    def _reload(self) -> None:
        """Take the file's content (another job's policy may have written it since)."""
        data = read_state(self.path, _FORMAT, _VERSION) if self.path else None
        if data is not None:
            self._data = data

    def record(self, key: str, t: float, occurrence: str) -> bool:
        """Count one hit of ``key`` at epoch second ``t``, once per ``occurrence`` (which names the
        job and its attempt). True if new."""
        self._reload()
        hits = self._data["hits"].setdefault(key, [])
        if any(h["occ"] == occurrence for h in hits):
            return False
        hits.append({"t": t, "occ": occurrence})
        newest = max(h["t"] for v in self._data["hits"].values() for h in v)
        for k in list(self._data["hits"]):
            kept = [h for h in self._data["hits"][k] if h["t"] > newest - self.keep_s]
            if kept:
                self._data["hits"][k] = kept
            else:
                del self._data["hits"][k]
        self._save()
        return True

    def count(self, key: str, now: float, window_s: float) -> int:
        """Hits of ``key`` in the window ``(now - window_s, now]``."""
        return sum(1 for h in self._data["hits"].get(key, ()) if now - window_s < h["t"] <= now)

    def previous_hit(self, key: str, t: float) -> float | None:
        """Epoch seconds of the newest hit of ``key`` before ``t``, or None."""
        return max((h["t"] for h in self._data["hits"].get(key, ()) if h["t"] < t), default=None)

    def escalated(self, key: str) -> dict[str, Any] | None:
        """The standing escalation of ``key`` (``{"level", "since", "release_after_s"}``), or None."""
        return self._data["escalated"].get(key)

    def escalate(self, key: str, level: str, t: float, release_after_s: float | None) -> None:
        """Keep ``key`` escalated to ``level`` from ``t`` on."""
        self._reload()
        self._data["escalated"][key] = {"level": level, "since": t, "release_after_s": release_after_s}
        self._save()

    def release(self, key: str) -> None:
        """Drop a standing escalation."""
        self._reload()
        if self._data["escalated"].pop(key, None) is not None:
            self._save()

    def _save(self) -> None:
        if self.path is not None:
            write_state(self.path, self._data)


@dataclass(frozen=True)
class Escalated:
    """One finding graded up: the new finding and the clause that says why."""

    finding: Finding
    clause: str


class Escalator:
    """Applies the frequency and duration rules to the NPU findings of an incident, and
    ``DEVICE_REPEAT`` to its other device faults.

    Args:
        history: where hits are kept.
        rules: the frequency rules (default ``FREQUENCY_RULES``).
        device_repeat: apply ``DEVICE_REPEAT`` (False under the ModelArts strategies, whose D4
            same-fault rule counts repeats its own way).
    """

    def __init__(self, history: FaultHistory, rules: Sequence[FrequencyRule] = FREQUENCY_RULES,
                 device_repeat: bool = True):
        self.history = history
        self.rules = tuple(rules)
        self.device_repeat = device_repeat

    def observe(self, findings: Iterable[Finding], occurrence: str) -> None:
        """Record each NPU occurrence (not recoveries) once per ``occurrence`` (the attempt)."""
        for f in findings:
            if is_npu(f) and not is_recovery(f):
                self.history.record(chip_key(f), f.time, occurrence)
            elif self.device_repeat and device_repeatable(f):
                self.history.record(device_key(f), f.time, occurrence)

    def rule_for(self, code: str) -> FrequencyRule | None:
        """The frequency rule that covers ``code``, or None."""
        return next((r for r in self.rules if code in r.codes), None)

    def apply(self, findings: Sequence[Finding], now: float) -> tuple[tuple[Finding, ...], list[str]]:
        """Grade up the NPU findings whose chip crossed a frequency rule (call ``observe`` first).

        Returns:
            (the findings, escalated ones replaced by copies whose action is isolate_node,
            class hardware_node, severity critical and ``level`` ``ManuallySeparateNPU (...)``;
            a user-input code becomes at most restart_job, class user_code), the clauses of the
            escalations and of the duration rule, in finding order, each once.
        """
        out: list[Finding] = []
        clauses: list[str] = []
        for f in findings:
            esc = (self._frequency(f, now) if is_npu(f) and not is_recovery(f)
                   else self._repeat(f, now) if self.device_repeat and device_repeatable(f) else None)
            if esc is not None:
                out.append(esc.finding)
                if esc.clause not in clauses:
                    clauses.append(esc.clause)
            else:
                out.append(f)
        clauses += [c for c in link_down_clauses(findings, now) if c not in clauses]
        return tuple(out), clauses

    def _frequency(self, f: Finding, now: float) -> Escalated | None:
        key, code = chip_key(f), npu_code(f)
        rule = self.rule_for(code)
        standing = self.history.escalated(key)
        if standing is not None and standing.get("release_after_s") is not None:
            quiet_since = self.history.previous_hit(key, f.time) or standing["since"]
            if f.time - quiet_since > standing["release_after_s"]:
                self.history.release(key)       # quiet long enough (81078603: 48 h)
                standing = None
        if standing is None:
            if rule is None:
                return None
            n = self.history.count(key, now, rule.window_s)
            if n < rule.times:
                return None
            self.history.escalate(key, rule.level, now, rule.release_after_s)
            why = f"{n} hits in {rule.window_s / 3600:g} h (>= {rule.times})"
        else:
            why = f"standing since an earlier escalation ({standing['level']})"
        where = key.replace("|", " chip ", 1).replace("|", " code ")
        if code in USER_INPUT_CODES:
            action, cls = Action.RESTART_JOB, FailureClass.USER_CODE
            clause = (f"R3 frequency: {code} on node {where}: {why}, but it is a user-input code "
                      "→ reschedule, never isolate")
        else:
            action, cls = Action.ISOLATE_NODE, FailureClass.HARDWARE_NODE
            clause = f"R3 frequency: node {where}: {why} → ManuallySeparateNPU → isolate_node"
        fields = dict(f.fields) | {"level": f"ManuallySeparateNPU (escalated: {why})",
                                   "table_level": f.fields.get("level")}
        severity = Severity.CRITICAL if cls is FailureClass.HARDWARE_NODE else max(f.severity, Severity.ERROR)
        new = dataclasses.replace(f, action=action, failure_class=cls, severity=severity, fields=fields)
        return Escalated(new, clause)


    def _repeat(self, f: Finding, now: float) -> Escalated | None:
        """``DEVICE_REPEAT``: the same device fault on one device in 2 attempts within 24 h."""
        key, rule = device_key(f), DEVICE_REPEAT
        n = self.history.count(key, now, rule.window_s)
        if n < rule.times:
            return None
        node, device, _ = key.split("|", 2)
        why = f"{n} hits in {rule.window_s / 3600:g} h (>= {rule.times})"
        clause = (f"device repeat: {f.rule_id} on node {node} device {device}: {why}: a restart in place "
                  "left the faulty device in service → isolate_node")
        if ambiguous_device_error(f):
            clause = (f"device repeat: {f.rule_id} on node {node} device {device}: {why}: the relaunch the "
                      "error's grade asks for failed the same way on the same device → device suspect → isolate_node")
        fields = dict(f.fields) | {"level": f"repeated on one device (escalated: {why})",
                                   "table_level": f.fields.get("level")}
        return Escalated(dataclasses.replace(f, action=Action.ISOLATE_NODE, severity=Severity.CRITICAL,
                                             failure_class=FailureClass.HARDWARE_NODE, fields=fields), clause)


def link_down_clauses(findings: Sequence[Finding], now: float) -> list[str]:
    """The duration rule: a ``81078603`` link down on one chip for longer than 20 s (until its
    recovery line, or until ``now``) -> PreSeparateNPU (notify: no new work on that chip)."""
    down: dict[str, float] = {}
    spans: dict[str, float] = {}
    for f in sorted(findings, key=lambda x: (x.time, x.seq)):
        if not is_npu(f) or npu_code(f) != LINK_DOWN:
            continue
        key = chip_key(f)
        if is_recovery(f):
            if key in down:
                spans[key] = max(spans.get(key, 0.0), f.time - down.pop(key))
        else:
            down.setdefault(key, f.time)
    for key, t in down.items():
        spans[key] = max(spans.get(key, 0.0), now - t)
    return [f"R3 duration: {LINK_DOWN} on node {key.split('|')[0]} chip {key.split('|')[1]} down "
            f"{span:.0f} s (> {LINK_DOWN_LIMIT_S:g} s) → PreSeparateNPU: notify, place no new work there"
            for key, span in spans.items() if span > LINK_DOWN_LIMIT_S]
