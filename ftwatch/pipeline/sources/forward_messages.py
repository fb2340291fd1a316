"""Forward protocol v1 messages ftwatch (or a test client) writes: requests, acks, handshake.

The decoder is ``ftwatch.pipeline.sources.forward_protocol``; this is its other half, kept apart
so that each stays one job. Field orders are those of the "Fluentd Forward Protocol
Specification (v1)" (Handshake Messages; Entry and carrier modes).
"""

from __future__ import annotations

import zlib
import hashlib
import struct
from typing import Any, Iterable, Mapping

import msgpack

EVENT_TIME = struct.Struct(">II")       # EventTime ext type 0: uint32 BE seconds, uint32 BE nanoseconds
MODES = ("message", "forward", "packed_forward", "compressed_packed_forward")

def event_time(seconds: float) -> msgpack.ExtType:
    """Epoch seconds as an EventTime ext value (packs as fixext8)."""
    whole = int(seconds // 1)
    nanos = min(int(round((seconds - whole) * 1e9)), 999_999_999)
    return msgpack.ExtType(0, EVENT_TIME.pack(whole, nanos))


def pack_request(tag: str, entries: Iterable[tuple[Any, dict, Mapping[str, Any] | None]],
                 mode: str = "forward", chunk: str | None = None, *, as_str: bool = False,
                 gzip_members: int = 1) -> bytes:
    """Packs entries as one request of the given mode (the inverse of :class:`ForwardDecoder`).

    Args:
        tag: the tag.
        entries: ``(time, record, metadata)``: time an int, or an EventTime ext (:func:`event_time`);
            metadata None or empty for ``[time, record]``, else ``[[time, metadata], record]``.
            Message mode takes exactly one entry and ignores its metadata.
        mode: one of ``message``, ``forward``, ``packed_forward``, ``compressed_packed_forward``.
        chunk: sets the ``chunk`` option (asks for an ack).
        as_str: PackedForward only: send the packed entries as msgpack str instead of bin.
        gzip_members: CompressedPackedForward only: split the stream into this many gzip members.
    """
    option: dict[str, Any] = {} if chunk is None else {"chunk": chunk}
    items = [[[t, dict(m)], r] if m else [t, r] for t, r, m in entries]
    if mode == "message":
        if len(items) != 1:
            raise ValueError("a Message request carries exactly one entry")
        t, r = items[0]
        t = t[0] if isinstance(t, list) else t
        return msgpack.packb([tag, t, r, option] if option else [tag, t, r], use_bin_type=True)
    if mode == "forward":
        return msgpack.packb([tag, items, option] if option else [tag, items], use_bin_type=True)
    packed = [msgpack.packb(item, use_bin_type=True) for item in items]
    if mode == "compressed_packed_forward":
        cut = max(1, -(-len(packed) // max(gzip_members, 1)))
        parts = [b"".join(packed[i:i + cut]) for i in range(0, len(packed), cut)] or [b""]
        option["compressed"] = "gzip"
        return msgpack.packb([tag, b"".join(_gzip(p) for p in parts), option], use_bin_type=True)
    if mode != "packed_forward":
        raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
    stream = b"".join(packed)
    if as_str:   # out_forward's legacy form: a msgpack str holding the raw (non-UTF-8) bytes
        return msgpack.packb([tag, stream.decode("utf-8", "surrogateescape"), *([option] if option else [])],
                             use_bin_type=True, unicode_errors="surrogateescape")
    return msgpack.packb([tag, stream, option] if option else [tag, stream], use_bin_type=True)


def _gzip(data: bytes) -> bytes:
    deflater = zlib.compressobj(wbits=31)
    return deflater.compress(data) + deflater.flush()


def pack_ack(chunk: str | bytes) -> bytes:
    """The server's response to a request with a ``chunk`` option: ``{"ack": chunk}``."""
    return msgpack.packb({"ack": chunk}, use_bin_type=True)


def helo(nonce: bytes, auth_salt: bytes = b"", keepalive: bool = True) -> bytes:
    """HELO (server to client): ``["HELO", {"nonce": bin, "auth": salt or "", "keepalive": bool}]``.

    An empty ``auth_salt`` (sent as "", as Fluentd's in_forward does) means no user authentication.
    """
    return msgpack.packb(["HELO", {"nonce": nonce, "auth": auth_salt or "", "keepalive": keepalive}],
                         use_bin_type=True)


def ping(client_hostname: str, shared_key_salt: bytes, shared_key_hexdigest: str,
         username: str = "", password: str = "") -> bytes:
    """PING (client to server), fields in the spec's order (see :class:`Ping`)."""
    return msgpack.packb(["PING", client_hostname, shared_key_salt, shared_key_hexdigest,
                          username, password], use_bin_type=True)


def pong(auth_result: bool, reason: str, server_hostname: str, shared_key_hexdigest: str) -> bytes:
    """PONG (server to client): ``["PONG", auth_result, reason ("" on success), server_hostname,
    digest]``; the digest is :func:`shared_key_digest` over the server's hostname ("" when refusing)."""
    return msgpack.packb(["PONG", bool(auth_result), reason, server_hostname, shared_key_hexdigest],
                         use_bin_type=True)


def shared_key_digest(shared_key_salt: bytes, hostname: str, nonce: bytes, shared_key: str) -> str:
    """sha512_hex(shared_key_salt + hostname + nonce + shared_key) (spec: PING and PONG).

    ``hostname`` is the client's for PING and the server's for PONG.
    """
    return hashlib.sha512(shared_key_salt + hostname.encode("utf-8", "surrogateescape") + nonce
                          + shared_key.encode("utf-8")).hexdigest()


def password_digest(auth_salt: bytes, username: str, password: str) -> str:
    """sha512_hex(auth_salt + username + raw_password) (spec: PING ``password``)."""
    return hashlib.sha512(auth_salt + username.encode("utf-8", "surrogateescape")
                          + password.encode("utf-8")).hexdigest()
