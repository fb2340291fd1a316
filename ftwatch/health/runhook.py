"""What ``ftwatch run`` calls: a Bootcheck before each attempt, Troubleshooting after each failure,
and the reset of the step-line tap for runtime stragglers (SPEC H1, H3; seed 001);
:class:`SayingStepTracker` is the tap ``ftwatch run`` builds (``ftwatch.pipeline.build``).

Kept here so that the runner's part stays three calls. Both passes write a block to
``<state-dir>/fault-tolerance.log``, one event to the store and a finding per failed or slow
check (:mod:`ftwatch.health.ftlog`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ftwatch.config.model import Config
from ftwatch.events import Finding
from ftwatch.health.bootcheck import run_checks
from ftwatch.health.ftlog import FaultToleranceLog, ending, verdict
from ftwatch.rules.stragglers import StepTracker


class HealthChecks:
    """The health side of one supervised job.

    Args:
        config: the whole config (``health``, ``storage.state_dir``).
        recorder: the job's recorder (store events and findings; ``say`` to the terminal).
        job, node: the job id and this machine's name.
        nproc: worker slots (the all-reduce's world size).
        devices: the slots' devices in order (``Slots.active``; the runner updates ``devices``
            and ``nproc`` before each start): agent ``i`` of the checks sees only ``devices[i]``,
            and the NVML check compares the GPUs it finds with them.
        steps: the engine's step-line tap (``ftwatch.pipeline.build.build_engine``), reset
            before each start; None without one.
    """

    def __init__(self, config: Config, recorder: Any, job: str, node: str, nproc: int,
                 devices: Sequence[str] | None = None, steps: StepTracker | None = None):
        self.config = config.health
        self.state_dir = Path(config.storage.state_dir)
        self.log = FaultToleranceLog(self.state_dir, recorder, job, node)
        self.say: Callable[[str], None] = getattr(recorder, "say", print)
        self.nproc = nproc
        self.devices = list(devices or [])
        self.steps = steps

    def _run(self, kind: str, attempt: int, end: Callable[[str], str], allreduce: bool = True,
             devices: Sequence[str] | None = None) -> list[Finding]:
        cfg = self.config
        started = time.time()
        self.say(f"ftwatch: {kind} (attempt {attempt}) -> {self.log.path}")
        if not cfg.paths:
            self.state_dir.mkdir(parents=True, exist_ok=True)   # the fallback path is ours to make
        devices = list(self.devices if devices is None else devices)
        results = run_checks(cfg.paths or [self.state_dir], cfg.disk_test_bytes, cfg.disk_min_mb_s, self.nproc,
                             cfg.allreduce_check and allreduce, cfg.allreduce_bytes, cfg.check_timeout, cfg.python,
                             cfg.min_busbw_gbs, devices or None, cfg.gpu_in_use)
        outcome = verdict(results)
        findings = self.log.write(kind, started, results, end(outcome), attempt=attempt)
        for f in findings:
            self.say(f"ftwatch: {kind}: {f.severity.name.lower()}: {f.line}")
        return findings

    def bootcheck(self, attempt: int) -> Finding | None:
        """Run the Bootcheck (when ``health.bootcheck``); returns the finding that blocks the start
        (a hardware fault), else None. Resets the step tracker: a new attempt's ranks start over."""
        if self.steps is not None:
            self.steps.reset()
        if not self.config.bootcheck:
            return None
        findings = self._run("Bootchecking", attempt, lambda v: ending(
            v, "a hardware fault blocks the start" if v == "blocked" else
            "task will be started anyway: only hardware faults block (seed 001)"))
        return _blocking(findings)

    def instance_restart(self, attempt: int, ranks: Sequence[int]) -> Finding | None:
        """Before an instance-level restart (``restart_instance``, MindCluster recover-in-place):
        Troubleshooting after the failure, then a Bootcheck before the restart, each as configured.

        Both leave out the all-reduce: the other workers still run (on their devices, in their
        own process group), so a group across every slot cannot form, and the failed ranks'
        device is tested by the disk, NVML and versions checks (the versions agent runs on the
        first failed rank's device). Returns the finding that blocks the restart (a hardware
        fault: the caller decides on it instead), else None.
        """
        who = ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)
        first = [self.devices[r] for r in ranks if 0 <= r < len(self.devices)][:1]
        devices = first + [d for d in self.devices if d not in first]
        if self.config.troubleshooting:
            self._run("Troubleshooting", attempt, lambda _v: f"Check Finished, {who} will be restarted.",
                      allreduce=False, devices=devices)
        if not self.config.bootcheck:
            return None
        findings = self._run("Bootchecking", attempt, lambda v: ending(
            v, f"a hardware fault blocks the restart of {who}" if v == "blocked" else f"{who} will be restarted"),
            allreduce=False, devices=devices)
        return _blocking(findings)

    def troubleshoot(self, attempt: int, restarting: bool) -> list[Finding]:
        """Run Troubleshooting after a failure (when ``health.troubleshooting``)."""
        if not self.config.troubleshooting:
            return []
        end = "Check Finished, task will be restarted." if restarting else "Check Finished, task will not be restarted."
        return self._run("Troubleshooting", attempt, lambda _v: end)


def _blocking(findings: Sequence[Finding]) -> Finding | None:
    """The first finding that blocks a start: a hardware fault (``isolate_node`` or worse)."""
    return next((f for f in findings if f.action.label in ("isolate_node", "fail_job")), None)


class SayingStepTracker(StepTracker):
    """A StepTracker that also tells the terminal about each straggler (or job slowdown) it finds."""

    def __init__(self, config, say: Callable[[str], None], **kwargs):
        super().__init__(config, **kwargs)
        self._say = say

    def said(self, finding):
        self._say(f"ftwatch: {finding.kind}: {finding.line}")     # straggler or slowdown
