"""C4D diagnosis records (SPEC R8): parse, grade, and turn into what the policy acts on.

C4D ("Calibrating Collective Communication over Converged ethernet - Diagnosis", PAI-DLC with ACCL;
seeds/000, C4D配置说明) gathers the collective-communication state of every node and writes its
diagnosis into the AIMaster log. Four record types: ``RankCommHang`` (a node hangs in
communication), ``RankNonCommHang`` (a hang outside communication, e.g. in compute),
``RankCommSlow`` and ``RankNonCommSlow`` (slow, communication or not). Levels and what AIMaster
does with them (same section):

* ``Error``: a communication hang longer than ``C4D_HANG_TIMEOUT`` x ``C4D_HANG_TIMES`` (10 s x 18 =
  3 min by default) -> AIMaster isolates the node named in the record and relaunches the job:
  ftwatch ``isolate_node`` (only with ``--enable-c4d-hang-detection``, which itself needs
  ``--enable-job-hang-detection``; otherwise notify);
* ``Warn``: a communication hang over ``C4D_HANG_TIMEOUT`` (hurts speed, not fatal) or a
  non-communication hang over it (may be fatal) -> no isolation, a person confirms: ``notify``;
* ``Info``: slowness (communication or not), for performance work -> ``notify``.

``C4D_HANG_TIMEOUT`` (microseconds, default 10 000 000) is how long a hang lasts before a Warn;
``C4D_HANG_TIMES`` (default 18) is how many such timeouts in a row make an Error. ftwatch applies
the same arithmetic when C4D's own settings differ from the job's ``--c4d-common-envs``: a Warn hang
whose ``times`` reaches C4D_HANG_TIMES, or whose ``duration`` reaches timeout x times, or the
C4D_HANG_TIMES-th Warn hang in a row of one rank (each at most ``ROW_GAP`` x C4D_HANG_TIMEOUT
after the one before), is graded Error.

Line format. The seed shows the diagnosis results only as screenshots, so the text form is ours,
built from the fields the seed names (level, record type, the node and rank concerned)::

    [C4D] Error RankCommHang rank=3 node=gpu-node-7 duration=182.4s times=18 op=AllReduce

``[C4D]``, a level (``Error``/``Warn``/``Warning``/``Info``, any case), a record type, then
``key=value`` pairs in any order: ``rank``, ``node`` (or ``host``/``ip``), ``duration`` (seconds;
``s``/``ms``/``us`` suffixes), ``times``; others are kept as fields. The built-in pack ``c4d.yaml``
finds these lines (one rule per level); ``refine`` reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity

TYPES = ("RankCommHang", "RankNonCommHang", "RankCommSlow", "RankNonCommSlow")
LEVELS = ("Info", "Warning", "Error")
_LINE = re.compile(r"\[C4D\]\s+(?P<level>error|warn(?:ing)?|info)\s+(?P<type>Rank(?:Non)?Comm(?:Hang|Slow))\b"
                   r"(?P<rest>.*)", re.IGNORECASE)
_KV = re.compile(r"([A-Za-z_][\w.-]*)=(\"[^\"]*\"|\S+)")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)?$")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}
#: Two Warn hangs of one rank more than ROW_GAP x C4D_HANG_TIMEOUT apart are not "in a row" (ours:
#: the seed says only "连续"; C4D writes one per timeout while a hang lasts, 2 allows one late line).
ROW_GAP = 2.0


@dataclass(frozen=True)
class C4DRecord:
    """One C4D diagnosis line.

    Attributes:
        level: ``Info``, ``Warning`` or ``Error``.
        type: one of ``TYPES``.
        rank, node: the rank and node the record names (None when absent).
        duration: seconds the hang or slowness lasted, when given.
        times: how many C4D_HANG_TIMEOUT periods the hang lasted, when given.
        extra: the other ``key=value`` pairs.
    """

    level: str
    type: str
    rank: int | None
    node: str | None
    duration: float | None
    times: int | None
    extra: dict[str, str]

    @property
    def hang(self) -> bool:
        return self.type.endswith("Hang")


@functools.lru_cache(maxsize=4096)
def parse_line(line: str) -> C4DRecord | None:
    """Parse a C4D line (see the module docstring); None when ``line`` is not one.

    Cached: the trigger test (``ftwatch.policy.triggers``) and :func:`refine` both read a C4D
    finding's line, and a line is parsed once. The record is shared: never change its ``extra``.
    """
    m = _LINE.search(line)
    if not m:
        return None
    word = m.group("level").lower()
    level = "Error" if word == "error" else "Info" if word == "info" else "Warning"
    kind = next(t for t in TYPES if t.lower() == m.group("type").lower())
    pairs = {k.lower(): v.strip('"') for k, v in _KV.findall(m.group("rest"))}
    rank = pairs.pop("rank", None)
    node = pairs.pop("node", None) or pairs.pop("host", None) or pairs.pop("ip", None)
    dur = _DURATION.match(pairs.pop("duration", "") or "")
    times = pairs.pop("times", None)
    return C4DRecord(level, kind, int(rank) if rank and rank.isdigit() else None, node,
                     float(dur.group(1)) * _UNIT[dur.group(2)] if dur else None,
                     int(times) if times and times.isdigit() else None, pairs)


@dataclass(frozen=True)
class C4DSettings:
    """How C4D records are graded (AIMaster flags; seeds/000).

    Attributes:
        enabled: ``--enable-c4d-hang-detection`` and ``--enable-job-hang-detection`` both on.
        hang_timeout: seconds (``C4D_HANG_TIMEOUT`` / 1e6), default 10.
        hang_times: ``C4D_HANG_TIMES``, default 18.
        log_level: ``--c4d-log-level``: records below it are ignored (default ``Warning``).
    """

    enabled: bool = False
    hang_timeout: float = 10.0
    hang_times: int = 18
    log_level: str = "Warning"


def is_c4d(f: Finding) -> bool:
    """True for a finding of the C4D pack (``c4d.*``)."""
    return f.rule_id.startswith("c4d.")


def grade(record: C4DRecord, settings: C4DSettings, warns_in_a_row: int = 1) -> tuple[str, str]:
    """The level ftwatch acts on and why: (level, reason).

    A Warn hang becomes Error when its ``times`` reaches ``hang_times``, its ``duration`` reaches
    ``hang_timeout * hang_times``, or it is the ``hang_times``-th Warn hang in a row of its rank.
    """
    if record.level == "Warning" and record.hang:
        limit = settings.hang_timeout * settings.hang_times
        if record.times is not None and record.times >= settings.hang_times:
            return "Error", f"times={record.times} >= C4D_HANG_TIMES={settings.hang_times}"
        if record.duration is not None and record.duration >= limit:
            return "Error", f"hung {record.duration:g} s >= C4D_HANG_TIMEOUT x C4D_HANG_TIMES = {limit:g} s"
        if warns_in_a_row >= settings.hang_times:
            return "Error", f"{warns_in_a_row} Warn hangs in a row >= C4D_HANG_TIMES={settings.hang_times}"
    return record.level, f"C4D level {record.level}"


def refine(findings: Sequence[Finding], settings: C4DSettings) -> tuple[Finding, ...]:
    """Grade every C4D finding and point it at the node and rank its record names.

    Returns:
        (findings with each C4D finding replaced: Error -> isolate_node, severity error, class hang
        (slow: straggler), origin node/rank from the record, or notify when C4D detection is off;
        Warn/Info -> notify, severity warning/info; below ``log_level`` -> none, class info;
        ``fields`` gain ``c4d_type``, ``c4d_level``, ``c4d_reason``, ``node``, ``rank``), in the
        order given.
    """
    new_of: dict[int, Finding] = {}
    streak: dict[tuple[str | None, int | None, str], int] = {}
    last: dict[tuple[str | None, int | None, str], float] = {}
    for f in sorted(findings, key=lambda x: (x.time, x.seq)):
        rec = parse_line(f.line) if is_c4d(f) else None
        if rec is None:
            continue
        key = (rec.node, rec.rank, rec.type)
        # "in a row": C4D writes a Warn every C4D_HANG_TIMEOUT while the hang lasts; Warns further
        # apart than ROW_GAP timeouts are separate hangs, and the count starts again
        contiguous = key in last and f.time - last[key] <= ROW_GAP * settings.hang_timeout
        streak[key] = (streak.get(key, 0) if contiguous else 0) + 1 if rec.level == "Warning" and rec.hang else 0
        last[key] = f.time
        level, reason = grade(rec, settings, streak[key])
        origin = f.origin
        if rec.node or rec.rank is not None:
            origin = Origin(f"rank{rec.rank}" if rec.rank is not None else f.origin.instance,
                            rec.rank if rec.rank is not None else f.origin.rank, f.origin.job,
                            rec.node or f.origin.node, f.origin.stream, f.origin.source)
        fields = dict(f.fields) | {"c4d_type": rec.type, "c4d_level": level, "c4d_reason": reason,
                                   "node": origin.node, "rank": rec.rank, **rec.extra}
        cls = FailureClass.HANG if rec.hang else FailureClass.STRAGGLER
        if LEVELS.index(level) < LEVELS.index(settings.log_level):
            new = dataclasses.replace(f, origin=origin, fields=fields, action=Action.NONE,
                                      failure_class=FailureClass.INFO, severity=Severity.INFO)
        elif level == "Error" and settings.enabled:
            new = dataclasses.replace(f, origin=origin, fields=fields, action=Action.ISOLATE_NODE,
                                      failure_class=cls, severity=Severity.ERROR)
        else:
            severity = Severity.INFO if level == "Info" else Severity.WARNING
            new = dataclasses.replace(f, origin=origin, fields=fields, action=Action.NOTIFY,
                                      failure_class=cls, severity=severity)
        new_of[id(f)] = new
    return tuple(new_of.get(id(f), f) for f in findings)


def _who(f: Finding) -> str:
    return f"{f.fields.get('c4d_type', f.rule_id)} on node {f.origin.node}" + (
        f" rank {f.rank}" if f.rank is not None else "")


def error_clause(f: Finding) -> str:
    """The clause of a C4D root cause that isolates (a refined Error finding)."""
    return f"R8 C4D Error {_who(f)} ({f.fields.get('c4d_reason', '')}) → isolate the node and restart"


def notify_clause(f: Finding, settings: C4DSettings) -> str:
    """The clause of a C4D finding that only notifies (Warn / Info, or Error with detection off)."""
    level, who = f.fields.get("c4d_level", "?"), _who(f)
    if level == "Error" and not settings.enabled:
        return (f"R8 C4D Error {who}, but C4D detection is off (enable_c4d_hang_detection needs "
                "enable_job_hang_detection) → notify")
    return f"R8 C4D {level} {who}: not isolated automatically, a person confirms → notify"
