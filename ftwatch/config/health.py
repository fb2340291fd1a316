"""The ``health`` section of the config: Bootcheck / Troubleshooting, node check, stragglers (SPEC H1-H3).

Kept apart from ``ftwatch.config.model`` for size and merges; ``Config.health`` holds a ``HealthConfig``.
Sources: seed 001 (the fault-tolerance log: Bootcheck at every start and restart, Troubleshooting
after every failure; hardware errors block, slow nodes do not) and seed 003 (DLRover's node check:
GEMM plus allgather, pairs, fastest with slowest, a straggler is slower than 2x the median).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_STRICT = ConfigDict(extra="forbid")

#: Built-in step-line patterns (Python regexes; group ``step``, and where the trainer prints it,
#: the step's duration as ``ms``, ``s``, ``its`` (iterations per second) or ``sit`` (seconds per it);
#: ``total``: a progress bar's length). The tap (``ftwatch.rules.stragglers``) also vetoes some hits
#: in Python (a progress bar with another description, a checkpoint or scheduler "step").
STEP_PATTERNS: dict[str, str] = {
    # Megatron-LM, megatron/training/training.py training_log(), printed by print_rank_last (the last
    # rank only): " [2026-...] iteration       10/     100 | ... | elapsed time per iteration (ms): 1234.5 | ..."
    "megatron": r"iteration\s+(?P<step>\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): (?P<ms>[0-9.]+)",
    # Megatron-LM --log-straggler: megatron/core/utils.py StragglerDetector.report() (README_STRAGGLER.md),
    # rank 0 logs the min / max round-trip time of all ranks with their ranks every log_interval:
    # "[2024-03-14 23:07:56] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | MnPwr/Rnk: ..."
    "megatron_straggler": r"MnRtt/Rnk: (?P<min_ms>[0-9.]+)ms/(?P<min_rank>\d+) \| "
                          r"MxRtt/Rnk: (?P<max_ms>[0-9.]+)ms/(?P<max_rank>\d+)",
    # DeepSpeed, deepspeed/runtime/engine.py _report_progress(), log_dist(ranks=[0]) every
    # steps_per_print steps: "[Rank 0] step=10, skipped=0, lr=[...], mom=[...]"
    "deepspeed": r"\bstep=(?P<step>\d+), skipped=\d+",
    # tqdm bars (tqdm/std.py format_meter: "{desc}: {percentage}%|{bar}| {n}/{total} [{elapsed}<{remaining},
    # {rate}]"), written as "\r" + bar: the HF Trainer's training bar (transformers trainer_callback.py
    # ProgressCallback, no description, world process zero) " 45%|####5     | 45/100 [00:10<00:12,  4.50it/s]"
    # and Lightning's TQDMProgressBar (lightning/pytorch/callbacks/progress/tqdm_progress.py) on global
    # rank 0, "Epoch 0:  45%|...| 45/100 [00:10<00:12,  4.50it/s,
    # v_num=0]". Bars with another description (Validation, Sanity Checking, Loading checkpoint shards...)
    # are vetoed by the tap, and so are bars of another length than the rank's first (HF's evaluation bar).
    "tqdm_its": r"\d+%\|[^|\n]*\| *(?P<step>\d+)/(?P<total>\d+) \[[0-9:]+<[0-9:?]+, +(?P<its>[0-9.]+)it/s",
    "tqdm_sit": r"\d+%\|[^|\n]*\| *(?P<step>\d+)/(?P<total>\d+) \[[0-9:]+<[0-9:?]+, +(?P<sit>[0-9.]+)s/it",
    # Lightning's RichProgressBar (lightning/pytorch/callbacks/progress/rich_progress.py: description
    # "Epoch N" or "Epoch N/M", BatchesProcessedColumn "45/100", CustomTimeColumn "0:00:10 • 0:00:12",
    # ProcessingSpeedColumn "4.50it/s"): "Epoch 0/9  ━━━━━━━━━━━━━━━ 45/100 0:00:10 • 0:00:12 4.50it/s v_num: 0"
    "lightning_rich": r"\bEpoch \d+(?:/\d+)? [^\n]*? (?P<step>\d+)/(?P<total>\d+|--) [-0-9:]+ \S+ [-0-9:]+ "
                      r"(?P<its>[0-9.]+)it/s",
    # plain trainers: "step 12/30 loss 0.43", "Step: 12", "global_step=12" (DeepSpeed's throughput line
    # "epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=..."); the tap vetoes lines about a
    # checkpoint, the learning-rate scheduler, evaluation or warm-up ("Saving checkpoint at step 100").
    "plain": r"(?:\bglobal_|\b)[Ss]tep\s*[:=]?\s*(?P<step>\d+)\b",
}
DEFAULT_STEP_PATTERNS = ["megatron", "megatron_straggler", "deepspeed", "tqdm_its", "tqdm_sit", "lightning_rich",
                         "plain"]
_DURATION_GROUPS = ("ms", "s", "its", "sit")


class StragglerConfig(BaseModel):
    """Runtime straggler detection from step lines (H3): no change to the training code."""

    model_config = _STRICT
    enabled: bool = Field(True, description="Read per-rank step times from step lines.")
    patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STEP_PATTERNS),
        description="Built-in names (megatron, megatron_straggler, deepspeed, tqdm_its, tqdm_sit, lightning_rich, "
        "plain) or Python regexes with a `step` group and/or a duration group `ms`, `s`, `its` or `sit`; the "
        "first that hits a line wins. Custom regexes must also compile in the engine's matcher (hyperscan/RE2: "
        "no lookaround, no backreferences); `ftwatch check` says so.")
    min_steps: int = Field(10, ge=3, description="Step times a rank needs before it can be called a straggler "
                           "(and the length of the baseline and recent windows of the single-stream slowdown).")
    window: int = Field(50, ge=3, description="The last N step times per rank that the statistics use.")
    factor: float = Field(1.5, gt=1.0, description="A rank whose median step time exceeds the other ranks' "
                          "median by this factor (and by 3 scaled MADs of the other ranks where there are 3+ "
                          "ranks) is a straggler; it may be reported again once it fell below half way back "
                          "(1 + (factor - 1) / 2) and slowed again.")
    slowdown_factor: float = Field(2.0, gt=1.0, description="Where only one rank prints step times (Megatron, "
                                   "DeepSpeed, HF Trainer, Lightning log on one rank): a `slowdown` finding when "
                                   "its median over the last min_steps step times is this times its baseline "
                                   "(the median of its first min_steps).")
    detector_reports: int = Field(3, ge=1, description="Megatron --log-straggler: consecutive reports whose max/min "
                                  "round-trip time exceeds `factor` with the same slowest rank before that rank "
                                  "is a straggler.")
    forget_after: float = Field(3600.0, gt=0, description="Seconds after which the step state of a job that printed "
                                "no step line is dropped (`ftwatch watch` sees many jobs come and go).")

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
    gpu_in_use: Literal["fail", "warn", "off"] = Field(
        "fail", description="A live process other than ftwatch's own workers on one of the job's GPUs at a check: fail (the node "
        "blocks: hardware_node, isolate_node), warn (notify only: GPUs shared on purpose) or off. "
        "Source: facebookresearch/gcm's running_procs health check (a real process is CRITICAL).")
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
