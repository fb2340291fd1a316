"""Extracts the fields of one log line: clean text, rank prefix, timestamp, level (SPEC P2).

Run on lines that a rule matched (and on block lines), so these favour clarity over speed; the
exception is the one stamp shape that the progress reader (``ftwatch.policy.progress.marks``) dates on
thousands of step lines a replay, Megatron's ``[YYYY-MM-DD HH:MM:SS]``, read by a cached shortcut
that gives the same answer (:func:`_bracketed`). None of them raises on odd input: bad bytes are
replaced, unknown formats give None. Over 400 lines because each stamp format needs its regex and its
reading, and they belong together: one line's fields.
"""

from __future__ import annotations

import bisect
import calendar
import functools
import re
from datetime import datetime, timezone

__all__ = ["clean", "split_rank_prefix", "strip_stamp_prefix", "parse_timestamp", "last_timestamp", "last_clock",
           "Stamps", "newlines", "year_of", "level_of"]

# ECMA-48 escape sequences, as terminals print them:
#   CSI  ESC [ params intermediates final        colours \x1b[31m, cursor moves \x1b[2K
#   OSC, DCS, SOS, PM, APC  ESC ] P X ^ _ ... up to BEL or ST (ESC \), or the end of the line
#   other ESC sequences  ESC intermediates final   \x1b(B, \x1b=, \x1b7
#   a lone ESC (a sequence cut off at the end of the line)
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_].*?(?:\x07|\x1b\\|\Z)"
    r"|\x1b[ -/]*[0-~]"
    r"|\x1b",
    re.DOTALL,
)

# One rank prefix at the start of a line, with one optional space after it:
#   [rank3]:      PyTorch (TORCH_DISTRIBUTED_DEBUG / c10d logging)
#   [default3]:   torchrun --tee / --log-dir, "[<role><rank>]:" for any role name
#   3:            older launchers: digits, a colon and a space (never "12:34:56")
#   (MyActor pid=480956, ip=10.0.0.2)   Ray: the driver reprints each task's or actor's output
#                 behind its name, pid and (when on another node) ip; no rank in it
#                 (ray-project/ray doc/source/ray-observability/ray-logging.rst, "Worker logs";
#                 python/ray/_private/worker.py print_worker_logs); vLLM's worker processes print
#                 the same "(VllmWorkerProcess pid=N) " / "(Worker_TP1 pid=N) " (vllm-project/vllm
#                 multiproc_worker_utils.py _add_prefix), as vLLM-Ascend does
#   [1,3]<stderr>:  Open MPI's mpirun --tag-output (mpirun(1): "Tag each line of output to stdout,
#                 stderr, and stddiag with [jobid, MCW_rank]<stdio stream>"; orte/prrte
#                 iof_base_output.c write the tag as "[%s,%s]<%s>:", jobid, rank, and stdout, stderr
#                 or stddiag); with --timestamp-output too, C's ctime() opens it, no space between:
#                 "Tue Jul  9 01:10:02 2019[1,0]<stderr>:" (the same file, "%s[%s,%s]<%s>:").
#                 The rank shares the bracket's group: every reader of group 1 reads it as is.
#   [3]<stderr>:  horovodrun's own launcher (gloo, and the output it relays): horovod/runner/common/util/
#                 safe_shell_exec.py prefix_connection, "{time}[{index}]<{prefix}>:{line}" with the rank
#                 as index and stdout or stderr as prefix; no jobid, so the stream must follow the bracket.
#: mpirun --timestamp-output's ctime, a prefix of its own (no rank) right before the tag: the last
#: alternative, so other lines fail it at their first byte only after the others failed
MPI_CTIME = r"[MTWFS][a-u]{2} [ADFJMNOS][a-u]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}(?=\[\d{1,9},\d{1,7}\]<std)"
#: the bracketed prefix with ``%s`` for its rank digits (a group, or a rank list): ``[rank3]:``,
#: ``[default3]:``, mpirun's ``[1,3]<stdout>:`` (its jobid a number, the stream named), each
#: with one optional space; ``re`` only (a lookahead keeps the rank in one group). Without
#: :data:`MPI_CTIME`, a prefix of its own: ``ftwatch.pipeline.replay_hang`` reads that stamp as a stamp.
RANK_BRACKET = (r"\[(?:[A-Za-z_][A-Za-z_-]*|\d{1,9},(?=\d{1,7}\]<std)|(?=\d{1,7}\]<std))%s\]"
                r"(?:<std(?:out|err|diag)>)?: ?")
