"""Sources: where lines come from.

``ftwatch run`` reads its own workers (``process``); ``ftwatch watch`` takes shipped lines from
the sources its config names. ``build_source`` is the registry from a config's ``type:`` to the
class (the type equals the module name, DESIGN.md).
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any, Callable, Mapping

from ftwatch.errors import SourceError


def build_source(config: Any, out: queue.Queue, state_dir: Path, count: Any = None,
                 positions: Mapping[str, tuple[int, bytes]] | None = None,
                 seen: Callable[[str, str], bool] | None = None, limits: Any = None,
                 repeated: Callable[[str, int], None] | None = None):
    """The source a ``watch.sources[]`` entry describes, not yet started.

    Args:
        config: one of ``ftwatch.config.watch``'s source models.
        out: the queue it puts ``list[Shipped]`` batches on (a ``role: host`` source's lines are
            marked as host evidence on the way: ``hostlog.HostQueue``).
        state_dir: where a file source keeps its offsets (``offsets/<name>.json``).
        count: ``(source name, event)`` callback of the listeners' connection events
            (``ftwatch.telemetry.Metrics.count_connection``), or None.
        positions: the positions the consumer's store holds (``SqliteStore.positions``: key ->
            (seq, document)); a file source resumes from its own when it is newer than its
            offsets file (``OffsetStore.adopt``). None: none.
        seen: ``(source, chunk) -> bool``: whether the consumer's store holds a Forward chunk id
            (``SqliteStore.chunk_seen``); given, a forward source acks a chunk only once its
            batch is acknowledged and skips one sent again (``ForwardSource`` "Exactly once").
            An HTTP source then answers 200 once its batch is acknowledged (at least once).
            None: both answer once a request is queued.
        limits: the ``limits`` config (``forward_chunks_kept``, ``forward_chunk_seconds``), or None
            for its defaults.
        repeated: ``(source, records)`` callback of the records skipped as sent before
            (``ftwatch.telemetry.Metrics.count_repeated``), or None.

    Raises:
        ValueError: an unknown ``type``.
        SourceError: a file source cannot keep its offsets (the directory or file cannot be made or written);
            a forward source's shared_key_file cannot be read; a listener's TLS certificate or
            key cannot be loaded.
    """
    kind = config.type
    if getattr(config, "role", "job") == "host":        # every line is a node's host log (hostlog.py)
        from ftwatch.pipeline.sources.hostlog import HostQueue
        out = HostQueue(out)
    if kind == "forward":
        from ftwatch.pipeline.sources.forward import ForwardSource
        tls = _tls(config)
        key = config.shared_key
        if key is None and config.shared_key_file is not None:   # a mounted Secret (deploy/ftwatch)
            try:
                key = config.shared_key_file.read_text().strip() or None
            except OSError as exc:
                raise SourceError(f"source {config.name}: shared_key_file {config.shared_key_file}: "
                                  f"{exc.strerror or exc}") from exc
        from ftwatch.config.limits import LimitsConfig
        limits = limits if limits is not None else LimitsConfig()
        return ForwardSource(out, config.host, config.port, shared_key=key, tls=tls,
                             name=config.name, max_connections=config.max_connections,
                             idle_timeout=config.idle_timeout, count=count, require_ack=seen is not None,
                             seen=seen, keep_chunks=limits.forward_chunks_kept,
                             keep_chunk_seconds=limits.forward_chunk_seconds, repeated=repeated)
    if kind == "http":
        from ftwatch.pipeline.sources.http import HttpSource
        return HttpSource(out, config.host, config.port, config.path, token=config.token, name=config.name,
                          max_connections=config.max_connections, idle_timeout=config.idle_timeout,
                          count=count, tls=_tls(config), require_ack=seen is not None)
    if kind == "file":
        from ftwatch.pipeline.sources.base import Position
        from ftwatch.pipeline.sources.checkpoints import OffsetStore
        from ftwatch.pipeline.sources.file_tail import FileTailSource
        try:
            offsets = OffsetStore(state_dir / "offsets" / f"{config.name}.json")
            stored = (positions or {}).get(offsets.key)
            offsets.adopt(Position(offsets.key, *stored) if stored is not None else None)
        except OSError as e:
            raise SourceError(f"file source {config.name}: {e.strerror or e}") from None
        return FileTailSource(list(config.paths), out, offsets, name=config.name,
                              read_from_head=config.read_from_head, envelope=config.envelope,
                              require_ack=True)
    if kind == "stdin":
        from ftwatch.pipeline.sources.stdin import StdinSource
        meta = {"envelope": config.envelope} if config.envelope else {}
        return StdinSource(out, meta=meta, name=config.name)
    raise ValueError(f"unknown source type {kind!r}")


def _tls(config: Any):
    """The server TLS context of a listener's ``tls_cert`` / ``tls_key``, or None.

    Raises:
        SourceError: they cannot be loaded.
    """
    if config.tls_cert is None:
        return None
    from ftwatch.pipeline.sources.tls import server_context
    return server_context(config.tls_cert, config.tls_key, f"source {config.name}")
