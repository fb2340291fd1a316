"""Check results and the fault-tolerance log (SPEC H1, seed 001 "平台的容错日志").

Every Bootcheck (before each start and restart) and Troubleshooting pass (after each failure)
is one timestamped block appended to ``<state-dir>/fault-tolerance.log``, in the seed's shape::

    2024-08-05 18:11:14 Start to run Bootchecking...
    2024-08-05 18:11:18 DiskTest /mnt/public/.gpfs_test: Succeed
    2024-08-05 18:11:18 /mnt/public RW TEST: 5.3 GB/s 674 MB/s
    2024-08-05 18:11:27 GPU Number: 1
    ...
    2024-08-05 18:11:51 AllReduce Check: Succeed
    2024-08-05 18:11:51 Check Finished.

and one event (``bootcheck`` / ``troubleshooting``) in the store with every result. A check that
failed or warned also becomes a Finding (rule id ``health.<check>``, kind ``health``): seed 001,
"硬件错误(如掉卡)将阻断任务继续执行 ... 其他异常问题(如慢节点)不会阻断任务": a hardware fault
isolates the node, a slow disk or a slow link only warns.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity

STATUSES = ("ok", "warn", "fail", "skipped")
LOG_NAME = "fault-tolerance.log"
SOURCE = "seed 001 (fault-tolerance log: Bootcheck / Troubleshooting)"


@dataclass(frozen=True)
class CheckResult:
    """What one check found.

    Attributes:
        check: ``disk``, ``gpu``, ``npu``, ``cpu``, ``versions``, ``allreduce`` (Bootcheck /
            Troubleshooting, ``ftwatch.health.bootcheck``) or ``nodecheck`` (``ftwatch.health.nodes``).
        status: ``ok``, ``warn`` (does not block), ``fail`` or ``skipped`` (a package or device
            the check needs is absent: never a failure).
        lines: the log lines, without their timestamps (seed 001's wording where it has one).
        time: epoch seconds when the check finished.
        failure_class, action: the verdict of a ``warn`` or ``fail`` (ignored otherwise).
        fields: the figures (``read_mb_s``, ``busbw_gbs`` ...), JSON-able.
    """

    check: str
    status: str
    lines: tuple[str, ...]
    time: float = field(default_factory=_time.time)
    failure_class: FailureClass = FailureClass.INFO
    action: Action = Action.NONE
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    @property
    def blocks(self) -> bool:
        """True when this result must stop the start (a hardware fault: isolate the node)."""
        return self.status == "fail" and self.action >= Action.ISOLATE_NODE

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "lines": list(self.lines), "time": self.time,
                "failure_class": self.failure_class.value, "action": self.action.label,
                "fields": dict(self.fields)}


_LABELS = {"gpu": "GPU", "npu": "NPU", "allreduce": "AllReduce", "disk": "DiskTest", "cpu": "CPU"}


def skipped(check: str, why: str) -> CheckResult:
    """A check that could not run here: ``<Check> Check: skipped: <why>``."""
    label = _LABELS.get(check, check.capitalize())
    return CheckResult(check, "skipped", (f"{label} Check: skipped: {why}",), fields={"why": why})


def finding_of(result: CheckResult, origin: Origin, seq: int = 0) -> Finding | None:
    """The Finding of a ``warn`` or ``fail`` result (None for ``ok`` and ``skipped``)."""
    if result.status not in ("warn", "fail"):
        return None
    severity = Severity.WARNING if result.status == "warn" else (
        Severity.CRITICAL if result.action >= Action.ISOLATE_NODE else Severity.ERROR)
    line = next((ln for ln in result.lines if "Fail" in ln or "slow" in ln.lower()), result.lines[0])
    return Finding(f"health.{result.check}", "health", result.failure_class, result.action, severity,
                   origin, line, result.time, seq, tuple(result.lines), dict(result.fields), SOURCE)


def _stamp(t: float) -> str:
    return _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(t))


def format_block(kind: str, started: float, results: Sequence[CheckResult], ending: str, ended: float) -> str:
    """One block of the log: ``Start to run <kind>...``, each result's lines, the ending line.

    Args:
        kind: ``Bootchecking`` or ``Troubleshooting`` (seed 001's words).
        started, ended: epoch seconds of the first and last line.
        ending: e.g. ``Check Finished.`` or ``Check Finished, task will be restarted.``
    """
    out = [f"{_stamp(started)} Start to run {kind}..."]
    for r in results:
        out += [f"{_stamp(r.time)} {line}" for line in r.lines]
    out.append(f"{_stamp(ended)} {ending}")
    return "\n".join(out) + "\n"


class FaultToleranceLog:
    """Appends check blocks to ``<state_dir>/fault-tolerance.log`` and to the store.

    Args:
        state_dir: the state folder (created if missing).
        recorder: anything with ``event(time, job, kind, **detail)`` and ``findings(list)``
            (``ftwatch.pipeline.recorder.Recorder``), or None for the file only.
        job: the job id of the events and findings.
        node: the host name in the findings' origin.
    """

    def __init__(self, state_dir: Path, recorder: Any = None, job: str = "local", node: str = "localhost"):
        self.path = Path(state_dir) / LOG_NAME
        self.recorder = recorder
        self.job = job
        self.node = node

    def write(self, kind: str, started: float, results: Sequence[CheckResult], ending: str,
              attempt: int | None = None, ended: float | None = None) -> list[Finding]:
        """Append one block; store the event and the findings. Returns the findings made.

        Args:
            kind: ``Bootchecking`` or ``Troubleshooting``.
            attempt: the job's attempt the block belongs to (in the event).
        """
        ended = _time.time() if ended is None else ended
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(format_block(kind, started, results, ending, ended))
        origin = Origin(self.node, None, self.job, self.node, "health", "health")
        findings = [f for f in (finding_of(r, origin) for r in results) if f is not None]
        if self.recorder is not None:
            event = "bootcheck" if kind.startswith("Boot") else kind.lower()
            self.recorder.event(ended, self.job, event, attempt=attempt, ending=ending,
                                checks=[r.to_dict() for r in results],
                                verdict=verdict(results))
            if findings:
                self.recorder.findings(findings)
        return findings


def ending(outcome: str, then: str = "") -> str:
    """The last line of a Bootcheck block for ``outcome`` (:func:`verdict`), the same for
    ``ftwatch run`` and ``ftwatch bootcheck``: ``Check Finished.`` (seed 001) for ``ok`` and
    ``warned`` (slow nodes do not block), else ``Check Finished: failed.`` / ``Check Finished:
    blocked.``; ``then`` (what happens next, e.g. ``task will be started``) is appended to a
    failed or blocked ending after a comma."""
    if outcome in ("ok", "warned"):
        return "Check Finished."
    return f"Check Finished: {outcome}" + (f", {then}." if then else ".")


def verdict(results: Iterable[CheckResult]) -> str:
    """``blocked`` (a hardware fault), ``failed``, ``warned`` or ``ok`` (skipped checks count as ok)."""
    results = list(results)
    if any(r.blocks for r in results):
        return "blocked"
    if any(r.status == "fail" for r in results):
        return "failed"
    return "warned" if any(r.status == "warn" for r in results) else "ok"