#: :data:`RANK_BRACKET` without the lookahead (hyperscan has none) and without a group: the
#: bracket of ``ftwatch.policy.progresslines``' prefix, ``%s`` the rank digits
RANK_BRACKET_HS = r"\[(?:[A-Za-z_][A-Za-z_-]*?%s\]|(?:\d{1,9},)?%s\]<std(?:out|err|diag)>): ?"
_RANK_PREFIX = re.compile(RANK_BRACKET % r"(\d{1,7})" + r"|(\d{1,6}): "
                          r"|\((?:[A-Za-z_][\w.-]{0,80} )?pid=\d{1,9}(?:, ip=[0-9A-Fa-f.:]{2,45})?\) |" + MPI_CTIME)
_MAX_PREFIXES = 4  # stacked prefixes, e.g. "[default1]:[rank1]: msg"
# the stacked prefixes at once (bytes, for the step tap): up to 3, then the innermost, whose rank counts
_RANK_PREFIXES_BYTES = re.compile(
    rb"(?:%s|\d{1,6}: |%s){0,%d}(?:%s|(\d{1,6}): )"
    % ((RANK_BRACKET % r"\d{1,7}").encode(), MPI_CTIME.encode(), _MAX_PREFIXES - 1,
       (RANK_BRACKET % r"(\d{1,7})").encode()))
RANK_PREFIXES_BYTES = _RANK_PREFIXES_BYTES  # public: the step tap matches it line by line (its groups: the rank)

# glog: "E1121 09:36:03.735000 140 file.cc:12]" (level, MMDD, time; no year, no zone); c10's own
# logger (c10/util/Logging.cpp MessageLogger, PyTorch built without glog, 2.x) writes the month
# unpadded and nanoseconds: "[rank1]:[E825 03:22:41.883011142 ProcessGroupNCCL.cpp:632]" (Aug 25)
_GLOG = re.compile(r"\[?([IWEF])(\d\d|[1-9])(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?\b")
# ISO-8601 and the Python logging forms: "2026-11-21T09:36:03.123Z", "2026-11-21 09:36:03,123",
# "2026-11-21 09:36:03.123456+08:00", "[2026-11-21 09:36:03]"; and Ascend's plog (CANN's
# slog, "2026-11-21-09:36:03.735.123": date and time joined by "-", milliseconds and
# microseconds as ".mmm.uuu").
# The same year-first date with "/" is a common logging datefmt, "%Y/%m/%d %H:%M:%S" (PaddleOCR's
# ppocr/utils/logging.py get_logger: "[2023/06/05 10:02:41] ppocr INFO: ...").
# Not read: torchelastic's failure summary's "  time      : 2026-05-03_22:41:52" (ProcessFailure.
# timestamp_isoformat, "%Y-%m-%d_%H:%M:%S" in local time) dates the failure, not the summary's lines:
# as their line time it put the summary before the watchdog lines it reports on.
_ISO = re.compile(
    r"(\d{4})[-/](\d\d)[-/](\d\d)[T -](\d\d):(\d\d):(\d\d)"
    r"(?:\.(\d{3})\.(\d{3})(?![\d.])|[.,](\d{1,9}))?"
    r"(?: ?(Z|[+-]\d\d:?\d\d)(?![\d:]))?"
)
# The head of an Ascend plog line, "[ERROR] HCCL(12345,python):" (level, module, pid and
# process name); the timestamp follows at once. Process names can push it past _NEAR. MindSpore's
# Python logger writes the same head with the thread after the pid, "[INFO] ME(2207731:2814734,
# MainProcess):" (mindspore/log.py format '[%(levelname)s] %(sub_module)s(%(process)d:%(thread)d,
# %(processName)s):%(asctime)s ...', as MindInsight's LOG_FORMAT).
_PLOG_HEAD = re.compile(r"\s*\[[A-Z]+\] [A-Za-z][\w-]*\(-?\d+(?::\d+)?,[^()\s]{0,64}\):")
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}
_MONTH = "(" + "|".join(_MONTHS) + ")"
# syslog / journald short (RFC 3164): "Nov 21 09:36:03 gpu-node-7 kernel: ...", "Nov  1 ...";
# no year, no zone. journalctl -o short-precise adds microseconds.
_SYSLOG = re.compile(_MONTH + r" {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))? ")
# dmesg -T and C's ctime(): "[Sat Nov 21 09:36:03 2026]" (weekday, month, day, time, year).
_CTIME = re.compile(r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MONTH
                    + r" {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})(?![\d:])")
