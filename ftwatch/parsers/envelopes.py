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

Pieces of one line are joined per key (file or pod container, plus stream: stdout, stderr
and containers never mix) by :class:`CriJoiner` / :class:`DockerJoiner`, at most
``MAX_PARTIAL`` bytes per key; past that the pieces go out with ``SPLIT_MARKER`` appended
(counted): memory stays bounded and no byte is dropped. Nothing here raises on bad input
(SPEC Q1): a line that is not its declared envelope parses to None; :func:`unwrap` passes
it through raw and counts it. The module is pure (no pipeline imports): :func:`unwrap` takes
any Shipped-like ``type(s)(time, line, meta)``, e.g. ``ftwatch.pipeline.sources.base.Shipped``.
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Hashable, Mapping, NamedTuple, Protocol, TypeVar

__all__ = [
    "MAX_PARTIAL", "SPLIT_MARKER", "CriLine", "DockerLine", "Joiner", "CriJoiner", "DockerJoiner",
    "Joiners", "parse_rfc3339", "parse_cri", "parse_docker", "unwrap",
]

MAX_PARTIAL = 10 * 1024 * 1024
"""Bytes of partial pieces one joiner key may hold before it hands them out (10 MiB)."""

SPLIT_MARKER = b" [ftwatch: line cut at the partial-size cap; it continues on the next line]"
"""Appended to a line handed out because its pieces passed ``MAX_PARTIAL`` bytes."""

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


@dataclass(slots=True)
class _Pending:
    parts: list[bytes]
    size: int
    time: float
    context: Any


class Joiner:
    """Joins the pieces of runtime-split lines, per key.

    Attributes:
        cap: bytes of pieces one key may hold before they are handed out with ``SPLIT_MARKER``.
        joined: lines completed from two or more pieces.
        split: lines handed out at the cap (each continues in a later message).
        flushed: partial lines handed out by ``flush`` (the rest never came).
    """

    def __init__(self, cap: int = MAX_PARTIAL):
        self.cap = cap
        self.joined = 0
        self.split = 0
        self.flushed = 0
        self._pending: dict[Hashable, _Pending] = {}

    def add(self, key: Hashable, piece: bytes, partial: bool, time: float = 0.0,
            context: Any = None) -> bytes | None:
        """Adds one piece; returns the whole line when this piece completes it.

        Args:
            key: whose line this is, e.g. ``(path, stream)``; keys never mix.
            piece: the piece's bytes, without any newline.
            partial: True when the line goes on in the next piece of this key.
            time: the piece's time; the first piece's is kept (see ``pending``).
            context: anything to keep with a pending line (``Joiners`` keeps the Shipped).

        Returns:
            The complete line (pieces concatenated), the pieces so far plus ``SPLIT_MARKER``
            when they reach ``cap`` bytes, or None while the line is incomplete.
        """
        pending = self._pending.get(key)
        if pending is None:
            if not partial:
                return piece
            if len(piece) >= self.cap:
                self.split += 1
                return piece + SPLIT_MARKER
            self._pending[key] = _Pending([piece], len(piece), time, context)
            return None
        pending.parts.append(piece)
        pending.size += len(piece)
        pending.context = context
        if not partial:
            del self._pending[key]
            self.joined += 1
            return b"".join(pending.parts)
        if pending.size >= self.cap:
            del self._pending[key]
            self.split += 1
            return b"".join(pending.parts) + SPLIT_MARKER
        return None

    def flush(self, key: Hashable) -> bytes | None:
        """Hands out (and forgets) the pieces pending under ``key``; None when there are none."""
        pending = self._pending.pop(key, None)
        if pending is None:
            return None
        self.flushed += 1
        return b"".join(pending.parts)

    def pending(self) -> list[tuple[Hashable, float, Any]]:
        """``(key, time of the first piece, context of the last piece)`` of each incomplete line."""
        return [(k, p.time, p.context) for k, p in self._pending.items()]


class CriJoiner(Joiner):
    """Joins CRI ``P`` pieces with the ``F`` line that ends them, per key."""

    def push(self, key: Hashable, line: CriLine, context: Any = None) -> bytes | None:
        """Adds a parsed CRI line under ``key`` (e.g. ``(path, stream)``); returns what ``add`` does:
        the full message once an ``F`` line completes it, else None (or the pieces at the cap)."""
        return self.add(key, line.message, line.partial, line.time, context)


