"""The ``slurm`` actuator: decisions carried out through Slurm's own commands (issue 14 item 3,
README "Slurm").

What each decision does (``JOB`` is ``slurm.job_id``, else ``$SLURM_JOB_ID`` under ``ftwatch run``,
else the decision's job under ``ftwatch watch``; ``NODE`` is the decision's node, under
``ftwatch run`` ``$SLURMD_NODENAME``, Slurm's name for this machine):

    restart_job         ``scontrol requeue JOB``: Slurm kills the job's processes and puts it back
                        to pending; it starts again from its batch script (``SLURM_RESTART_COUNT``
                        counts the requeues). Under ``run`` only with ``restart: requeue`` (the
                        default); ``restart: local`` restarts the workers in the allocation.
    restart_instance,   under ``watch``: as restart_job (Slurm has no per-instance object to
    restart_in_place    restart); under ``run`` the local workers restart (not handled here).
    isolate_node        the circuit breaker first (``breaker.NodeBreaker``, the nodes and ftwatch's
                        drains read with ``sinfo``: beyond it the decision is held, status ``held``);
                        then ``scontrol update NodeName=NODE State=DRAIN Reason="ftwatch <decision
                        id>: <rule>: <line>"`` (no new jobs there; a person resumes it), then requeue.
    fail_job            ``fail: cancel``: ``scancel JOB``; ``fail: hold``: ``scontrol requeuehold
                        JOB`` (pending, priority 0, until ``scontrol release JOB``).
    notify, none        nothing.

A command that fails is retried ``retries`` times with a doubling backoff, unless Slurm refused it
for good (an invalid job id, no permission); one whose goal already holds (a requeue of a job
that is pending, a cancel of a job that ended) is done; a missing command is one line naming it. ``dry_run`` runs none of the writes (``sinfo`` is still read) and reports each as
it would have been run. Every command's line is in the :class:`ActResult` (``calls``) that the
driver stores with the decision (``ftwatch explain`` shows it).

In a multi-node job one agent (the leader) acts for the whole job (``ftwatch.pipeline.cluster.
handover``): it names the node to drain (``act(node=...)``) and gives a :class:`Ledger` of the
commands already done for that decision, so that a next leader does not run them again.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from ftwatch.clock import SystemClock
from ftwatch.config.slurm import SlurmConfig
from ftwatch.errors import ConfigError
from ftwatch.events import Action, Decision
from ftwatch.pipeline.actuators.breaker import NodeBreaker
from ftwatch.pipeline.actuators.exec import ActResult

# 1234, an array task 1234_7, a heterogeneous job's component 1234+1
JOB_ID = re.compile(r"^\d+(_\d+)?(\+\d+)?$")
# scontrol / scancel messages that a retry cannot change
PERMANENT = ("invalid job id", "invalid node name", "access/permission denied", "presently disabled",
             "only batch jobs", "invalid user id")
# ... and those saying the goal already holds: a requeue of a job Slurm already put back to pending
# (its own requeue, or ours seen again in the job's output under watch), a cancel of an ended job
ALREADY = {"requeue": ("pending execution",), "requeuehold": ("pending execution",),
           "scancel": ("already completing or completed",)}
MAX_REASON = 200          # characters of a drain reason kept
MAX_OUTPUT = 400          # characters of a failed command's message kept

# argv, timeout (s) -> (exit status, stdout and stderr). Raises FileNotFoundError, subprocess.TimeoutExpired.
Runner = Callable[[Sequence[str], float], "tuple[int, str]"]


class Ledger(Protocol):
    """The commands of one decision already carried out (by whoever acted before), by their ``what``."""

    def done(self, what: str) -> bool: ...

    def mark(self, what: str) -> None: ...


class SlurmError(Exception):
    """A command failed for good (its outcome line says why)."""


@dataclass
class Command:
    """One Slurm command the actuator ran or would have run."""

    argv: tuple[str, ...]
    what: str
    outcome: str = ""
    tries: int = field(default=0, compare=False)

    def line(self) -> str:
        """``scontrol requeue 1234 (requeue the job): ok``."""
        tries = f" after {self.tries} tries" if self.tries > 1 else ""
        return f"{shlex.join(self.argv)} ({self.what}): {self.outcome or 'not run'}{tries}"


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """Runs ``argv`` (no shell); returns its exit status and its output (stdout, then stderr)."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def missing_command(config: SlurmConfig, env: Mapping[str, str] | None = None) -> str | None:
    """One line naming the first of scontrol, scancel, sinfo that cannot be found, or None."""
    path = (env if env is not None else os.environ).get("PATH")
    for name in (config.scontrol, config.scancel, config.sinfo):
        if shutil.which(name, path=path) is None:
            where = "" if os.sep in name else " on PATH"
            return (f"{name} not found{where}: the slurm actuator needs Slurm's client commands "
                    f"(Debian: slurm-client) on this machine")
    return None


