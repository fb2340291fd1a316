"""The ``phases`` section: phases of a run told from its log lines, each with its own job-hang
interval (SPEC R6, issue 13 item 4). ``ftwatch.pipeline.sources.phases`` applies it.

A long initialisation (loading shards, building datasets), an evaluation or a checkpoint save
prints nothing for minutes; with one ``job_hang_interval`` for the whole run, that interval is
either huge (a real hang waits) or a false hang restart. With ``phases.enabled``, the first
output of a run is ``initialization`` until the first step line; a line matching a phase's
pattern starts that phase, a step line starts ``training`` (the policy's ``job_hang_interval``).
The defaults match PyTorch, Hugging Face Trainer, Megatron-LM, DeepSpeed and Lightning lines.

Startup (issue 17 item 5): the silence between the workers' start and their first output
(imports, rendezvous) is ``initialization`` too, judged with its interval, not the training one:
in ``run``, which sees the workers start, even with ``enabled`` false (``startup``). ``watch`` and
``replay`` meet a job by its first line, so no silence before it is judged there; with
``enabled`` the job is in ``initialization`` from that line until its first step line.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid")

DEFAULT_PATTERNS: dict[str, list[str]] = {
    "initialization": [
        r"Initializing distributed", r"initializing torch distributed", r"> initializing model parallel",
        r"> building \S+ model", r"Loading checkpoint shards", r"\[comm\.py:\d+:init_distributed\]",
        r"LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES",
    ],
    "data_loading": [
        r"> building train, validation, and test datasets", r"> building indices", r"Loading dataset",
        r"Generating (?:train|validation|test) split", r"Building dataset", r"Tokenizing",
    ],
    "evaluation": [
        r"\*\*\*\*\* Running Evaluation \*\*\*\*\*", r"\*\*\*\*\* Running Prediction \*\*\*\*\*",
        r"\bValidation DataLoader \d+", r"^\s*Validation:", r"\bevaluating\b", r"Running evaluation",
    ],
    "checkpoint_save": [
        r"Saving model checkpoint to", r"saving checkpoint at iteration", r"is about to be saved",
        r"Saving checkpoint", r"Saving latest checkpoint",
    ],
    "checkpoint_load": [
        r"loading checkpoint from", r"Loading checkpoint", r"Loading model from", r"Resuming from checkpoint",
    ],
}

DEFAULT_INTERVALS: dict[str, float] = {phase: 3600.0 for phase in DEFAULT_PATTERNS}

DEFAULT_STEP_PATTERNS: list[str] = [
    r"\{'loss': ", r"'train_runtime'",                       # Hugging Face Trainer
    r"\biteration\s+\d+/\s*\d+ \|",                          # Megatron-LM
    r"\bstep[=:]\s*\d+.*\bloss",                             # DeepSpeed, plain PyTorch loops
    r"\bEpoch \d+:\s+\d+%",                                  # Lightning's progress bar
    r"\bstep \d+\b.*\bloss\b",
]


class PhasesConfig(BaseModel):
    """Phase detection from log lines (module doc)."""

    model_config = _STRICT
    enabled: bool = Field(False, description="Tell phases from log lines and use their hang intervals.")
    startup: bool = Field(True, description="run: the silence from the workers' start to their first output is "
                          "judged with the initialization interval, even when enabled is false.")
    intervals: dict[str, float] = Field(
        default_factory=dict,
        description="phase -> job-hang interval in seconds (-1: no hang detection in it), over the "
                    "defaults (3600 for each phase, or policy.job_hang_interval when longer); "
                    "training uses policy.job_hang_interval.")
    patterns: dict[str, list[str]] = Field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_PATTERNS.items()},
                                           description="phase -> regexes of the lines that start it.")
    step_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_STEP_PATTERNS),
                                     description="Regexes of step lines: they start (or resume) training.")
