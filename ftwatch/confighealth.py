"""The ``health`` section of the config: Bootcheck / Troubleshooting, node check, stragglers (SPEC H1-H3).

Kept apart from ``ftwatch.config`` for size and merges; ``Config.health`` holds a ``HealthConfig``.
Sources: seed 001 (the fault-tolerance log: Bootcheck at every start and restart, Troubleshooting
after every failure; hardware errors block, slow nodes do not) and seed 003 (DLRover's node check:
GEMM plus allgather, pairs, fastest with slowest, a straggler is slower than 2x the median).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid")

#: Built-in step-line patterns (Python regexes; group ``step``, and where the trainer prints it,
#: the step's duration as ``ms``, ``s``, ``its`` (iterations per second) or ``sit`` (seconds per it)).
STEP_PATTERNS: dict[str, str] = {
    # Megatron-LM: " iteration       10/     100 | ... | elapsed time per iteration (ms): 1234.5 | ..."
    "megatron": r"iteration\s+(?P<step>\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): (?P<ms>[0-9.]+)",
    # DeepSpeed engine: "[Rank 0] step=10, skipped=0, lr=[...], mom=[...]"
    "deepspeed": r"\bstep=(?P<step>\d+), skipped=\d+",
    # tqdm bars of the HF Trainer and Lightning: " 10/100 [00:05<00:45,  2.00it/s" or "1.52s/it"
    "tqdm_its": r"\b(?P<step>\d+)/\d+ \[[0-9:]+<[0-9:?]+, +(?P<its>[0-9.]+)it/s",
    "tqdm_sit": r"\b(?P<step>\d+)/\d+ \[[0-9:]+<[0-9:?]+, +(?P<sit>[0-9.]+)s/it",
    # plain trainers: "step 12/30 loss 0.43", "Step: 12", "global_step=12"
    "plain": r"\b[Ss]tep[ :=]+(?P<step>\d+)\b",
}
_DURATION_GROUPS = ("ms", "s", "its", "sit")


class StragglerConfig(BaseModel):
    """Runtime straggler detection from step lines (H3): no change to the training code."""

    model_config = _STRICT
    enabled: bool = Field(True, description="Read per-rank step times from step lines.")
    patterns: list[str] = Field(
        default_factory=lambda: ["megatron", "deepspeed", "tqdm_its", "tqdm_sit", "plain"],
        description="Built-in names (megatron, deepspeed, tqdm_its, tqdm_sit, plain) or Python regexes with a "
        "`step` group and/or a duration group `ms`, `s`, `its` or `sit`; the first that hits a line wins.")
    min_steps: int = Field(10, ge=3, description="Step times a rank needs before it can be called a straggler.")
    window: int = Field(50, ge=3, description="The last N step times per rank that the statistics use.")
    factor: float = Field(1.5, gt=1.0, description="A rank whose median step time exceeds the other ranks' "
                          "median by this factor (and by 3 scaled MADs where there are 3+ ranks) is a straggler.")

    @field_validator("patterns")
    @classmethod
    def _known_or_regex(cls, value: list[str]) -> list[str]:
        for item in value:
            if item in STEP_PATTERNS:
                continue
            try:
                rx = re.compile(item)
            except re.error as exc:
                raise ValueError(f"{item!r} is neither a built-in pattern ({', '.join(STEP_PATTERNS)}) "
                                 f"nor a valid regex: {exc}") from None
            if "step" not in rx.groupindex and not set(_DURATION_GROUPS) & set(rx.groupindex):
                raise ValueError(f"{item!r}: a step pattern needs a (?P<step>...) group or a duration group "
                                 f"({', '.join(_DURATION_GROUPS)})")
        return value


class NodeCheckConfig(BaseModel):
    """The node check (H2, DLRover's ``--network-check``, seed 003)."""

    model_config = _STRICT
    gemm_size: int = Field(512, ge=0, description="Matrix side of the timed matrix multiply (0: none).")
    gemm_iters: int = Field(8, ge=1, description="Matrix multiplies per check.")
    allreduce_bytes: int = Field(1 << 20, gt=0, description="Bytes all-reduced per check.")
    straggler_factor: float = Field(2.0, gt=1.0, description="A node slower than this times the median is a "
                                    "straggler (DLRover's 2x, seed 003).")
    timeout: float = Field(60.0, gt=0, description="Seconds a pair may take before it counts as failed.")
    min_nodes: int | None = Field(None, ge=1, description="`ftwatch run --network-check`: the fewest healthy "
                                  "worker slots the job may start with; null: the MIN of "
                                  "supervisor.nproc_per_node (all slots for a plain N).")


class HealthConfig(BaseModel):
    """Health checks: Bootcheck, Troubleshooting, node check, stragglers (SPEC H1-H3)."""

    model_config = _STRICT
    bootcheck: bool = Field(True, description="Run a Bootcheck before every start and restart (seed 001).")
    troubleshooting: bool = Field(True, description="Run a Troubleshooting pass after every failure (seed 001).")
    paths: list[Path] = Field(default_factory=list,
                              description="Folders whose disks are tested (read/write); each must exist (a missing "
                              "mount fails the check and blocks the start; never created); empty: the state_dir.")
    disk_test_bytes: int = Field(16 << 20, ge=4096, description="Bytes written, fsynced and read back per path.")
    disk_min_mb_s: float = Field(50.0, ge=0, description="A write slower than this (MB/s) warns: a slow "
                                 "disk does not block (seed 001). 50: under a tenth of the healthy writes in seed "
                                 "001's log (630-726 MB/s) and below one spinning disk's sequential write.")
    allreduce_check: bool = Field(True, description="All-reduce across the job's worker slots, with a bus "
                                  "bandwidth figure (gloo on CPU, NCCL on GPUs); needs torch.")
    allreduce_bytes: int = Field(4 << 20, gt=0, description="Bytes per all-reduce of the bandwidth figure.")
    min_busbw_gbs: float = Field(0.0, ge=0, description="Bus bandwidth (GB/s) below which the check warns; 0: never.")
    check_timeout: float = Field(60.0, gt=0, description="Seconds the all-reduce check may take.")
    python: str | None = Field(None, description="Interpreter of the torch checks; null: ftwatch's own.")
    network_check: bool = Field(False, description="`ftwatch run`: a node check over the worker slots before "
                                "the first start (DLRover --network-check).")
    exclude_straggler: bool = Field(False, description="A straggler found by the node check exits and is "
                                    "excluded (DLRover --exclude-straggler).")
    nodecheck: NodeCheckConfig = Field(default_factory=NodeCheckConfig, description="Node check.")
    straggler: StragglerConfig = Field(default_factory=StragglerConfig, description="Runtime stragglers.")
