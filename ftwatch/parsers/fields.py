"""Extracts the fields of one log line: clean text, rank prefix, timestamp, level (SPEC P2).

Run on lines that a rule matched (and on block lines), so these favour clarity over speed; the
exception is the one stamp shape that the progress reader (``ftwatch.policy.progress.marks``) dates on
thousands of step lines a replay, Megatron's ``[YYYY-MM-DD HH:MM:SS]``, read by a cached shortcut
that gives the same answer (:func:`_bracketed`). None of them raises on odd input: bad bytes are
replaced, unknown formats give None. Over 400 lines because each stamp format needs its regex and its
reading, and they belong together: one line's fields.
"""

from __future__ import annotations

import calendar
import functools
import re
from datetime import datetime, timezone

__all__ = ["clean", "split_rank_prefix", "strip_stamp_prefix", "parse_timestamp", "year_of", "level_of"]

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

_ANY_CLOCK = re.compile(r"\d\d:\d\d:\d\d")  # in every timestamp format above: a line without one has none

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
