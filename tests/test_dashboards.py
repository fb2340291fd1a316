"""Kibana saved objects in dashboards/ and ``ftwatch dashboards import`` against a local HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ftwatch.cli import main
from ftwatch.report.dashboards import (dangling_references, decode, encode, load_sources, parse_ndjson, to_ndjson,
                                with_prefix)
from ftwatch.pipeline.sinks.elasticsearch import setup as essetup

ROOT = Path(__file__).resolve().parents[1]
NDJSON = ROOT / "dashboards" / "ftwatch.ndjson"
OBJECTS = parse_ndjson(NDJSON.read_text(encoding="utf-8"), str(NDJSON))

# Ids are part of the contract: overwrite=true replaces by id, and people link to the dashboard.
STABLE_IDS = {
    ("index-pattern", "ftwatch-dv-events"), ("index-pattern", "ftwatch-dv-findings"),
    ("index-pattern", "ftwatch-dv-decisions"), ("index-pattern", "ftwatch-dv-alerts"),
    ("index-pattern", "ftwatch-dv-all"), ("index-pattern", "ftwatch-dv-output"),
    ("visualization", "ftwatch-vis-restarts-over-time"), ("visualization", "ftwatch-vis-decisions-by-action"),
    ("visualization", "ftwatch-vis-failure-classes"), ("visualization", "ftwatch-vis-top-root-causes"),
    ("visualization", "ftwatch-vis-isolated-nodes"), ("search", "ftwatch-search-job-timeline"),
    ("visualization", "ftwatch-vis-new-failure-signatures"),
    ("dashboard", "ftwatch-dashboard-overview"),
}


def test_the_ndjson_is_built_from_the_readable_sources():
    assert to_ndjson(load_sources(ROOT / "dashboards" / "src")) == NDJSON.read_text(encoding="utf-8")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "build_dashboards.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_reference_resolves():
    assert dangling_references(OBJECTS) == []
    broken = [dict(o, references=[{"name": "panel_1", "type": "visualization", "id": "gone"}])
              if o["type"] == "dashboard" else o for o in OBJECTS]
    assert any("gone is missing" in b for b in dangling_references(broken))


def test_ids_are_stable_and_every_object_keeps_its_migration_versions():
    assert {(o["type"], o["id"]) for o in OBJECTS} == STABLE_IDS
    assert all(o.get("coreMigrationVersion") and o.get("typeMigrationVersion") for o in OBJECTS)


def test_one_data_view_per_data_stream():
    titles = {o["attributes"]["title"] for o in OBJECTS if o["type"] == "index-pattern"}
    assert set(essetup.data_streams("ftwatch")) <= titles


def test_the_dashboard_shows_every_visualisation_and_the_timeline():
    board = decode(next(o for o in OBJECTS if o["type"] == "dashboard"))
    refs = {r["name"]: r["id"] for r in board["references"]}
    shown = {refs[p["panelRefName"]] for p in board["attributes"]["panelsJSON"]}
    assert shown == {i for t, i in STABLE_IDS if t in ("visualization", "search")}


def test_every_field_the_visualisations_use_is_mapped():
    props = essetup.mappings()["properties"]

    def mapped(field: str) -> bool:
        where = props
        parts = field.split(".")
        for n, part in enumerate(parts):
            if part not in where:
                return False
            if n < len(parts) - 1:
                where = where[part].get("properties", {})
        return True

    fields = {agg["params"]["field"] for o in OBJECTS if o["type"] == "visualization"
              for agg in decode(o)["attributes"]["visState"]["aggs"] if "field" in agg["params"]}
    assert fields and all(mapped(f) for f in fields), fields


def test_sources_round_trip_through_encode_and_decode():
    for obj in OBJECTS:
        assert encode(decode(obj)) == obj


def test_another_prefix_moves_the_data_views():
    moved = with_prefix(OBJECTS, "acme")
    titles = {o["attributes"]["title"] for o in moved if o["type"] == "index-pattern"}
    assert "acme-events" in titles and "acme-events,acme-findings,acme-decisions,acme-alerts" in titles


class Kibana:
    """A local HTTP server that records import requests and answers like Kibana."""

    def __init__(self, status: int = 200, answer: dict | None = None):
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                       "body": body})
                raw = json.dumps(answer or {"success": True, "successCount": len(OBJECTS), "errors": []}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def kibana():
    made: list[Kibana] = []

    def make(**kwargs) -> Kibana:
        made.append(Kibana(**kwargs))
        return made[-1]

    yield make
    for k in made:
        k.close()


def _file_part(request: dict) -> tuple[str, bytes]:
    """(field name, content) of the multipart body's one part."""
    head = f"Content-Type: {request['headers']['content-type']}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + request["body"])
    parts = list(message.iter_parts())
    assert len(parts) == 1
    return parts[0].get_param("name", header="content-disposition"), parts[0].get_payload(decode=True)


