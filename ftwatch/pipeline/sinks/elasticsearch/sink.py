"""The Elasticsearch sink (SPEC E2): what the SQLite store receives, as ECS documents in data streams.

Flow::

    write(batch of records)  -> one encoder: record type -> ecs.*_doc (pure) + event.sequence  -> DiskBuffer journal (esbuffer.py: appended before anything is sent)
    flush()  -> first (until it succeeds): is the index template there? if not, install it
                (``essetup.install``; a user without the privilege gets one warning)
             -> one bulk request per sealed segment (``require_data_stream=true``: nothing
                ever lands in a plain, dynamically mapped index), through the official client
             -> per item: 2xx sent; 409 already there (a retry after a lost ack): done;
                429 / 5xx: retried, then kept on disk (never dead-lettered: transient);
                no data stream (template missing, or a plain index in the way): kept on disk;
                other 4xx: dead letter (``ftwatch es flush --dead-letters`` replays them)
             -> whole request: no connection, timeout, 429 or 5xx: retried ``max_retries`` times
                with backoff, then kept on disk; 401/403/404 (set-up problems): kept on disk;
                other 4xx: dead letter

The buffer is capped at ``max_buffer_bytes``: when it is full, new documents are dropped (not
journaled), counted (``<buffer>/dropped.count``, metric ``ftwatch_spool_items{state="dropped"}``)
and logged as errors; what is already on disk is kept, so the cluster gets an unbroken history up
to the point where the buffer filled.

Every document is created (bulk ``create`` op) under a stable ``_id`` (``ecs``), so nothing is
doubled by a retry. Each gets ECS ``event.sequence``: the order this sink was handed the
documents, which tells apart records with the same time (the SQLite store's row order). Writers never wait for the network: they only append to the journal; the
background thread (``start``) or an explicit ``flush`` sends. ``close`` flushes once more and
leaves what the cluster did not take on disk for the next run.

Client: ``elasticsearch`` 8.x (pinned in pyproject). It sends ``compatible-with=8`` media types,
which Elasticsearch 8.x and 9.x servers accept (9.x through REST API compatibility); a 9.x client
would be refused by 8.x servers (elasticsearch-py README "Compatibility", issue #2928). It also
requires ``X-Elastic-Product: Elasticsearch`` on 2xx answers and refuses other products.

Size: about 420 lines, one class: the journal, the sequence numbers, the template state and the
flusher thread share one lock discipline; the pure parts are apart already (``ecs`` encodes,
``buffer`` journals, ``client`` classifies answers, ``setup`` installs templates).
"""

from __future__ import annotations

import logging
import socket
import threading
import time as _time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ftwatch.events import Decision, DeliveryResult
from ftwatch.pipeline.sinks.base import FindingBatch, LifecycleEvent, OutputBatch, Record, RunEnd, encode
from ftwatch.pipeline.sinks.elasticsearch import ecs, setup as essetup
from ftwatch.pipeline.sinks.elasticsearch.buffer import DiskBuffer
from ftwatch.pipeline.sinks.elasticsearch.client import KEEP_STATUSES, SinkStats, build_client, no_data_stream, reason

__all__ = ["ElasticsearchSink", "SinkStats", "build_client"]

log = logging.getLogger(__name__)

