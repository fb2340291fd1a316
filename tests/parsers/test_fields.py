"""Field extraction: clean, rank prefixes, timestamps, levels (SPEC P2)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftwatch.parsers import fields
from ftwatch.parsers.fields import clean, level_of, parse_timestamp, split_rank_prefix


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


# -- clean ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, text",
    [
        (b"NCCL WARN Cuda failure 'out of memory'\n", "NCCL WARN Cuda failure 'out of memory'"),
        (b"line with crlf\r\n", "line with crlf"),
        (b"bad \xff\xfe utf8 \xe4\xb8\n", "bad \ufffd\ufffd utf8 \ufffd"),
        ("中文日志\n".encode(), "中文日志"),
        (b"\x1b[31mERROR\x1b[0m: rank 3 failed", "ERROR: rank 3 failed"),
        (b"\x1b[1;32m[I1121 09:36:03]\x1b[0m ok\x1b[K\r\n", "[I1121 09:36:03] ok"),
        (b"\x1b]0;window title\x07progress 50%", "progress 50%"),
        (b"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ end", "link end"),
        (b"\x1b(Bplain\x1b=", "plain"),
        (b"cut off at the end \x1b", "cut off at the end "),
        (b"tab\tand\x00nul kept", "tab\tand\x00nul kept"),
        (b"", ""),
    ],
)
def test_clean(raw, text):
    assert clean(raw) == text


@given(st.binary(max_size=200))
def test_clean_never_raises_and_leaves_no_escape_or_line_ending(raw):
    text = clean(raw)
    assert "\x1b" not in text
    assert not text.endswith(("\r", "\n"))


@given(st.text(alphabet=st.characters(blacklist_characters="\x1b\r\n"), max_size=80))
def test_clean_keeps_plain_text(text):
    raw = text.encode("utf-8", "surrogatepass")
    assert clean(raw) == raw.decode("utf-8", "replace")


# -- split_rank_prefix -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, rank, rest",
    [
        ("[rank3]:[W1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:4561] Warning: destroy_process_group()",
         3, "[W1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:4561] Warning: destroy_process_group()"),
        ("[rank1]: Traceback (most recent call last):", 1, "Traceback (most recent call last):"),
        ('[rank1]:   File "/workspace/train.py", line 42, in <module>', 1,
         '  File "/workspace/train.py", line 42, in <module>'),
        ("[default3]:step 100 loss 2.31", 3, "step 100 loss 2.31"),
        ("[trainer12]:epoch 1", 12, "epoch 1"),
        ("[default1]:[rank1]: torch.distributed.DistBackendError: NCCL error", 1,
         "torch.distributed.DistBackendError: NCCL error"),
        ("[default0]:[rank8]: msg", 8, "msg"),
        ("3: RuntimeError: CUDA error: out of memory", 3, "RuntimeError: CUDA error: out of memory"),
        ("12:34:56 INFO started", None, "12:34:56 INFO started"),
        ("2026-11-21 09:36:03,123 - INFO - hello", None, "2026-11-21 09:36:03,123 - INFO - hello"),
        ("[W1121 09:36:03.735000 140 file.cc:12] x", None, "[W1121 09:36:03.735000 140 file.cc:12] x"),
        ("[2026-11-21 09:36:03] iteration 10", None, "[2026-11-21 09:36:03] iteration 10"),
        ("[rank]: no digits", None, "[rank]: no digits"),
        ("", None, ""),
        # Ray's driver reprints a task's or actor's output behind "(<name> pid=N[, ip=A]) ": no rank
        ("(TaskRunner pid=467613) Traceback (most recent call last):", None,
         "Traceback (most recent call last):"),
        ('(TaskRunner pid=467613)   File "/home/verl/fsdp_workers.py", line 118, in __init__', None,
         '  File "/home/verl/fsdp_workers.py", line 118, in __init__'),
        ("(pid=45601) task", None, "task"),
        ("(WorkerDict pid=480956, ip=10.0.0.2) [rank3]: RuntimeError: x", 3, "RuntimeError: x"),
        ("(main_task pid=3) [default1]:step 1", 1, "step 1"),
        # vLLM's worker processes use the same form (colour codes are gone after clean())
        ("(VllmWorkerProcess pid=4242) ERROR 04-24 16:14:56 worker.py:99] x", None,
         "ERROR 04-24 16:14:56 worker.py:99] x"),
        ("(Worker_TP1 pid=77) EJ0001: Failed to initialize the HCCP process.", None,
         "EJ0001: Failed to initialize the HCCP process."),
        ("(not a prefix) pid=3 x", None, "(not a prefix) pid=3 x"),
        ("(pid=abc) x", None, "(pid=abc) x"),
    ],
)
def test_split_rank_prefix(line, rank, rest):
    assert split_rank_prefix(line) == (rank, rest)


prefix_st = st.one_of(
    st.builds(lambda n, sp: f"[rank{n}]:" + sp, st.integers(0, 99999), st.sampled_from(["", " "])),
    st.builds(lambda role, n: f"[{role}{n}]:", st.sampled_from(["default", "trainer", "worker_", "ps"]),
              st.integers(0, 4095)),
    st.builds(lambda n: f"{n}: ", st.integers(0, 99999)),
)


@given(prefix_st, st.text(max_size=60))
def test_split_rank_prefix_never_loses_text_after_the_prefix(prefix, rest):
    rank, out = split_rank_prefix(prefix + rest)
    assert rank is not None
    if prefix.endswith(":") and rest.startswith(" "):
        rest = rest[1:]  # the one optional space belongs to the prefix
    assert rest.endswith(out)
    if split_rank_prefix(rest) == (None, rest):      # no rank (nor Ray) prefix after this one
        assert out == rest
        assert rank == int("".join(c for c in prefix if c.isdigit()))


@given(st.text(max_size=60))
def test_split_rank_prefix_returns_a_suffix(text):
    rank, out = split_rank_prefix(text)
    assert text.endswith(out)
    # a prefix was removed exactly when a rank was found, except a Ray prefix, which names none
    assert (rank is None) == (out == text) or (rank is None and RAY_PREFIX.match(text))


RAY_PREFIX = re.compile(r"\((?:[A-Za-z_][\w.-]* )?pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\) ")


@given(st.sampled_from(["(TaskRunner pid=467613) ", "(pid=45601) ", "(MyActor pid=7, ip=10.0.0.2) "]),
       st.text(max_size=60))
def test_split_rank_prefix_removes_a_ray_prefix_without_a_rank(prefix, rest):
    rank, out = split_rank_prefix(prefix + rest)
    assert rest.endswith(out)
    if split_rank_prefix(rest) == (None, rest):
        assert (rank, out) == (None, rest)


# -- parse_timestamp -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, expected",
    [
        ("E1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout",
         utc(2026, 11, 21, 9, 36, 3, 735000)),
        ("[rank1]:[E1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:616] Watchdog", utc(2026, 11, 21, 9, 36, 3, 735000)),
        ("[W1121 09:36:03.735227713 ProcessGroupNCCL.cpp:4115] Warning", utc(2026, 11, 21, 9, 36, 3) + 0.735227713),
        ("I0102 00:00:01 1 x.cc:1] no fraction", utc(2026, 1, 2, 0, 0, 1)),
        ("2026-11-21T09:36:03.123Z job started", utc(2026, 11, 21, 9, 36, 3, 123000)),
        ("2026-11-21T09:36:03.123+08:00 job started", utc(2026, 11, 21, 1, 36, 3, 123000)),
        ("2026-11-21T09:36:03-0530 x", utc(2026, 11, 21, 15, 6, 3)),
        ("2026-11-21T09:36:03 no zone", utc(2026, 11, 21, 9, 36, 3)),
        ("2026-11-21 09:36:03,123 - torch.distributed.elastic - INFO - hello", utc(2026, 11, 21, 9, 36, 3, 123000)),
        ("2026-11-21 09:36:03.123456 | INFO | step", utc(2026, 11, 21, 9, 36, 3, 123456)),
        ("[2026-11-21 09:36:03] iteration      100/   5000 | lm loss: 2.3", utc(2026, 11, 21, 9, 36, 3)),
        (" [2026-11-21 09:36:03,456] [INFO] [logging.py:96:log_dist] [Rank 0] step=10",
         utc(2026, 11, 21, 9, 36, 3, 456000)),
        ("[default0]:[2026-11-21 09:36:03] iteration 1", utc(2026, 11, 21, 9, 36, 3)),
        ("INFO 2026-11-21 09:36:03 worker ready", utc(2026, 11, 21, 9, 36, 3)),
        # the year-first date with "/" (PaddleOCR's datefmt "%Y/%m/%d %H:%M:%S")
        ("[2026/11/21 09:36:03] ppocr INFO: train dataloader has 125 iters", utc(2026, 11, 21, 9, 36, 3)),
        ("LAUNCH INFO 2026-11-21 09:36:03,221 Terminating with signal 15", utc(2026, 11, 21, 9, 36, 3, 221000)),
        # syslog / journald kernel lines (no year: the given one)
        ("Nov 21 09:36:03 gpu-node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python3, "
         "GPU has fallen off the bus.", utc(2026, 11, 21, 9, 36, 3)),
        ("Nov  1 09:36:03 gpu-node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable double "
         "bit error", utc(2026, 11, 1, 9, 36, 3)),
        ("Nov 21 09:36:03.735123 gpu-node-7 kernel: NVRM: Xid (PCI:0000:b1:00): 13", utc(2026, 11, 21, 9, 36, 3, 735123)),
        ("[rank1]:Nov 21 09:36:03 gpu-node-7 kernel: NVRM: Xid", utc(2026, 11, 21, 9, 36, 3)),
        # dmesg -T (its own year)
        ("[Sat Nov 21 09:36:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python3, GPU has fallen off "
         "the bus.", utc(2026, 11, 21, 9, 36, 3)),
        ("[Tue Dec  1 23:59:59 2026] NVRM: Xid (PCI:0000:3b:00): 94, pid=1, Contained ECC error",
         utc(2026, 12, 1, 23, 59, 59)),
        # Ascend plog / CANN slog: date-time joined by "-", ".mmm.uuu"
        ("[ERROR] HCCL(12345,python):2026-11-21-09:36:03.735.123 [hccl_comm.cc:123][12345][Init][Comm] "
         "HcclCommInitRootInfo failed", utc(2026, 11, 21, 9, 36, 3, 735123)),
        ("[ERROR] PROFILING(3350779,pt_main_thread_worker):2026-11-21-09:36:03.735.123 [prof.cpp:1] x",
         utc(2026, 11, 21, 9, 36, 3, 735123)),
        ("[default3]:[WARNING] RUNTIME(-1,null):2026-11-21-09:36:03.000.001 [rt.cc:9] y",
         utc(2026, 11, 21, 9, 36, 3, 1)),
        # MindSpore's Python logger: pid:thread in the head (mindspore/log.py), past the first 40 characters
        ("[INFO] ME(2207731:281473428730880,MainProcess):2026-11-21-09:36:03.512.118 [mindspore/parallel/cluster/"
         "process_entity/_api.py:276] Start worker process with rank id:0", utc(2026, 11, 21, 9, 36, 3, 512118)),
        ("2026-11-21-09:36:03.735.123 plain", utc(2026, 11, 21, 9, 36, 3, 735123)),
        ("2026-11-21-09:36:03.735 millis only", utc(2026, 11, 21, 9, 36, 3, 735000)),
        ("2026-11-21-09:36:03 none", utc(2026, 11, 21, 9, 36, 3)),
        # Slurm's cancel line: the stamp mid-line (slurmstepd req.c, srun's time-limit handler)
        ("slurmstepd: error: *** JOB 3318842 ON x3005c0s13b0n0 CANCELLED AT 2026-11-21T09:36:03 DUE TO TIME LIMIT ***",
         utc(2026, 11, 21, 9, 36, 3)),
        ("slurmstepd-gpu31-07: error: *** STEP 6620417.0 ON gpu31-07 CANCELLED AT 2026-11-21T09:36:03 ***",
         utc(2026, 11, 21, 9, 36, 3)),
        ("srun: error: *** STEP 771203.0 CANCELLED AT 2026-11-21T09:36:03 DUE TO TIME LIMIT ***",
         utc(2026, 11, 21, 9, 36, 3)),
        ("[rank3]:slurmstepd: error: *** JOB 37361369 ON lf5146 CANCELLED AT 2026-11-21T09:36:03 DUE TO PREEMPTION ***",
         utc(2026, 11, 21, 9, 36, 3)),
    ],
)
def test_parse_timestamp(line, expected):
    assert parse_timestamp(line, 2026) == pytest.approx(expected, abs=1e-6)


def test_glog_uses_the_given_year():
    line = "F0229 23:59:59.000001 7 check.cc:1] Check failed"
    assert parse_timestamp(line, 2028) == pytest.approx(utc(2028, 2, 29, 23, 59, 59, 1), abs=1e-6)
    assert parse_timestamp(line, 2026) is None  # no Feb 29 in 2026


def test_c10_logger_stamp_with_an_unpadded_month():
    """PyTorch's own logger (c10 MessageLogger, no glog) writes months 1-9 with one digit and the
    fraction in nanoseconds: ``[E825 03:22:41.883011142`` is Aug 25, not unparsed."""
    line = "[rank1]:[E825 03:22:41.883011142 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught"
    assert parse_timestamp(line, 2026) == pytest.approx(utc(2026, 8, 25, 3, 22, 41, 883011), abs=1e-3)
    assert parse_timestamp("[W101 00:00:01.5 x.cpp:1] w", 2026) == pytest.approx(utc(2026, 1, 1, 0, 0, 1, 500000))
    assert parse_timestamp("[E1030 15:51:02.412 x.cpp:1] e", 2024) == pytest.approx(utc(2024, 10, 30, 15, 51, 2, 412000))
    assert parse_timestamp("[E925 13:32:36 x.cpp:1] e", None) is None      # no year, like glog


@pytest.mark.parametrize("line", [
    "E1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:616] Watchdog",
    "Nov 21 09:36:03 gpu-node-7 kernel: NVRM: Xid (PCI:0000:3b:00): 79",
])
def test_without_a_year_yearless_formats_give_none(line):
    assert parse_timestamp(line, 2024) == pytest.approx(utc(2024, 11, 21, 9, 36, 3), abs=1)
    assert parse_timestamp(line, None) is None


@pytest.mark.parametrize("line", [
    "[Sat Nov 21 09:36:03 2026] NVRM: Xid",
    "[ERROR] HCCL(12345,python):2026-11-21-09:36:03.735.123 [hccl_comm.cc:123]",
    "2026-11-21 09:36:03,123 - INFO - hello",
])
def test_formats_with_a_year_ignore_the_given_one(line):
    assert parse_timestamp(line, None) == parse_timestamp(line, 2024) is not None
    assert int(parse_timestamp(line, None)) == int(utc(2026, 11, 21, 9, 36, 3))


def test_offset_matches_datetime():
    tz = timezone(timedelta(hours=-7))
    assert parse_timestamp("2026-03-01T00:00:00-07:00", 2026) == datetime(2026, 3, 1, tzinfo=tz).timestamp()


@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):",
        "node3:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>",
        "2026-13-01 09:36:03 month 13",
        "2026/13/01 09:36:03 month 13, slash form",
        "2026-11-21 25:00:00 hour 25",
        "E1341 09:36:03.735000 140 x.cc:1] month 13",
        "a long message that mentions a date much later: 2026-11-21 09:36:03",
        # near misses of the syslog, dmesg and plog forms
        "Nov 31 09:36:03 gpu-node-7 kernel: no Nov 31",
        "NOV 21 09:36:03 gpu-node-7 kernel: month in capitals",
        "Nov 21 9:36:03 gpu-node-7 kernel: one-digit hour",
        "kernel: Nov 21 09:36:03 not at the start",
        "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, raw dmesg: seconds since boot",
        "[Sat Nov 21 09:36:03] NVRM: Xid, weekday but no year",
        "[Sat Nov 21 09:36:03 26] NVRM: Xid, two-digit year",
        "[Sat Nov 31 09:36:03 2026] NVRM: Xid, no Nov 31",
        "[ERROR] HCCL(12345,python):2026-11-21-25:36:03.735.123 [hccl_comm.cc:123] hour 25",
        "[ERROR] HCCL(12345,python):2026-02-30-09:36:03.735.123 [hccl_comm.cc:123] Feb 30",
        "[ERROR] PROFILING(3350779,pt_main_thread_worker): failed at 2026-11-21-09:36:03.735.123",
        "20261121-09:36:03.735.123 no dashes in the date",
        "2026-11-21--09:36:03 two dashes",
        "  time      : 2026-11-21_11:02:19",
        # a cancel line's near misses: no "***" head, a date with no time, a stamp in words
        "a message quoting a cancel far into it: JOB 12 ON n1 CANCELLED AT 2026-11-21T09:36:03 (no *** head)",
        "slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-21 09:36 ***",
        "slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-02-30T09:36:03 *** Feb 30",
        "",
    ],
)
def test_parse_timestamp_none(line):
    assert parse_timestamp(line, 2026) is None


@given(st.text(max_size=80), st.one_of(st.none(), st.integers(1970, 2100)))
def test_parse_timestamp_never_raises(text, year):
    value = parse_timestamp(text, year)
    assert value is None or isinstance(value, float)


_DIGIT = st.sampled_from("0123456789") | st.sampled_from("\u0663\uff15")     # ASCII, Arabic-Indic, full-width
_BRACKETED = st.builds(
    lambda lead, dash, y, mo, d, sep, h, mi, s, tail: f"{lead}[{y}{dash}{mo}{dash}{d}{sep}{h}:{mi}:{s}]{tail}",
    st.sampled_from(["", "[rank1]: ", "[default0]:[rank3]: ", "7: ", "(Worker pid=12) "]),
    st.sampled_from(["-", "/"]),
    st.text(_DIGIT, min_size=4, max_size=4) | st.sampled_from(["2026", "0000", "9999"]),
    st.text(_DIGIT, min_size=2, max_size=2) | st.sampled_from(["01", "02", "12", "13", "00"]),
    st.text(_DIGIT, min_size=2, max_size=2) | st.sampled_from(["01", "28", "29", "30", "31", "32"]),
    st.sampled_from([" ", "T", "-", "_"]),
    st.text(_DIGIT, min_size=2, max_size=2) | st.sampled_from(["00", "23", "24"]),
    st.text(_DIGIT, min_size=2, max_size=2) | st.sampled_from(["00", "59", "60"]),
    st.text(_DIGIT, min_size=2, max_size=2) | st.sampled_from(["00", "59", "60", "61", "99"]),
    st.sampled_from(["", " iteration 10/ 100 |", ".123", " +08:00", "Z", "]"]) | st.text(max_size=12),
)


@given(_BRACKETED, st.one_of(st.none(), st.integers(1970, 2100)))
def test_bracketed_stamp_fast_path_reads_as_the_general_path(text, year):
    """``[YYYY-MM-DD HH:MM:SS]`` lines take a cached shortcut (``fields._bracketed``): it gives the
    general path's answer for every such line, impossible dates and seconds, other digits and
    neighbouring fractions, zones and prefixes included."""
    from ftwatch.parsers import fields

    fast = parse_timestamp(text, year)
    general = fields._bracketed
    fields._bracketed = lambda _text: fields._NOT_BRACKETED
    try:
        slow = parse_timestamp(text, year)
    finally:
        fields._bracketed = general
    assert fast == slow


def test_bracketed_stamp_fast_path_is_taken():
    from ftwatch.parsers import fields

    assert fields._bracketed("[2026-11-21 09:16:40] iteration 1000/ 1000000 |") == 1795252600.0
    assert fields._bracketed("[2026-02-30 09:16:40] x") is None
    assert fields._bracketed("[2026-11-21 09:16:60] x") is None
    assert fields._bracketed("[2026-11-21 09:16:40.5] x") is fields._NOT_BRACKETED


# -- level_of ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, level",
    [
        ("E1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:616] Watchdog", "ERROR"),
        ("[rank0]:[W1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:4561] Warning: x", "WARNING"),
        ("F1121 09:36:03.735000 140 check.cc:1] Check failed", "CRITICAL"),
        ("I1121 09:36:03.735000 140 x.cc:1] ok", "INFO"),
        ("node3:1234:1234 [0] NCCL WARN Cuda failure 'out of memory'", "WARNING"),
        ("node3:1234:1234 [0] NCCL INFO Channel 00/0", "INFO"),
        ("2026-11-21 09:36:03,123 - torch.distributed.elastic - ERROR - failed", "ERROR"),
        ("WARNING:torch.distributed.run:Setting OMP_NUM_THREADS", "WARNING"),
        ("[2026-11-21 09:36:03] [CRITICAL] disk full", "CRITICAL"),
        ("FATAL: all ranks lost", "CRITICAL"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", None),
        ("KeyError: 'lr'", None),
        ("", None),
    ],
)
def test_level_of(line, level):
    assert level_of(line) == level


# vLLM's logger (vllm/logger.py: "%(levelname)s %(asctime)s [...]", datefmt "%m-%d %H:%M:%S"),
# behind vLLM v1's "(APIServer pid=611) " process prefix or bare
@pytest.mark.parametrize("line, expected", [
    ("INFO 11-13 09:15:02 [loggers.py:118] Engine 000: Avg prompt throughput: 51.2 tokens/s",
     datetime(2026, 11, 13, 9, 15, 2, tzinfo=timezone.utc).timestamp()),
    ("(APIServer pid=611) WARNING 05-14 13:47:02 [api_server.py:1940] Received SIGTERM",
     datetime(2026, 5, 14, 13, 47, 2, tzinfo=timezone.utc).timestamp()),
])
def test_vllm_stamps_read_only_when_asked(line, expected):
    assert parse_timestamp(line, 2026, vllm=True) == expected
    assert parse_timestamp(line, 2026) is None       # the engine's line clock keeps them untimed
    assert parse_timestamp(line, None, vllm=True) is None     # no year, like glog


@pytest.mark.parametrize("line", [
    "INFO 13-45 09:15:02 [x.py:1] no such date",
    "INFO 11-13 09:15:02-07 not this form",
    "INFO:     10.8.1.5:51022 - \"POST /v1/completions HTTP/1.1\" 200 OK",
])
def test_vllm_stamp_counterexamples(line):
    assert parse_timestamp(line, 2026, vllm=True) is None


def test_year_of_answers_as_datetime_around_every_new_year():
    """``year_of`` keeps the last year's span (issue 16): times just before, at and after each new
    year, asked in an order that moves the kept span back and forth, get ``datetime``'s year
    (which rounds to the microsecond: 0.4 us before midnight is already the new year there,
    0.6 us before still the old one), and what ``datetime`` refuses is refused alike."""
    from datetime import datetime, timezone

    from ftwatch.parsers.fields import year_of
    times = []
    for year in (1970, 1999, 2000, 2024, 2025, 2026, 2027, 2100):
        start = datetime(year, 1, 1, tzinfo=timezone.utc).timestamp()
        times += [start + d for d in (-1.0, -0.5, -6e-7, -5e-7, -4e-7, -1e-7, 0.0, 1e-7, 1e-6, 1.0, 86400.0)]
    for t in times + times[::-1] + [t for pair in zip(times, times[::-1]) for t in pair]:
        assert year_of(t) == datetime.fromtimestamp(t, tz=timezone.utc).year, t
    for bad, error in ((float("nan"), ValueError), (float("inf"), OverflowError), (1e20, OverflowError)):
        with pytest.raises(error):
            year_of(bad)


@pytest.mark.parametrize("line, rank, rest", [
    ("[1,3]<stderr>: Traceback (most recent call last):", 3, "Traceback (most recent call last):"),
    ("[1,12]<stdout>:step 0, loss = 5.9", 12, "step 0, loss = 5.9"),
    ("[1,0]<stddiag>:warn", 0, "warn"),
    ("Tue Jul  9 01:10:02 2019[1,4]<stderr>:NCCL INFO x", 4, "NCCL INFO x"),
    ("[1,3]: a list, no tag", None, "[1,3]: a list, no tag"),
])
def test_split_rank_prefix_reads_mpirun_tag_output(line, rank, rest):
    # mpirun(1) --tag-output "[jobid,MCW_rank]<stdio stream>", --timestamp-output's ctime before it
    assert fields.split_rank_prefix(line) == (rank, rest)
    assert fields.rank_prefix_at(line.encode(), 0)[0] == rank


@pytest.mark.parametrize("line, rank, rest", [
    ("[1]<stderr>:RuntimeError: ncclCommInitRank failed: unhandled cuda error", 1,
     "RuntimeError: ncclCommInitRank failed: unhandled cuda error"),
    ("[12]<stdout>:step 0, loss = 5.9", 12, "step 0, loss = 5.9"),
    ("[3]: a list, no stream", None, "[3]: a list, no stream"),
    ("[3] <stderr>: a space between", None, "[3] <stderr>: a space between"),
])
def test_split_rank_prefix_reads_horovodruns_rank_and_stream(line, rank, rest):
    # horovod/runner/common/util/safe_shell_exec.py prefix_connection: "{time}[{index}]<{prefix}>:{line}"
    assert fields.split_rank_prefix(line) == (rank, rest)
    assert fields.rank_prefix_at(line.encode(), 0)[0] == rank


def test_mpirun_timestamp_output_ctime_is_the_line_time():
    t = fields.parse_timestamp("Tue Jul  9 01:10:02 2019[1,0]<stderr>:node-a:21544 NCCL INFO", 2026)
    assert t == fields.parse_timestamp("[Tue Jul  9 01:10:02 2019] x", None)
    assert t is not None



@pytest.mark.parametrize("line", [
    "20/01/06 22:12:57 INFO SparkContext: Starting job: foreachPartition at XGBoost.scala:525",
    "20/01/06 22:12:57 WARN TaskSetManager: Lost task 3.0 in stage 9.0",
    "[rank2]: 20/01/06 22:12:57 ERROR ApplicationMaster: RECEIVED SIGNAL TERM",
])
def test_sparks_log4j_console_stamp_is_the_line_time(line):
    # Spark's conf/log4j.properties.template: "%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n"
    assert parse_timestamp(line, None) == datetime(2020, 1, 6, 22, 12, 57, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("line", [
    "01/06/20 22:12:57 job submitted",          # month first, no level word: another program's date
    "20/01/06 22:12:57 starting",
    "20/13/06 22:12:57 INFO impossible month",
])
def test_a_two_digit_year_date_without_sparks_shape_is_no_stamp(line):
    assert parse_timestamp(line, None) is None
