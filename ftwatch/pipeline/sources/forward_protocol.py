"""Pure decoding and encoding of the Fluentd Forward protocol v1 (SPEC S3); no sockets here.

Source: "Fluentd Forward Protocol Specification (v1)" (fluent/fluentd wiki). A connection carries
a stream of msgpack values; each one is a *request*:

- ``nil``: a heartbeat, skipped.
- *Message*: ``[tag, time, record, option?]``.
- *Forward*: ``[tag, [entry, ...], option?]``.
- *PackedForward*: ``[tag, <bin|str: entries packed back to back>, option?]`` (both accepted).
- *CompressedPackedForward*: PackedForward whose bytes are gzip (option ``compressed: "gzip"``),
  possibly several gzip members concatenated.
- *PING* (handshake, client to server):
  ``["PING", client_hostname, shared_key_salt, shared_key_hexdigest, username, password]``.

The mode is told by the type of the second element, as the spec says. An *entry* is
``[time, record]`` or, from fluent-bit 2.1 on, ``[[time, metadata], record]``. A *time* is an
integer (epoch seconds) or an *EventTime*: msgpack ext type 0 holding 8 bytes, uint32 big-endian
seconds then uint32 big-endian nanoseconds, sent as fixext8 or ext8; both become float seconds.
msgpack's own timestamp (ext -1) and a float are accepted too.

Digests (spec, "Handshake Messages"), SHA-512 as lowercase hex, strings hashed as UTF-8:
PING ``shared_key_hexdigest`` = sha512(shared_key_salt + client_hostname + nonce + shared_key);
PONG ``shared_key_hexdigest`` = sha512(shared_key_salt + server_hostname + nonce + shared_key)
(same order: the server's hostname, the client's salt from its PING); PING ``password`` =
sha512(auth_salt + username + raw_password) or "". ``nonce`` and ``auth_salt`` come from HELO.

Deviation: the spec says a server SHOULD ignore a request that is not an array; this decoder
rejects it, so a peer sending garbage is disconnected and counted, not half-understood.

Bounds: a request may take at most ``max_frame_size`` bytes on the wire (fluent-bit's in_forward
closes the connection past its ``buffer_max_size``, 6 MiB), and gzip may expand to at most
``max_decompressed_size`` bytes. Decoded Python objects typically take 3-5x a frame's bytes; a
hostile frame of tiny maps can take up to about 100x.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType
from typing import Any, Mapping, Union

import msgpack

from ftwatch.errors import SourceError
# The encoders live in forward_messages.py (re-exported here for callers of this module).
from ftwatch.pipeline.sources.forward_messages import (  # noqa: F401
    EVENT_TIME, MODES, event_time, helo, pack_ack, pack_request, password_digest, ping, pong,
    shared_key_digest)

__all__ = [
    "MAX_FRAME_SIZE", "MAX_DECOMPRESSED_SIZE", "ForwardProtocolError", "Entries", "Ping",
    "Event", "ForwardDecoder", "decode_request", "event_time", "pack_request", "pack_ack", "helo",
    "ping", "pong", "shared_key_digest", "password_digest",
]

MAX_FRAME_SIZE = 6 * 1024 * 1024          # bytes; fluent-bit in_forward's buffer_max_size default
MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024  # bytes one CompressedPackedForward may expand to
_SLICE = 64 * 1024                        # bytes fed to msgpack at once (granularity of the bound)
_EVENT_TIME = EVENT_TIME
_NO_METADATA: Mapping[str, Any] = MappingProxyType({})



class ForwardProtocolError(SourceError):
    """The peer sent something the Forward protocol v1 does not allow.

    Attributes:
        events: the requests decoded before the bad one in the same ``feed`` call (complete and
            valid; a caller may still hand them on before closing the connection).
    """

    def __init__(self, message: str, events: list[Event] | None = None):
        super().__init__(message)
        self.events: list[Event] = events or []


@dataclass(frozen=True, slots=True)
class Entries:
    """One data request (Message, Forward, PackedForward or CompressedPackedForward).

    Attributes:
        tag: the request's tag, e.g. ``kube.var.log.containers.x.log``.
        entries: ``(time, record, metadata)`` per event: epoch seconds (float), the record map,
            and fluent-bit's per-event metadata map (empty for ``[time, record]`` entries).
        chunk: the ``chunk`` option (str, or bytes if sent as bin) the server must echo in an
            ack, or None when no ack is wanted.
        mode: one of ``message``, ``forward``, ``packed_forward``, ``compressed_packed_forward``.
        option: the whole option map (``size``, ``chunk``, ``compressed``, ...), or empty.
    """

    tag: str
    entries: list[tuple[float, dict, Mapping[str, Any]]]
    chunk: str | bytes | None = None
    mode: str = "forward"
    option: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Ping:
    """A handshake PING (client to server), fields as the spec names them.

    Attributes:
        client_hostname: the client's hostname.
        shared_key_salt: the client's salt (bytes; a str salt is taken as its UTF-8 bytes).
        shared_key_hexdigest: sha512 hex of salt + client_hostname + nonce + shared_key.
        username: "" unless user authentication is used.
        password: sha512 hex of auth_salt + username + raw password, or "".
    """

    client_hostname: str
    shared_key_salt: bytes
    shared_key_hexdigest: str
    username: str
    password: str


Event = Union[Entries, Ping]


def _ext_hook(code: int, data: bytes, _unpack=_EVENT_TIME.unpack) -> Any:
    """msgpack ext → EventTime (type 0, 8 bytes) as float seconds; other types pass through."""
    if code == 0:
        if len(data) != 8:
            raise ForwardProtocolError(f"EventTime (ext type 0) must hold 8 bytes, got {len(data)}")
        seconds, nanos = _unpack(data)
        return seconds + nanos / 1e9
    return msgpack.ExtType(code, data)


def _unpacker(max_buffer: int) -> msgpack.Unpacker:
    # str is decoded with surrogateescape so that a PackedForward sent as str (binary msgpack
    # inside) can be turned back into its exact bytes, and invalid UTF-8 never fails (SPEC Q1).
    return msgpack.Unpacker(None, raw=False, max_buffer_size=max_buffer, ext_hook=_ext_hook,
                            unicode_errors="surrogateescape", strict_map_key=True)


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def _time(value: Any) -> float:
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise ForwardProtocolError(f"time is not finite: {value!r}")
        return value
    if kind is int:
        return float(value)
    if kind is msgpack.Timestamp:
        return value.to_unix()
    raise ForwardProtocolError(f"time must be an integer or EventTime, got {kind.__name__}")


def _entry(item: Any) -> tuple[float, dict, Mapping[str, Any]]:
    if type(item) is not list or len(item) != 2:
        raise ForwardProtocolError("an entry must be [time, record] or [[time, metadata], record]")
    head, record = item
    if type(record) is not dict:
        raise ForwardProtocolError(f"a record must be a map, got {type(record).__name__}")
    if type(head) is list:
        if len(head) != 2 or type(head[1]) is not dict:
            raise ForwardProtocolError("an entry header must be [time, metadata map]")
        return _time(head[0]), record, head[1]
    return _time(head), record, _NO_METADATA


def _entries(items: list) -> list[tuple[float, dict, Mapping[str, Any]]]:
    """A Forward request's entries; the usual shapes (all ``[time, record]`` or all
    ``[[time, metadata], record]``, times of one kind) are checked a column at a time with C-level
    ``map``/``set`` passes; anything else goes through :func:`_entry`: same results, same errors."""
    try:
        if not items or set(map(type, items)) != _LIST or set(map(len, items)) != _TWO:
            raise _Slow
        heads, records = zip(*items)
        if set(map(type, records)) != _DICT:
            raise _Slow
        if set(map(type, heads)) != _LIST:
            return list(zip(_times(heads), records, repeat(_NO_METADATA)))
        if set(map(len, heads)) != _TWO:
            raise _Slow
        times, metas = zip(*heads)
        if set(map(type, metas)) != _DICT:
            raise _Slow
        return list(zip(_times(times), records, metas))
    except _Slow:
        return [_entry(item) for item in items]


def _times(times: tuple) -> Any:
    """A column of times as floats, like :func:`_time`; raises _Slow unless all are float or all int."""
    kinds = set(map(type, times))
    if kinds == _FLOAT and math.isfinite(sum(times)):   # a finite sum: each one finite
        return times
    if kinds == _INT:
        return map(float, times)
    raise _Slow


class _Slow(Exception):
    """The column-wise path of :func:`_entries` does not apply."""


_LIST, _DICT, _FLOAT, _INT, _TWO = {list}, {dict}, {float}, {int}, {2}


def _gunzip(data: bytes, limit: int) -> bytes:
    """Inflates one or more concatenated gzip members, at most ``limit`` bytes in all."""
    out: list[bytes] = []
    total, rest = 0, data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)   # 31: gzip wrapper only
            while not inflater.eof:
                piece = inflater.decompress(rest, limit - total + 1)
                total += len(piece)
                if total > limit:
                    raise ForwardProtocolError(f"gzip entries expand past {limit} bytes")
                out.append(piece)
                rest = inflater.unconsumed_tail
                if not piece and not rest:
                    raise ForwardProtocolError("gzip entries are truncated")
            rest = inflater.unused_data
    except zlib.error as err:
        raise ForwardProtocolError(f"gzip entries are corrupt: {err}") from None
    return b"".join(out)


def _packed(data: bytes) -> list[tuple[float, dict, Mapping[str, Any]]]:
    """Decodes a MessagePackEventStream: entries packed back to back."""
    unpacker = _unpacker(max(len(data), 1))
    unpacker.feed(data)
    entries = []
    end = 0   # tell() runs ahead inside a partial value: only a complete one marks an end
    try:
        for item in unpacker:
            entries.append(_entry(item))
            end = unpacker.tell()
    except (msgpack.UnpackException, ValueError, TypeError) as err:   # not ForwardProtocolError
        raise ForwardProtocolError(f"packed entries are not valid msgpack: {err}") from None
    if end != len(data):
        raise ForwardProtocolError("packed entries end in the middle of an entry")
    return entries


def decode_request(obj: Any, max_decompressed_size: int = MAX_DECOMPRESSED_SIZE) -> Event | None:
    """Turns one decoded msgpack value into an Event (None for a nil heartbeat).

    Raises:
        ForwardProtocolError: the value is not a request of the Forward protocol v1.
    """
    if obj is None:
        return None
    if type(obj) is not list:
        raise ForwardProtocolError(f"a request must be an array or nil, got {type(obj).__name__}")
    n = len(obj)
    if n == 6 and obj[0] == "PING":
        host, salt, digest, user, password = obj[1:]
        if not (type(host) is str and isinstance(salt, (str, bytes)) and type(digest) is str
                and type(user) is str and type(password) is str):
            raise ForwardProtocolError("PING fields must be strings")
        return Ping(host, _as_bytes(salt), digest, user, password)
    if n < 2 or n > 4:
        raise ForwardProtocolError(f"a request must have 2 to 4 elements, got {n}")
    tag, second = obj[0], obj[1]
    if type(tag) is not str:
        raise ForwardProtocolError(f"the tag must be a string, got {type(tag).__name__}")
    kind = type(second)
    if kind is list or kind is str or kind is bytes:
        if n > 3:
            raise ForwardProtocolError(f"a Forward/PackedForward request has at most 3 elements, got {n}")
        option = _option(obj[2] if n == 3 else None)
        if kind is list:
            mode, entries = "forward", _entries(second)
        elif option.get("compressed") == "gzip":
            data = _gunzip(_as_bytes(second), max_decompressed_size)
            mode, entries = "compressed_packed_forward", _packed(data)
        else:
            mode, entries = "packed_forward", _packed(_as_bytes(second))
    else:
        if n < 3:
            raise ForwardProtocolError("a Message request must be [tag, time, record, option?]")
        record = obj[2]
        if type(record) is not dict:
            raise ForwardProtocolError(f"a record must be a map, got {type(record).__name__}")
        option = _option(obj[3] if n == 4 else None)
        mode, entries = "message", [(_time(second), record, _NO_METADATA)]
    chunk = option.get("chunk")
    if chunk is not None and not isinstance(chunk, (str, bytes)):
        raise ForwardProtocolError(f"the chunk option must be a string, got {type(chunk).__name__}")
    return Entries(tag, entries, chunk, mode, option)


def _option(value: Any) -> Mapping[str, Any]:
    if value is None:
        return _NO_METADATA
    if type(value) is not dict:
        raise ForwardProtocolError(f"the option must be a map, got {type(value).__name__}")
    return value


class ForwardDecoder:
    """Incremental decoder of one connection's byte stream into Events.

    Feed it bytes as they arrive, in any split; it returns the requests completed so far. After it
    has raised, the connection must be closed: the decoder stays failed (msgpack's parser state is
    not trustworthy past an error).

    Args:
        max_frame_size: bytes one request may span on the wire; a longer one raises
            (checked every 64 KiB, so at most that much more is ever held).
        max_decompressed_size: bytes one CompressedPackedForward may inflate to.
    """

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE,
                 max_decompressed_size: int = MAX_DECOMPRESSED_SIZE):
        if max_frame_size < 1:
            raise ValueError("max_frame_size must be positive")
        self.max_frame_size = max_frame_size
        self.max_decompressed_size = max_decompressed_size
        self._unpacker = _unpacker(max_frame_size + _SLICE)
        self._fed = 0            # bytes fed so far
        self._frame_start = 0    # stream offset where the incomplete request begins
        self._failed: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes of the request in progress (received, not yet a complete request)."""
        return self._fed - self._frame_start

    def feed(self, data: bytes) -> list[Event]:
        """Adds bytes; returns the requests they complete, in order (heartbeats skipped).

        Raises:
            ForwardProtocolError: malformed msgpack, a value that is not a request, or a request
                longer than ``max_frame_size``; ``.events`` holds the good ones before it.
        """
        if self._failed is not None:
            raise ForwardProtocolError(f"decoder already failed: {self._failed}")
        events: list[Event] = []
        view = memoryview(data)
        try:
            for start in range(0, len(view), _SLICE):
                piece = view[start:start + _SLICE]
                self._unpacker.feed(piece)
                self._fed += len(piece)
                for obj in self._unpacker:
                    self._frame_start = self._unpacker.tell()
                    event = decode_request(obj, self.max_decompressed_size)
                    if event is not None:
                        events.append(event)
                if self._fed - self._frame_start > self.max_frame_size:
                    raise msgpack.BufferFull
        except ForwardProtocolError as err:
            self._failed = str(err)
        except msgpack.BufferFull:
            self._failed = f"a request is longer than max_frame_size ({self.max_frame_size} bytes)"
        except (msgpack.UnpackException, ValueError, TypeError, OverflowError) as err:
            self._failed = f"malformed msgpack: {type(err).__name__}: {err}".rstrip(": ")
        else:
            return events
        raise ForwardProtocolError(self._failed, events)



