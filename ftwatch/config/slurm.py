"""The ``slurm`` section: the Slurm actuator (issue 14 item 3, README "Slurm").

Used by ``ftwatch run --actuator slurm`` (``supervisor.actuator: slurm``: ``ftwatch run`` inside an
sbatch script, the job id from ``SLURM_JOB_ID``) and by ``ftwatch watch`` with
``watch.actuator.type: slurm`` (the job id is the decision's job, named by ``watch.identity``).
Kept apart from ``ftwatch.config.model`` for size; ``Config.slurm`` holds a ``SlurmConfig``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ftwatch.config.kubernetes import BreakerConfig

_STRICT = ConfigDict(extra="forbid")


class SlurmConfig(BaseModel):
    """What each decision does through Slurm's commands (``scontrol``, ``scancel``, ``sinfo``)."""

    model_config = _STRICT
    job_id: str | None = Field(None, description="The Slurm job id to act on; None: $SLURM_JOB_ID "
                               "under `ftwatch run`, the decision's job under `ftwatch watch`.")
    restart: Literal["requeue", "local"] = Field(
        "requeue", description="restart_job under `ftwatch run`: requeue the job (scontrol requeue; "
        "Slurm starts it again, possibly elsewhere) or restart the workers in the allocation (local).")
    fail: Literal["cancel", "hold"] = Field(
        "cancel", description="fail_job: scancel the job, or requeue it held (scontrol requeuehold: "
        "pending with priority 0 until `scontrol release`).")
    reason_prefix: str = Field("ftwatch", min_length=1, description="First word of a drain reason "
                               "(`<prefix> <decision id>: <rule>: <line>`); also how ftwatch's drains "
                               "are told apart from others.")
    breaker: BreakerConfig = Field(default_factory=BreakerConfig, description="Isolation circuit breaker "
                                   "(the Kubernetes actuator's).")
    dry_run: bool = Field(False, description="Log, store and alert every command the actuator would run, "
                          "run none (sinfo, a read, is run).")
    retries: int = Field(3, ge=0, description="Retries of a command that failed (not of one Slurm refused "
                         "for good: invalid job id, permission denied).")
    backoff: float = Field(1.0, gt=0, description="Seconds before the first retry, doubled each time.")
    timeout: float = Field(30.0, gt=0, description="Seconds one command may take.")
    scontrol: str = Field("scontrol", description="The scontrol command (a name on PATH or a path).")
    scancel: str = Field("scancel", description="The scancel command.")
    sinfo: str = Field("sinfo", description="The sinfo command (node count and drains, for the breaker).")
