"""``ftwatch report`` from Elasticsearch: a ``ReportReader`` over the sink's data streams (SPEC E2).

Reads ``<prefix>-events``, ``-findings``, ``-decisions`` and ``-output`` (written by
``ftwatch.pipeline.sinks.elasticsearch.sink``) with the official client and maps the ECS documents
back to the SQLite store's rows (``ftwatch.pipeline.sinks.elasticsearch.ecsread``), so the page is the same
whichever store it comes from. Runs are derived from the ``job_start`` events and the sink's
``job_end`` documents.

Reading is complete however large the job: every query pages through a point in time
(``POST <index>/_pit``, then ``_search`` with ``pit`` + ``search_after`` sorted on
``_shard_doc``, Elasticsearch "Paginate search results"), and the jobs come from a
``composite`` aggregation paged with ``after``. Rows are put in time order here, ties broken by
``event.sequence`` (the order the sink wrote them); findings, which may be many, are sorted so by
Elasticsearch (``_shard_doc`` the last key) and handed over page by page. The output counts are
summed per instance and bucket by Elasticsearch (a ``composite`` aggregation too, with ``min`` /
``max`` ones for their bounds), so the report folds them page by page, as it folds the SQLite
store's. A data stream not created yet (no decision ever) reads as empty (``ignore_unavailable``).

A hub (tests/test_layering.py): the report reads what the pipeline's sink wrote.
"""

from __future__ import annotations

import math
from typing import Any, Iterator
from urllib.parse import urlsplit

from ftwatch.errors import FtwatchError
from ftwatch.pipeline.sinks.elasticsearch import ecsread
from ftwatch.report.reader import in_window, run_in_window

Row = dict[str, Any]
_READ_KINDS = ("events", "findings", "decisions", "output")
_FIELDS = ["@timestamp", "ftwatch", "event.sequence", "error.stack_trace"]   # what ecsread uses
# findings in ecsread.epoch order (@timestamp is ftwatch.epoch to the millisecond, and the time of
# a document written before ftwatch.epoch), then seq and event.sequence (0 when absent)
_FINDING_ORDER = [{"@timestamp": "asc"}, {"ftwatch.epoch": {"order": "asc", "missing": "_first"}},
                  {"ftwatch.seq": {"order": "asc", "missing": 0}},
                  {"event.sequence": {"order": "asc", "missing": 0}}, "_shard_doc"]


class EsReadError(FtwatchError):
    """Elasticsearch could not be read: unreachable, refused (credentials, rights) or answered
    something that is not Elasticsearch. ``status``: the HTTP status when it refused, else None."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _public(url: str) -> str:
    """``url`` without any ``user:password@``."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}".rstrip("/")


