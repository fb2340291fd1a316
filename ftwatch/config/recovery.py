"""Config of the recovery policies beyond AIMaster's flags (issue 4): ModelArts annotations (SPEC M2,
D4), NPU escalation (R3) and node blame.

Kept apart from ``ftwatch.config.model`` for size and easy merges: ``Config.modelarts`` holds a
``ModelArtsConfig``, ``Config.recovery`` a ``RecoveryConfig``. The C4D knobs are AIMaster flags
(``--c4d-log-level``, ``--c4d-common-envs``) and so live in ``policy``; ``parse_c4d_envs`` reads
the latter.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

_MODELARTS = "ModelArts 训练作业故障恢复 (seeds/002)"

#: The ModelArts annotations, verbatim (seed 002, "API接口设置").
JOB_RETRY_NUM = "fault-tolerance/job-retry-num"
UNCONDITIONAL_RETRY = "fault-tolerance/job-unconditional-retry"
HANG_RETRY = "fault-tolerance/hang-retry"
POD_RETRY_NUM = "fault-tolerance/pod-retry-num"


class ModelArtsAnnotations(BaseModel):
    """The ``metadata.annotations`` of a ModelArts training job, keys verbatim; values may be
    strings as in the API (``"8"``, ``"true"``). Source: seeds/002, API接口设置."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    job_retry_num: int | None = Field(
        None, alias=JOB_RETRY_NUM, ge=1, le=128,
        description="Automatic restart, 1-128 restarts: in-place recovery and isolating job reschedule; "
        "null: ModelArts recovery off.")
    job_unconditional_retry: bool = Field(
        False, alias=UNCONDITIONAL_RETRY,
        description="Unconditional job reschedule on any non-zero exit (needs job-retry-num).")
    hang_retry: bool = Field(
        False, alias=HANG_RETRY, description="Hang restart in the same containers, costs no restart (needs job-retry-num).")
    pod_retry_num: int | None = Field(
        None, alias=POD_RETRY_NUM, ge=1, le=128,
        description="Pod reschedule: recreate only the failed pods, this many times (needs job-retry-num).")

    @model_validator(mode="after")
    def _needs_retry_num(self) -> "ModelArtsAnnotations":
        others = [k for k, on in ((UNCONDITIONAL_RETRY, self.job_unconditional_retry), (HANG_RETRY, self.hang_retry),
                                  (POD_RETRY_NUM, self.pod_retry_num is not None)) if on]
        if others and self.job_retry_num is None:
            raise ValueError(f"{', '.join(others)} needs {JOB_RETRY_NUM} (seeds/002: each strategy is "
                             f"enabled by setting {JOB_RETRY_NUM} first)")
        return self


class ModelArtsConfig(BaseModel):
    """ModelArts recovery strategies and degrade rules (SPEC D4, seeds/002); on when
    ``annotations`` sets ``fault-tolerance/job-retry-num``, and then it replaces the AIMaster
    decision (``policy``) for the job."""

    model_config = ConfigDict(extra="forbid")
    annotations: ModelArtsAnnotations = Field(default_factory=ModelArtsAnnotations,
                                              description="ModelArts annotations.")
    hang_restarts_in_a_row: int = Field(
        3, ge=1, description="Hang restarts in a row allowed; the next hang in a row fails the job (降级策略).")
    unconditional_in_a_row: int = Field(
        3, ge=1, description="Unconditional reschedules in a row with no node or chip fault; the next "
        "one fails the job as a user-code problem.")
    same_fault_times: int = Field(
        3, ge=1, description="The same node, chip and fault code this often within same_fault_window → "
        "isolate (user-input codes: reschedule only).")
    same_fault_window: float = Field(86400.0, gt=0, description="Seconds of the same-fault window (24 h).")

    @property
    def enabled(self) -> bool:
        """True when ``fault-tolerance/job-retry-num`` is set."""
        return self.annotations.job_retry_num is not None


class BlameConfig(BaseModel):
    """Node blame across attempts and jobs: a node that keeps being the root cause is isolated."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(False, description="Blame nodes for root causes and isolate repeat offenders (off: vendor behaviour).")
    threshold: int = Field(3, ge=2, description="Root causes on one node within window that isolate it.")
    window: float = Field(86400.0, gt=0, description="Seconds a root cause counts against its node (decay).")
    cooldown: float = Field(
        86400.0, ge=0, description="Seconds after a blame isolation in which the node's count restarts from "
        "zero and it is not isolated again.")


class RecoveryConfig(BaseModel):
    """NPU fault escalation (SPEC R3) and node blame (issue 4)."""

    model_config = ConfigDict(extra="forbid")
    escalation: bool = Field(
        True, description="MindCluster frequency/duration rules: repeated chip faults isolate the node.")
    blame: BlameConfig = Field(default_factory=BlameConfig, description="Node blame.")


#: C4D environment variables (seeds/000, C4D配置说明) -> (default, meaning).
C4D_ENV_DEFAULTS: dict[str, int] = {"C4D_HANG_TIMEOUT": 10_000_000, "C4D_HANG_TIMES": 18}


def parse_c4d_envs(text: str) -> dict[str, str]:
    """Read ``--c4d-common-envs`` (``k1=v1,k2=v2``; seeds/000, C4D配置说明).

    ``C4D_HANG_TIMEOUT`` (microseconds) and ``C4D_HANG_TIMES`` must be positive integers; other
    keys (``C4D_CONN_BW_CHECK_PERIOD``, ``C4D_RUNTIME_LOG_LEVEL``, ``C4D_ENABLE_STATS_OUTPUT``) are
    kept as given.

    Raises:
        ValueError: an item without ``=`` or a bad number.
    """
    out: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{item!r} is not KEY=VALUE")
        key, value = key.strip(), value.strip()
        if key in C4D_ENV_DEFAULTS and not (value.isdigit() and int(value) > 0):
            raise ValueError(f"{key}={value}: expected a positive integer")
        out[key] = value
    return out


def c4d_settings(common_envs: str) -> tuple[float, int]:
    """(hang timeout in seconds, hang times) from ``--c4d-common-envs``, defaults 10 s and 18."""
    envs: dict[str, Any] = {**C4D_ENV_DEFAULTS, **parse_c4d_envs(common_envs)}
    return int(envs["C4D_HANG_TIMEOUT"]) / 1e6, int(envs["C4D_HANG_TIMES"])