# vLLM's own logger (vllm/logger.py: _FORMAT "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d]
# %(message)s", _DATE_FORMAT "%m-%d %H:%M:%S"): "INFO 11-13 09:15:02 [loggers.py:118] ..."; no year,
# no zone. vLLM v1 puts its "(APIServer pid=611) " process prefix before it (a rank prefix here).
_LEVEL_MD = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?![\d:.-])")
# Apache Spark's log4j console layout, its default in every release's conf template
# (conf/log4j.properties.template "%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n"; log4j2.properties.template
# from 3.3, the same pattern with "%ex"): "20/01/06 22:12:57 INFO SparkContext: ...", a two-digit year
# (this century), no fraction, no zone. Read only when the level word follows, so that another
# program's "01/06/20 ..." (month first) is not taken for it.
_SPARK = re.compile(r"(\d\d)/(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d) (?=(?:TRACE|DEBUG|INFO|WARN|ERROR|FATAL) )")
_LEAD = re.compile(r"[\s\[(]*")  # what may come before a timestamp "at the start"
# Slurm's cancel line, its stamp mid-line: slurmstepd's "*** JOB 123 ON nid001 CANCELLED AT
# 2026-03-23T18:40:07 DUE TO TIME LIMIT ***" ("STEP 123.0" for a step; "DUE TO PREEMPTION", "NODE
# FAILURE, ...", "JOB REQUEUE", or nothing for an scancel; older Slurm without "ON <node>") and srun's
# "*** STEP %u.%u CANCELLED AT %s DUE TO TIME LIMIT ***" (src/slurmd/slurmstepd/req.c
# _handle_signal_container, src/srun/.../srun_job.c|launch.c _timeout_handler). The time is
# slurm_make_time_str's: ISO "%Y-%m-%dT%H:%M:%S" by default, the node's local time, no zone.
_CANCEL_AT = re.compile(r"\*\*\* (?:JOB|STEP) [\w.+]+(?: ON \S+)? CANCELLED AT "
                        r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\b")
_NEAR = 40  # characters: how far into the line an ISO timestamp may start

# The last time of day (from ``pos`` on); the line holding it is parsed from its start: every
# timestamp format above has one within the first _HEAD_BYTES of its line (rank prefixes and a plog head included). Greedy and unanchored, it
# runs from the end in C (about 7 ms per MiB without a match; a line-anchored form took 16).
_HEAD_BYTES = 240
_ANY_CLOCK = re.compile(r"\d\d:\d\d:\d\d")  # in every timestamp format above: a line without one has none
_MAX_TRIES = 16  # lines with a time of day but no timestamp tried before giving up

_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_LEVEL_WORD = re.compile(r"\b(CRITICAL|FATAL|ERROR|WARNING|WARN|INFO)\b")
_WORD_LEVELS = {"FATAL": "CRITICAL", "WARN": "WARNING"}
_LEVEL_SPAN = 100  # characters: a level word further in is message text, not the line's level


def clean(raw: bytes) -> str:
    """Decodes one raw line into text: UTF-8 with bad bytes replaced, no line ending, no ANSI codes.

    Args:
        raw: one line as read (may hold invalid UTF-8, a trailing ``\\r\\n``, terminal escapes).

    Returns:
        The text, with U+FFFD for each undecodable byte, trailing ``\\r``/``\\n`` removed, and
        ANSI escape sequences (CSI colours such as ``\\x1b[1;32m``, OSC titles, other ESC
        sequences) removed. Never raises.
    """
    text = raw.decode("utf-8", errors="replace")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text.rstrip("\r\n")


def split_rank_prefix(text: str) -> tuple[int | None, str]:
    """Recognises and removes the rank prefixes at the start of a line.

    Recognised: PyTorch's ``[rank3]:``, torchrun's ``[default3]:`` (any ``[<role><digits>]:``,
    e.g. ``[trainer12]:``) and the older ``3: `` (digits, colon, space), each with one optional
    space after it; Ray's ``(TaskRunner pid=467613) `` / ``(pid=45601, ip=10.0.0.2) `` is removed
    too, but names no rank (a traceback behind it joins into one record all the same). Stacked prefixes (``[default1]:[rank1]: msg``) are all removed; the rank is
    the innermost one, the closest to the message. In ``[rank3]:[W1121 09:36:03.735000 ...]``
    only ``[rank3]:`` goes. Indentation after the one space is kept (traceback frames).

    Args:
        text: a cleaned line.

    Returns:
        (rank, rest), or (None, text) when there is no prefix.
    """
    rank: int | None = None
    pos = 0
    for _ in range(_MAX_PREFIXES):
        m = _RANK_PREFIX.match(text, pos)
        if m is None:
            break
        digits = m.group(1) or m.group(2)
        if digits is not None:                  # a Ray prefix names no rank
            rank = int(digits)
        pos = m.end()
    return rank, text[pos:]


# A whole RFC 3339 timestamp and one space at the start of a line: what `kubectl logs --timestamps`
# and `docker logs --timestamps` put before every line they print (Kubernetes kubectl reference,
# "--timestamps: Include timestamps on each line in the log output", RFC3339Nano; docker CLI
# reference, "docker container logs --timestamps"), and what log shippers and job UIs (Beaker,
# cloud log viewers) keep when a log is copied out.
_STAMP_PREFIX = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) ")