class EsReader:
    """Reads the report's rows from Elasticsearch.

    Args:
        client: an ``elasticsearch.Elasticsearch`` (``ftwatch.pipeline.sinks.elasticsearch.sink.build_client``).
        prefix: ``storage.elasticsearch.data_stream_prefix``.
        since, until: the time window (epoch s; None: open), as ``ftwatch.report.reader``'s.
        page_size: hits per search request (and jobs per aggregation page).
        keep_alive: how long the point in time lives between two pages.
        url: shown as the report's source (credentials stripped).

    Raises:
        EsReadError: (from every method) the cluster is unreachable or refuses the request.
    """

    def __init__(self, client: Any, prefix: str = "ftwatch", *, since: float | None = None,
                 until: float | None = None, page_size: int = 1000, keep_alive: str = "2m",
                 url: str = ""):
        self.client = client
        self.prefix = prefix
        self.since, self.until = since, until
        self.page_size = page_size
        self.keep_alive = keep_alive
        self.url = _public(url) if url else "Elasticsearch"
        self.source = f"{self.url} ({prefix}-*)"
        self.searches = 0            # search requests sent (pages)

    @classmethod
    def from_config(cls, cfg: Any, **kwargs: Any) -> "EsReader":
        """A reader for an ``ElasticsearchConfig`` (its URLs, credentials, TLS and prefix)."""
        from ftwatch.pipeline.sinks.elasticsearch.sink import build_client
        return cls(build_client(cfg), cfg.data_stream_prefix, url=cfg.url[0], **kwargs)

    # -- talking to the cluster -----------------------------------------------------------------

    def _call(self, what: str, fn: Any, **kwargs: Any) -> Any:
        from elastic_transport import TransportError
        from elasticsearch import ApiError, UnsupportedProductError
        try:
            return fn(**kwargs)
        except UnsupportedProductError as exc:
            raise EsReadError(f"{self.url} is not Elasticsearch: {exc}") from None
        except ApiError as exc:
            status = exc.meta.status if exc.meta is not None else None
            raise EsReadError(f"Elasticsearch at {self.url} refused {what} ({status}): {exc.message}",
                              status) from None
        except TransportError as exc:
            raise EsReadError(f"Elasticsearch at {self.url} is unreachable: {exc}") from None

    def check(self) -> None:
        """Fail early, with a clear message, when the cluster cannot be reached.

        Raises:
            EsReadError: unreachable, refused, or not Elasticsearch.
        """
        self._call("the root endpoint", self.client.info)

    def _range(self) -> list[Row]:
        """A ``@timestamp`` range (milliseconds, widened to whole ms) for the window, or none;
        the exact window is applied to ``ftwatch.epoch`` after reading."""
        if self.since is None and self.until is None:
            return []
        bounds: Row = {"format": "epoch_millis"}
        if self.since is not None:
            bounds["gte"] = math.floor(self.since * 1000)
        if self.until is not None:
            bounds["lt"] = math.ceil(self.until * 1000) + 1
        return [{"range": {"@timestamp": bounds}}]

    def _scan(self, kind: str, filters: list[Row], sort: list[Any] | None = None) -> Iterator[Row]:
        """Every document ``_source`` of ``<prefix>-<kind>`` matching ``filters``, through a point
        in time paged with ``search_after``: in ``sort``'s order (its last key ``_shard_doc``, so
        that a page boundary never splits ties), else unordered (callers sort)."""
        index = f"{self.prefix}-{kind}"
        try:
            pit = self._call(f"a point in time on {index}", self.client.open_point_in_time, index=index,
                             keep_alive=self.keep_alive, ignore_unavailable=True)["id"]
        except EsReadError as exc:
            if exc.status == 404:           # the data stream was never written
                return
            raise
        after: list[Any] | None = None
        try:
            while True:
                kwargs: Row = {"pit": {"id": pit, "keep_alive": self.keep_alive}, "size": self.page_size,
                               "sort": sort or ["_shard_doc"], "query": {"bool": {"filter": filters}},
                               "source": {"includes": _FIELDS}, "track_total_hits": False}
                if after is not None:
                    kwargs["search_after"] = after
                answer = self._call(f"a search of {index}", self.client.search, **kwargs)
                self.searches += 1
                pit = answer.get("pit_id") or pit
                hits = answer["hits"]["hits"]
                for hit in hits:
                    yield hit["_source"]
                if len(hits) < self.page_size:
                    return
                after = hits[-1]["sort"]
        finally:
            try:
                self.client.close_point_in_time(id=pit)
            except Exception:          # the PIT expires by itself; do not hide the real error
                pass

    def _docs(self, kind: str, job: str, windowed: bool = True) -> list[Row]:
        filters: list[Row] = [{"term": {"ftwatch.job": job}}] + (self._range() if windowed else [])
        docs = list(self._scan(kind, filters))
        if windowed:
            docs = [d for d in docs if in_window(ecsread.epoch(d), self.since, self.until)]
        return docs

    # -- the ReportReader methods ---------------------------------------------------------------

    def jobs(self) -> list[str]:
        """Jobs with a document in the events, findings, decisions or output data streams (in
        the window), sorted."""
        index = ",".join(f"{self.prefix}-{k}" for k in _READ_KINDS)
        agg: Row = {"composite": {"size": self.page_size,
                                  "sources": [{"job": {"terms": {"field": "ftwatch.job"}}}]}}
        jobs: set[str] = set()
        while True:
            answer = self._call(f"the jobs of {index}", self.client.search, index=index, size=0,
                                query={"bool": {"filter": self._range()}}, aggs={"jobs": agg},
                                ignore_unavailable=True, allow_no_indices=True)
            self.searches += 1
            result = (answer.get("aggregations") or {}).get("jobs") or {}
            buckets = result.get("buckets") or []
            jobs.update(str(b["key"]["job"]) for b in buckets)
            if not buckets or "after_key" not in result:
                break
            agg = {"composite": {**agg["composite"], "after": result["after_key"]}}
        return sorted(jobs)

    def runs(self, job: str) -> list[Row]:
        docs = self._scan("events", [{"term": {"ftwatch.job": job}},
                                     {"terms": {"event.action": ["job_start", "job_end"]}}])
        ordered = sorted(docs, key=lambda d: (ecsread.epoch(d), ecsread.sequence(d)))
        return [r for r in ecsread.run_rows(ordered) if run_in_window(r, self.since, self.until)]

    def events(self, job: str) -> list[Row]:
        docs = sorted(self._docs("events", job), key=lambda d: (ecsread.epoch(d), ecsread.sequence(d)))
        return [ecsread.event_row(d) for d in docs if not ecsread.is_run_end(d)]

    def findings(self, job: str) -> Iterator[Row]:
        """The job's findings in time order (ties: the finding's ``seq``, then the order the sink
        wrote them), sorted by Elasticsearch and read page by page: a long job holds hundreds of
        thousands (a warning per step), which the report folds as they come."""
        for doc in self._scan("findings", [{"term": {"ftwatch.job": job}}] + self._range(), _FINDING_ORDER):
            if in_window(ecsread.epoch(doc), self.since, self.until):
                yield ecsread.finding_row(doc)

    def decisions(self, job: str) -> list[Row]:
        docs = sorted(self._docs("decisions", job), key=lambda d: (ecsread.epoch(d), ecsread.sequence(d)))
        return [ecsread.decision_row(d) for d in docs]

    def _output_filters(self, job: str) -> list[Row]:
        """The job's output documents in the window: exact on ``ftwatch.epoch`` (the bucket's
        start, as the SQLite reader's ``bucket``)."""
        exact: Row = {}
        if self.since is not None:
            exact["gte"] = self.since
        if self.until is not None:
            exact["lt"] = self.until
        return ([{"term": {"ftwatch.job": job}}] + self._range()
                + ([{"range": {"ftwatch.epoch": exact}}] if exact else []))

    def _aggregate(self, what: str, filters: list[Row], aggs: Row) -> Row:
        """One ``size: 0`` search of ``<prefix>-output`` with ``aggs``; its aggregations ({} when
        the data stream was never written)."""
        index = f"{self.prefix}-output"
        answer = self._call(f"{what} of {index}", self.client.search, index=index, size=0,
                            query={"bool": {"filter": filters}}, aggs=aggs,
                            ignore_unavailable=True, allow_no_indices=True)
        self.searches += 1
        return answer.get("aggregations") or {}

    def output(self, job: str) -> Iterator[Row]:
        """The job's output counts by instance, then bucket, a bucket's documents summed (the
        sink writes a bucket again as another document), as the SQLite store gives them.

        Summed by Elasticsearch and read page by page (a ``composite`` aggregation over
        instance and bucket, paged with ``after``): a long ``watch`` writes a document per
        instance and bucket (1,000 pods: 17 M a day), which are never all held here."""
        sums = {"lines": {"sum": {"field": "ftwatch.lines"}}, "bytes": {"sum": {"field": "ftwatch.bytes"}},
                "seconds": {"max": {"field": "ftwatch.seconds"}}, "rank": {"max": {"field": "ftwatch.rank"}}}
        comp: Row = {"size": self.page_size, "sources": [
            {"instance": {"terms": {"field": "ftwatch.instance"}}},
            {"bucket": {"terms": {"field": "ftwatch.epoch"}}}]}
        filters = self._output_filters(job)
        while True:
            result = self._aggregate("the output counts", filters,
                                     {"rows": {"composite": comp, "aggs": sums}}).get("rows") or {}
            buckets = result.get("buckets") or []
            for b in buckets:
                rank = b["rank"]["value"]
                yield {"job": job, "instance": b["key"]["instance"], "rank": None if rank is None else int(rank),
                       "bucket": float(b["key"]["bucket"]), "seconds": float(b["seconds"]["value"]),
                       "lines": int(b["lines"]["value"]), "bytes": int(b["bytes"]["value"])}
            if not buckets or "after_key" not in result:
                return
            comp = {**comp, "after": result["after_key"]}

    def output_bounds(self, job: str) -> tuple[float, float, float] | None:
        """The first and the last bucket start (epoch s) of :meth:`output`'s rows and their
        shortest bucket (s), or None when it has none (``min`` / ``max`` aggregations)."""
        got = self._aggregate("the output bounds", self._output_filters(job), {
            "first": {"min": {"field": "ftwatch.epoch"}}, "last": {"max": {"field": "ftwatch.epoch"}},
            "step": {"min": {"field": "ftwatch.seconds"}}})
        values = [(got.get(k) or {}).get("value") for k in ("first", "last", "step")]
        return None if None in values else (float(values[0]), float(values[1]), float(values[2]))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "EsReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
