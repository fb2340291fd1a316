"""The ``mindcluster`` section: MindCluster's process-level recovery dialect (SPEC M3, D5; seed 004).

Seed 004 (配置进程级在线恢复) names the task annotation ``recover-strategy`` with five strategies
that "may be combined freely, separated by commas": ``retry`` (进程级在线恢复, online recovery
inside the running processes), ``recover`` (进程级别重调度, the processes are rescheduled),
``recover-in-place`` (进程级原地恢复, the failed processes restart where they are), ``dump``
(保存临终遗言, save last words) and ``exit`` (退出训练); and torchrun's ``--max_restarts`` and
``--monitor_interval`` in the launch script (its example: ``--max_restarts 5 --monitor_interval
10``). The seed fixes no order among combined strategies and no dump signal; ftwatch's choices
(README "MindCluster recover-strategy and local isolation"):

- precedence: ``retry`` (while the processes live) -> ``recover-in-place`` -> ``recover`` ->
  stop; ``dump`` runs before workers are stopped; ``exit`` (or no recovering strategy) means
  the job fails instead of restarting;
- ``dump_signal`` SIGUSR1 (the usual "save now" signal of schedulers), ``dump_grace`` 30 s.

``policy_overrides`` translates the section into the AIMaster policy (M4: one config holds the
dialects): a recovering strategy enables restarts, ``max_restarts`` is the restart budget.
"""

from __future__ import annotations

import signal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid")
#: The strategies in ftwatch's precedence order (seed 004 lists them in this order too).
STRATEGIES = ("retry", "recover-in-place", "recover", "dump", "exit")
RECOVERING = frozenset({"recover", "recover-in-place"})


class MindClusterConfig(BaseModel):
    """MindCluster ``recover-strategy`` and its torchrun knobs (seed 004); off while the strategy is empty."""

    model_config = _STRICT
    recover_strategy: list[str] = Field(
        default_factory=list, description="Comma-combined: retry, recover, recover-in-place, dump, exit "
        "(seed 004); empty: off (the policy alone decides).")
    max_restarts: int | None = Field(
        None, ge=0, description="torchrun --max_restarts: the restart budget (replaces "
        "policy.max_num_of_job_restart); null: keep the policy's.")
    monitor_interval: float | None = Field(
        None, gt=0, description="torchrun --monitor_interval: seconds between checks of the workers "
        "(ftwatch's tick: hangs, stale blocks); null: 0.2.")
    dump_signal: str = Field("SIGUSR1", description="Signal asking a worker for its last-words checkpoint (dump).")
    dump_grace: float = Field(30.0, ge=0, description="Seconds the workers get to write last words before the stop.")
    retry_timeout: float = Field(
        60.0, gt=0, description="Seconds a retry may take: every worker must acknowledge and report a step again.")

    @field_validator("recover_strategy", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            return value
        names = [str(v).strip().lower() for v in items if str(v).strip()]
        unknown = [n for n in names if n not in STRATEGIES]
        if unknown:
            raise ValueError(f"unknown strategy {', '.join(unknown)}; expected a comma-combination of "
                             f"{', '.join(STRATEGIES)} (seed 004)")
        return [s for s in STRATEGIES if s in names]

    @field_validator("dump_signal")
    @classmethod
    def _signal(cls, value: str) -> str:
        signal_number(value)
        return value.strip().upper()

    @property
    def enabled(self) -> bool:
        """True when a strategy is configured."""
        return bool(self.recover_strategy)

    def has(self, strategy: str) -> bool:
        """Whether ``strategy`` is among the configured ones."""
        return strategy in self.recover_strategy


def signal_number(name: str | int) -> int:
    """``SIGUSR1`` / ``USR1`` / ``10`` -> the signal number. Raises ValueError for anything else."""
    text = str(name).strip().upper()
    if text.isdigit():
        return int(signal.Signals(int(text)))
    try:
        return int(signal.Signals[text if text.startswith("SIG") else "SIG" + text])
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def policy_overrides(mc: MindClusterConfig) -> dict[str, Any]:
    """The policy fields the section sets: ``enable_job_restart`` (whether a recovering strategy is
    given; only with a strategy) and ``max_num_of_job_restart`` (``max_restarts``, also alone)."""
    out: dict[str, Any] = {}
    if mc.enabled:
        out["enable_job_restart"] = bool(RECOVERING & set(mc.recover_strategy))
    if mc.max_restarts is not None:
        out["max_num_of_job_restart"] = mc.max_restarts
    return out