def strip_stamp_prefix(text: str) -> str:
    """``text`` without a leading RFC 3339 timestamp and its one space (``kubectl logs
    --timestamps``' ``2026-08-07T22:58:24.992Z ``), or ``text`` unchanged.

    For joining a traceback whose every line carries the stamp: its frames are indented only after
    it (``ftwatch.rules.engine``). Only the stamp-then-space shape counts (a 'T' between date and
    time, a zone), so a Python logging line (``2026-08-07 22:58:24,992 - root - ...``) keeps its text.
    """
    m = _STAMP_PREFIX.match(text)
    return text[m.end():] if m else text


def rank_prefix_at(data: bytes, pos: int) -> tuple[int | None, int]:
    """``split_rank_prefix`` on the raw line of ``data`` starting at ``pos``, without decoding it
    and in one regex match: (rank or None, the offset where the text after the prefixes starts).
    For the step tap, which reads its fields from a chunk's bytes (ANSI escapes already removed)."""
    m = _RANK_PREFIXES_BYTES.match(data, pos)
    if m is None:
        return None, pos
    return int(m.group(1) or m.group(2)), m.end()


@functools.lru_cache(maxsize=4096)
def _whole_seconds(year: int | str, month: str, day: str, hour: str, minute: str, second: str) -> float | None:
    """Epoch seconds of a UTC date and time given as strings, None when impossible. Cached: the
    lines of one second (every rank's step line, a burst of errors) share one conversion."""
    try:
        fields = (int(year), int(month), int(day), int(hour), int(minute), int(second))
        datetime(*fields)  # validates
    except ValueError:
        return None
    return float(calendar.timegm(fields + (0, 0, 0)))


def _epoch(parts: tuple[str | None, ...], year: int | None, zone: str | None) -> float | None:
    """Returns epoch seconds from (year?, month, day, hour, minute, second, fraction) strings.

    A missing zone means UTC. Returns None for an impossible date or time (Feb 30, 25:00).
    """
    if year is None:
        year_s, month, day, hour, minute, second, frac = parts
        seconds = _whole_seconds(year_s, month, day, hour, minute, second)
    else:
        month, day, hour, minute, second, frac = parts
        seconds = _whole_seconds(year, month, day, hour, minute, second)
    if seconds is None:
        return None
    if frac:
        seconds += int(frac) / 10 ** len(frac)
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return seconds


#: ``[YYYY-MM-DD HH:MM`` (the head of Megatron's ``[2026-11-21 09:00:01] iteration ...`` stamp): the
#: minute's epoch seconds, None for an impossible one, :data:`_NOT_BRACKETED` for another shape (cleared
#: past 4,096 minutes)
_BRACKET_MINUTE = re.compile(r"\[(\d{4})-(\d\d)-(\d\d)[T -](\d\d):(\d\d)")
_NOT_BRACKETED = object()
_minutes: dict[str, object] = {}


