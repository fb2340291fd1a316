"""What ``ftwatch run`` calls: a Bootcheck before each attempt, Troubleshooting after each failure,
and the step-line tap for runtime stragglers (SPEC H1, H3; seed 001).

Kept here so that the runner's part stays three calls. Both passes write a block to
``<state-dir>/fault-tolerance.log``, one event to the store and a finding per failed or slow
check (:mod:`ftwatch.health.ftlog`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ftwatch.config import Config
from ftwatch.events import Finding
from ftwatch.health.bootcheck import run_checks
from ftwatch.health.ftlog import FaultToleranceLog, verdict
from ftwatch.health.stragglers import StepTracker


class HealthChecks:
    """The health side of one supervised job.

    Args:
        config: the whole config (``health``, ``storage.state_dir``).
        recorder: the job's recorder (store events and findings; ``say`` to the terminal).
        job, node: the job id and this machine's name.
        nproc: worker slots (the all-reduce's world size).
    """

    def __init__(self, config: Config, recorder: Any, job: str, node: str, nproc: int):
        self.config = config.health
        self.state_dir = Path(config.storage.state_dir)
        self.log = FaultToleranceLog(self.state_dir, recorder, job, node)
        self.say: Callable[[str], None] = getattr(recorder, "say", print)
        self.nproc = nproc
        self.steps = _SayingTracker(self.config.straggler, self.say) if self.config.straggler.enabled else None

    def _run(self, kind: str, attempt: int, ending: Callable[[str], str]) -> list[Finding]:
        cfg = self.config
        started = time.time()
        self.say(f"ftwatch: {kind} (attempt {attempt}) -> {self.log.path}")
        results = run_checks(cfg.paths or [self.state_dir], cfg.disk_test_bytes, cfg.disk_min_mb_s, self.nproc,
                             cfg.allreduce_check, cfg.allreduce_bytes, cfg.check_timeout, cfg.python,
                             cfg.min_busbw_gbs)
        outcome = verdict(results)
        findings = self.log.write(kind, started, results, ending(outcome), attempt=attempt)
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
        findings = self._run("Bootchecking", attempt, lambda v: "Check Finished." if v != "blocked" else
                             "Check Finished, a hardware fault blocks the start.")
        return next((f for f in findings if f.action.label == "isolate_node"), None)

    def troubleshoot(self, attempt: int, restarting: bool) -> list[Finding]:
        """Run Troubleshooting after a failure (when ``health.troubleshooting``)."""
        if not self.config.troubleshooting:
            return []
        end = "Check Finished, task will be restarted." if restarting else "Check Finished, task will not be restarted."
        return self._run("Troubleshooting", attempt, lambda _v: end)


class _SayingTracker(StepTracker):
    """A StepTracker that also tells the terminal about each straggler (or job slowdown) it finds."""

    def __init__(self, config, say: Callable[[str], None]):
        super().__init__(config)
        self._say = say

    def observe(self, origin, index, text, time, seq=0):
        found = super().observe(origin, index, text, time, seq)
        if found is not None:
            self._say(f"ftwatch: {found.kind}: {found.line}")     # straggler or slowdown
        return found
