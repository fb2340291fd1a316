"""The silence a watcher's line reports and the stamp of Slurm's cancel line (ftwatch.parsers.silence)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from ftwatch.parsers.silence import cancel_stamp, duration_seconds, reported_silence


@pytest.mark.parametrize("text, seconds", [
    ("2h11m", 7860.0), ("10m0s", 600.0), ("5h02m", 18120.0), ("1h0m0s", 3600.0), ("30 minutes", 1800.0),
    ("2 hours", 7200.0), ("90s", 90.0)])
def test_durations_in_go_and_word_forms(text, seconds):
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("line, seconds", [
    ("Too long with no output (exceeded 10m0s): context deadline exceeded", 600.0),           # CircleCI
    ("No output has been received in the last 10m0s, this potentially indicates a stalled build", 600.0),  # Travis
    ("[2025-12-29 09:03:00] node-monitor: job grpo no log output for 5h02m; all 16 GPUs at 0% utilisation", 18120.0),
    ("2026-01-14 12:31:47 job-watch: mnist produced no output on any worker for 2h11m; terminating", 7860.0),
])
def test_a_watchers_silence_report_gives_its_duration(line, seconds):
    assert reported_silence(line) == seconds


@pytest.mark.parametrize("line", [
    "step 120 loss 2.31 no output dir given, using ./out",          # "no output" without a duration
    "Epoch 3 finished in 2h11m",                                     # a duration that is no silence
    "WARNING: output for 30 minutes buffered",
])
def test_lines_that_report_no_silence(line):
    assert reported_silence(line) is None


def test_slurmstepd_cancel_line_is_dated_by_its_mid_line_stamp():
    line = "slurmstepd: error: *** JOB 771204 ON gpu-n112 CANCELLED AT 2026-03-23T18:40:07 DUE TO TIME LIMIT ***"
    assert cancel_stamp(line) == datetime(2026, 3, 23, 18, 40, 7, tzinfo=timezone.utc).timestamp()
    assert cancel_stamp("srun: error: *** STEP 12.0 CANCELLED AT 2020-01-02T03:04:05 DUE TO TIME LIMIT ***") \
        == datetime(2020, 1, 2, 3, 4, 5, tzinfo=timezone.utc).timestamp()


def test_other_lines_carry_no_cancel_stamp():
    assert cancel_stamp("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.") is None
    assert cancel_stamp("job cancelled at 2026-03-23T18:40:07 by the user") is None


def test_a_servers_access_line_is_a_request_line():
    from ftwatch.parsers.silence import REQUEST_LINE
    import re
    rx = re.compile(REQUEST_LINE)
    assert rx.search(b'INFO:     10.12.0.44:50312 - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    assert rx.search(b'10.0.0.7 - - [10/Oct/2026:13:55:36 -0700] "GET /health HTTP/1.0" 503 2326')
    # counterexamples: a quoted request without its status, a URL in a message
    assert not rx.search(b'client sent "GET /v1/models HTTP/1.1" and went away')
    assert not rx.search(b"Downloading https://huggingface.co/x/resolve/main/config.json HTTP 200")