class ElasticsearchSink:
    """Writes ECS documents to ``<prefix>-{events,findings,decisions,alerts,output}`` data streams.

    A ``Sink`` (``ftwatch.pipeline.sinks.base``): :meth:`write` journals, a thread sends.

    Args:
        client: an ``elasticsearch.Elasticsearch`` (or anything with its ``bulk``).
        buffer_dir: the on-disk buffer and dead-letter file (``esbuffer``).
        prefix: the data stream prefix.
        batch_size: documents per bulk request.
        max_retries: retries of one bulk request per flush; ``backoff`` the seconds before
            retry 1, 2 ... (the last repeats); ``sleep`` waits (default: until ``close``;
            tests pass a recorder).
        max_buffer_bytes: cap of the on-disk buffer (0: none); when full new documents are
            dropped and counted (module doc).
        rollover_max_age, retention: the ILM policy installed when the index template is
            missing (``essetup.install``).
        labels: added to every document (``ecs.dedot`` explains dotted keys).
        host: ``host.name`` of documents that name no node (default: this machine's name).
        now: wall clock, epoch seconds (alerts without a time).

    Raises:
        SinkError: (not retryable) when the buffer directory cannot be used.
    """

    def __init__(self, client: Any, buffer_dir: Path, *, prefix: str = "ftwatch", batch_size: int = 500,
                 max_retries: int = 3, backoff: Sequence[float] = (0.5, 2.0, 5.0),
                 max_buffer_bytes: int = 0, rollover_max_age: str = "7d", retention: str = "90d",
                 labels: Mapping[str, str] | None = None,
                 host: str | None = None, sleep: Callable[[float], Any] | None = None,
                 now: Callable[[], float] = _time.time):
        self.client = client
        self.prefix = prefix
        self.buffer = DiskBuffer(buffer_dir, batch_size, max_bytes=max_buffer_bytes)
        self.max_retries = max_retries
        self.backoff = tuple(backoff) or (0.0,)
        self.ilm = (rollover_max_age, retention)
        self._template_ok = False              # the index template is known to be there
        self._require_ds = True                # False: a cluster before 8.13 (``_bulk``)
        self._template_warned = False
        self._dropping = False
        self.labels = dict(labels or {})
        self.host = host or socket.gethostname()
        self.stats = SinkStats()
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait          # a backoff ends early when closing
        self._now = now
        self._lock = threading.Lock()          # the journal
        self._flush_lock = threading.Lock()    # one flush at a time
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._sequence = 0                     # event.sequence of the next document
        self._writer = uuid.uuid4().hex[:16]   # tells this sink's output documents apart
        self._outputs = 0
        self._encoders = {RunEnd: self._run_end_docs, LifecycleEvent: self._event_docs,
                          FindingBatch: self._finding_docs, Decision: self._decision_docs,
                          DeliveryResult: self._delivery_docs, OutputBatch: self._output_docs}

    @classmethod
    def from_config(cls, cfg: Any, state_dir: Path, **kwargs: Any) -> "ElasticsearchSink":
        """A sink for an ``ElasticsearchConfig``; its buffer is ``cfg.buffer_dir`` or
        ``<state_dir>/es-buffer``."""
        client = build_client(cfg)
        try:
            return cls(client, cfg.buffer_dir or Path(state_dir) / "es-buffer",
                       prefix=cfg.data_stream_prefix, batch_size=cfg.batch_size,
                       max_retries=cfg.max_retries, backoff=cfg.backoff,
                       max_buffer_bytes=cfg.max_buffer_bytes, rollover_max_age=cfg.rollover_max_age,
                       retention=cfg.retention, labels=cfg.labels, **kwargs)
        except BaseException:
            client.close()                     # the buffer is unusable (e.g. held by another run)
            raise

    # -- the sink face --------------------------------------------------------------------------

    def write(self, batch: Sequence[Record]) -> None:
        """Journal the documents of ``batch`` (records of ``ftwatch.pipeline.sinks.base``); never
        waits for the network. A run's start has no document (its ``job_start`` event carries it).

        Raises:
            TypeError: a record that is not a sink record.
        """
        docs: list[ecs.Doc] = []
        for record in batch:
            docs += encode(self._encoders, record) or []
        self._queue(docs)

    def _run_end_docs(self, r: RunEnd) -> list[ecs.Doc]:
        return [ecs.run_end_doc(r.job, r.attempt, r.time, r.status, host=self.host, labels=self.labels)]

    def _event_docs(self, e: LifecycleEvent) -> list[ecs.Doc]:
        return [ecs.event_doc(e.time, e.job, e.kind, e.instance, e.rank, e.detail, host=self.host,
                              labels=self.labels)]

    def _finding_docs(self, b: FindingBatch) -> list[ecs.Doc]:
        return [ecs.finding_doc(f, b.attempt, labels=self.labels) for f in b.findings]

    def _decision_docs(self, d: Decision) -> list[ecs.Doc]:
        return [ecs.decision_doc(d, host=self.host, labels=self.labels)]

    def _delivery_docs(self, r: DeliveryResult) -> list[ecs.Doc]:
        return [ecs.delivery_doc(r, None, time=self._now(), host=self.host, labels=self.labels)]

    def _output_docs(self, b: OutputBatch) -> list[ecs.Doc]:
        """A bucket written twice is two documents, summed by readers; an instance's ``Origin``
        gives ``host.name`` (its node) and the pod labels."""
        docs = []
        with self._lock:
            for job, instance, rank, bucket, seconds, lines, nbytes in b.rows:
                o = b.origins.get((job, instance))
                docs.append(ecs.output_doc(job, instance, rank, bucket, seconds, lines, nbytes,
                                           writer=self._writer, n=self._outputs,
                                           host=o.node if o is not None else self.host, labels=self.labels,
                                           pod_labels=dict(o.labels) if o is not None and o.labels else None))
                self._outputs += 1
        return docs

    def _queue(self, docs: list[ecs.Doc]) -> None:
        if not docs:
            return
        with self._lock:
            entries = []
            for d in docs:
                d.source["event"]["sequence"] = self._sequence
                self._sequence += 1
                entries.append({"index": f"{self.prefix}-{d.kind}", "id": d.id, "doc": d.source, "tries": 0})
            before = self.buffer.dropped
            full = self.buffer.append(entries)
            dropped = self.buffer.dropped - before
            self.stats.queued += len(entries) - dropped
            self.stats.dropped += dropped
            if dropped and not self._dropping:
                log.error("the Elasticsearch buffer %s is full (storage.elasticsearch.max_buffer_bytes "
                          "= %d): new documents are DROPPED until the cluster takes what waits",
                          self.buffer.directory, self.buffer.max_bytes)
            elif not dropped and self._dropping:
                log.warning("the Elasticsearch buffer %s has room again; %d documents were dropped "
                            "in all (%s)", self.buffer.directory, self.buffer.dropped,
                            self.buffer.dropped_path)
            self._dropping = bool(dropped)
        if full:
            self._wake.set()

    # -- sending --------------------------------------------------------------------------------

    def pending(self) -> int:
        """Documents written here and not yet acknowledged by Elasticsearch."""
        with self._lock:
            return self.buffer.pending()

    def flush(self, retries: int | None = None) -> int:
        """Send everything journaled so far. Returns how many documents are still on disk.

        Args:
            retries: retries per bulk request (default ``max_retries``).

        Never raises for Elasticsearch trouble: what is not taken stays on disk and
        ``stats.last_error`` says why.
        """
        retries = self.max_retries if retries is None else retries
        with self._flush_lock:
            self.ensure_template()
            with self._lock:
                self.buffer.seal()
                segments = self.buffer.segments()
            left = 0
            for seg in segments:
                entries, bad = self.buffer.read(seg)
                if bad:
                    self._dead([{"reason": "unreadable buffer line", "status": None, "raw": b}
                                for b in bad])
                keep, reachable = self._send(entries, retries) if entries else ([], True)
                self.buffer.rewrite(seg, keep)
                left += len(keep)
                if not reachable:          # the cluster is away: keep the rest for later
                    left += sum(len(self.buffer.read(s)[0]) for s in segments[segments.index(seg) + 1:])
                    break
            if left:
                self.stats.failed_flushes += 1
            return left

    def _send(self, entries: list[dict[str, Any]], retries: int) -> tuple[list[dict[str, Any]], bool]:
        """One segment: (entries still to send, whether the cluster took the request)."""
        from elastic_transport import TransportError
        from elasticsearch import ApiError
        todo, request_failed = entries, False
        held: list[dict[str, Any]] = []
        for attempt in range(retries + 1):
            if attempt and self._stop.is_set():       # closing: no more retries, keep on disk
                break
            if attempt:
                self.stats.retries += 1
                self._sleep(self.backoff[min(attempt - 1, len(self.backoff) - 1)])
            ops: list[dict[str, Any]] = []
            for e in todo:
                ops += [{"create": {"_index": e["index"], "_id": e["id"]}}, e["doc"]]
            try:
                answer = self._bulk(ops)
            except ApiError as exc:
                status = exc.meta.status if exc.meta is not None else 0
                self.stats.note(f"bulk refused with {status}: {exc.message}")
                if status == 429 or status >= 500:
                    request_failed = True
                    continue
                if status in KEEP_STATUSES or status < 400:   # < 400: not Elasticsearch
                    log.error("Elasticsearch refused the bulk request (%s); documents stay in %s",
                              exc, self.buffer.directory)
                    return todo, False
                self._dead([self._dead_record(e, status, exc.message) for e in todo])
                return [], True
            except TransportError as exc:
                self.stats.note(f"no connection: {exc}")
                request_failed = True
                continue
            checked = self._items(todo, answer.body.get("items"))
            request_failed = checked is None
            if checked is not None:
                todo, hold = checked
                held += hold
            if not todo:
                return held, True
        return todo + held, not request_failed

    def _bulk(self, ops: list[dict[str, Any]]) -> Any:
        """One bulk request, ``require_data_stream=true`` where the cluster knows it (8.13+; an
        older one refuses the whole request with 400 naming the parameter: then it is sent
        without, once and from then on, and the index template alone makes the data streams)."""
        from elasticsearch import ApiError
        if not self._require_ds:
            return self.client.bulk(operations=ops)
        try:
            return self.client.bulk(operations=ops, require_data_stream=True)
        except ApiError as exc:
            if exc.meta is None or exc.meta.status != 400 or "require_data_stream" not in f"{exc} {exc.body}":
                raise
        self._require_ds = False
        log.warning("this Elasticsearch does not know require_data_stream (before 8.13): bulk requests "
                    "go without it; the index template still makes the data streams")
        return self.client.bulk(operations=ops)

    def _items(self, todo: list[dict[str, Any]], items: Any
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        """Check a 200 answer item by item; returns (entries to retry now, entries to keep on
        disk without retrying: their data stream cannot be made yet). None: the answer does not
        match the request, retry them all."""
        if not isinstance(items, list) or len(items) != len(todo):
            self.stats.note(f"bulk answer does not list {len(todo)} items")
            return None
        retry, dead, hold = [], [], []
        why = ""
        for entry, item in zip(todo, items):
            result = next(iter(item.values()), {}) if isinstance(item, dict) else {}
            status = int(result.get("status", 0))
            if 200 <= status < 300:
                self.stats.sent += 1
            elif status == 409:
                self.stats.duplicates += 1
            elif status == 429 or status >= 500:
                retry.append(entry)
            elif no_data_stream(status, result.get("error")):
                hold.append(entry)
                why = reason(result.get("error"))
            else:
                dead.append(self._dead_record(entry, status, result.get("error")))
        if retry:
            self.stats.note(f"{len(retry)} documents refused with 429/5xx")
        if hold:
            self._template_ok = False          # look again at the next flush
            self.stats.held += len(hold)
            self.stats.note(f"{len(hold)} documents refused: no data stream "
                            f"({why}); run `ftwatch es setup`")
        if dead:
            self._dead(dead)
        return retry, hold

    def ensure_template(self) -> bool:
        """Make sure the index template ``<prefix>`` exists (install it when missing). True when
        it is there. Never raises: without the privilege to install it, one warning is logged
        and documents stay on disk (``require_data_stream``) until ``ftwatch es setup`` ran."""
        if self._template_ok:
            return True
        state, error = essetup.ensure_template(self.client, self.prefix, *self.ilm)
        if state == "unknown":
            self.stats.note(f"cannot check the index template {self.prefix}: {error}")
            return False
        if state == "missing":
            self.stats.note(f"index template {self.prefix} missing and not installed: {error}")
            if not self._template_warned:
                self._template_warned = True
                log.warning("the Elasticsearch index template %r is missing and could not be installed "
                            "(%s): run `ftwatch es setup` as a user allowed to manage templates; "
                            "documents wait in %s until then", self.prefix, error, self.buffer.directory)
            return False
        if state == "installed":
            log.warning("installed the missing Elasticsearch index template %r (`ftwatch es setup`)", self.prefix)
        self._template_ok = True
        return True

    def replay_dead_letters(self) -> int:
        """Queue the documents of the dead-letter file again (``ftwatch es flush
        --dead-letters``); the next ``flush`` sends them the usual way (refused for good again:
        back into the dead-letter file). Lines without a document (unreadable buffer lines) stay.
        Returns how many were queued."""
        with self._lock:
            records, rest = self.buffer.take_dead_letters()
            entries = [{"index": r["index"], "id": r["id"], "doc": r["doc"], "tries": 0} for r in records]
            self.buffer.append(entries, capped=False)
            self.buffer.seal()
            self.buffer.put_dead_letters(rest)
            self.stats.queued += len(entries)
        return len(entries)

    @staticmethod
    def _dead_record(entry: dict[str, Any], status: int | None, error: Any) -> dict[str, Any]:
        return {"reason": error, "status": status, "index": entry["index"], "id": entry["id"],
                "doc": entry["doc"]}

    def _dead(self, records: list[dict[str, Any]]) -> None:
        n = self.buffer.dead_letter(records)
        self.stats.dead_lettered += n
        log.error("%d documents refused by Elasticsearch for good; see %s", n, self.buffer.dead_letter_path)

    # -- life cycle -----------------------------------------------------------------------------

    def start(self, interval: float) -> None:
        """Flush every ``interval`` seconds (and when a batch fills) in a daemon thread."""
        if self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.is_set():
                self._wake.wait(interval)
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    self.flush()
                except Exception as exc:       # never let the flusher die; the data is on disk
                    self.stats.note(f"flush failed: {exc}")
                    log.exception("Elasticsearch flush failed")

        self._thread = threading.Thread(target=loop, name="ftwatch-es-flush", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, flush once (no retries) and release the buffer; what is left stays
        on disk for the next run."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        try:
            left = self.flush(retries=0)
            if left:
                log.warning("%d documents for Elasticsearch stay in %s (%s)", left,
                            self.buffer.directory, self.stats.last_error)
        finally:
            with self._lock:
                self.buffer.close()
            closer = getattr(self.client, "close", None)
            if closer is not None:
                closer()
