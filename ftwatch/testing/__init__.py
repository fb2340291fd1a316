"""Test doubles shipped with ftwatch (like ``structlog.testing``): use them instead of writing fakes.

- :class:`FakeClock` (from ``ftwatch.clock``): time moves only when a test advances it; no test sleeps.
- :class:`ListSource`: a source that hands out a scripted list of batches, in order, on no thread:
  ``list[Shipped]`` batches onto a queue as the shipped sources do, or ``Output``/``Started``/
  ``ProcessExit`` lists from :meth:`ListSource.poll` as the supervisor does.
- :class:`CaptureSink`: a sink that keeps every record (events, findings, decisions, deliveries,
  output counts, runs) in lists, where the Recorder would have written SQLite rows.
- :class:`CaptureNotifier`: a receiver that keeps every notification it got, and can be told to
  fail the next N sends or to be down, raising ``NotifyError``; :class:`CaptureAlerts`: an alert
  path (in the Recorder's place of the event center) that keeps the alerts it is handed.
- :func:`finding`, :func:`decision`, :func:`origin`: the event types with sensible defaults; name
  only what the test is about.
- :class:`FakeSupervisor` and :class:`FakeControl`: scripted workers (:class:`Say`, :class:`Exit`,
  :func:`script_of`) on a FakeClock and a control socket without a socket (scripted subscribers
  and their answers), for driving ``ftwatch run``'s loop without processes (``ftwatch.pipeline.build.build_run(..., clock=, supervisor=,
  control=)``); ``poll`` moves the clock to the next scripted item as the real one would block.
- Worker commands the tests share: :func:`python_job` with :data:`KEYERROR_JOB`,
  :data:`CLEAN_JOB` and :data:`SIGKILL_JOB`, and :func:`write_nccl_crash_worker`, a torchrun-style
  worker script whose rank 1 dies with an NCCL error on the first attempt.

Nothing here starts a thread or a process, or waits. The run loop's doubles (the fake
supervisor and control socket, their scripts) live in ``ftwatch.testing.runloop`` and are
re-exported here, so a test imports every double from ``ftwatch.testing``.
"""

from __future__ import annotations

import queue
import sys
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ftwatch.alerting.dispatch import NullAlerts
from ftwatch.clock import FakeClock
from ftwatch.errors import NotifyError
from ftwatch.events import Action, Decision, DeliveryResult, FailureClass, Finding, Origin, Severity, Target
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, RunEnd, RunStart, encode
from ftwatch.pipeline.sources.base import ShippedBatch
from ftwatch.testing.runloop import Exit, FakeControl, FakeSupervisor, Say, script_of

__all__ = ["CLEAN_JOB", "JOB", "KEYERROR_JOB", "SIGKILL_JOB", "T0", "CaptureAlerts", "CaptureNotifier", "CaptureSink",
           "Exit",
           "FakeClock", "FakeControl", "FakeSupervisor", "ListSource", "Say", "StoredEvent", "decision", "finding",
           "origin", "python_job", "script_of", "write_nccl_crash_worker"]

JOB = "job-7"
"""The job of the builders' findings and decisions unless a test names another."""
T0 = 1_795_219_200.0
"""2026-11-21T00:00:00Z in epoch seconds: the builders' default time and ``FakeClock``'s start."""

_JOB_WIDE = frozenset({Action.NONE, Action.NOTIFY, Action.RESTART_JOB, Action.FAIL_JOB})


# --------------------------------------------------------------------------- sources

