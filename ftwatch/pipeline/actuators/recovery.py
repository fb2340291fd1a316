"""Following MindCluster's live strategies while ``ftwatch run`` carries them out (SPEC D5, seed
004): :class:`RetryWatch` follows one ``retry`` (ask the live workers to recover in place; each
must acknowledge and then report a step), :class:`DumpWatch` one ``dump`` (signal, grace, who
wrote last words), and :class:`RecoveryHandler` adds their control ops (``retry_done``,
``dump_done``, ``dump_ready``). Pure state, driven by ``ftwatch.pipeline.actuators.local`` (real
time) and by tests (a FakeClock): nothing here starts, signals or waits for a process.

What a decision means for the workers (the strategies' plan, local isolation) is the policy
stage's: ``ftwatch.policy.plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ftwatch.events import Finding
from ftwatch.pipeline.sources.control import ControlHandler


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
