"""Soak part 4: a webhook receiver and an Elasticsearch stand-in down for a while under ``watch``.

A real ``ftwatch watch`` reads a Forward listener; every 0.5 s a new job ships one line that a
soak rule fails (``SOAK FATAL``), so each job gets one finding, one ``fail_job`` decision and one
alert. The alert goes to a webhook receiver (a local HTTP server, :class:`Receiver`), and every
record to Elasticsearch (the stand-in of ``tests/pipeline/sinks/conftest.py``, a real HTTP server
speaking the bulk API). Both are up for a while, then stopped (connection refused) for the
outage (120 s x SOAK_SCALE: minutes), then started again on the same ports, the stand-in keeping the
documents it had, as a cluster does. Jobs keep coming throughout.

Once they are back, the soak waits until every decision in ftwatch's SQLite store has reached
both (or a deadline passes) and counts, per decision id (an alert carries it in its
``Idempotency-Key``, ``<decision>-<receiver>``; a decision document in ``ftwatch.decision_id``):

- alerts lost: decisions whose alert never arrived; duplicated: arrivals of a key seen before;
- documents lost: decisions and findings in SQLite without their Elasticsearch document;
  duplicated: a decision or a soak job's finding stored under two document ids.

Scale 1: about 3 minutes (10 s up, 120 s down, 10 s up, then the resend: spooled alerts are
retried every 30 s).
"""

from __future__ import annotations

import collections
import importlib.util
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fluent import sender

from bench.soak.common import ROOT, Figure, Watch, free_port, say, scale, wait_for, zero
from bench.soak.listeners import JOB_LABEL, record