def _bracketed(text: str) -> object:
    """:func:`parse_timestamp` of a line that opens with ``[YYYY-MM-DD HH:MM:SS]`` (no fraction, no
    zone), or :data:`_NOT_BRACKETED` for any other line. The same answer: no rank prefix, glog,
    syslog, vLLM, ctime or plog head can open such a line, so the general path ends in ``_ISO`` at
    its second character, with no fraction or zone before the ``]``. Its minute is read once
    (:data:`_minutes`), the second added (``calendar.timegm`` is linear in it; a second past 59 is
    impossible, as ``datetime`` says). ~0.5 us a line against ~5 us on the general path."""
    if text[:1] != "[" or text[17:18] != ":" or text[20:21] != "]":
        return _NOT_BRACKETED
    second = text[18:20]
    if not (second.isascii() and second.isdigit()):
        return _NOT_BRACKETED
    key = text[:17]
    minute = _minutes.get(key)
    if minute is None and key not in _minutes:
        m = _BRACKET_MINUTE.fullmatch(key)
        if len(_minutes) >= 4096:
            _minutes.clear()
        minute = _minutes[key] = _NOT_BRACKETED if m is None else _whole_seconds(*m.groups(), "00")
    if minute is None or minute is _NOT_BRACKETED:
        return minute
    seconds = int(second)
    return minute + seconds if seconds < 60 else None


def parse_timestamp(text: str, year: int | None, vllm: bool = False) -> float | None:
    """Finds a timestamp at or near the start of a line and converts it to epoch seconds.

    Formats (rank prefixes are skipped first):

    * glog ``E1121 09:36:03.735000 140 file.cc:12]``, also bracketed as PyTorch's C++ warnings
      print it (``[W1121 09:36:03.735000 ...]``); no year.
    * syslog / journald (RFC 3164), as kernel lines reach ``/var/log/kern.log`` or
      ``journalctl -k``: ``Nov 21 09:36:03 gpu-node-7 kernel: NVRM: Xid ...`` (``Nov  1`` too,
      microseconds as ``journalctl -o short-precise`` prints them); no year.
    * with ``vllm``: vLLM's logger (``vllm/logger.py``: level, then ``%m-%d %H:%M:%S``),
      ``INFO 11-13 09:15:02 [loggers.py:118] Engine 000: ...``; no year, whole seconds. Only
      the replay's hang scan asks for it (a silence of minutes is what it measures); the
      engine's line clock does not, because a whole-second stamp placed before a glog stamp
      of the same second (``W1212 12:10:10.102944``) would reorder the findings that root
      cause ranks by time.
    * ``dmesg -T`` (util-linux, C's ``ctime`` form): ``[Sat Nov 21 09:36:03 2026] NVRM: ...``.
    * Apache Spark's log4j console layout (``yy/MM/dd HH:mm:ss`` then the level), as a Spark
      driver or executor log prints it: ``20/01/06 22:12:57 INFO SparkContext: ...``.
    * ISO-8601 ``2026-11-21T09:36:03.123Z``, with ``+08:00``/``+0800`` or no zone; Python
      logging ``2026-11-21 09:36:03,123``; ``2026-11-21 09:36:03.123456``;
      ``[2026-11-21 09:36:03]``; the date also with ``/`` (``[2023/06/05 10:02:41]``, PaddleOCR's datefmt).
    * Ascend plog (CANN slog): ``[ERROR] HCCL(12345,python):2026-11-21-09:36:03.735.123 [...]``,
      and that ``2026-11-21-09:36:03.735.123`` form (date and time joined by ``-``,
      milliseconds and microseconds as ``.mmm.uuu``) wherever an ISO date may stand.

    * Slurm's cancel line, whose stamp stands mid-line after the ``slurmstepd: error:`` head:
      ``*** JOB 123 ON nid001 CANCELLED AT 2026-03-23T18:40:07 DUE TO TIME LIMIT ***`` (and
      ``*** STEP 123.0 ...``, srun's too). The line is written when the scheduler signals the
      job, so that is its time (an scancel or time limit after hours of silence comes after
      that silence, as live). The stamp is the node's local time without a zone, read as every
      zoneless stamp is (the glog, syslog and Python ``asctime`` stamps beside it are local too).

    glog, syslog, vLLM and dmesg stamps must open the line (after spaces and brackets); an ISO or
    plog date may start within the first 40 characters (``INFO 2026-11-21 ...``), or right after
    a plog head however long its process name. Raw ``dmesg`` (``[12345.678901]``, seconds
    since boot) is no timestamp.

    Args:
        text: a cleaned line.
        year: the year for glog, syslog and vLLM timestamps, which have none (the year the line was
            received); None: such timestamps give None (only stamps with a year count).
        vllm: also read vLLM's ``LEVEL MM-DD HH:MM:SS`` form.

    Returns:
        Epoch seconds (float, fractions to the digit given; UTC unless the text gives an offset),
        or None when there is no valid timestamp.
    """
    stamp = _bracketed(text)
    if stamp is not _NOT_BRACKETED:
        return stamp
    if _ANY_CLOCK.search(text) is None:
        return None                     # every format has a time of day: none here, no stamp
    _, rest = split_rank_prefix(text)
    if rest is not text:
        m = _CTIME.match(text)          # mpirun --timestamp-output: ctime in the rank prefix
        if m is not None:
            month, day, hour, minute, second, year_s = m.groups()
            return _epoch((year_s, str(_MONTHS[month]), day, hour, minute, second, None), None, None)
        stamp = _bracketed(rest)
        if stamp is not _NOT_BRACKETED:
            return stamp
    start = _LEAD.match(rest).end()
    m = _GLOG.match(rest, start)
    if m is not None:
        return None if year is None else _epoch(m.groups()[1:], year, None)
    m = _SYSLOG.match(rest, start)
    if m is not None:
        if year is None:
            return None
        return _epoch((str(_MONTHS[m.group(1)]),) + m.groups()[1:], year, None)
    m = _LEVEL_MD.match(rest, start) if vllm else None
    if m is not None:
        return None if year is None else _epoch(m.groups(), year, None)
    m = _CTIME.match(rest, start)
    if m is not None:
        month, day, hour, minute, second, year_s = m.groups()
        return _epoch((year_s, str(_MONTHS[month]), day, hour, minute, second, None), None, None)
    m = _SPARK.match(rest, start)
    if m is not None:
        yy, month, day, hour, minute, second = m.groups()
        return _epoch((f"20{yy}", month, day, hour, minute, second, None), None, None)
    head = _PLOG_HEAD.match(rest)
    if head is not None:
        m = _ISO.match(rest, head.end())
    else:
        m = _ISO.search(rest, 0, _NEAR + 64)
        if m is not None and m.start() > _NEAR:
            m = None
    if m is not None:
        millis, micros, frac = m.group(7, 8, 9)
        return _epoch(m.groups()[:6] + (millis + micros if millis else frac,), None, m.group(10))
    return cancel_stamp(rest) if "CANCELLED AT" in rest else None