class DockerJoiner(Joiner):
    """Joins docker json-file 16 KiB pieces (``log`` without ``\\n``) with the piece that ends the line."""

    def push(self, key: Hashable, line: DockerLine, context: Any = None) -> bytes | None:
        """Adds a parsed docker line under ``key`` (e.g. ``(path, stream)``); returns what ``add``
        does: the full message (``\\n`` removed) once complete, else None (or pieces at the cap)."""
        message = line.message
        partial = not message.endswith(b"\n")
        return self.add(key, message if partial else message[:-1], partial, line.time, context)


class ShippedLike(Protocol):
    """What :func:`unwrap` needs of a Shipped: ``type(s)(time, line, meta)`` builds a new one."""

    time: float
    line: bytes
    meta: Mapping[str, Any]


S = TypeVar("S", bound=ShippedLike)


@dataclass
class Joiners:
    """The joiners and counters :func:`unwrap` uses; one per watch loop (not thread-safe).

    Attributes:
        cri: joins CRI pieces.
        docker: joins docker pieces.
        unwrapped: lines that parsed as their declared envelope.
        malformed: lines that did not (passed through raw), by envelope name.
    """

    cri: CriJoiner = field(default_factory=CriJoiner)
    docker: DockerJoiner = field(default_factory=DockerJoiner)
    unwrapped: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    _last_meta: tuple = field(default=(None, None, None), repr=False)

    def counts(self) -> dict[str, int]:
        """Flat counters for metrics: unwrapped, malformed_<envelope>, joined, split, flushed."""
        out = {"unwrapped": self.unwrapped}
        out.update({f"malformed_{k}": v for k, v in self.malformed.items()})
        out["joined"] = self.cri.joined + self.docker.joined
        out["split"] = self.cri.split + self.docker.split
        out["flushed"] = self.cri.flushed + self.docker.flushed
        return out

    def flush(self, before: float | None = None) -> list:
        """Hands out incomplete lines as Shipped (the pieces so far), e.g. on a flush timeout.

        Args:
            before: only lines whose first piece is older than this epoch time; None: all.

        Returns:
            A list of Shipped like :func:`unwrap` returns, with the first piece's time.
        """
        out = []
        for joiner in (self.cri, self.docker):
            for key, t, context in joiner.pending():
                if before is not None and t >= before:
                    continue
                data = joiner.flush(key)
                if data is not None and context is not None:
                    out.append(type(context)(t, data, _meta(context.meta, key[1])))
        return out


def _meta(meta: Mapping[str, Any], stream: str) -> dict[str, Any]:
    """A copy of ``meta`` without ``envelope`` and with ``stream`` set."""
    out = dict(meta)
    out.pop("envelope", None)
    out["stream"] = stream
    return out


def _source_key(meta: Mapping[str, Any]) -> Hashable:
    """Which writer a line is from: its file's path, else its pod's container, else its tag."""
    path = meta.get("path")
    if path is not None:
        return path
    kube = meta.get("kubernetes")
    if kube is not None and isinstance(kube, Mapping):
        return (kube.get("namespace_name"), kube.get("pod_name"), kube.get("container_name"))
    return meta.get("tag")


def unwrap(shipped: S, joiners: Joiners) -> list[S]:
    """Unwraps one shipped line according to ``meta["envelope"]`` (``cri``, ``docker`` or absent).

    Args:
        shipped: a Shipped (``time``, ``line``, ``meta``).
        joiners: the loop's joiners; pieces are joined per (file or container or tag, stream).

    Returns:
        ``[shipped]`` unchanged when there is no envelope, or the line is not its declared
        envelope (counted in ``joiners.malformed``; never raised); ``[]`` while a split line
        is incomplete; else one Shipped with the runtime's time, the message as ``line``, and
        ``meta`` a copy without ``envelope`` and with ``stream`` set (one copy is shared by
        consecutive lines with the same input meta: treat it as read-only).
    """
    meta = shipped.meta
    envelope = meta.get("envelope")
    if envelope is None:
        return [shipped]
    if envelope == "cri":
        parsed = parse_cri(shipped.line)
        joiner: Joiner = joiners.cri
    elif envelope == "docker":
        parsed = parse_docker(shipped.line)
        joiner = joiners.docker
    else:
        parsed = None
    if parsed is None:
        name = str(envelope)
        joiners.malformed[name] = joiners.malformed.get(name, 0) + 1
        return [shipped]
    joiners.unwrapped += 1
    stream = parsed.stream
    data = joiner.push((_source_key(meta), stream), parsed, shipped)  # type: ignore[attr-defined]
    if data is None:
        return []
    last = joiners._last_meta          # lines of one file share one meta: copy it once
    if last[0] is meta and last[1] == stream:
        out_meta = last[2]
    else:
        out_meta = _meta(meta, stream)
        joiners._last_meta = (meta, stream, out_meta)
    return [type(shipped)(parsed.time, data, out_meta)]
