"""Unwraps container-runtime log envelopes: Kubernetes CRI lines and docker json-file lines (SPEC S5).

Formats:
    CRI (the Kubernetes CRI logging format, as kubelet's CRI API docs and containerd/CRI-O
    write it under ``/var/log/pods``): one line per write,
    ``<RFC3339Nano time> <stdout|stderr> <tags> <message>``, e.g.
    ``2026-11-21T09:36:03.735123456Z stderr F KeyError: 'lr'``. ``tags`` is ``F`` (full: the
    message ends a line) or ``P`` (partial: the runtime cut a long line, commonly at 16 KiB,
    and the next ``P``/``F`` line of the same stream continues it); several tags are joined by
    ``:``. The message has no newline of its own.
    docker json-file (docker's ``json-file`` logging driver): one JSON object per line,
    ``{"log":"...\\n","stream":"stderr","time":"2026-11-21T09:36:03.735123456Z"}``. ``log``
    ends with ``\\n`` when it ends a line; docker cuts lines longer than 16 KiB into pieces
    whose ``log`` has no trailing ``\\n``.

Nothing here raises on bad input (SPEC Q1): a line that is not its declared envelope parses to
None. Joining the pieces of split lines, and unwrapping shipped records, is
:mod:`ftwatch.parsers.joiners`.
"""

from __future__ import annotations

import calendar
import json
import re
from datetime import datetime
from typing import NamedTuple

__all__ = ["CriLine", "DockerLine", "parse_rfc3339", "parse_cri", "parse_docker"]

_TIME = rb"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9})\d*)?(Z|z|[+-]\d\d:?\d\d)?"
_RFC3339 = re.compile(_TIME)
_CRI = re.compile(_TIME + rb" (stdout|stderr) ([A-Z]+(?::[A-Z]+)*)(?: |\Z)")   # groups 1-8: time


def _zone_offset(zone: bytes | None) -> int:
    """Seconds east of UTC of ``Z``, ``+08:00`` or ``-0530``; None and ``Z`` are 0."""
    if not zone or zone in (b"Z", b"z"):
        return 0
    digits = zone[1:].replace(b":", b"")
    return (-1 if zone[:1] == b"-" else 1) * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)


_last_second: tuple[bytes, float] = (b"", 0.0)   # one-entry cache: (text up to the second, its epoch)


def parse_rfc3339(text: bytes | str) -> float | None:
    """Converts an RFC 3339 timestamp (Go's ``time.RFC3339Nano`` and kin) to epoch seconds.

    Accepts ``2026-11-21T09:36:03.735123456Z``, a ``+08:00``/``-0530`` offset or none (UTC),
    ``T``/``t``/space between date and time, 0 to 9 fraction digits (more are ignored) and a
    ``,`` decimal mark. The whole text must be the timestamp.

    Args:
        text: the timestamp, bytes or str.

    Returns:
        Epoch seconds (a float: nanoseconds are rounded to about 0.2 microseconds), or None when
        the text is no timestamp or an impossible date (Feb 30, 25:00).
    """
    if isinstance(text, str):
        text = text.encode("ascii", "replace")
    m = _RFC3339.fullmatch(text)
    return None if m is None else _epoch(m, text)


def _epoch(m: re.Match, text: bytes) -> float | None:
    """Epoch seconds of a ``_TIME`` match at the start of ``text`` (groups 1-8); None if impossible."""
    global _last_second
    head = text[:19]
    cached = _last_second           # one read: threads may replace it, never half of it
    if head == cached[0]:
        base = cached[1]
    else:
        try:
            fields = tuple(int(g) for g in m.group(1, 2, 3, 4, 5, 6))
            datetime(*fields)
        except ValueError:
            return None
        base = float(calendar.timegm(fields + (0, 0, 0)))
        _last_second = (head, base)
    frac = m.group(7)
    seconds = base + (int(frac) / 10 ** len(frac) if frac else 0.0)
    zone = m.group(8)
    return seconds if zone is None or zone == b"Z" else seconds - _zone_offset(zone)


class CriLine(NamedTuple):
    """One parsed CRI log line.

    Attributes:
        time: epoch seconds of the runtime's timestamp.
        stream: ``stdout`` or ``stderr``.
        partial: True for a ``P`` piece (the line goes on in the next piece of this stream).
        message: the text after the tags, as written (no newline).
    """

    time: float
    stream: str
    partial: bool
    message: bytes


class DockerLine(NamedTuple):
    """One parsed docker json-file line; a 3-tuple ``(time, stream, message)``.

    Attributes:
        time: epoch seconds of ``time``.
        stream: ``stdout`` or ``stderr`` (whatever ``stream`` holds; ``stdout`` when missing).
        message: the ``log`` field as UTF-8 bytes, verbatim: a complete line ends with ``\\n``, a
            16 KiB piece of a longer line does not (see ``partial``).
    """

    time: float
    stream: str
    message: bytes

    @property
    def partial(self) -> bool:
        """True when the line goes on in the next piece (``log`` does not end with ``\\n``)."""
        return not self.message.endswith(b"\n")


def parse_cri(line: bytes) -> CriLine | None:
    """Parses ``<RFC3339Nano time> <stdout|stderr> <P|F>[:tags] <message>``.

    Args:
        line: one line of a CRI log file; one trailing ``\\n`` is ignored.

    Returns:
        The CriLine, or None when the line is not CRI (bad time, stream or tags). Never raises.
    """
    try:
        if line.endswith(b"\n"):
            line = line[:-1]
        m = _CRI.match(line)
        if m is None:
            return None
        tags = m.group(10)
        partial = tags == b"P" or b"P" in tags.split(b":")
        if not partial and tags != b"F" and b"F" not in tags.split(b":"):
            return None
        t = _epoch(m, line)
        if t is None:
            return None
        return CriLine(t, "stdout" if m.group(9) == b"stdout" else "stderr", partial, line[m.end():])
    except Exception:  # noqa: BLE001 - Q1: a parser never raises into the loop
        return None


def parse_docker(line: bytes) -> DockerLine | None:
    """Parses one docker json-file line ``{"log": ..., "stream": ..., "time": ...}``.

    Invalid UTF-8 in the line is replaced (U+FFFD) before decoding; lone surrogates from
    ``\\ud800`` escapes are kept as their surrogate-pass bytes.

    Args:
        line: one line of a ``*-json.log`` file.

    Returns:
        The DockerLine, or None when the line is not a JSON object with a string ``log`` and a
        valid ``time``. Never raises.
    """
    try:
        try:
            obj = json.loads(line)
        except UnicodeDecodeError:
            obj = json.loads(line.decode("utf-8", "replace"))
        if not isinstance(obj, dict) or not isinstance(obj.get("log"), str):
            return None
        log, stamp = obj["log"], obj.get("time")
        t = parse_rfc3339(stamp) if isinstance(stamp, str) else None
        if t is None:
            return None
        stream = obj.get("stream")
        stream = stream if isinstance(stream, str) and stream else "stdout"
        return DockerLine(t, stream, log.encode("utf-8", "surrogatepass"))
    except Exception:  # noqa: BLE001 - Q1: a parser never raises into the loop
        return None