def cancel_stamp(text: str) -> float | None:
    """The epoch seconds of a Slurm ``*** JOB|STEP ... CANCELLED AT <time> ***`` line; None otherwise.

    The time has no zone (the node's local time, as the log's other zoneless stamps): read as
    :func:`parse_timestamp` reads a zoneless ISO stamp, so the two compare.
    """
    m = _CANCEL_AT.search(text)
    return None if m is None else _epoch(m.groups() + (None,), None, None)


def last_timestamp(data: bytes, lo: int, hi: int, year: int | None) -> tuple[int, float] | None:
    """Finds the last line starting in ``data[lo:hi]`` that carries a timestamp.

    The candidates (lines with a time of day near their start) are found from the end by
    :func:`last_clock` (regex searches in C); only they are decoded and parsed (:func:`parse_timestamp`), at most
    16 of them (a clock that ends a longer count, tqdm's ETA ``<104:10:00``, is none and costs
    no try: more than 16 such bars once hid the stamp before them). So a chunk's lines that carry no timestamp cost no Python work.

    Args:
        data: complete lines (``b"\\n"``-separated), ANSI escapes removed or not.
        lo: where the search starts: 0 or the start of a line.
        hi: where it ends (exclusive): the start of the line whose predecessor is wanted, or
            ``len(data)``.
        year: the year for stamps without one (glog, syslog); None: those do not count.

    Returns:
        (the line's start offset, epoch seconds), or None when no line there has a timestamp.
    """
    if _CLOCK_COLON.search(data, lo + 2, hi) is None:
        # no time of day wholly in the span (its first colon, two digits on each side after it):
        # found by one forward search led by the colon, without :func:`last_clock`'s windows
        # (issue 16: most lines between two hits of a traceback hold none, ~8 us a record)
        return None
    end = hi
    tries = 0
    while tries < _MAX_TRIES:
        if end <= lo:
            return None
        clock = last_clock(data, lo, end)
        if clock < 0:
            return None
        if clock > lo and data[clock - 1] in _DIGIT_BYTES:
            end = clock             # the tail of a longer count (tqdm's ETA ``<104:10:00``): no time of
            continue                # day and no try; the line before it may still hold its stamp
        tries += 1
        line = data.rfind(b"\n", lo, clock)
        line = lo if line < 0 else line + 1
        head = line + _HEAD_BYTES
        eol = data.find(b"\n", line, head)      # the line's head: a later time of day is no stamp
        stamp = parse_timestamp(clean(data[line:eol if eol >= 0 else head]), year)
        if stamp is not None:
            return line, stamp
        end = line
    return None


