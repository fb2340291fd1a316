"""TLS for the listeners (issue 13): the Forward source, the HTTP source and the SDK endpoint
of ``watch`` serve TLS when their config names a PEM certificate (``tls_cert``, with
``tls_key`` unless the key is in the same file).

The listening socket is wrapped without a handshake on accept: each connection's handshake
runs on its own thread at its first read, so a slow or silent client never holds up the
accept loop (and meets the listener's idle timeout like any other).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from ftwatch.errors import SourceError


def server_context(cert: Path | str, key: Path | str | None, what: str) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) with the certificate chain loaded.

    Args:
        cert: PEM certificate (chain).
        key: PEM private key; None: it is in ``cert``.
        what: the listener, for the error (``source forward``, ``watch.monitor``).

    Raises:
        SourceError: the files cannot be read or do not hold a matching certificate and key.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key) if key else None)
    except (OSError, ssl.SSLError) as exc:
        raise SourceError(f"{what}: TLS certificate {cert}" + (f" / key {key}" if key else "") +
                          f": {getattr(exc, 'strerror', None) or exc}") from exc
    return context


def wrap_listener(server: Any, context: ssl.SSLContext | None) -> None:
    """Make a ``socketserver`` server's listening socket TLS (nothing when ``context`` is None):
    the accepted connections are TLS sockets that shake hands at their first read."""
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
