"""torchelastic's failure summary (P3): rank, exit code, signal, host, time and the root cause.

The summaries are as torchrun prints them (``ChildFailedError.format_msg`` in
``torch/distributed/elastic/multiprocessing/errors``): the first one is from a recorded job
(``tests/golden/torchrun_sigkill``) where rank 1 was SIGKILLed and the agent stopped the others.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftwatch.parsers import torchelastic
from ftwatch.parsers.torchelastic import MAX_SUMMARY_LINES, SummaryFailure, SummaryLines, parse_summary

AT = datetime(2026, 11, 21, 11, 2, 19, tzinfo=timezone.utc).timestamp()

SIGKILL_SUMMARY = """\
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
=======================================================
/srv/train/examples/train_ddp.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-21_11:02:19
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 18988)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 18988
[2]:
  time      : 2026-11-21_11:02:19
  host      : node-a
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 18990)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 18990
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_11:02:19
  host      : node-a
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 18989)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 18989
=======================================================""".splitlines()

SIGKILL_EXPECTED = [
    SummaryFailure(0, -15, "node-a", AT, False),
    SummaryFailure(2, -15, "node-a", AT, False),
    SummaryFailure(1, -9, "node-a", AT, True),
]

# One failed worker and nothing else, with the traceback its @record error file gave (indented by
# two spaces, as format_msg does) and a multi-node host name.
NO_OTHER_FAILURES = """\
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_09:36:04
  host      : gpu-node-3.cluster.local
  rank      : 13 (local_rank: 5)
  exitcode  : 1 (pid: 4120)
  error_file: /tmp/torchelastic_k2x9/none_abc/attempt_0/5/error.json
  traceback : Traceback (most recent call last):
    File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper
      return f(*args, **kwargs)
    File "/srv/train/train.py", line 182, in main
      warmup = config["warmup_steps"]
  KeyError: 'warmup_steps'
  \n\
============================================================""".splitlines()


def test_sigkill_summary_gives_every_failure_and_the_root_cause():
    assert parse_summary(SIGKILL_SUMMARY) == SIGKILL_EXPECTED


def test_no_other_failures_and_an_error_file_traceback():
    [failure] = parse_summary(NO_OTHER_FAILURES)
    assert failure == SummaryFailure(13, 1, "gpu-node-3.cluster.local",
                                     datetime(2026, 11, 21, 9, 36, 4, tzinfo=timezone.utc).timestamp(), True)


def test_worker_lines_around_the_summary_are_not_part_of_it():
    """torchrun --tee prefixes worker output with [defaultN]:; worker lines that look like fields stay out."""
    before = [
        "[default0]:step 7/12 loss 0.9119",
        "[default1]:injecting fault sigkill at step 8",
        "[default0]:  rank      : 0 (local_rank: 0)",
        "[default0]:  exitcode  : 3 (pid: 1)",
        "W1121 11:02:19.507000 18964 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
        "18988 closing signal SIGTERM",
    ]
    after = ["[default2]:  rank      : 7 (local_rank: 7)", "[default2]:  exitcode  : -6 (pid: 2)"]
    assert parse_summary(before + SIGKILL_SUMMARY + after) == SIGKILL_EXPECTED


def test_summary_labelled_by_a_launcher_is_read_through_the_labels():
    """srun --label puts "0: " before every line of torchrun's output."""
    assert parse_summary(["0: " + line for line in SIGKILL_SUMMARY]) == SIGKILL_EXPECTED
    assert parse_summary(["[default0]:" + line for line in SIGKILL_SUMMARY]) == SIGKILL_EXPECTED


def test_summary_cut_short_keeps_the_complete_entries():
    cut = SIGKILL_SUMMARY[: SIGKILL_SUMMARY.index("  exitcode  : -9 (pid: 18989)  (SIGKILL)")]
    assert parse_summary(cut) == SIGKILL_EXPECTED[:2]


def test_garbled_entries_are_dropped_and_odd_values_tolerated():
    text = [
        "Failures:",
        "[1]:",
        "  rank      : <N/A>",                         # no rank: dropped
        "  exitcode  : -15 (pid: 1)",
        "[2]:",
        "  time      : 2026-11-21T11:02:19",           # not torchelastic's format: no time
        "  rank      : 2 (local_rank: 2)",
        "  exitcode  : -15 (pid: 2)\r",
        "[3]:",
        "  rank      : 3 (local_rank: 3)",
        "  exitcode  : (pid: 3)",                      # no code: dropped
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 4)",
        "=====",
    ]
    assert parse_summary(text) == [SummaryFailure(2, -15, "", None, False), SummaryFailure(1, -9, "", None, True)]


