"""Reads what a line says about a job's silence: a watcher's report of it, a scheduler's stamp after it.

The replay's hang scan (``ftwatch.pipeline.replay_hang``) measures silences between timestamped
lines. Two kinds of line tell it more than their own stamp:

* A **silence report**: a watcher outside the job states how long the job wrote nothing, e.g.
  CircleCI's ``Too long with no output (exceeded 10m0s): context deadline exceeded`` and Travis
  CI's ``No output has been received in the last 10m0s, this potentially indicates a stalled
  build`` (both documented in those services' troubleshooting pages), or a site's job watcher,
  ``job X produced no output on any worker for 2h11m; terminating``. The duration is read; the
  scan then knows that no instance wrote in the span before the report's stamp, even where the
  lines before it carry no stamp of their own.
* A **scheduler's cancel line**: Slurm's slurmstepd writes ``*** JOB 123 ON node CANCELLED AT
  2026-03-23T18:40:07 DUE TO TIME LIMIT ***`` (``STEP 123.0`` for a step; ``DUE TO PREEMPTION``,
  ``NODE FAILURE``, ``JOB REQUEUE``, or nothing for an ``scancel``), and srun its own ``*** STEP
  %u.%u CANCELLED AT %s DUE TO TIME LIMIT ***`` (Slurm ``src/slurmd/slurmstepd/req.c``
  ``_handle_signal_container``, ``src/srun`` ``_timeout_handler``; the time is
  ``slurm_make_time_str``'s, ISO ``%Y-%m-%dT%H:%M:%S`` by default). Its stamp stands mid-line,
  after the ``slurmstepd: error:`` head; ``fields.parse_timestamp`` reads it there
  (``fields.cancel_stamp``, re-exported here), so the engine's line clock and the hang scan both
  date the line by it.

* A **request line**: a web server's access log writes one line per request it answered, with the
  request line quoted and the status after it (the Common Log Format's ``"%r" %>s``, as Apache and
  nginx write it; uvicorn's access formatter, under vLLM, SGLang and FastAPI servers:
  ``INFO:     10.0.0.7:40552 - "GET /health HTTP/1.1" 200 OK``). Such a line carries no stamp of
  its own, and it is no continuation of the stamped line before it: each answer is an event at its
  own time, so the hang scan reads it as it reads a progress line (:data:`REQUEST_LINE`).

Neither function raises; unknown text gives None.
"""

from __future__ import annotations

import re

from ftwatch.parsers.fields import cancel_stamp

__all__ = ["REQUEST_LINE", "reported_silence", "cancel_stamp", "duration_seconds"]

_UNITS = {"h": 3600.0, "hour": 3600.0, "hours": 3600.0, "hr": 3600.0, "hrs": 3600.0,
          "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
          "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0}
# Go's time.Duration.String() ("10m0s", "2h11m0s"), its short forms ("2h11m", "5h02m"), and words
# ("30 minutes", "2 hours"): one or more number-unit parts
_PART = r"\d+(?:\.\d+)? ?(?:hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)(?![a-z])"
_DURATION = r"(" + _PART + r"(?: ?" + _PART + r")*)"
_PARTS = re.compile(r"(\d+(?:\.\d+)?) ?([a-z]+)")
# "no (log) output ... for|in the last <duration>", "with no output (exceeded <duration>)"
_REPORT = re.compile(
    r"\bno (?:log |new )?output\b[^\n]{0,80}?\b(?:for|in the last|since) " + _DURATION
    + r"|\bwith no output \(exceeded " + _DURATION + r"\)",
    re.IGNORECASE)

#: A request an access log line records (see the module docstring), on bytes: the quoted request line
#: (method, target, protocol) and the three-digit status after it.
REQUEST_LINE = rb'"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) \S+ HTTP/\d(?:\.\d)?" \d{3}\b'


def duration_seconds(text: str) -> float | None:
    """``"2h11m"`` -> 7860.0, ``"10m0s"`` -> 600.0, ``"30 minutes"`` -> 1800.0; None if no part reads."""
    total, seen = 0.0, False
    for number, unit in _PARTS.findall(text.lower()):
        scale = _UNITS.get(unit)
        if scale is None:
            return None
        total += float(number) * scale
        seen = True
    return total if seen else None


def reported_silence(text: str) -> float | None:
    """The silence, in seconds, that a watcher's report on this line states; None if it states none.

    Args:
        text: a cleaned line.

    Returns:
        Seconds (> 0) of the stated silence, or None.
    """
    m = _REPORT.search(text)
    if m is None:
        return None
    seconds = duration_seconds(m.group(1) or m.group(2))
    return seconds if seconds else None
