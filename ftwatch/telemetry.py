"""The Prometheus ``/metrics`` endpoint of ``ftwatch run`` and ``ftwatch watch`` (SPEC E5).

Built on the official ``prometheus_client``; every :class:`Metrics` has its own registry, so
several can live in one process (tests). The hub code increments them where the work happens
(``Recorder``: lines read, findings, decisions, restarts; the watcher: ingest lag); spool and
queue sizes are read when Prometheus scrapes.

=====================================  =======  ==========================================
metric                                 type     labels
=====================================  =======  ==========================================
``ftwatch_lines_total``                counter  ``job_id``: log lines read
``ftwatch_bytes_total``                counter  ``job_id``: log bytes read
``ftwatch_findings_total``             counter  ``job_id``, ``failure_class``, ``severity``
``ftwatch_decisions_total``            counter  ``job_id``, ``action``
``ftwatch_restarts_total``             counter  ``job_id``, ``kind`` (``job``, ``instance``, or
                                                the actuator's action in ``watch``)
``ftwatch_ingest_lag_seconds``         histog.  now minus the record time of shipped lines
                                                (``watch``; per origin and batch, newest line)
``ftwatch_ingest_lag_last_seconds``    gauge    the last such lag
``ftwatch_spool_items``                gauge    ``spool`` (``alerts``, ``elasticsearch``),
                                                ``state`` (``pending``/``dead``; and
                                                ``dropped`` for ``elasticsearch``: never
                                                journaled, the buffer was full)
``ftwatch_spool_bytes``                gauge    ``spool``, ``state``
``ftwatch_queue_batches``              gauge    batches waiting in ``watch``'s ingest queue
``ftwatch_run_queue_bytes``            gauge    ``run``: workers' output bytes read and not
                                                yet taken by the loop (bounded: the readers
                                                then wait and the workers' pipes fill)
``ftwatch_run_queue_age_seconds``      gauge    ``run``: how long the oldest such output has
                                                waited (0: none waits; the monitor's lag)
``ftwatch_source_connections_total``   counter  ``source``, ``event``: ``accepted``,
                                                ``refused`` (over ``max_connections``),
                                                ``idle_closed`` (Forward / HTTP listeners)
``ftwatch_state_evicted_total``        counter  ``kind``: state dropped by a cap of the
                                                ``limits`` section (``job``, ``job_idle``,
                                                ``finding``, ``instance``, ...;
                                                ``ftwatch.config.limits``), read from
                                                ``ftwatch.bounded.EVICTIONS`` at scrape time
=====================================  =======  ==========================================

A job whose state ``watch`` drops (``limits.max_jobs``, ``limits.job_idle_seconds``, a failed
job) has its series dropped too (:meth:`Metrics.forget_job`), so the label sets stay as bounded
as the jobs: a job that speaks again starts its counters from 0 (a counter reset to Prometheus).

The label is ``job_id``, not ``job``: Prometheus sets ``job`` to the scrape job's name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ftwatch.bounded import EVICTIONS
from ftwatch.errors import ConfigError
from ftwatch.events import Action

LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, float("inf"))


class _SpoolCollector:
    """Counts the entries (and their bytes) of spools at scrape time."""

    def __init__(self) -> None:
        self.spools: dict[str, tuple[Path, str]] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        items = GaugeMetricFamily("ftwatch_spool_items", "Entries waiting in a spool (not yet "
                                  "delivered: pending; refused for good: dead).", labels=["spool", "state"])
        size = GaugeMetricFamily("ftwatch_spool_bytes", "Bytes of a spool's entries.",
                                 labels=["spool", "state"])
        for name, (path, layout) in sorted(self.spools.items()):
            usage = _jsonl_usage(path) if layout == "jsonl" else _files_usage(path)
            for state, n, b in usage:
                items.add_metric([name, state], n)
                size.add_metric([name, state], b)
        yield items
        yield size


class _EvictionCollector:
    """``ftwatch_state_evicted_total{kind}`` from the process's eviction tally (``ftwatch.bounded``)."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("ftwatch_state_evicted", "State dropped by a cap of the limits "
                                     "section, by kind.", labels=["kind"])
        for kind, n in sorted(EVICTIONS.snapshot().items()):
            family.add_metric([kind], n)
        yield family


def _files_usage(path: Path) -> list[tuple[str, int, int]]:
    """(state, entries, bytes) of a directory with a file per entry, dead ones in ``dead/``
    (``ftwatch.alerting.spool``)."""
    out = []
    for state, directory in (("pending", path), ("dead", path / "dead")):
        n = b = 0
        try:
            with os.scandir(directory) as entries:
                for e in entries:
                    if e.is_file(follow_symlinks=False) and not e.name.startswith("."):
                        n += 1
                        b += e.stat(follow_symlinks=False).st_size
        except OSError:
            pass                   # not created yet: empty
        out.append((state, n, b))
    return out


