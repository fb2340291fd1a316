"""torchelastic's failure summary (P3): which rank failed, with what exit code or signal.

torchrun prints it when a worker group fails (``torch/distributed/elastic/multiprocessing/errors``)::

    Failures:
    [1]:
      time      : 2026-11-21_09:36:04
      host      : node-a
      rank      : 2 (local_rank: 2)
      exitcode  : -15 (pid: 4121)
      ...
    Root Cause (first observed failure):
    [0]:
      time      : 2026-11-21_09:36:03
      host      : node-a
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 4120)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 4120

``ftwatch replay`` takes the job's exit codes from it: the summary only restates
failures (its own lines are fallout), but its exit codes are facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from ftwatch.parsers.fields import split_rank_prefix

_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)$")
_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_RANK = re.compile(r"^(\d+)")
_EXIT = re.compile(r"^(-?\d+)")
_ROOT = "Root Cause (first observed failure)"


@dataclass(frozen=True, slots=True)
class SummaryFailure:
    """One failure listed in the summary.

    Attributes:
        rank: global rank.
        exitcode: the process's exit code; negative means killed by signal ``-exitcode``.
        host: the node it ran on.
        time: epoch seconds (the summary's local time read as UTC), or None.
        root_cause: True for the "Root Cause (first observed failure)" entry.
    """

    rank: int
    exitcode: int
    host: str
    time: float | None
    root_cause: bool


def parse_summary(lines: Iterable[str]) -> list[SummaryFailure]:
    """Every failure entry of every torchelastic summary in ``lines`` (cleaned text lines).

    Lines that are not part of a summary are skipped; a partial entry without rank or
    exitcode is dropped. A launcher's label before a line (``srun --label``'s ``0: ``, a
    ``[default0]:`` prefix) is removed first. Never raises on odd input.
    """
    out: list[SummaryFailure] = []
    in_summary = root = False
    entry: dict[str, str] | None = None

    def close() -> None:
        if entry and "rank" in entry and "exitcode" in entry:
            rank = _RANK.match(entry["rank"])
            code = _EXIT.match(entry["exitcode"])
            if rank and code:
                out.append(SummaryFailure(int(rank.group(1)), int(code.group(1)),
                                          entry.get("host", ""), _time(entry.get("time", "")), root))

    for line in lines:
        if not in_summary and "Failures:" not in line and _ROOT not in line:
            continue                                # the bulk of a log: one substring test
        line = split_rank_prefix(line)[1]
        text = line.strip()
        if text.startswith("Failures:") or text.startswith(_ROOT):
            close()
            entry = None
            in_summary = True
            root = text.startswith("Root Cause")
            continue
        if not in_summary:
            continue
        if _ENTRY.match(text):
            close()
            entry = {}
            continue
        field = _FIELD.match(line)
        if field and entry is not None:
            entry[field.group(1)] = field.group(2).strip()
        elif text.startswith("====="):
            close()
            entry = None
            in_summary = False
    close()
    return out


def _time(text: str) -> float | None:
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d_%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


CLEAN_FINISH = b"worker group successfully finished"
"""What a torchelastic agent logs (INFO, ``LOGLEVEL=INFO``) once every worker of its group
exited 0: ``[default] worker group successfully finished. Waiting 300 seconds for other agents
to finish.`` (``torch/distributed/elastic/agent/server/api.py``, ``SimpleElasticAgent._invoke_run``;
torch 2.x)."""


def finished_cleanly(data: bytes) -> bool:
    """True when a chunk of a launcher's output says its worker group finished successfully
    (:data:`CLEAN_FINISH`); the only sign of a clean end that shipped logs carry."""
    return CLEAN_FINISH in data