def test_import_sends_multipart_with_kbn_xsrf_and_overwrite(kibana, capsys):
    k = kibana()
    assert main(["dashboards", "import", "--kibana-url", k.url, "--api-key", "c2VjcmV0"]) == 0
    (request,) = k.requests
    assert request["path"] == "/api/saved_objects/_import?overwrite=true"
    assert request["headers"]["kbn-xsrf"] and request["headers"]["authorization"] == "ApiKey c2VjcmV0"
    assert request["headers"]["content-type"].startswith("multipart/form-data; boundary=")
    name, content = _file_part(request)
    assert name == "file" and parse_ndjson(content.decode()) == OBJECTS
    assert f"{len(OBJECTS)} of {len(OBJECTS)} objects imported" in capsys.readouterr().out


def test_import_into_a_space_with_basic_auth_and_another_prefix(kibana):
    k = kibana()
    assert main(["dashboards", "import", "--kibana-url", k.url + "/", "--space", "ml-ops", "--username", "elastic",
                 "--password", "pw", "--data-stream-prefix", "acme"]) == 0
    (request,) = k.requests
    assert request["path"] == "/s/ml-ops/api/saved_objects/_import?overwrite=true"
    assert request["headers"]["authorization"].startswith("Basic ")
    assert b'"title":"acme-events"' in _file_part(request)[1]


def test_refusals_are_reported_and_fail_the_command(kibana, capsys):
    k = kibana(answer={"success": False, "successCount": 11, "errors": [
        {"type": "dashboard", "id": "ftwatch-dashboard-overview", "error": {"type": "missing_references"}}]})
    assert main(["dashboards", "import", "--kibana-url", k.url]) == 1
    assert "dashboard/ftwatch-dashboard-overview" in capsys.readouterr().err
    bad = kibana(status=403, answer={"message": "forbidden"})
    assert main(["dashboards", "import", "--kibana-url", bad.url]) == 1
    assert "403" in capsys.readouterr().err


def test_no_kibana_is_a_clear_error(capsys):
    assert main(["dashboards", "import", "--kibana-url", "http://127.0.0.1:9"]) == 1
    assert "cannot reach Kibana" in capsys.readouterr().err


def test_the_dashboard_has_a_job_control_over_the_data_view_of_all_streams():
    board = decode(next(o for o in OBJECTS if o["type"] == "dashboard"))
    controls = board["attributes"]["controlGroupInput"]["panelsJSON"]
    (cid, control), = controls.items()
    assert control["type"] == "optionsListControl" and control["explicitInput"]["fieldName"] == "ftwatch.job"
    refs = {r["name"]: (r["type"], r["id"]) for r in board["references"]}
    assert refs[f"controlGroup_{cid}:optionsListDataView"] == ("index-pattern", "ftwatch-dv-all")
    assert isinstance(next(o for o in OBJECTS if o["type"] == "dashboard")["attributes"]["controlGroupInput"]
                      ["panelsJSON"], str)                      # Kibana takes it JSON-in-a-string
    assert "job" in essetup.mappings()["properties"]["ftwatch"]["properties"]
    without = [dict(o, references=[r for r in o["references"] if not r["name"].startswith("controlGroup_")])
               if o["type"] == "dashboard" else o for o in OBJECTS]
    assert any("has no data view reference" in b for b in dangling_references(without))


def test_the_timeline_breaks_ties_in_time_with_event_sequence():
    search = decode(next(o for o in OBJECTS if o["type"] == "search"))
    assert search["attributes"]["sort"] == [["@timestamp", "asc"], ["event.sequence", "asc"]]
    assert essetup.mappings()["properties"]["event"]["properties"]["sequence"]["type"] == "long"


@pytest.mark.slow
def test_the_wheel_ships_the_ndjson_and_the_import_finds_it_outside_a_checkout(tmp_path):
    """Built with the project's build backend; the packaged copy is dashboards/ftwatch.ndjson itself."""
    import zipfile

    from hatchling.builders.wheel import WheelBuilder

    (wheel,) = WheelBuilder(str(ROOT)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        assert z.read("ftwatch/dashboards_data/ftwatch.ndjson") == NDJSON.read_bytes()
        z.extractall(site)
    proc = subprocess.run([sys.executable, "-c", "from ftwatch.cli.dashboards import _default_ndjson; "
                           "p = _default_ndjson(); print(p); print(len(p.read_text(encoding='utf-8')))"],
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    where, size = proc.stdout.split()
    assert where.startswith(str(site)) and int(size) == len(NDJSON.read_text(encoding="utf-8"))
