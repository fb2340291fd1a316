"""The ``supervisor`` section (the local workers of ``ftwatch run``), elastic worker counts ``N`` or
``MIN:MAX`` (torchrun's ``--nnodes=1:4`` syntax, DLRover's ``--nnodes=MIN:MAX``, seed 003), and the
device list a local job's slots map onto.

``parse_elastic_range`` serves ``supervisor.nproc_per_node`` (workers on this machine, shrinking
down to MIN when devices are isolated) and anything else that takes such a range (``nodecheck``).
Kept apart from ``ftwatch.config.model`` for size; ``Config.supervisor`` holds a ``SupervisorConfig``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


@dataclass(frozen=True, slots=True)
class ElasticRange:
    """A count between ``min`` and ``max`` (both >= 1, ``min <= max``)."""

    min: int
    max: int

    @property
    def fixed(self) -> bool:
        """True for a plain ``N`` (min == max)."""
        return self.min == self.max

    def __str__(self) -> str:
        return str(self.max) if self.fixed else f"{self.min}:{self.max}"


def parse_elastic_range(value: int | str) -> ElasticRange:
    """Parse ``3``, ``"3"`` or ``"2:3"`` into an ElasticRange.

    Args:
        value: an int >= 1, or a string ``N`` or ``MIN:MAX`` (spaces allowed around the numbers).

    Raises:
        ValueError: not a number or a range, a number < 1, or MIN > MAX (the message says which).
    """
    if isinstance(value, bool):
        raise ValueError(f"expected N or MIN:MAX, got {value!r}")
    if isinstance(value, int):
        lo = hi = value
    elif isinstance(value, str):
        parts = value.split(":")
        if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"expected N or MIN:MAX (e.g. 2:4), got {value!r}")
        lo, hi = int(parts[0]), int(parts[-1])
    else:
        raise ValueError(f"expected N or MIN:MAX, got {value!r}")
    if lo < 1:
        raise ValueError(f"the worker count must be >= 1, got {value!r}")
    if lo > hi:
        raise ValueError(f"MIN must not exceed MAX, got {value!r}")
    return ElasticRange(lo, hi)


def default_devices(count: int, env: Mapping[str, str] | None = None) -> list[str]:
    """The devices a local job's slots map onto when the config names none.

    ``CUDA_VISIBLE_DEVICES`` when it lists devices, else ``ASCEND_RT_VISIBLE_DEVICES``, else
    ``0 .. count-1`` (a CPU machine, or one whose GPUs the environment hides (:func:`hidden_devices`):
    model slots, so that an isolation is still real and visible in the workers' count).

    Args:
        count: how many devices to model without a visible-devices variable (the MAX workers).
        env: the environment to read (``os.environ`` when None).
    """
    env = os.environ if env is None else env
    hidden = hidden_devices(env)
    for name in DEVICE_ENV:
        text = env.get(name, "").strip()
        if text and name not in hidden:
            return [d.strip() for d in text.split(",") if d.strip()]
    return [str(i) for i in range(count)]


def hidden_devices(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The visible-devices variables that the environment sets so that no GPU is visible, with
    their values, which the workers must see unchanged (as torchrun passes them).

    CUDA shows a process only the devices ``CUDA_VISIBLE_DEVICES`` lists, up to the first invalid
    entry (NVIDIA CUDA C++ Programming Guide, "CUDA Environment Variables"): set but empty, or
    with ``-1`` first, it hides every GPU, the usual way to make a job run on the CPU.

    Returns:
        ``{"CUDA_VISIBLE_DEVICES": value}`` for such a value, else ``{}``.
    """
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None and (not value.strip() or value.split(",")[0].strip() == "-1"):
        return {"CUDA_VISIBLE_DEVICES": value}
    return {}


class SupervisorConfig(BaseModel):
    """The local supervisor (``ftwatch run``): how workers are launched and stopped."""

    model_config = ConfigDict(extra="forbid")
    nproc_per_node: int | str = Field(
        1, description="Workers on this machine: N, or MIN:MAX (elastic: isolating a device restarts with "
        "fewer, down to MIN).")
    grace_period: float = Field(10.0, ge=0, description="Seconds between SIGTERM and SIGKILL when stopping.")
    master_addr: str = Field("127.0.0.1", description="MASTER_ADDR given to the workers.")
    master_port: int = Field(0, ge=0, le=65535, description="MASTER_PORT; 0: pick a free port.")
    restart_delay: float = Field(1.0, ge=0, description="Seconds to wait before a restart.")
    actuator: Literal["local", "slurm"] = Field(
        "local", description="What carries out restart_job, isolate_node and fail_job: the local "
        "workers only, or Slurm (the `slurm` section; README \"Slurm\"). --actuator.")
    devices: list[str] | None = Field(
        None, description="Devices the worker slots map onto (LOCAL_RANK i -> i-th healthy one); null: "
        "CUDA_VISIBLE_DEVICES, else ASCEND_RT_VISIBLE_DEVICES, else 0..MAX-1.")
    keep_scene_seconds: float = Field(
        0.0, ge=0, description="On a final failure keep the workers this long and print how to attach (A3); 0: off.")
    settle_max: float = Field(
        1.0, ge=0, description="After a failure (Sync), at most this many seconds for the other workers' own "
        "errors before deciding; the wait ends sooner once every worker has exited or reported an error.")

    @field_validator("nproc_per_node")
    @classmethod
    def _nproc(cls, value: int | str) -> int | str:
        rng = parse_elastic_range(value)
        return rng.max if rng.fixed else str(rng)

    @property
    def nproc_range(self) -> ElasticRange:
        """``nproc_per_node`` as an elastic range (min == max for a plain N)."""
        return parse_elastic_range(self.nproc_per_node)
