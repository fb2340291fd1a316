"""The fault-tolerance policy section (AIMaster's flags as config, SPEC M1) and the AIMaster
flag dialect: ``parse_aimaster_flags`` reads the PAI-DLC AIMaster flags verbatim (seed ``000``,
"全量参数说明") into ``policy`` fields. ``ftwatch.config.model`` re-exports all three names.
"""

from __future__ import annotations

import shlex
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ftwatch.config.recovery import parse_c4d_envs
from ftwatch.errors import ConfigError, Issue

_STRICT = ConfigDict(extra="forbid")


class PolicyConfig(BaseModel):
    """The fault-tolerance policy: the AIMaster flags in snake_case, with AIMaster's defaults.

    Source for every default and meaning: the AIMaster doc (seeds/000, 全量参数说明).
    """

    model_config = _STRICT
    job_execution_mode: Literal["Sync", "Async"] = Field(
        "Sync", description="Sync: a retryable failure restarts the whole job; Async: only the failed instance.")
    enable_job_restart: bool = Field(False, description="Allow restarting the job (Sync, or a PS/Chief in Async).")
    max_num_of_job_restart: int = Field(3, ge=0, description="Restarts allowed before the job is failed.")
    enable_job_hang_detection: bool = Field(
        False, description="Restart when no instance wrote stdout/stderr for job_hang_interval (Sync only).")
    job_hang_interval: int = Field(1800, gt=0, description="Seconds of silence of every instance that is a hang.")
    enable_c4d_hang_detection: bool = Field(
        False, description="C4D slow/hang diagnosis; takes effect only with enable_job_hang_detection.")
    c4d_log_level: Literal["Info", "Warning", "Error"] = Field(
        "Warning", description="C4D records below this level are ignored (Warning: Warning and Error).")
    c4d_common_envs: str = Field(
        "", description="C4D env k1=v1,k2=v2: C4D_HANG_TIMEOUT (us, 10000000), C4D_HANG_TIMES (18) ...")
    enable_job_exit_hang_detection: bool = Field(
        False, description="Restart when one instance succeeded but the job has not ended in time (Sync only).")
    job_exit_hang_interval: int = Field(600, gt=0, description="Seconds after the first successful exit.")
    fault_tolerant_policy: Literal["OnFailure", "ExitCodeAndErrorMsg", "Never"] = Field(
        "ExitCodeAndErrorMsg", description="OnFailure: restart on any failure; ExitCodeAndErrorMsg: only "
        "when exit code / error message is retryable; Never: fail at once.")
    max_num_of_same_error: int = Field(
        10, ge=0, description="The job fails when one error occurs on one instance more often than this.")
    max_tolerated_failure_rate: float = Field(
        -1.0, description="The job fails when more than this fraction (0..1) of instances failed; -1: off.")

    @field_validator("job_execution_mode", "fault_tolerant_policy", "c4d_log_level", mode="before")
    @classmethod
    def _canonical_case(cls, value: Any, info: Any) -> Any:
        choices = {"job_execution_mode": ("Sync", "Async"), "c4d_log_level": ("Info", "Warning", "Error")}.get(
            info.field_name, ("OnFailure", "ExitCodeAndErrorMsg", "Never"))
        if isinstance(value, str):
            for choice in choices:
                if value.strip().lower() == choice.lower():
                    return choice
        return value

    @field_validator("c4d_common_envs")
    @classmethod
    def _c4d_envs(cls, value: str) -> str:
        parse_c4d_envs(value)
        return value

    @field_validator("max_tolerated_failure_rate")
    @classmethod
    def _rate(cls, value: float) -> float:
        if value != -1 and not 0 <= value <= 1:
            raise ValueError("must be -1 (off) or between 0 and 1")
        return value


#: The AIMaster flags, verbatim (seed 000, 全量参数说明) -> PolicyConfig field.
AIMASTER_FLAGS: dict[str, str] = {
    "--" + name.replace("_", "-"): name for name in PolicyConfig.model_fields
}
_BOOL_WORDS = {"true": True, "1": True, "false": False, "0": False}


def parse_aimaster_flags(args: str | Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Read AIMaster flags (``ErrorMonitoringArgs``) into policy fields.

    Accepts ``--flag=value`` and ``--flag value``; booleans take ``True/False/true/false/1/0`` and a
    bare boolean flag means True. A flag given twice: the last one wins (as with argparse). A ``--``
    ends the flags: it and everything after it are returned unread (the training command).

    Args:
        args: one string (split like a shell, as DLC's ``ErrorMonitoringArgs``) or an argv list.

    Returns:
        ({policy field: validated value} for the flags given, [the arguments not recognised, in order]).

    Raises:
        ConfigError: every bad value or missing value, each Issue naming its flag (file ``<argv>``).
    """
    try:
        argv = shlex.split(args) if isinstance(args, str) else list(args)
    except ValueError as exc:  # unbalanced quotes
        raise ConfigError(Issue("<argv>", 0, f"cannot split the flags: {exc}")) from None
    raw: dict[str, Any] = {}
    flag_of: dict[str, str] = {}
    rest: list[str] = []
    issues: list[Issue] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":  # what follows belongs to the training command
            rest += argv[i - 1:]
            break
        flag, eq, value = arg.partition("=")
        field = AIMASTER_FLAGS.get(flag)
        if field is None:
            rest.append(arg)
            continue
        is_bool = PolicyConfig.model_fields[field].annotation is bool
        if not eq:
            nxt = argv[i] if i < len(argv) else None
            if is_bool:
                if nxt is not None and nxt.lower() in _BOOL_WORDS:
                    value, i = nxt, i + 1
                else:
                    value = "true"
            elif nxt is None or nxt.startswith("--"):
                issues.append(Issue("<argv>", 0, f"{flag}: needs a value"))
                continue
            else:
                value, i = nxt, i + 1
        if is_bool:
            if value.lower() not in _BOOL_WORDS:
                issues.append(Issue("<argv>", 0, f"{flag}={value}: expected True or False"))
                continue
            raw[field] = _BOOL_WORDS[value.lower()]
        else:
            raw[field] = value
        flag_of[field] = flag
    try:
        policy = PolicyConfig.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            field = str(err["loc"][0])
            msg = err["msg"].removeprefix("Value error, ")
            issues.append(Issue("<argv>", 0, f"{flag_of[field]}={raw[field]}: {msg}"))
        policy = None
    if issues:
        raise ConfigError(issues)
    assert policy is not None
    return {name: getattr(policy, name) for name in raw}, rest