def _stand_in() -> type:
    """FakeElasticsearch, the stand-in the sink's tests use, loaded under a name of its own (a
    module named ``conftest`` would clash with pytest's when a test imports this part)."""
    spec = importlib.util.spec_from_file_location("soak_fake_elasticsearch",
                                                  ROOT / "tests" / "pipeline" / "sinks" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FakeElasticsearch


FakeElasticsearch = _stand_in()

RULES = """\
rules:
  - id: soak.fatal
    keywords: ["SOAK FATAL"]
    class: user_code
    action: fail_job
    severity: error
"""


class Receiver:
    """A webhook receiver on 127.0.0.1 that records each POST's ``Idempotency-Key`` and answers 200.

    Args:
        port: the port (0: any free one); reused on :meth:`start` after :meth:`stop`.
    """

    def __init__(self, port: int = 0):
        self.keys: list[str] = []
        self.lock = threading.Lock()
        self.port = port
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> "Receiver":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with owner.lock:
                    owner.keys.append(self.headers.get("Idempotency-Key", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def restart_es(old: FakeElasticsearch) -> FakeElasticsearch:
    """A new stand-in on ``old``'s port holding what ``old`` held (a cluster back from an outage)."""
    new = FakeElasticsearch(port=old.port)
    new.docs, new.puts, new.streams, new.plain = old.docs, old.puts, old.streams, old.plain
    return new


def stored(db: Path) -> tuple[set[str], int]:
    """(decision ids, finding rows) of the soak jobs in ftwatch's SQLite store."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        decisions = {r[0] for r in conn.execute("SELECT decision_id FROM decisions WHERE job LIKE 'soak/soak-alert-%'")}
        findings = conn.execute("SELECT COUNT(*) FROM findings WHERE rule_id = 'soak.fatal'").fetchone()[0]
    return decisions, findings


def es_counts(es: FakeElasticsearch) -> tuple[collections.Counter, collections.Counter]:
    """(documents per decision id, finding documents per soak job) in the stand-in."""
    decisions: collections.Counter = collections.Counter()
    findings: collections.Counter = collections.Counter()
    for (index, _id), doc in list(es.docs.items()):
        ft = doc.get("ftwatch", {})
        if "decisions" in index and str(ft.get("job", "")).startswith("soak/soak-alert-"):
            decisions[ft.get("decision_id")] += 1
        elif "findings" in index and ft.get("rule_id", doc.get("event", {}).get("action")) == "soak.fatal":
            findings[ft.get("job")] += 1
    return decisions, findings


def run(tmp: Path, outage: float | None = None, up: float | None = None, every: float = 0.5) -> list[Figure]:
    """Runs part 4 in ``tmp``; returns its figures.

    Args:
        tmp: a fresh directory.
        outage: seconds both are down (default 120 x SOAK_SCALE).
        up: seconds of jobs before and after the outage (default 10 x SOAK_SCALE).
        every: seconds between new failing jobs.
    """
    outage = 120 * scale() if outage is None else outage
    up = 10 * scale() if up is None else up
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "rules.yaml").write_text(RULES)
    hook, es, fwd = Receiver().start(), FakeElasticsearch(), free_port()
    config = {"rules": {"files": [str(tmp / "rules.yaml")]},
              "alerting": {"receivers": [{"type": "webhook", "name": "ops", "timeout": 2, "max_retries": 1,
                                          "url": f"http://127.0.0.1:{hook.port}/hook"}]},
              "storage": {"elasticsearch": {"url": f"http://127.0.0.1:{es.port}", "flush_interval": 1}},
              "watch": {"sources": [{"type": "forward", "name": "fwd", "port": fwd}], "settle": 0.5,
                        "identity": {"job_label": JOB_LABEL},
                        "actuator": {"type": "exec", "command": ["true"], "timeout": 10}}}
    watch = Watch(tmp, config).start()
    jobs = [0]
    client = sender.FluentSender("kube", host="127.0.0.1", port=fwd, timeout=30)

    def jobs_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and watch.alive():
            client.emit("var.log.containers", record(f"soak-alert-{jobs[0]}", 0, "SOAK FATAL the soak's fault"))
            jobs[0] += 1
            time.sleep(every)
    try:
        if not watch.wait_listening(fwd):
            return [zero("outage: watch crashes", 1, f"did not start: {watch.stderr()}")]
        say(f"outage: receivers up {up:.0f} s, down {outage:.0f} s, up again")
        jobs_for(up)
        hook.stop()
        es.close()
        jobs_for(outage)
        hook.start()
        es = restart_es(es)
        say(f"outage: receivers back after {outage:.0f} s; {jobs[0]} failing jobs so far")
        jobs_for(up)
        client.close()
        db = watch.state / "ftwatch.db"

        def delivered() -> bool:
            if not watch.alive():
                return True
            ids, _ = stored(db)
            keys = {k.rsplit("-", 1)[0] for k in hook.keys}
            docs, _ = es_counts(es)
            return len(ids) >= jobs[0] and ids <= keys and ids <= set(docs)
        started = time.monotonic()
        wait_for(delivered, 150, 1.0)
        say(f"outage: caught up {time.monotonic() - started:.0f} s after the last job")
        time.sleep(3)                      # late duplicates would arrive now
        ids, finding_rows = stored(db)
        keys = collections.Counter(k.rsplit("-", 1)[0] for k in hook.keys)
        docs, finding_docs = es_counts(es)
        crashed = 0 if watch.alive() else 1
        note = f"{jobs[0]} failing jobs, {len(ids)} decisions in SQLite"
        return [zero("outage: watch crashes", crashed, watch.stderr()[-300:] if crashed else ""),
                zero("outage: decisions missing for jobs", max(0, jobs[0] - len(ids)), note),
                zero("outage: alerts lost", len(ids - set(keys)), f"{sum(keys.values())} webhook deliveries"),
                zero("outage: alerts duplicated", sum(n - 1 for n in keys.values())),
                zero("outage: documents lost", len(ids - set(docs)) + max(0, finding_rows - len(finding_docs)),
                     f"{len(docs)} decision + {len(finding_docs)} finding documents; "
                     f"{len(es.bulk_requests())} bulk requests after the outage"),
                zero("outage: documents duplicated", sum(n - 1 for n in docs.values())
                     + sum(n - 1 for n in finding_docs.values()))]
    finally:
        watch.stop()
        hook.stop()
        es.close()