class ListSource:
    """A source that hands out a scripted list of batches, in the order given.

    Read it either way the pipeline reads its sources:

    - as a shipped source (``ShippedSource``: ``name``, ``start``, ``stop``): :meth:`start` puts
      every batch on ``out`` at once, each as a ``ShippedBatch`` (a ``list[Shipped]`` the consumer
      acknowledges), so :attr:`acked` shows whether the consumer acknowledged them;
    - as the supervisor (``poll(timeout) -> list[Output | Started | ProcessExit]``): each
      :meth:`poll` returns the next batch, and ``[]`` once all were handed out.

    Args:
        batches: the batches, each a sequence of items (``Shipped`` for ``watch``; ``Output``,
            ``Started``, ``ProcessExit`` for the run loop).
        out: the queue :meth:`start` fills; None when the source is only polled.
        name: the source's name.

    Attributes:
        handed: how many batches were handed out so far.
        started, stopped: whether :meth:`start` / :meth:`stop` were called.
    """

    def __init__(self, batches: Iterable[Sequence[Any]], out: queue.Queue | None = None, name: str = "list"):
        self.batches = [ShippedBatch(b) for b in batches]
        self.out = out
        self.name = name
        self.handed = 0
        self.started = False
        self.stopped = False

    def start(self) -> None:
        """Put every batch not yet handed out on ``out``, without blocking.

        Raises:
            ValueError: the source has no ``out`` queue.
            queue.Full: ``out`` is bounded and too small for the script (a test sizes it).
        """
        if self.out is None:
            raise ValueError(f"{self.name}: no queue to put the batches on (poll() it instead)")
        self.started = True
        while self.handed < len(self.batches):
            self.out.put_nowait(self.batches[self.handed])
            self.handed += 1

    def stop(self) -> None:
        """Mark the source stopped; idempotent."""
        self.stopped = True

    def poll(self, timeout: float = 0.0) -> list[Any]:
        """The next batch as a plain list, or ``[]`` once all were handed out (never waits: the
        ``timeout`` in seconds is accepted for the supervisor's signature and ignored)."""
        if self.handed >= len(self.batches):
            return []
        self.handed += 1
        return list(self.batches[self.handed - 1])

    @property
    def exhausted(self) -> bool:
        """Whether every batch was handed out."""
        return self.handed >= len(self.batches)

    @property
    def acked(self) -> int:
        """How many batches the consumer acknowledged (``ShippedBatch.ack``)."""
        return sum(b.acked for b in self.batches)


# --------------------------------------------------------------------------- sinks

StoredEvent = LifecycleEvent
"""What :attr:`CaptureSink.events` holds: the ``LifecycleEvent`` records as written (the old name)."""


class CaptureSink:
    """A sink double (``ftwatch.pipeline.sinks.base.Sink``): every record the Recorder writes
    lands in a list, in order.

    ``write(batch)`` sorts each record into the attribute for its type; ``close`` ends it, and a
    write after :meth:`close` raises, as the SQLite store's does. Writes are thread-safe.

    Attributes:
        events: the ``LifecycleEvent`` records, in order.
        findings: every stored finding, in order; ``finding_attempts`` holds each one's attempt.
        decisions: the stored decisions.
        deliveries: the stored ``DeliveryResult`` objects.
        output: the output-count rows ``(job, instance, rank, bucket, seconds, lines, bytes)``.
        runs: ``{(job, attempt): {"started", "command", "ended", "status"}}`` (epoch seconds).
        closed: whether :meth:`close` was called.
    """

    def __init__(self) -> None:
        self.events: list[LifecycleEvent] = []
        self.findings: list[Finding] = []
        self.finding_attempts: list[int] = []
        self.decisions: list[Decision] = []
        self.deliveries: list[Any] = []
        self.output: list[tuple] = []
        self.runs: dict[tuple[str, int], dict[str, Any]] = {}
        self.closed = False
        self._lock = threading.Lock()
        self._encoders = {RunStart: self._run_start, RunEnd: self._run_end, LifecycleEvent: self.events.append,
                          FindingBatch: self._findings, Decision: self.decisions.append,
                          DeliveryResult: self.deliveries.append, OutputBatch: self._output}

    def write(self, batch: Sequence[Any]) -> None:
        """Keep every record of ``batch``.

        Raises:
            RuntimeError: after :meth:`close`.
            TypeError: a record that is not a sink record.
        """
        with self._writing():
            for record in batch:
                encode(self._encoders, record)

    def _run_start(self, r: RunStart) -> None:
        self.runs[(r.job, r.attempt)] = {"started": r.time, "command": r.command, "ended": None,
                                         "status": "running"}

    def _run_end(self, r: RunEnd) -> None:
        run = self.runs.setdefault((r.job, r.attempt), {"started": None, "command": ""})
        run.update(ended=r.time, status=r.status)

    def _findings(self, b: FindingBatch) -> None:
        self.findings += b.findings
        self.finding_attempts += [b.attempt] * len(b.findings)

    def _output(self, b: OutputBatch) -> None:
        self.output += b.rows

    def close(self) -> None:
        """Close the sink; later writes raise RuntimeError. Idempotent."""
        self.closed = True

    def kinds(self, job: str | None = None) -> list[str]:
        """The kinds of the stored events (of ``job`` only, when given), in order."""
        return [e.kind for e in self.events if job is None or e.job == job]

    def _writing(self) -> threading.Lock:
        if self.closed:
            raise RuntimeError("CaptureSink: write after close()")
        return self._lock