def test_fields_after_the_closing_border_are_ignored():
    trailing = ["[7]:", "  rank      : 7 (local_rank: 7)", "  exitcode  : 1 (pid: 9)"]
    assert parse_summary(SIGKILL_SUMMARY + trailing) == SIGKILL_EXPECTED


def test_two_summaries_in_one_log_are_both_read_in_order():
    found = parse_summary(NO_OTHER_FAILURES + ["[default0]:restarting"] + SIGKILL_SUMMARY)
    assert [(f.rank, f.root_cause) for f in found] == [(13, True), (0, False), (2, False), (1, True)]


def test_log_without_summary_gives_nothing():
    assert parse_summary(["[default0]:step 1/12 loss 4.6369", "Root Cause analysis: none", ""]) == []


@given(st.lists(st.one_of(st.text(max_size=60), st.sampled_from(SIGKILL_SUMMARY + NO_OTHER_FAILURES)),
                max_size=60))
def test_never_raises_and_every_entry_has_a_rank_and_a_code(lines):
    for failure in parse_summary(lines):
        assert isinstance(failure.rank, int) and failure.rank >= 0
        assert isinstance(failure.exitcode, int)


# -- SummaryLines: the summaries of a stream read chunk by chunk -----------------------------------

_NOISE = [f"[rank{i % 4}]: step {i} loss 1.{i:03d}" for i in range(300)]
_LOG = _NOISE + SIGKILL_SUMMARY + _NOISE + NO_OTHER_FAILURES + _NOISE


def _read(chunks: list[bytes]) -> tuple[list[SummaryFailure], SummaryLines, list[bool]]:
    reader = SummaryLines()
    closed = [reader.take(c) for c in chunks]
    kept = list(reader.lines)
    return reader.failures(), kept, closed


@given(st.lists(st.integers(min_value=1, max_value=len(_LOG) - 1), max_size=8, unique=True))
def test_chunked_reading_equals_reading_the_whole_log(cuts):
    """Wherever the chunk boundaries fall (at line ends), the failures are those of the whole log."""
    bounds = [0, *sorted(cuts), len(_LOG)]
    chunks = [("\n".join(_LOG[a:b]) + "\n").encode() for a, b in zip(bounds, bounds[1:])]
    found, _, _ = _read(chunks)
    assert found == parse_summary(_LOG)


def test_only_the_summaries_own_lines_are_kept():
    """The worker lines between and around summaries are never split, cleaned or kept."""
    found, kept, closed = _read([("\n".join(_LOG) + "\n").encode()])
    def own(summary: list[str]) -> list[str]:          # from its start line to its closing border
        first = next(i for i, line in enumerate(summary) if line.startswith("Failures:"))
        border = next(i for i in range(first, len(summary)) if summary[i].startswith("====="))
        return summary[first:border + 1]
    assert kept == own(SIGKILL_SUMMARY) + own(NO_OTHER_FAILURES)
    assert not any("loss" in line for line in kept)
    assert closed == [True]
    assert [f.rank for f in found] == [0, 2, 1, 13]


def test_a_summary_that_never_closes_is_cut_after_its_line_limit():
    start = SIGKILL_SUMMARY[7:-1]                        # from Failures: on, no closing border
    chunk = ("\n".join(start + _NOISE * 10) + "\n").encode()
    reader = SummaryLines()
    assert reader.take(chunk)                            # cut: read as closed
    assert len(reader.lines) == MAX_SUMMARY_LINES + 1
    assert not reader.take(("\n".join(_NOISE) + "\n").encode())
    assert len(reader.lines) == MAX_SUMMARY_LINES + 1    # nothing more after the cut


class _CountingBytes(bytes):
    """A chunk that counts its ``find`` calls per needle."""

    def find(self, sub, *args):                          # noqa: D401 - bytes.find with a tally
        self.calls[sub] = self.calls.get(sub, 0) + 1
        return super().find(sub, *args)


