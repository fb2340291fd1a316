"""What shipped sources (Forward, HTTP, stdin, file tails) hand to ``ftwatch watch``.

A shipped source does not know the job, node or instance of a line: it hands over the
line and whatever metadata came with it (a fluent-bit record's fields, a file's path), and
``ftwatch.pipeline.identity`` turns the metadata into an Origin. Lines still wrapped in a
container runtime's envelope (CRI, docker json-file) are unwrapped by
``ftwatch.parsers.envelopes`` before that.

Sources put their output on one bounded ``queue.Queue``: when it is full, ``put`` blocks the
source's thread, so a Forward connection stops being read (TCP backpressure) and a file tail
stops reading, instead of ftwatch buffering without limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol


@dataclass(frozen=True, slots=True)
class Shipped:
    """One log line as a shipped source received it.

    Attributes:
        time: epoch seconds (the record's own time where the protocol carries one, else receipt).
        line: the log text, without its trailing newline; may still be a CRI/docker envelope
            when ``meta["envelope"]`` says so.
        meta: the record's other fields (fluent-bit: ``stream``, ``kubernetes`` {``pod_name``,
            ``namespace_name``, ``host``, ``labels``, ``container_name``}; ``tag``; a file
            source: ``path``; ``envelope``: ``cri`` | ``docker`` | absent).
    """

    time: float
    line: bytes
    meta: Mapping[str, Any] = field(default_factory=dict)


class ShippedSource(Protocol):
    """A source that puts ``list[Shipped]`` batches on a queue until stopped."""

    name: str

    def start(self) -> None:
        """Start its thread(s); returns at once. Raises SourceError if it cannot start."""

    def stop(self) -> None:
        """Stop and join its threads; idempotent."""