# --------------------------------------------------------------------------- notifiers

class CaptureNotifier:
    """A receiver (``ftwatch.alerting.notifiers.Notifier``) that keeps what it is sent.

    Args:
        name: the receiver's name (notification ids end in it).
        kind: its kind, which picks the template (``webhook``, ``dingtalk`` ...).
        fail: how many of the next sends raise ``NotifyError`` before sends succeed again.
        retryable: whether those errors (and :attr:`down`'s) say a retry may work.
        max_retries: the retries the sender grants this receiver (None: the sender's own).
        clock: when given, :attr:`times` gets ``clock.time()`` of each accepted send.

    Attributes:
        sent: the accepted notifications, in order.
        attempts: every call of :meth:`send`, failed ones included.
        down: while True every send fails (a receiver that is unreachable).
        times: epoch seconds of each accepted send (with a ``clock``).
    """

    def __init__(self, name: str = "capture", kind: str = "webhook", *, fail: int = 0,
                 retryable: bool = True, max_retries: int | None = None, clock: Any = None):
        self.name, self.kind = name, kind
        self.max_retries = max_retries
        self.retryable = retryable
        self.clock = clock
        self.sent: list[Any] = []
        self.times: list[float] = []
        self.attempts = 0
        self.down = False
        self._fail = fail

    def fail(self, times: int = 1, retryable: bool = True) -> None:
        """Make the next ``times`` sends raise ``NotifyError(retryable=retryable)``."""
        self._fail, self.retryable = times, retryable

    def send(self, notification: Any) -> None:
        """Keep ``notification``.

        Raises:
            NotifyError: while :attr:`down`, or for each send still to fail.
        """
        self.attempts += 1
        if self.down:
            raise NotifyError(f"{self.name} is down", retryable=self.retryable)
        if self._fail > 0:
            self._fail -= 1
            raise NotifyError(f"{self.name}: scripted failure", retryable=self.retryable)
        self.sent.append(notification)
        if self.clock is not None:
            self.times.append(self.clock.time())

    @property
    def ids(self) -> list[str]:
        """The ids of the accepted notifications."""
        return [n.id for n in self.sent]

    def log(self, label: str = "job") -> list[tuple[str, str]]:
        """``(the alert's label value, its status)`` per accepted notification, e.g.
        ``[("job-a", "firing"), ("job-a", "resolved")]``."""
        return [(n.alert.labels.get(label), n.alert.status) for n in self.sent]


class CaptureAlerts(NullAlerts):
    """An alert path (``ftwatch.alerting.dispatch.AlertPath``) that keeps the alerts it is handed
    and delivers nothing (the rest is ``NullAlerts``').

    Args:
        log: when given, ``"alert"`` is appended to it at each dispatch (a test's record of the
            order things happened in, shared with other doubles).

    Attributes:
        alerts: the alerts dispatched, in order.
    """

    def __init__(self, log: list[str] | None = None):
        self.alerts: list[Any] = []
        self.log = log

    def dispatch(self, alert: Any) -> list[DeliveryResult]:
        self.alerts.append(alert)
        if self.log is not None:
            self.log.append("alert")
        return []


# --------------------------------------------------------------------------- builders

def origin(rank: int | None = 1, job: str = JOB, node: str = "node-a", *, instance: str | None = None,
           stream: str = "stderr", source: str = "process") -> Origin:
    """The Origin of worker ``worker-<rank>`` (or ``instance``) of ``job`` on ``node``."""
    return Origin(instance or f"worker-{rank}", rank, job, node, stream, source)