_FEW = 256                 # ``Stamps``: questions answered by regex before the times of day are listed
_CLOCK_COLON = re.compile(rb":(?=\d\d:\d\d)")   # the first colon of a time of day (its digits before it)
_DIGIT_BYTES = frozenset(b"0123456789")
_FIRST_LOOK = 256          # ``last_clock``: bytes before ``hi`` searched first, then 4x as many each time


def last_clock(data: bytes, lo: int, hi: int) -> int:
    """The offset of the last time of day (``\\d\\d:\\d\\d:\\d\\d``, its eight bytes) wholly in
    ``data[lo:hi]``, -1 when none is: what ``re.match(rb"(?s).*(\\d\\d:\\d\\d:\\d\\d)", ...)``'s
    group 1 starts at, found faster.

    That regex backtracks from ``hi`` byte by byte (~10-20 ns a byte in ``re``): a search back over
    lines without a clock (a traceback's frames, untimed step lines) cost ~60 us per 6 KB, ~6 % of a
    bench replay (issue 16). Here windows that end at ``hi`` and grow 4x each time (from
    :data:`_FIRST_LOOK` bytes, each overlapping the one after it by seven, so that no clock across
    their border is missed) are searched forward by :data:`_CLOCK_COLON`, led by its literal colon
    (~1-2 ns a byte), the last hit whose two bytes before are digits taken: about 10x faster far
    from the clock, and no slower near it.

    Args:
        data: the bytes.
        lo: where the span starts (its first clock may start there).
        hi: where it ends (exclusive; a clock must end by it).
    """
    end, width, digits = hi, _FIRST_LOOK, _DIGIT_BYTES
    while True:
        start = max(lo, end - width)
        found = -1
        for m in _CLOCK_COLON.finditer(data, start + 2, end):
            colon = m.start()
            if data[colon - 2] in digits and data[colon - 1] in digits:
                found = colon
        if found >= 0:
            return found - 2
        if start <= lo:
            return -1
        end, width = min(hi, start + 7), width * 4


class Stamps:
    """:func:`last_timestamp` asked many times over one chunk (the step tap's and the progress
    reader's clocks): past its first few questions (regex searches, as :func:`last_timestamp`'s),
    the chunk's times of day are listed once, in one C pass (a search led by a colon, ~20 ms per
    30 MB), and each search is a bisection over them; each line tried is parsed once.
    :meth:`last` answers exactly what :func:`last_timestamp` answers.

    Args:
        data: complete lines, as for :func:`last_timestamp`.
        year: the year for stamps without one.
    """

    def __init__(self, data: bytes, year: int | None):
        self.data, self.year = data, year
        self._clocks: list[int] | None = None
        self._asked = 0                          # the first ``_FEW`` questions are answered by regex
        self._parsed: dict[int, float | None] = {}

    def clocks(self) -> list[int]:
        """The offsets of every time of day (``\\d\\d:\\d\\d:\\d\\d``, overlapping ones too), sorted."""
        if self._clocks is None:
            data, digits = self.data, _DIGIT_BYTES
            self._clocks = [c for c in (m.start() - 2 for m in _CLOCK_COLON.finditer(data))
                            if c >= 0 and data[c] in digits and data[c + 1] in digits]
        return self._clocks

    def _few(self) -> bool:
        """Whether to answer by a regex search (a chunk asked a few times, e.g. once per rank, need
        not have its times of day listed)."""
        self._asked += 1
        return self._clocks is None and self._asked <= _FEW

    def has_clock(self, lo: int, hi: int) -> bool:
        """Whether a time of day lies wholly in ``data[lo:hi]``."""
        if self._few():
            return last_clock(self.data, lo, hi) >= 0
        clocks = self.clocks()
        i = bisect.bisect_left(clocks, lo)
        return i < len(clocks) and clocks[i] + 8 <= hi

    def last(self, lo: int, hi: int) -> tuple[int, float] | None:
        """``last_timestamp(data, lo, hi, year)``."""
        few = self._few()
        data, clocks = self.data, None if few else self.clocks()
        end = hi
        for _ in range(_MAX_TRIES):
            if end <= lo:
                return None
            if few:
                clock = last_clock(data, lo, end)
                if clock < 0:
                    return None
            else:
                i = bisect.bisect_right(clocks, end - 8) - 1    # the last time of day ending by ``end``
                if i < 0 or clocks[i] < lo:
                    return None
                clock = clocks[i]
            line = data.rfind(b"\n", lo, clock)
            line = lo if line < 0 else line + 1
            stamp = self._parsed.get(line, self)
            if stamp is self:
                head = line + _HEAD_BYTES
                eol = data.find(b"\n", line, head)      # the line's head: a later time of day is no stamp
                stamp = self._parsed[line] = parse_timestamp(clean(data[line:eol if eol >= 0 else head]), self.year)
            if stamp is not None:
                return line, stamp
            end = line
        return None


