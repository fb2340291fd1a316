"""Carrying out MindCluster strategies and keep-scene in ``ftwatch run`` (SPEC D5, A3).

:class:`RecoveryActs` is mixed into :class:`ftwatch.pipeline.run.JobRunner` (kept apart for
size): the waits here run the runner's own loop step (poll the supervisor, handle each item, drain
the control socket), so output is echoed and fed to the rules while a retry, a dump or a kept
scene is under way. The decisions themselves come from ``ftwatch.pipeline.actuators.recovery``.

Needs from the runner: ``supervisor``, ``control``, ``controls`` (a ``RecoveryHandler``),
``recorder``, ``clock``, ``config``, ``mc``, ``scene``, ``slots``, ``budgets``, ``job``,
``health`` (``HealthChecks``), ``_state``, ``_stop_requested``, ``_handle(item, state)``,
``_add(state, findings)``, ``_incident(trigger, state)`` and ``_sleep(seconds)``.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from ftwatch.config.mindcluster import signal_number
from ftwatch.events import Action, Decision, Finding, Target
from ftwatch.pipeline.actuators.recovery import DumpWatch, Plan, RetryWatch

POLL_SECONDS = 0.2   # seconds per loop step while waiting (the runner's tick)


class RecoveryActs:
    """The runner's retry, in-place restart, dump and keep-scene steps."""

    supervisor: Any
    control: Any
    controls: Any
    recorder: Any

    def _in_place(self, how: Plan, state: Any) -> Decision | None:
        """MindCluster recover-in-place: restart the failed ranks, the others run on (after the
        instance-level health checks: a hardware fault found there is decided on instead)."""
        go, replaced = self._checked_instance_restart(list(how.ranks), state)
        if not go:
            return replaced
        self._sleep(self.config.supervisor.restart_delay)
        for rank in how.ranks:
            state.failed.discard(f"worker-{rank}")
            self.recorder.say(f"ftwatch: restarting rank {rank} in place")
            self.supervisor.restart_instance(rank)

    def _checked_instance_restart(self, ranks: list[int], state: Any) -> tuple[bool, Decision | None]:
        """H1 for an instance-level restart (seed 001: checks at every restart, Troubleshooting after
        every failure): ``health.instance_restart`` runs both, without the all-reduce.

        Returns:
            (True, None): go on with the restart. (False, decision): the Bootcheck found a hardware
            fault, so the restart of those ranks cannot help: the fault became an incident of its
            own (the policy's decision, usually ``isolate_node``: its device leaves the slots),
            whose decision replaces the restart. No second round of checks runs inside it.
        """
        if getattr(self, "_instance_checking", False):
            return True, None
        blocking = self.health.instance_restart(self.budgets.attempt, ranks)
        if blocking is None:
            return True, None
        self._add(state, [blocking])
        self._instance_checking = True
        try:
            return False, self._incident(blocking, state)
        finally:
            self._instance_checking = False

    def _retry(self, fault: Finding, state: Any) -> tuple[bool, Finding | None]:
        """MindCluster retry: ask the live workers to recover in place (SDK ``on_retry``) and wait
        until each acknowledged and reported a step. Returns (recovered, a failing exit meanwhile).

        Without a subscribed worker the fault is left alone (recovered=True: as without retry)."""
        running = {f"worker-{r}" for r in self.supervisor.running()}
        asked = self.control.subscribers.instances("retry") & running
        if not asked:
            return True, None
        if fault.fingerprint in state.retried:
            self.recorder.say(f"ftwatch: {fault.rule_id} again on {fault.origin.instance} after a retry: escalating")
            return False, None
        state.retried.add(fault.fingerprint)
        watch = RetryWatch(uuid.uuid4().hex[:12], fault, set(), self.clock.mono(), self.mc.retry_timeout)
        self.controls.retry = watch
        watch.asked = self.control.subscribers.notify(
            "retry", {"id": watch.id, "rule": fault.rule_id, "line": fault.line, "instance": fault.origin.instance,
                      "rank": fault.rank}, asked)
        if not watch.asked:                    # every subscriber's connection was gone
            self.controls.retry = None
            return True, None
        self.recorder.say(f"ftwatch: MindCluster retry {watch.id}: asking {', '.join(sorted(watch.asked))} "
                          f"to recover in place from {fault.rule_id}")
        trigger = None
        try:
            while (outcome := watch.outcome(self.clock.mono())) == "pending" and not self._stop_requested.is_set():
                for item in self.supervisor.poll(POLL_SECONDS):
                    t = self._handle(item, state)
                    if t is not None and trigger is None:
                        trigger = t
                        watch.fail(f"{t.origin.instance} ended ({t.line})")
                self.control.drain(self.controls)
        finally:
            self.controls.retry = None
        self.recorder.event(self.clock.time(), self.job, "retry", fault.origin.instance, fault.rank,
                            id=watch.id, rule=fault.rule_id, outcome=outcome, asked=sorted(watch.asked))
        if outcome != "recovered":
            self.recorder.say(f"ftwatch: MindCluster retry {watch.id} {outcome}")
            return False, trigger
        used = self.budgets.restarts_used
        steps = ", ".join(f"{i} at step {s}" for i, s in sorted(watch.stepped.items()))
        self.recorder.decision(Decision(
            self.clock.time(), Action.NOTIFY, Target(self.job, fault.origin.instance, fault.rank, fault.origin.node),
            fault, f"D5 MindCluster retry: {len(watch.asked)} worker(s) recovered in place and resumed "
                   f"({steps}) → training goes on", used,
            max(0, self.policy.max_restarts - used), (fault,), self.budgets.attempt))
        return True, None

    def _dump(self) -> None:
        """MindCluster dump: signal the live workers for last words, wait up to ``dump_grace``.

        Only workers whose main process installed ``Monitor.on_dump`` (SDK ``dump_ready``, by
        pid) are signalled: the signal's default action would kill the others. A worker started
        through a shell wrapper (``sh -c "python train.py"``) is the shell's child: it is not
        signalled unless the wrapper ``exec``s Python. A signalled worker that exits within the
        dump window counts as stopped by ftwatch, not as a failure (``_exited``)."""
        if not self.mc.has("dump"):
            return
        running = {f"worker-{r}" for r in self.supervisor.running()}
        live = {i: p for i, p in self.scene.pids().items() if i in running}
        ready = self.controls.dump_ready_pids()
        pids = {i: p for i, p in live.items() if p in ready}
        skipped = sorted(set(live) - set(pids))
        if skipped:
            self.recorder.say(f"ftwatch: not asking {', '.join(skipped)} for last words (no on_dump handler)")
        if not pids:
            return
        sig = signal_number(self.mc.dump_signal)
        watch = self.controls.dump = DumpWatch(pids, self.clock.mono(), self.mc.dump_grace)
        self.recorder.say(f"ftwatch: asking {', '.join(sorted(pids))} for last words ({self.mc.dump_signal}, "
                          f"{self.mc.dump_grace:g} s)")
        for pid in pids.values():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            while not watch.complete(self.clock.mono()) and not self._stop_requested.is_set():
                for item in self.supervisor.poll(POLL_SECONDS):
                    self._handle(item, self._state)
                self.control.drain(self.controls)
        finally:
            self.controls.dump = None
        outcomes = watch.outcomes()
        self.recorder.event(self.clock.time(), self.job, "dump", signal=self.mc.dump_signal, outcomes=outcomes)
        self.recorder.say("ftwatch: last words: " + "; ".join(f"{i} {o}" for i, o in outcomes.items()))

    def _keep_scene(self) -> None:
        """A3: leave the workers as they are for ``keep_scene_seconds`` and say how to attach."""
        seconds = self.config.supervisor.keep_scene_seconds
        if seconds <= 0:
            return
        sup = self.supervisor
        env = {"MASTER_ADDR": sup.master_addr, "MASTER_PORT": str(sup.master_port), "WORLD_SIZE": str(sup.nproc),
               **self.slots.env()}
        self.recorder.say(self.scene.attach_text(seconds, self.config.storage.state_dir, env, os.getcwd()))
        self.recorder.event(self.clock.time(), self.job, "keep_scene", seconds=seconds, pids=self.scene.pids())
        deadline = self.clock.mono() + seconds
        while self.clock.mono() < deadline and not self._stop_requested.is_set():
            for item in sup.poll(min(POLL_SECONDS, max(0.0, deadline - self.clock.mono()))):
                self._handle(item, self._state)
            self.control.drain(self.controls)
        self.recorder.say("ftwatch: scene released")
