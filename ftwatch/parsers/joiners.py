"""Joins runtime-split lines and unwraps shipped records (SPEC S5; the envelopes themselves are
parsed by :mod:`ftwatch.parsers.envelopes`).

Pieces of one line are joined per key (file or pod container, plus stream: stdout, stderr
and containers never mix) by :class:`CriJoiner` / :class:`DockerJoiner`, at most
``MAX_PARTIAL`` bytes per key; past that the pieces go out with ``SPLIT_MARKER`` appended
(counted): memory stays bounded and no byte is dropped. Nothing here raises on bad input
(SPEC Q1): :func:`unwrap` passes a line that is not its declared envelope through raw and
counts it. The module is pure (no pipeline imports): :func:`unwrap` takes any Shipped-like
``type(s)(time, line, meta)``, e.g. ``ftwatch.pipeline.sources.base.Shipped``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Protocol, TypeVar

from ftwatch.parsers.envelopes import CriLine, DockerLine, parse_cri, parse_docker

__all__ = ["MAX_PARTIAL", "SPLIT_MARKER", "Joiner", "CriJoiner", "DockerJoiner", "Joiners", "unwrap"]

MAX_PARTIAL = 10 * 1024 * 1024
"""Bytes of partial pieces one joiner key may hold before it hands them out (10 MiB)."""

SPLIT_MARKER = b" [ftwatch: line cut at the partial-size cap; it continues on the next line]"
"""Appended to a line handed out because its pieces passed ``MAX_PARTIAL`` bytes."""


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