_REPLACE_FROM = 2048       # ``newlines``: spans of this many bytes and more are counted by a replace


def newlines(data: bytes, start: int = 0, end: int | None = None) -> int:
    """``data.count(b"\\n", start, end)``, faster for a long span.

    ``bytes.count`` of one byte compares byte by byte (CPython 3.11: ~0.33-0.54 ms a MiB, the
    most of a bench replay's line counting: a chunk's lines are counted whole for the metrics and
    the engine, issue 16); ``bytes.replace`` finds the newlines with ``memchr`` and copies what
    is between them, ~4x faster over a MiB (0.13 ms) even with its copy and the span's, and
    faster from a few KiB on (measured: 4 KiB 2.6 against 1.1 us). The copies live only during
    the call. Shorter spans are counted in place.

    Args:
        data: the bytes.
        start, end: the span, as for ``bytes.count`` (offsets within ``data``; ``end`` None: its end).
    """
    size = len(data)
    if end is None or end > size:
        end = size
    if start < 0 or end - start < _REPLACE_FROM:
        return data.count(b"\n", start, end)
    part = data if start == 0 and end == size else data[start:end]
    return len(part) - len(part.replace(b"\n", b""))


def year_of(t: float) -> int:
    """The UTC year of epoch seconds ``t``: the year for stamps that carry none (glog, syslog).

    Asked for every chunk fed and read (``watch`` with 1,000 pods: thousands of times a second,
    ~2 us each through ``datetime``), so the last year's span is kept and a time inside it is
    answered by two comparisons; its last second is left to ``datetime`` (which rounds to the
    microsecond, so ``end - 1e-7`` is already next year there). Raises as ``datetime`` does.
    """
    start, end, year = _YEAR_SPAN
    if start <= t < end:
        return year
    year = datetime.fromtimestamp(t, tz=timezone.utc).year
    if 1 < year < 9999:
        _remember_year(year)
    return year


def _remember_year(year: int) -> None:
    global _YEAR_SPAN
    start = datetime(year, 1, 1, tzinfo=timezone.utc).timestamp()
    _YEAR_SPAN = (start, datetime(year + 1, 1, 1, tzinfo=timezone.utc).timestamp() - 1.0, year)


_YEAR_SPAN = (0.0, 0.0, 0)   # [start, end) epoch seconds of the year last asked for, and the year


def level_of(text: str) -> str | None:
    """Says the level of a line: ``ERROR``, ``WARNING``, ``INFO`` or ``CRITICAL``, else None.

    From a glog letter opening the line (``E1121 ...``, also after a rank prefix or in brackets;
    ``F`` is CRITICAL), else from the first upper-case level word in the first 100 characters
    (``NCCL WARN`` is WARNING, ``FATAL`` is CRITICAL). ``Error`` in ``RuntimeError`` is no level.

    Args:
        text: a cleaned line.
    """
    _, rest = split_rank_prefix(text)
    m = _GLOG.match(rest, _LEAD.match(rest).end())
    if m is not None:
        return _GLOG_LEVELS[m.group(1)]
    m = _LEVEL_WORD.search(rest, 0, _LEVEL_SPAN)
    if m is not None:
        word = m.group(1)
        return _WORD_LEVELS.get(word, word)
    return None