class SlurmActuator:
    """Acts on decisions through ``scontrol``, ``scancel`` and ``sinfo`` (module doc).

    Args:
        config: the ``slurm`` section.
        job_id: the Slurm job to act on when ``config.job_id`` is unset (``run``: $SLURM_JOB_ID);
            None: the decision's job (``watch``).
        node: the Slurm node name of this machine (``run``: $SLURMD_NODENAME); None: the
            decision's node.
        clock: time of the breaker's window.
        sleep: waits between retries.
        log: one line per command (the drivers print them).
        runner: runs one command (tests give a fake); default :func:`run_command`.
    """

    def __init__(self, config: SlurmConfig, job_id: str | None = None, node: str | None = None, clock=None,
                 sleep: Callable[[float], None] | None = None, log: Callable[[str], None] | None = None,
                 runner: Runner | None = None):
        self.config = config
        self.job_id = config.job_id or job_id
        self.node = node
        self.clock = clock or SystemClock()
        self.sleep = sleep or time.sleep
        self.log = log
        self.runner = runner or run_command
        b = config.breaker
        self.breaker = NodeBreaker(b.max_share, b.max_nodes, b.window)
        self.calls: list[Command] = []
        self._ledger: Ledger | None = None

    @classmethod
    def for_run(cls, config: SlurmConfig, env: Mapping[str, str] | None = None, **kwargs) -> "SlurmActuator":
        """The actuator of ``ftwatch run --actuator slurm`` inside a Slurm job.

        Raises:
            ConfigError: no job id ($SLURM_JOB_ID unset and no ``slurm.job_id``), or a command
                is missing (one line each).
        """
        env = os.environ if env is None else env
        job_id = config.job_id or env.get("SLURM_JOB_ID")
        if not job_id:
            raise ConfigError("--actuator slurm: SLURM_JOB_ID is not set: run ftwatch inside a Slurm job "
                              "(an sbatch script) or set slurm.job_id")
        missing = missing_command(config, env)
        if missing:
            raise ConfigError(f"--actuator slurm: {missing}")
        return cls(config, job_id=job_id, node=env.get("SLURMD_NODENAME") or None, **kwargs)

    def handles(self, action: Action) -> bool:
        """Whether Slurm carries ``action`` out under ``ftwatch run`` (else the local workers do)."""
        if action is Action.RESTART_JOB:
            return self.config.restart == "requeue"
        return action in (Action.ISOLATE_NODE, Action.FAIL_JOB)

    # -- the actuator protocol ------------------------------------------------------------------

    def act(self, decision: Decision, *, node: str | None = None, ledger: Ledger | None = None) -> ActResult:
        """Carries the decision out; never raises (a failure is ``failed`` with the commands' lines).

        Args:
            decision: the decision.
            node: the Slurm node an ``isolate_node`` drains (default: this actuator's node, else
                the decision's).
            ledger: the decision's commands already done (skipped, said so) and where each one
                done now is marked; None: every command runs.
        """
        self.calls = []
        self._ledger = ledger
        action = decision.action
        if action in (Action.NONE, Action.NOTIFY):
            return ActResult("skipped")
        job = self.job_id or decision.target.job
        if not JOB_ID.match(job or ""):
            return ActResult("failed", None, f"job {job!r} is not a Slurm job id: name watched jobs by their "
                                             f"Slurm job id (watch.identity) or set slurm.job_id")
        try:
            if action is Action.ISOLATE_NODE:
                held = self._isolate(decision, job, node)
                if held:
                    return self._result("held", held)
            elif action is Action.FAIL_JOB:
                if self.config.fail == "hold":
                    self._write((self.config.scontrol, "requeuehold", job), "requeue the job held")
                else:
                    self._write((self.config.scancel, job), "cancel the job")
            else:                                            # restart_job, restart_instance, restart_in_place
                self._requeue(job)
        except SlurmError as exc:
            return self._result("failed", str(exc))
        return self._result("dry_run" if self.config.dry_run else "done")

    # -- internals -------------------------------------------------------------------------------

    def _isolate(self, decision: Decision, job: str, node: str | None = None) -> str | None:
        """Breaker, drain, requeue; the breaker's reason when it holds (no breaker for a drain
        the ledger says was done)."""
        node = node or self.node or decision.target.node
        if node:
            now = self.clock.time()
            if not (self._ledger is not None and self._ledger.done("drain the node")):
                total, drained = self._nodes()
                held = self.breaker.check(node, now, total, drained)
                if held:
                    return held
            self._write((self.config.scontrol, "update", f"NodeName={node}", "State=DRAIN",
                         f"Reason={self.reason(decision)}"), "drain the node")
            self.breaker.record(node, now)
        self._requeue(job)
        return None

    def _requeue(self, job: str) -> None:
        self._write((self.config.scontrol, "requeue", job), "requeue the job")

    def reason(self, decision: Decision) -> str:
        """The drain reason: ``<prefix> <decision id>: <rule>: <line>`` on one line, cut short."""
        rc = decision.root_cause
        why = f"{rc.rule_id}: {rc.line}" if rc is not None else decision.policy_clause
        text = f"{self.config.reason_prefix} {decision.decision_id}: {why}"
        return " ".join(text.split())[:MAX_REASON]

    def _nodes(self) -> tuple[int, dict[str, float]]:
        """(the cluster's node count, node -> when ftwatch drained it (epoch s)) from ``sinfo``.

        Raises:
            SlurmError: sinfo failed.
        """
        out = self._run(Command((self.config.sinfo, "-h", "-N", "-o", "%N|%T|%H|%E"),
                                "count the nodes and find ftwatch's drains"))
        names: set[str] = set()
        drained: dict[str, float] = {}
        ours = re.compile(re.escape(self.config.reason_prefix) + r" [0-9a-f]{16}: ")
        for row in out.splitlines():
            parts = row.strip().split("|", 3)
            if len(parts) < 4 or not parts[0]:
                continue
            name, state, stamp, reason = parts
            names.add(name)
            when = _epoch(stamp)
            if "drain" in state.lower() and ours.match(reason) and when is not None:
                drained[name] = when
        return len(names), drained

    def _write(self, argv: tuple[str, ...], what: str) -> None:
        """A command that changes something: not run in dry run."""
        call = Command(argv, what)
        if self.config.dry_run or (self._ledger is not None and self._ledger.done(what)):
            self.calls.append(call)
            call.outcome = "dry run (not run)" if self.config.dry_run else "done before (not run again)"
            self._said(call)
            return
        self._run(call)
        if self._ledger is not None:
            self._ledger.mark(what)

    def _run(self, call: Command) -> str:
        """Runs ``call``, retrying failures with a doubling backoff. Returns its output.

        Raises:
            SlurmError: the command is missing, Slurm refused it for good, or it kept failing.
        """
        self.calls.append(call)
        wait = self.config.backoff
        while True:
            call.tries += 1
            try:
                status, output = self.runner(call.argv, self.config.timeout)
            except FileNotFoundError:
                self._done(call, f"failed: {call.argv[0]} not found: the slurm actuator needs Slurm's "
                                 f"client commands (Debian: slurm-client) on PATH")
                raise SlurmError(call.outcome) from None
            except subprocess.TimeoutExpired:
                status, output = -1, f"no answer in {self.config.timeout:g} s"
            if status == 0:
                self._done(call, "ok")
                return output
            message = _last_line(output) or f"exit status {status}"
            verb = call.argv[1] if len(call.argv) > 1 and call.argv[0] == self.config.scontrol else "scancel"
            if any(a in message.lower() for a in ALREADY.get(verb, ())):
                self._done(call, f"ok: already so ({message})")
                return output
            if any(p in message.lower() for p in PERMANENT) or call.tries > self.config.retries:
                self._done(call, f"failed: {message}")
                raise SlurmError(f"{shlex.join(call.argv)}: {message}")
            self.sleep(wait)
            wait *= 2

    def _done(self, call: Command, outcome: str) -> None:
        call.outcome = outcome
        self._said(call)

    def _said(self, call: Command) -> None:
        if self.log is not None:
            self.log(call.line())

    def _result(self, status: str, why: str = "") -> ActResult:
        lines = tuple(c.line() for c in self.calls)
        return ActResult(status, None, "\n".join(([why] if why else []) + list(lines)), lines)


def _last_line(output: str) -> str:
    """The last non-empty line of a command's output (Slurm puts the error there), cut short."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:MAX_OUTPUT] if lines else ""


def _epoch(stamp: str) -> float | None:
    """sinfo's ``%H`` (``2026-11-26T03:31:51``, local time) as epoch seconds; None when Unknown."""
    try:
        return time.mktime(time.strptime(stamp.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
