"""How a decision is carried out on one machine: MindCluster strategies (SPEC D5, seed 004) and
local isolation (A1). Pure logic, driven by ``ftwatch.pipeline.run`` (real time) and by tests
(a FakeClock): nothing here starts, signals or waits for a process.

- :func:`plan` turns the policy's decision into what the runner does: restart the failed workers
  in place, restart the job, or stop and fail; the decision's clause says which strategy chose it.
- :func:`isolate_devices` excludes the device of the blamed rank and of every other rank with an
  isolate-level finding in the incident (``Slots``) for an ``isolate_node`` decision, or fails the
  job when fewer than MIN devices would be left.
- :class:`RetryWatch` follows one ``retry`` (ask the live workers to recover in place; each must
  acknowledge and then report a step), :class:`DumpWatch` one ``dump`` (signal, grace, who wrote
  last words). :class:`RecoveryHandler` adds their control ops (``retry_done``, ``dump_done``).

Precedence when strategies are combined (ftwatch's, README): ``retry`` while the processes live,
then ``recover-in-place``, then ``recover``; ``dump`` before any stop; ``exit`` fails.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ftwatch.config.mindcluster import RECOVERING, MindClusterConfig
from ftwatch.events import Action, Decision, FailureClass, Finding, Severity, Target
from ftwatch.pipeline.sources.control import ControlHandler
from ftwatch.pipeline.actuators.slots import Slots

RESTARTS = (Action.RESTART_INSTANCE, Action.RESTART_IN_PLACE, Action.RESTART_JOB, Action.ISOLATE_NODE)
_NOT_RETRYABLE_KINDS = ("exit_code", "hang", "exit_hang", "summary")


@dataclass(frozen=True)
class Plan:
    """What the runner does with a decision.

    Attributes:
        kind: ``in_place`` (restart ``ranks`` only, the others run on), ``job`` (stop all, start
            all), ``fail`` (stop all, the job failed) or ``none`` (nothing: success / notify).
        ranks: the ranks an ``in_place`` plan restarts.
    """

    kind: str
    ranks: tuple[int, ...] = ()


def plan(decision: Decision, mc: MindClusterConfig, failed_ranks: set[int], running: bool) -> tuple[Decision, Plan]:
    """The plan for ``decision`` under the MindCluster strategies (off: the policy's own action).

    Args:
        decision: the policy's decision.
        mc: the ``mindcluster`` section.
        failed_ranks: ranks that failed on their own and are not running.
        running: whether some worker still runs (in place needs survivors to make sense).

    Returns:
        (the decision, its clause extended by the strategy that chose the plan; the plan).
    """
    act = decision.action
    if act is Action.FAIL_JOB:
        if mc.enabled and not RECOVERING & set(mc.recover_strategy):
            return _clause(decision, f"D5 MindCluster {_names(mc)}: no recover strategy → exit: stop and fail"), Plan("fail")
        return decision, Plan("fail")
    if act not in RESTARTS:
        return decision, Plan("none")
    if not mc.enabled:
        return decision, Plan("job")
    if mc.has("recover-in-place") and act is not Action.ISOLATE_NODE and failed_ranks and running:
        ranks = tuple(sorted(failed_ranks))
        who = ", ".join(f"rank {r}" for r in ranks)
        target = Target(decision.target.job, f"worker-{ranks[0]}" if len(ranks) == 1 else None,
                        ranks[0] if len(ranks) == 1 else None, decision.target.node)
        decision = dataclasses.replace(decision, action=Action.RESTART_IN_PLACE, target=target)
        return _clause(decision, f"D5 MindCluster recover-in-place → restart {who} in place, "
                                 "the other workers run on"), Plan("in_place", ranks)
    if mc.has("recover"):
        why = "restart the job without the isolated device" if act is Action.ISOLATE_NODE else "restart the job"
        return _clause(decision, f"D5 MindCluster recover → {why}"), Plan("job")
    why = ("a device must be excluded: restart the job" if act is Action.ISOLATE_NODE
           else "no failed worker to restart alone: restart every worker")
    return _clause(decision, f"D5 MindCluster recover-in-place → {why}"), Plan("job")


def isolate(decision: Decision, slots: Slots) -> tuple[Decision, str | None]:
    """``isolate_devices``, returning only the first device isolated (the root cause's), or None."""
    decision, devices = isolate_devices(decision, slots)
    return decision, devices[0] if devices else None


def isolation_ranks(decision: Decision) -> list[int]:
    """The ranks whose devices an ``isolate_node`` decision takes out of the slots: the target's
    rank first, then every other rank with an isolate-level real finding in the incident (a second
    GPU that fell off the bus in the same incident goes too), in rank order."""
    ranks = [decision.target.rank] if decision.target.rank is not None else []
    for f in decision.findings:
        if (f.action is Action.ISOLATE_NODE and f.severity >= Severity.ERROR and f.rank is not None
                and f.failure_class not in (FailureClass.FALLOUT, FailureClass.INFO) and f.rank not in ranks):
            ranks.append(f.rank)
    return ranks[:1] + sorted(ranks[1:])


def isolate_devices(decision: Decision, slots: Slots) -> tuple[Decision, list[str]]:
    """Carry out an ``isolate_node`` decision on one machine: exclude the device of every rank of
    ``isolation_ranks`` (bounded by MIN: fewer than MIN devices left fails the job); where the
    root cause names its device in ``fields["device"]`` (a Bootcheck's NVML check) and that
    device is an active one, that device stands for the root cause's rank.

    Returns:
        (the decision, with its clause extended; FAIL_JOB when fewer than MIN devices are left;
        the isolated devices, the root cause's first). A decision of another action, or one whose
        ranks have no device, comes back unchanged but for the clause (then the job restarts with
        every device).
    """
    if decision.action is not Action.ISOLATE_NODE:
        return decision, []
    rc = decision.root_cause
    named = rc.fields.get("device") if rc is not None else None     # a health check names its device
    pairs: list[tuple[int | None, str | None]] = []
    if named is not None and str(named) in slots.active:
        pairs.append((slots.active.index(str(named)), str(named)))
    pairs += [(r, slots.device_of(r)) for r in isolation_ranks(decision)]   # all looked up before any is removed
    seen: set[str] = set()
    pairs = [(r, d) for r, d in pairs if d is not None and not (d in seen or seen.add(d))]
    if not pairs:
        return _clause(decision, f"A1 local: no device known for rank {decision.target.rank}; nothing isolated"), []
    by_rank = {f.rank: f for f in reversed(decision.findings) if f.action is Action.ISOLATE_NODE}
    for rank, device in pairs:
        why = by_rank.get(rank) or rc
        slots.isolate(device, rank=rank, rule=why.rule_id if why else None, line=why.line if why else None,
                      time=decision.time, attempt=decision.attempt)
    rng = slots.range
    what = ", ".join(f"device {d} (rank {r})" for r, d in pairs)
    devices = [d for _, d in pairs]
    if not slots.viable:
        text = (f"A1 local: isolated {what}; {slots.nproc} healthy device(s) left, "
                f"below the minimum {rng.min} of --nproc-per-node {rng} → fail_job")
        return dataclasses.replace(_clause(decision, text), action=Action.FAIL_JOB), devices
    return _clause(decision, f"A1 local: isolated {what}; restart with {slots.nproc} "
                             f"worker(s) on {','.join(slots.active)} (--nproc-per-node {rng})"), devices


def retry_candidate(f: Finding) -> bool:
    """A finding ``retry`` may answer: a real, retryable error seen in a log (not an exit or a hang)
    whose rule recommends a restart short of isolation (the device is still there)."""
    return (f.severity >= Severity.ERROR and f.kind not in _NOT_RETRYABLE_KINDS
            and f.failure_class in (FailureClass.RETRYABLE_INFRA, FailureClass.HARDWARE_NODE)
            and f.action in (Action.RESTART_INSTANCE, Action.RESTART_IN_PLACE, Action.RESTART_JOB))


def _names(mc: MindClusterConfig) -> str:
    return "recover-strategy " + ",".join(mc.recover_strategy)


def _clause(decision: Decision, text: str) -> Decision:
    return dataclasses.replace(decision, policy_clause=f"{decision.policy_clause}; {text}")


@dataclass
class RetryWatch:
    """One ``retry``: the workers asked, their answers, the steps they reported since.

    Args:
        id: the retry's id (in the notice and the answers).
        finding: the fault it answers.
        asked: the instances the notice reached.
        started: monotonic seconds when it was sent; timeout: seconds it may take.
    """

    id: str
    finding: Finding
    asked: set[str]
    started: float
    timeout: float
    answers: dict[str, tuple[bool, str]] = field(default_factory=dict)
    stepped: dict[str, int] = field(default_factory=dict)
    failure: str | None = None

    def answer(self, instance: str, ok: bool, error: str = "") -> None:
        """A worker's ``retry_done``."""
        if instance in self.asked:
            self.answers[instance] = (ok, error)

    def step(self, instance: str, step: int) -> None:
        """A worker reported a step; it counts once the worker has answered ok."""
        if self.answers.get(instance, (False, ""))[0]:
            self.stepped.setdefault(instance, step)

    def fail(self, why: str) -> None:
        """Something ended the retry (a worker exited)."""
        self.failure = self.failure or why

    def outcome(self, now: float) -> str:
        """``pending``, ``recovered`` or ``failed: <why>`` at monotonic time ``now``."""
        if self.failure:
            return f"failed: {self.failure}"
        bad = sorted(i for i, (ok, _) in self.answers.items() if not ok)
        if bad:
            return f"failed: {bad[0]} could not recover ({self.answers[bad[0]][1] or 'no reason given'})"
        if self.asked and set(self.stepped) >= self.asked:
            return "recovered"
        if now - self.started >= self.timeout:
            missing = sorted(self.asked - set(self.stepped))
            return f"failed: no step from {', '.join(missing)} within {self.timeout:g} s"
        return "pending"


@dataclass
class DumpWatch:
    """One ``dump``: the workers signalled and what each did within the grace period.

    Args:
        asked: instance -> pid of the workers signalled.
        started: monotonic seconds of the signal; grace: seconds they get.
    """

    asked: dict[str, int]
    started: float
    grace: float
    dumped: dict[str, str | None] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    exited: dict[str, str] = field(default_factory=dict)

    def done(self, instance: str, path: str | None, ok: bool) -> None:
        """A worker's ``dump_done``."""
        if instance in self.asked:
            (self.dumped.__setitem__(instance, path) if ok else self.refused.add(instance))

    def exit(self, instance: str, how: str) -> None:
        """A signalled worker ended (``exit 0``, ``signal SIGUSR1`` ...)."""
        if instance in self.asked:
            self.exited.setdefault(instance, how)

    def complete(self, now: float) -> bool:
        """Every worker answered or ended, or the grace period is over."""
        settled = set(self.dumped) | self.refused | set(self.exited)
        return settled >= set(self.asked) or now - self.started >= self.grace

    def outcomes(self) -> dict[str, str]:
        """instance -> ``dumped <path>``, ``dump failed``, ``exited (<how>) without dump_done`` or
        ``no answer within <grace> s``."""
        out = {}
        for inst in sorted(self.asked):
            if inst in self.dumped:
                out[inst] = f"dumped {self.dumped[inst] or ''}".rstrip()
            elif inst in self.refused:
                out[inst] = "dump failed"
            elif inst in self.exited:
                out[inst] = f"exited ({self.exited[inst]}) without dump_done"
            else:
                out[inst] = f"no answer within {self.grace:g} s"
        return out


class RecoveryHandler(ControlHandler):
    """The SDK's ops plus ``retry_done`` (``id``, ``ok``, ``error``), ``dump_done`` (``path``,
    ``ok``) and ``dump_ready`` (``pid``: the process installed ``Monitor.on_dump``); they update
    :attr:`retry` / :attr:`dump` when one is under way, and :meth:`dump_ready_pids`."""

    retry: RetryWatch | None = None
    dump: DumpWatch | None = None

    def dump_ready_pids(self) -> set[int]:
        """Pids of the worker processes that handle the dump signal (only they are signalled)."""
        if "_dump_ready" not in self.__dict__:
            self._dump_ready: set[int] = set()
        return self._dump_ready

    def _op_dump_ready(self, m: dict[str, Any]) -> dict[str, Any]:
        pid = m.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return {"ok": False, "error": "pid must be a positive integer"}
        self.dump_ready_pids().add(pid)
        return {"ok": True}

    def _op_retry_done(self, m: dict[str, Any]) -> dict[str, Any]:
        instance, _ = self._sender(m)
        if self.retry is None or m.get("id") != self.retry.id or instance is None:
            return {"ok": False, "error": "no such retry under way"}
        self.retry.answer(instance, m.get("ok") is True, str(m.get("error") or ""))
        self._event("retry_done", m, id=m.get("id"), result=m.get("ok") is True, error=m.get("error"))
        return {"ok": True}

    def _op_dump_done(self, m: dict[str, Any]) -> dict[str, Any]:
        instance, _ = self._sender(m)
        path = m.get("path") if isinstance(m.get("path"), str) else None
        self._event("dump_done", m, path=path, result=m.get("ok") is True)
        if self.dump is not None and instance is not None:
            self.dump.done(instance, path, m.get("ok") is True)
        return {"ok": True}

    def _op_report_step(self, m: dict[str, Any]) -> dict[str, Any]:
        answer = super()._op_report_step(m)
        instance, _ = self._sender(m)
        if answer.get("ok") and self.retry is not None and instance is not None:
            self.retry.step(instance, m["step"])
        return answer
