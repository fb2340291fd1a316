"""The rank the others waited for was busy, not broken (SPEC R7, issue 12 item 3).

A program may run work on one rank while the others wait for it in a barrier: Hugging Face's
``main_process_first`` is built for that ("A context manager for torch distributed environment
where on needs to do something on the main process, while blocking replicas ... One such use is
for datasets's map feature which to be efficient should be run once on the main process",
transformers ``TrainingArguments.main_process_first``; accelerate's ``main_process_first`` /
``wait_for_everyone`` the same). The replicas wait under the process group's timeout; when the
main process's work outlasts it, their barrier (a store read, a collective, an NPU stream
synchronise under HCCL) times out and they die while the main process is still working.
Transformers names the cure: ``ddp_timeout``, "The timeout for torch.distributed.init_process_group
calls, used to avoid GPU socket timeouts when performing slow operations in distributed runnings"
(default 1800 s). Nothing failed: the job's own schedule asked the replicas to wait longer than
its timeout, and a restart runs the same work under the same timeout (the work was cut before
it finished, so no cache of it was saved). That is the job's configuration: user_code, fail_job.

:func:`busy_rank` reads it from the evidence, not from a case:

1. every rank that reports an error was *waiting*: its findings include a timeout (a rule of
   ``collectives.TIMEOUT_RULES`` or a line that says the wait timed out) and a wait for peers (a
   collective timeout rule, or a line or traceback frame naming a barrier, a collective or the
   store read a barrier does), and none of its findings is a fault of its own (hardware, OOM, a
   program error); exits are left aside (a waiting rank's exit says nothing more);
2. another rank, with no error of its own up to then, was in a phase of its own work
   (:data:`PHASE_RULES`, ``lifecycle.rank_phase.*`` in ``rules/packs/lifecycle.yaml``: the
   datasets map progress bar), its latest such line before the first timeout not finished
   (below 100 %), and by the bar's own account (tqdm's ``[elapsed<remaining, ...]``) that work
   both overlaps the replicas' wait (from the first timeout less the wait's timeout, given by
   ``Timeout(ms)`` or ``timed out after <ms>ms`` where a line has it, else
   :data:`DEFAULT_WAIT_SECONDS`, to the first timeout) and lasts at least that timeout: the work
   could not end before the replicas' wait did, whatever else happened (a node that died
   meanwhile would not have saved them). A replayed bar line without a time of its own carries
   the last stamped line's, so the overlap, not the line's time alone, ties it to the wait. A phase line on a stream without a rank prefix
   (``torchrun`` prefixes its workers' tracebacks, ``[rank1]:``, but not rank 0's progress bar)
   counts when the waiting ranks are named: it is not one of theirs.

Then that rank is the root cause, ``collective.busy_rank`` (user_code, fail_job). A rank that
shows no phase line is not read as busy: a silent rank stays the hang reading of
``ftwatch.policy.collectives.silent_rank``.
"""

from __future__ import annotations

import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity
from ftwatch.policy.collectives import TIMEOUT_RULES

#: Rules that say a rank is in a phase of its own work outside training (lifecycle.yaml's
#: ``lifecycle.rank_phase.*``; tests/policy/test_busy_rank.py keeps the two in step).
PHASE_RULES = frozenset({"lifecycle.rank_phase.datasets_map"})
#: The wait assumed where no line gives its timeout: torch.distributed's default process-group
#: timeout for the store and gloo (``default_pg_timeout``, 30 min) and transformers' ``ddp_timeout``.
DEFAULT_WAIT_SECONDS = 1800.0
SOURCE = ("transformers src/transformers/training_args.py TrainingArguments.main_process_first and "
          "ddp_timeout; huggingface/datasets src/datasets/arrow_dataset.py Dataset.map progress bar")
#: A line that says a wait timed out (c10d "Socket Timeout", gloo "Timed out waiting", CANN
#: "Stream synchronize timeout", the watchdog's "timed out").
_TIMEOUT = re.compile(r"(?i)\btim(?:e|ed)[ _-]?out\b|timeout\b")
#: A wait for peers, on the error line or a frame of its traceback: a barrier (torch's, a
#: framework's ``main_process_first`` / ``wait_for_everyone``), a collective, the store read
#: that a barrier or a communicator's set-up does.
_WAIT_CALL = re.compile(r"\bbarrier\(|main_process_first|wait_for_everyone|\ball_?reduce\b|\bbroadcast\("
                        r"|store->get|key-value store")
#: A progress bar's percentage, counts, elapsed and remaining time (tqdm:
#: ``37%|███▋      | 851000/2300000 [21:05<35:52, 673.1 examples/s]``; ``?`` while unknown).
_BAR = re.compile(r"(\d+)%\|[^|]*\| *(\d+)/(\d+) \[([0-9:]+)<([0-9:]+|\?)")
#: A wait's timeout spelled out on its line (c10d's socket: ``timed out after 1800000ms``).
_AFTER_MS = re.compile(r"timed out after (\d+) ?ms")
_OWN_FAULTS = frozenset({FailureClass.HARDWARE_NODE, FailureClass.OOM, FailureClass.USER_CODE})
_LOGGED = ("keyword", "fault_code")