def test_a_start_missing_from_the_chunk_is_searched_for_once(monkeypatch):
    """Issue 16: each summary's end searched every start to the chunk's end again; a start the
    chunk lacks (here the root-cause heading) is now looked for once per chunk (without
    hyperscan: with it, one scan lists the starts)."""
    monkeypatch.setattr(torchelastic, "_hs", None)
    summary = [line for line in SIGKILL_SUMMARY if "Root Cause" not in line]
    text = "\n".join((_NOISE[:20] + summary) * 5) + "\n"
    chunk = _CountingBytes(text.encode())
    chunk.calls = {}
    reader = SummaryLines()
    assert reader.take(chunk)
    assert chunk.calls[b"Failures:"] == 5                # once per summary
    assert chunk.calls[b"Root Cause (first observed failure)"] == 1
    plain = SummaryLines()
    plain.take(text.encode())
    assert plain.lines == reader.lines


@given(st.lists(st.lists(st.sampled_from([b"Failures:", b"Root Cause", b"Root Cause (first observed failure):",
                                          b"Fail", b"ures:", b"x", b"\n", b" "]), max_size=6).map(b"".join),
                max_size=12))
def test_holding_summary_finds_the_chunks_may_hold_summary_would(chunks):
    """One search over a batch's chunks joined (issue 16) names the chunks a search of each names,
    also where a start's words run across two chunks (``Fail`` + ``ures:``: neither holds them)."""
    from ftwatch.parsers.torchelastic import holding_summary, may_hold_summary
    assert holding_summary(chunks) == {k for k, chunk in enumerate(chunks) if may_hold_summary(chunk)}


def _strptime_time(text: str) -> float | None:
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d_%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


@given(st.tuples(*(st.integers(0, hi) for hi in (9999, 13, 32, 25, 61, 62))), st.sampled_from(["", " ", "\t"]))
def test_a_summary_time_is_read_as_strptime_reads_it(parts, pad):
    # the padded form torchelastic writes is read by one match (issue 16): the same epoch seconds,
    # and None for the same impossible times (Feb 30, hour 24, second 60), as strptime
    from ftwatch.parsers.torchelastic import _time
    text = pad + "%04d-%02d-%02d_%02d:%02d:%02d" % parts + pad
    assert _time(text) == _strptime_time(text)


def test_an_unpadded_summary_time_is_still_read():
    from ftwatch.parsers.torchelastic import _time
    for text in ("2026-1-5_1:2:3", "2026-11-21_11:02:23", "2026-02-30_00:00:00", "soon"):
        assert _time(text) == _strptime_time(text)


_PARTS = [SIGKILL_SUMMARY, NO_OTHER_FAILURES, [line for line in SIGKILL_SUMMARY if "Root Cause" not in line],
          [line for line in NO_OTHER_FAILURES if "Failures:" not in line], SIGKILL_SUMMARY[7:-1], _NOISE, _NOISE[:40]]


@pytest.mark.skipif(torchelastic._hs is None, reason="hyperscan not installed")
@given(st.lists(st.sampled_from(range(len(_PARTS))), max_size=10), st.lists(st.integers(0, 2000), max_size=6))
def test_starts_listed_by_one_scan_read_the_summaries_the_searches_read(parts, cuts):
    # issue 16: a chunk's starts from one hyperscan scan (start_offsets) and then bisection, as the
    # bytes.find searches found them: the same lines kept, the same closings, whatever the cuts
    lines = [line for k in parts for line in _PARTS[k]]
    bounds = [0, *sorted({c % (len(lines) + 1) for c in cuts}), len(lines)]
    chunks = [("\n".join(lines[a:b]) + "\n").encode() for a, b in zip(bounds, bounds[1:]) if b > a]
    fast = _read(chunks)
    real = torchelastic._hs
    try:
        torchelastic._hs = None
        assert _read(chunks) == fast
    finally:
        torchelastic._hs = real


@pytest.mark.skipif(torchelastic._hs is None, reason="hyperscan not installed")
@given(st.lists(st.sampled_from([b"Failures:", b"Root Cause (first observed failure)", b"Root Cause", b"Fail",
                                 b"x" * 1000, b"\n", b" "]), max_size=12).map(b"".join))
def test_may_hold_summary_by_one_scan_answers_as_the_searches(data):
    from ftwatch.parsers.torchelastic import _STARTS, may_hold_summary
    data = data + b"\n" + b"y" * 4096                   # past the size the scan is used from
    assert may_hold_summary(data) == any(s in data for s in _STARTS)
    assert may_hold_summary(data[:100]) == any(s in data[:100] for s in _STARTS)
