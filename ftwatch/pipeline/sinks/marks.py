"""The exactly-once marks in the SQLite store: what a batch leaves for ``watch``'s next start.

Three tables, each written in the transaction of the batch whose effects they mark (so after a
kill the marks and the effects agree) and read back by ``watch`` at start (issue 17); times are
epoch seconds::

    positions(key, seq, document BLOB, time)                       primary key (key)
    chunks(id, source, chunk, time)                                unique (source, chunk)
    open_blocks(origin JSON PK, labels JSON, data BLOB, base, skip JSON, time)

``positions`` (schema 3): each shipped source's position after its last batch (a file tail's
offsets; a lower ``seq`` never replaces a higher one), read by :func:`positions`.

``chunks`` (schema 4): the Forward ``chunk`` ids of the requests whose records a batch handled
(``ChunksSeen``); each write prunes the ids older than its ``keep_seconds`` and all but the
newest ``keep``. ``watch``'s Forward sources ask :func:`chunk_seen` on every request that
carries one (a client resending a chunk whose ack a kill lost).

``open_blocks`` (schema 4): the multi-line blocks still open after a batch (``OpenBlocks``), one
row per origin (its equality fields as a JSON list), read by :func:`open_blocks`, so a traceback
whose first lines a committed position has passed is not lost with the process.

``ftwatch.pipeline.sinks.sqlite`` owns the file, its migrations and its transactions; this
module gives it the tables' schemas, the encoders of the three records (:data:`ENCODERS`) and
the readers, which take its row query (``rows(sql, args) -> rows``).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ftwatch.events import Origin
from ftwatch.pipeline.sinks.base import ChunksSeen, OpenBlocks, SourcePosition

Rows = Callable[..., list]
"""The store's row query: ``rows(sql, args=()) -> list of sqlite3.Row``."""

SCHEMA_V3 = """
CREATE TABLE positions (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, document BLOB NOT NULL, time REAL NOT NULL DEFAULT 0);
"""

SCHEMA_V4 = """
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY, source TEXT NOT NULL, chunk TEXT NOT NULL, time REAL NOT NULL,
    UNIQUE (source, chunk));
CREATE INDEX chunks_time ON chunks (time);
CREATE TABLE open_blocks (
    origin TEXT PRIMARY KEY, labels TEXT NOT NULL DEFAULT '[]', data BLOB NOT NULL, base REAL NOT NULL,
    skip TEXT NOT NULL DEFAULT '[]', time REAL NOT NULL);
"""


def _position_rows(p: SourcePosition) -> list[tuple[str, list[tuple]]]:
    return [("INSERT INTO positions (key, seq, document, time) VALUES (?, ?, ?, ?) ON CONFLICT (key) "
             "DO UPDATE SET seq = excluded.seq, document = excluded.document, time = excluded.time "
             "WHERE excluded.seq > positions.seq", [(p.key, p.seq, bytes(p.document), p.time)])]


def _chunk_rows(c: ChunksSeen) -> list[tuple[str, list[tuple]]]:
    """The ids, then the pruning: by age (the time index), then all but the newest ``keep`` ids
    (``id`` rises with every insert, so the cut is one range on the primary key)."""
    if not c.chunks:
        return []
    return [("INSERT OR IGNORE INTO chunks (source, chunk, time) VALUES (?, ?, ?)",
             [(source, chunk, c.time) for source, chunk in c.chunks]),
            ("DELETE FROM chunks WHERE time < ?", [(c.time - c.keep_seconds,)]),
            ("DELETE FROM chunks WHERE id <= (SELECT max(id) FROM chunks) - ?", [(c.keep,)])]


def _origin_key(o: Origin) -> str:
    return json.dumps([o.instance, o.rank, o.job, o.node, o.stream, o.source])


def _block_rows(b: OpenBlocks) -> list[tuple[str, list[tuple]]]:
    closed = [(_origin_key(o),) for o, data, _, _ in b.blocks if data is None]
    kept = [(_origin_key(o), json.dumps([list(pair) for pair in o.labels]), data, base, json.dumps(sorted(skip)),
             b.time) for o, data, base, skip in b.blocks if data is not None]
    return ([("DELETE FROM open_blocks WHERE origin = ?", closed)] if closed else []) + (
        [("INSERT OR REPLACE INTO open_blocks (origin, labels, data, base, skip, time) VALUES (?, ?, ?, ?, ?, ?)",
          kept)] if kept else [])


ENCODERS: dict[type, Callable[[Any], list[tuple[str, list[tuple]]]]] = {
    SourcePosition: _position_rows, ChunksSeen: _chunk_rows, OpenBlocks: _block_rows}
"""The marks' sink records -> the statements and rows that store them."""


def positions(rows: Rows) -> dict[str, tuple[int, bytes]]:
    """Each shipped source's position stored with its last batch: key -> (seq, document)."""
    return {r["key"]: (r["seq"], bytes(r["document"])) for r in rows("SELECT key, seq, document FROM positions")}


def chunk_seen(rows: Rows, source: str, chunk: str) -> bool:
    """Whether a batch that handled Forward ``chunk`` of ``source`` was committed (and its id
    not pruned since)."""
    return bool(rows("SELECT 1 FROM chunks WHERE source = ? AND chunk = ?", (source, chunk)))


def open_blocks(rows: Rows) -> list[tuple[Origin, bytes, float, frozenset[int]]]:
    """The open blocks stored with the last batches: ``(origin, data, base, skip)`` each, oldest
    first (``Engine.restore_block``)."""
    out = []
    for r in rows("SELECT origin, labels, data, base, skip FROM open_blocks ORDER BY time"):
        instance, rank, job, node, stream, source = json.loads(r["origin"])
        labels = tuple(tuple(pair) for pair in json.loads(r["labels"]))
        out.append((Origin(instance, rank, job, node, stream, source, labels), bytes(r["data"]), r["base"],
                    frozenset(json.loads(r["skip"]))))
    return out