def _jsonl_usage(path: Path) -> list[tuple[str, int, int]]:
    """(state, entries, bytes) of a directory of JSON-lines files, an entry a line, the dead
    ones in ``dead-letter.jsonl``, and the ``dropped`` count of ``dropped.count`` (bytes 0:
    not kept) (``ftwatch.pipeline.sinks.elasticsearch.buffer``)."""
    counts = {"pending": [0, 0], "dead": [0, 0]}
    try:
        files = sorted(path.glob("*.jsonl"))
    except OSError:
        files = []
    for f in files:
        try:
            data = f.read_bytes()
        except OSError:
            continue               # sealed or acknowledged meanwhile
        slot = counts["dead" if f.name == "dead-letter.jsonl" else "pending"]
        slot[0] += data.count(b"\n")
        slot[1] += len(data)
    try:
        dropped = int((path / "dropped.count").read_text().strip() or 0)
    except (OSError, ValueError):
        dropped = 0
    return [(state, n, b) for state, (n, b) in counts.items()] + [("dropped", dropped, 0)]


_RESTART_ACTIONS = frozenset(a.label for a in (Action.RESTART_JOB, Action.RESTART_INSTANCE,
                                               Action.RESTART_IN_PLACE, Action.ISOLATE_NODE))


class Metrics:
    """ftwatch's counters and gauges in one registry.

    Args:
        registry: where they live; a new one when None.
    """

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.lines = Counter("ftwatch_lines", "Log lines read.", ["job_id"], registry=r)
        self.bytes = Counter("ftwatch_bytes", "Log bytes read.", ["job_id"], registry=r)
        self.findings = Counter("ftwatch_findings", "Findings made by rules, exits and hang timers.",
                                ["job_id", "failure_class", "severity"], registry=r)
        self.decisions = Counter("ftwatch_decisions", "Policy decisions.", ["job_id", "action"],
                                 registry=r)
        self.restarts = Counter("ftwatch_restarts", "Restarts carried out.", ["job_id", "kind"],
                                registry=r)
        self.lag = Histogram("ftwatch_ingest_lag_seconds", "Seconds from a shipped record's time "
                             "to its ingestion.", buckets=LAG_BUCKETS, registry=r)
        self.lag_last = Gauge("ftwatch_ingest_lag_last_seconds", "The last ingest lag observed.",
                              registry=r)
        self.queue = Gauge("ftwatch_queue_batches", "Batches waiting in the ingest queue.",
                           registry=r)
        self.run_queue_bytes = Gauge("ftwatch_run_queue_bytes", "ftwatch run: workers' output bytes read "
                                     "and waiting for the loop.", registry=r)
        self.run_queue_age = Gauge("ftwatch_run_queue_age_seconds", "ftwatch run: seconds the oldest output "
                                   "waiting for the loop has waited.", registry=r)
        self.connections = Counter("ftwatch_source_connections", "Connections to the Forward and HTTP "
                                   "listeners: accepted, refused (over max_connections), idle_closed.",
                                   ["source", "event"], registry=r)
        self.repeated = Counter("ftwatch_source_repeated_records", "Records of Forward chunks sent again "
                                "after they were handled (a kill lost their ack): acked and skipped.",
                                ["source"], registry=r)
        self._spools = _SpoolCollector()
        r.register(self._spools)
        r.register(_EvictionCollector())
        self._server = None
        self._output: dict[str, tuple] = {}      # job -> its (lines, bytes) counters, labelled

    # -- the real paths call these --------------------------------------------------------------

    def count_output(self, job: str, lines: int, nbytes: int) -> None:
        """``lines`` lines of ``nbytes`` bytes of ``job`` were read. Called per origin and chunk
        (1,000 pods: 1,000 times a batch), so each job's two labelled counters are looked up once."""
        pair = self._output.get(job)
        if pair is None:
            if len(self._output) >= 4096:
                self._output.clear()
            pair = self._output[job] = (self.lines.labels(job), self.bytes.labels(job))
        pair[0].inc(lines)
        pair[1].inc(nbytes)

    def count_findings(self, findings: Iterable) -> None:
        """Count findings (``ftwatch.events.Finding``) by job, failure class and severity."""
        for f in findings:
            self.findings.labels(f.origin.job, f.failure_class.value, f.severity.name.lower()).inc()

    def count_decision(self, job: str, action: str) -> None:
        """A decision with action label ``action`` was taken for ``job``."""
        self.decisions.labels(job, action).inc()

    def count_restart(self, job: str, kind: str) -> None:
        """A restart of kind ``kind`` (``job``, ``instance``, or an action label) was carried out."""
        self.restarts.labels(job, kind).inc()

    def count_event(self, job: str, kind: str, detail: Mapping[str, Any]) -> None:
        """Count what a lifecycle event (``Recorder.event``) says was carried out: ``job_restart``
        (kind ``job``), ``instance_restart`` (kind ``instance``) and an ``actuator`` event whose
        restart action is ``done`` (kind: the action's label)."""
        if kind in ("job_restart", "instance_restart"):
            self.count_restart(job, kind.split("_")[0])
        elif kind == "actuator" and detail.get("status") == "done" and \
                detail.get("action") in _RESTART_ACTIONS:
            self.count_restart(job, detail["action"])

    def count_connection(self, source: str, event: str) -> None:
        """A listener ``source`` accepted, refused or idle-closed a connection (``event``)."""
        self.connections.labels(source, event).inc()

    def count_repeated(self, source: str, records: int) -> None:
        """A Forward source acked and skipped a chunk of ``records`` records it had handled before."""
        self.repeated.labels(source).inc(records)

    def forget_job(self, job: str) -> int:
        """Drop every series labelled ``job_id=job`` (its state was dropped: ``limits``); returns
        how many went. Reads prometheus_client's children map (``_metrics``, under its lock): the
        library removes a child only by its full label values. The job's cached output counters go
        too: kept, a job that speaks again would count into children no longer registered, and its
        output series would not come back."""
        self._output.pop(job, None)
        gone = 0
        for metric in (self.lines, self.bytes, self.findings, self.decisions, self.restarts):
            with metric._lock:
                keys = [k for k in metric._metrics if k[0] == job]
                for k in keys:
                    del metric._metrics[k]
            gone += len(keys)
        return gone

    def observe_lag(self, seconds: float) -> None:
        """A shipped record was ingested ``seconds`` after its own time (negative: clock skew,
        counted as 0)."""
        seconds = max(0.0, seconds)
        self.lag.observe(seconds)
        self.lag_last.set(seconds)

    def watch_spool(self, name: str, path: Path | str, layout: str = "files") -> None:
        """Report the size of a spool at each scrape.

        Args:
            layout: ``files``: a file per entry, dead ones in ``dead/`` (the alert spool);
                ``jsonl``: JSON-lines files, an entry a line, dead ones in
                ``dead-letter.jsonl`` (the Elasticsearch buffer).
        """
        if layout not in ("files", "jsonl"):
            raise ValueError(f"unknown spool layout {layout!r}")
        self._spools.spools[name] = (Path(path), layout)

    def watch_queue(self, size: Callable[[], float]) -> None:
        """Report ``size()`` as ``ftwatch_queue_batches`` at each scrape (e.g. ``queue.qsize``)."""
        self.queue.set_function(size)

    def watch_lag(self, lag: Callable[[], tuple[float, float]]) -> None:
        """Report ``lag()`` = (bytes, seconds) as ``ftwatch_run_queue_bytes`` and
        ``ftwatch_run_queue_age_seconds`` at each scrape (``Supervisor.lag``)."""
        self.run_queue_bytes.set_function(lambda: lag()[0])
        self.run_queue_age.set_function(lambda: lag()[1])

    # -- the endpoint ---------------------------------------------------------------------------

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` over HTTP on ``host:port`` in a daemon thread (port 0: a free one).

        Returns:
            the port bound.

        Raises:
            OSError: the address cannot be bound.
        """
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return server.server_port

    def close(self) -> None:
        """Stop serving (no-op when not serving)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class NullMetrics:
    """Metrics off: the counting calls of :class:`Metrics` that the pipeline makes, doing nothing."""

    def count_output(self, job: str, lines: int, nbytes: int) -> None:
        pass

    def count_findings(self, findings: Iterable) -> None:
        pass

    def count_decision(self, job: str, action: str) -> None:
        pass

    def count_restart(self, job: str, kind: str) -> None:
        pass

    def count_event(self, job: str, kind: str, detail: Mapping[str, Any]) -> None:
        pass

    def observe_lag(self, seconds: float) -> None:
        pass

    def forget_job(self, job: str) -> int:
        return 0

    def close(self) -> None:
        pass


NULL_METRICS = NullMetrics()


def start_metrics(storage, port: int | None, state_dir: Path,
                  say: Callable[[str], None] = print) -> Metrics | None:
    """Start the endpoint ``run`` and ``watch`` serve, if asked for, and ``say`` its URL.

    Args:
        storage: the ``storage`` config: its ``metrics`` (``ftwatch.config.metrics.MetricsConfig``)
            and ``elasticsearch`` (whose buffer is reported as spool ``elasticsearch``).
        port: ``--metrics-port`` (wins over the config's port; on 127.0.0.1 when the config
            names no address); None: the config alone.
        state_dir: its ``spool`` directory (the alert spool) is reported as spool ``alerts``.

    Returns:
        the serving Metrics (``close`` it at the end), or None when neither the config nor
        ``port`` asks for metrics.

    Raises:
        ConfigError: the address cannot be bound.
    """
    from ftwatch.config.metrics import parse_listen
    config = storage.metrics
    if port is None and config.listen is None:
        return None
    host, wanted = parse_listen(config.listen) if config.listen else ("127.0.0.1", 0)
    metrics = Metrics()
    metrics.watch_spool("alerts", Path(state_dir) / "spool")
    es = getattr(storage, "elasticsearch", None)
    if es is not None:
        metrics.watch_spool("elasticsearch", Path(es.buffer_dir or Path(state_dir) / "es-buffer"), "jsonl")
    try:
        bound = metrics.serve(host, wanted if port is None else port)
    except OSError as exc:
        raise ConfigError(f"metrics endpoint {host}:{wanted if port is None else port}: "
                          f"cannot listen: {exc}") from None
    shown = f"[{host}]" if ":" in host else host
    say(f"ftwatch: metrics on http://{shown}:{bound}/metrics")
    return metrics