def finding(rule_id: str = "nccl.unhandled_system_error", *, line: str | None = None, time: float = T0,
            action: Action = Action.RESTART_JOB,
            failure_class: FailureClass = FailureClass.RETRYABLE_INFRA,
            severity: Severity = Severity.ERROR, kind: str = "keyword", at: Origin | None = None,
            rank: int | None = 1, job: str = JOB, node: str = "node-a", seq: int = 0,
            evidence: Sequence[str] = (), fields: Mapping[str, Any] | None = None) -> Finding:
    """A Finding with sensible defaults: an NCCL error on ``worker-1`` of ``job-7`` at :data:`T0`.

    Args:
        rule_id: the rule that fired.
        line: the root-cause line (default ``"<rule_id> on rank <rank>"``).
        time: epoch seconds.
        action, failure_class, severity, kind: the rule's verdict.
        at: the origin; default :func:`origin` of ``rank``, ``job``, ``node``.
        seq, evidence, fields: as on ``Finding``.
    """
    where = at if at is not None else origin(rank, job, node)
    return Finding(rule_id, kind, failure_class, action, severity, where,
                   line if line is not None else f"{rule_id} on rank {where.rank}", time, seq,
                   tuple(evidence), dict(fields or {}))


_DEFAULT: Any = object()


def decision(action: Action = Action.RESTART_JOB, root_cause: Finding | None = _DEFAULT, *,
             time: float | None = None, target: Target | None = None, clause: str = "test clause",
             restarts_used: int = 1, restarts_left: int = 2, findings: Sequence[Finding] = (),
             attempt: int = 0) -> Decision:
    """A Decision with sensible defaults.

    Args:
        action: what it does.
        root_cause: its root cause; default ``finding(action=action)``; None for a decision
            without one (a spent budget).
        time: epoch seconds; default one second after the root cause (or :data:`T0`).
        target: default the whole job for ``none``/``notify``/``restart_job``/``fail_job``,
            else the root cause's instance, rank and node.
        clause, restarts_used, restarts_left, findings, attempt: as on ``Decision``.
    """
    rc = finding(action=action) if root_cause is _DEFAULT else root_cause
    if time is None:
        time = rc.time + 1.0 if rc is not None else T0
    if target is None:
        o = rc.origin if rc is not None else origin(None, instance="")
        target = Target(o.job) if action in _JOB_WIDE or rc is None else \
            Target(o.job, o.instance, o.rank, o.node)
    return Decision(time, action, target, rc, clause, restarts_used, restarts_left, tuple(findings), attempt)


# --------------------------------------------------------------------------- worker commands

def python_job(code: str, *args: str) -> list[str]:
    """The argv of a worker that runs ``code`` in this Python (``sys.executable -c code args``)."""
    return [sys.executable, "-c", code, *args]


KEYERROR_JOB = python_job("import sys; d={}; d['lr']")
"""A worker that dies of a KeyError traceback (user code: ``fail_job``)."""
CLEAN_JOB = python_job("print('ok')")
"""A worker that prints one line and exits 0."""
SIGKILL_JOB = python_job("import os,signal; os.kill(os.getpid(), signal.SIGKILL)")
"""A worker that kills itself with SIGKILL (exit -9: a retryable restart)."""

_NCCL_CRASH_WORKER = r'''
import os, sys, time
rank = int(os.environ["RANK"]); attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for step in range(STEPS):
    print(f"rank {rank} attempt {attempt} step {step}LOSS", flush=True)
    time.sleep(STEP_SECONDS)
if attempt == 0:
    if rank == 1:
        print("RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
              "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1", flush=True)
        os.kill(os.getpid(), 9)
    time.sleep(120)
if attempt == 1 and HANG_ON_RETRY:
    time.sleep(120)     # every rank silent: a job hang
print(f"rank {rank} done", flush=True)
'''


def write_nccl_crash_worker(path: Path, steps: int = 5, step_seconds: float = 0.2, loss: bool = False,
                            hang_on_retry: bool = False) -> Path:
    """Write a torchrun-style worker script (run it under ``ftwatch run --nproc-per-node 2+``).

    Each rank prints ``rank R attempt A step S`` ``steps`` times, ``step_seconds`` apart (with
    `` loss 1/(S+1)`` when ``loss``). On the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0)
    rank 1 then prints NCCL's ``unhandled system error`` and SIGKILLs itself while the others
    wait 120 s (the restart stops them). Later attempts print ``rank R done`` and exit 0; with
    ``hang_on_retry`` the second attempt is silent for 120 s first (a job hang).

    Returns:
        ``path``.
    """
    script = (_NCCL_CRASH_WORKER.replace("STEP_SECONDS", repr(float(step_seconds)))
              .replace("STEPS", str(int(steps)))
              .replace("LOSS", " loss {1.0 / (step + 1):.3f}" if loss else "")
              .replace("HANG_ON_RETRY", repr(bool(hang_on_retry))))
    path.write_text(script, encoding="utf-8")
    return path
