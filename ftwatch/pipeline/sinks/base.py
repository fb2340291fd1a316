"""The one write protocol every sink shares: ``write(batch)`` of typed records, and ``close()``.

A batch is a sequence of the records in :data:`RECORD_TYPES`: the core's ``Decision`` and
``DeliveryResult`` as they are, and small records for what has no core type (a run's start
and end, a lifecycle event, findings of one attempt, closed output buckets, a shipped source's
position, the Forward chunk ids a batch carried, open blocks). Each sink has one
encoder, a dict from record type to a function (:func:`encode`), so a new sink writes the
records it cares about and passes over the others; no sink mirrors another's methods.

The sinks: ``sqlite.SqliteStore`` (every record, one transaction per batch; also the reader
behind ``ftwatch report`` and ``ftwatch explain``), ``elasticsearch.sink.ElasticsearchSink`` (ECS
documents), ``jsonl.DecisionsFile`` (the decisions file: decisions only). ``fanout.FanOut`` is
a sink over several; :data:`NULL_SINK` takes everything and keeps nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar, Union, runtime_checkable

from ftwatch.events import Decision, DeliveryResult, Finding

T = TypeVar("T")

OutputRow = tuple[str, str, "int | None", float, float, int, int]
"""``(job, instance, rank, bucket, seconds, lines, bytes)``: ``lines`` lines of ``bytes`` bytes
read from ``instance`` in the ``seconds`` long bucket starting at ``bucket`` (epoch s)."""


@dataclass(frozen=True, slots=True)
class RunStart:
    """Attempt ``attempt`` (0 = first start) of ``job`` began at ``time`` (epoch s) running
    ``command`` (an argv, or a shell string)."""

    job: str
    attempt: int
    time: float
    command: str | Sequence[str] = ""


@dataclass(frozen=True, slots=True)
class RunEnd:
    """An attempt ended at ``time`` (epoch s): ``status`` is ``succeeded``, ``failed``,
    ``restarted`` or ``stopped``."""

    job: str
    attempt: int
    time: float
    status: str


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """A lifecycle event at ``time`` (epoch s): ``kind`` is ``job_start``, ``instance_exit``,
    ``job_restart``, ``alert_resolved`` ...; ``detail`` anything JSON-able (pid, returncode ...)."""

    time: float
    job: str
    kind: str
    instance: str | None = None
    rank: int | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FindingBatch:
    """Findings of attempt ``attempt`` (every one, fallout included)."""

    findings: Sequence[Finding]
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class OutputBatch:
    """Closed output buckets (:data:`OutputRow`); ``origins`` maps (job, instance) to the latest
    ``Origin`` of that instance (its node and pod labels; only the Elasticsearch sink uses them)."""

    rows: Sequence[OutputRow]
    origins: Mapping[tuple[str, str], Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where a shipped source stands after the lines whose effects are written in the same batch
    (``ShippedBatch.position``): one row per ``key``, a higher ``seq`` replacing it; ``document``
    is the source's own (a file tail's offsets file). Only a transactional store keeps it (the
    SQLite store; ``ftwatch watch`` reads it back at start)."""

    key: str
    seq: int
    document: bytes
    time: float = 0.0


@dataclass(frozen=True, slots=True)
class ChunksSeen:
    """The Forward ``chunk`` ids (``(source, chunk)`` pairs) whose records are handled in the same
    batch, at ``time`` (epoch s): a later request that carries one of them again is acked and
    skipped (``ForwardSource``, issue 17). The store keeps at most ``keep`` ids, none older than
    ``keep_seconds`` (``limits.forward_chunks_kept`` / ``forward_chunk_seconds``). Only a
    transactional store keeps them (the SQLite store)."""

    chunks: Sequence[tuple[str, str]]
    time: float
    keep: int
    keep_seconds: float


@dataclass(frozen=True, slots=True)
class OpenBlocks:
    """Open multi-line blocks (a traceback not closed yet) that changed in a batch, at ``time``
    (epoch s): ``(origin, data, base, skip)`` as ``Engine.changed_blocks`` gives them, ``data``
    None for a block closed since. Written in the batch's transaction, so the lines a stored
    position has passed are never only in memory (``watch`` restores them at start, issue 17).
    Only a transactional store keeps them (the SQLite store)."""

    blocks: Sequence[tuple[Any, "bytes | None", float, frozenset]]
    time: float


Record = Union[RunStart, RunEnd, LifecycleEvent, FindingBatch, Decision, DeliveryResult, OutputBatch,
               SourcePosition, ChunksSeen, OpenBlocks]
RECORD_TYPES: tuple[type, ...] = (RunStart, RunEnd, LifecycleEvent, FindingBatch, Decision,
                                  DeliveryResult, OutputBatch, SourcePosition, ChunksSeen, OpenBlocks)


@runtime_checkable
class Sink(Protocol):
    """Where records go. ``write`` may raise ``ftwatch.errors.SinkError`` (retryable or not);
    ``close`` flushes what the sink buffers and releases it (further writes fail)."""

    def write(self, batch: Sequence[Record]) -> None: ...

    def close(self) -> None: ...


def encode(encoders: Mapping[type, Callable[[Any], T]], record: Any) -> T | None:
    """Encode ``record`` with the function its type maps to in ``encoders``.

    Returns:
        What the encoder returned; None for a record type the sink passes over.

    Raises:
        TypeError: ``record`` is not one of :data:`RECORD_TYPES` (a programming error: a record
            nobody can store must not vanish silently).
    """
    fn = encoders.get(type(record))
    if fn is not None:
        return fn(record)
    if not isinstance(record, RECORD_TYPES):
        raise TypeError(f"not a sink record: {type(record).__name__}")
    return None


class NullSink:
    """A sink that keeps nothing (the recorder without a store)."""

    def write(self, batch: Sequence[Record]) -> None:
        for record in batch:
            encode({}, record)            # still refuse what is not a record

    def close(self) -> None:
        pass


NULL_SINK = NullSink()