def _waiting(mine: Sequence[Finding]) -> bool:
    """Says whether one rank's logged findings show it waiting for peers until a timeout."""
    errors = [f for f in mine if f.severity >= Severity.ERROR and f.failure_class is not FailureClass.INFO]
    if not errors or any(f.failure_class in _OWN_FAULTS for f in errors):
        return False
    timed_out = any(f.rule_id in TIMEOUT_RULES or _TIMEOUT.search(f.line) for f in errors)
    waits = any(f.rule_id in TIMEOUT_RULES or any(_WAIT_CALL.search(x) for x in (f.line, *f.evidence))
                for f in mine)
    return timed_out and waits


def _clock(text: str) -> float:
    """tqdm's ``[H:]MM:SS`` as seconds."""
    secs = 0.0
    for part in text.split(":"):
        secs = secs * 60 + int(part)
    return secs


def _unfinished(f: Finding) -> tuple[int, float, float] | None:
    """A phase line's bar below 100 %: its percentage, elapsed and remaining seconds; None when it
    is done, has no bar, or does not know what remains."""
    m = _BAR.search(f.line)
    if m is None or m.group(5) == "?":
        return None
    pct, done, total = (int(g) for g in m.groups()[:3])
    return (pct, _clock(m.group(4)), _clock(m.group(5))) if pct < 100 and done < total else None


def _timeout_s(f: Finding) -> float | None:
    """The timeout a wait line gives (the watchdog's ``Timeout(ms)``, c10d's ``after <ms>ms``)."""
    if isinstance(f.fields.get("timeout_ms"), int):
        return f.fields["timeout_ms"] / 1000.0
    m = _AFTER_MS.search(f.line)
    return int(m.group(1)) / 1000.0 if m else None


def busy_rank(order: Sequence[Finding], errors: Sequence[Finding]) -> Finding | None:
    """``collective.busy_rank`` on the rank the others waited for (see the module docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        errors: the errors to explain (the real ones, or the fallout when there is none): every
            one that names a rank must be on a waiting rank; one without a rank may only be
            fallout or an exit (a launcher's report).

    Returns:
        A Finding on the busy rank's phase line's origin, at the first timeout's (time, seq), or
        None when the errors are not all waits or no other rank shows unfinished work of its own.
    """
    if any(f.rank is None and f.kind in _LOGGED and f.failure_class is not FailureClass.FALLOUT for f in errors):
        return None
    by_rank: dict[int, list[Finding]] = {}
    unranked: dict[str, list[Finding]] = {}
    for f in order:
        if f.kind in _LOGGED:
            (by_rank.setdefault(f.rank, []) if f.rank is not None else unranked.setdefault(f.origin.instance, [])
             ).append(f)
    waiting = sorted({f.rank for f in errors if f.rank is not None and f.kind in _LOGGED})
    if not waiting or not all(_waiting(by_rank.get(r, ())) for r in waiting):
        return None
    timeouts = [f for r in waiting for f in by_rank[r] if f.rule_id in TIMEOUT_RULES or _TIMEOUT.search(f.line)]
    first = min(timeouts, key=lambda f: (f.time, f.seq))
    window = max((t for f in timeouts if (t := _timeout_s(f)) is not None), default=DEFAULT_WAIT_SECONDS)
    others = [(str(r), m) for r, m in sorted(by_rank.items()) if r not in waiting] + sorted(unranked.items())
    for who, mine in others:
        before = [f for f in mine if (f.time, f.seq) <= (first.time, first.seq)]
        if any(f.severity >= Severity.ERROR and f.failure_class is not FailureClass.INFO for f in before):
            continue
        phase = max((f for f in before if f.rule_id in PHASE_RULES), key=lambda f: (f.time, f.seq), default=None)
        bar = _unfinished(phase) if phase is not None else None
        if bar is None:
            continue
        pct, elapsed, remaining = bar
        work = elapsed + remaining
        if work < window or phase.time - elapsed > first.time or phase.time + remaining < first.time - window:
            continue
        rank = phase.rank
        name = f"rank {rank}" if rank is not None else f"{who} (no rank prefix)"
        line = (f"{name} was still in work of its own ({phase.rule_id}, {pct}% done, {work:.0f} s of work by its "
                f"bar) when rank(s) {waiting} timed out waiting ({first.rule_id}, timeout {window:.0f} s): the "
                "program held them in a barrier longer than its timeout (rank-0-only work outlasting the "
                "process-group timeout; raise the timeout, e.g. ddp_timeout, or do the work before the "
                "distributed job)")
        return Finding("collective.busy_rank", "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                       phase.origin, line, first.time, first.seq, (phase.line, first.line),
                       {"busy": rank, "waiting": waiting, "phase": phase.rule_id, "percent": pct,
                        "work_s": work, "timeout_s": window}, SOURCE)
    return None
