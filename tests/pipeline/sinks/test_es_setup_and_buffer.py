"""The Elasticsearch sink's set-up and limits against the fake cluster (conftest): documents only
ever go to data streams (the template is installed when missing, or they wait on disk), `es setup`
brings existing streams' mappings up to date, the dead-letter file can be replayed, the disk
buffer has a cap, and `es flush` on a buffer in use says so in one line."""

from __future__ import annotations

import json
import logging

from elasticsearch import Elasticsearch

from ftwatch.cli import main
from ftwatch.telemetry import _jsonl_usage
from ftwatch.pipeline.sinks.elasticsearch import setup as essetup
from tests.pipeline.sinks.test_elasticsearch import decision, make_sink, write_some


def test_the_fake_refuses_data_stream_writes_until_a_template_matches(fake_es):
    client = Elasticsearch(fake_es.url, max_retries=0)
    ops = [{"create": {"_index": "ftwatch-events", "_id": "a"}}, {"@timestamp": "2026-01-01T00:00:00Z"}]
    item = client.bulk(operations=ops, require_data_stream=True)["items"][0]["create"]
    assert item["status"] == 404 and item["error"]["type"] == "index_not_found_exception"
    assert not client.indices.exists_index_template(name="ftwatch")
    essetup.install(client)
    assert client.indices.exists_index_template(name="ftwatch")
    assert client.bulk(operations=ops, require_data_stream=True)["items"][0]["create"]["status"] == 201
    assert fake_es.streams == {"ftwatch-events": "ftwatch"}
    client.close()


def test_a_missing_template_is_installed_before_the_first_write(fake_es, tmp_path):
    sink = make_sink(fake_es.url, tmp_path / "buf")
    write_some(sink, 2)
    assert sink.flush() == 0
    assert "/_index_template/ftwatch" in fake_es.puts and fake_es.streams == {"ftwatch-events": "ftwatch"}
    assert all("require_data_stream=true" in r["path"] for r in fake_es.bulk_requests())
    assert fake_es.plain == set()
    sink.close()


def test_without_the_privilege_to_install_it_documents_wait_on_disk_with_one_warning(fake_es, tmp_path, caplog):
    fake_es.refuse_puts = True
    sink = make_sink(fake_es.url, tmp_path / "buf")
    write_some(sink, 3)
    with caplog.at_level(logging.WARNING, logger="ftwatch.pipeline.sinks.elasticsearch.sink"):
        assert sink.flush() == 3
        assert sink.flush() == 3
    warnings = [r for r in caplog.records if "could not be installed" in r.getMessage()]
    assert len(warnings) == 1 and "ftwatch es setup" in warnings[0].getMessage()
    assert fake_es.docs == {} and sink.stats.dead_lettered == 0
    assert not (tmp_path / "buf" / "dead-letter.jsonl").exists()
    fake_es.refuse_puts = False                 # an administrator runs `ftwatch es setup`
    assert main(["es", "setup", "--url", fake_es.url]) == 0
    assert sink.flush() == 0 and len(fake_es.docs) == 3 and set(fake_es.streams) == {"ftwatch-events"}
    sink.close()


def test_a_plain_index_in_the_way_keeps_documents_on_disk(fake_es, tmp_path):
    """An index auto-created by an older writer (no data stream): kept, not dead-lettered."""
    client = Elasticsearch(fake_es.url, max_retries=0)
    client.bulk(operations=[{"create": {"_index": "ftwatch-events", "_id": "old"}},
                            {"@timestamp": "2026-01-01T00:00:00Z"}])
    client.close()
    sink = make_sink(fake_es.url, tmp_path / "buf")
    write_some(sink, 2)
    assert sink.flush() == 2
    assert "not a data stream" in sink.stats.last_error and sink.stats.dead_lettered == 0
    sink.close()


def test_es_setup_again_updates_the_mappings_of_existing_data_streams(fake_es, tmp_path, capsys):
    sink = make_sink(fake_es.url, tmp_path / "buf")
    write_some(sink, 1)
    sink.write([decision()])
    assert sink.flush() == 0
    sink.close()
    assert set(fake_es.streams) == {"ftwatch-events", "ftwatch-decisions"}
    capsys.readouterr()
    assert main(["es", "setup", "--url", fake_es.url]) == 0
    out = capsys.readouterr().out
    assert "PUT ftwatch-events/_mapping" in out and "PUT ftwatch-decisions/_mapping" in out
    body = fake_es.puts["/ftwatch-events/_mapping"]
    assert body["properties"] == essetup.mappings()["properties"]
    assert body["_meta"]["version"] == essetup.TEMPLATE_VERSION and body["dynamic"] == "false"


def test_dead_letters_are_replayed_by_es_flush(fake_es, tmp_path, capsys):
    sink = make_sink(fake_es.url, tmp_path / "es-buffer")
    write_some(sink, 4)
    fake_es.fail_next = ["partial"]                 # item 2 refused with 400 (1: 429, resent)
    assert sink.flush() == 0 and sink.stats.dead_lettered == 1
    sink.close()
    dead = tmp_path / "es-buffer" / "dead-letter.jsonl"
    with dead.open("a") as fh:
        fh.write("not json\n")                     # a line without a document stays
    assert len(fake_es.docs) == 3
    assert main(["es", "flush", "--url", fake_es.url, "--state-dir", str(tmp_path)]) == 0
    assert len(fake_es.docs) == 3                   # a plain flush leaves the dead letters alone
    assert main(["es", "flush", "--dead-letters", "--url", fake_es.url, "--state-dir", str(tmp_path)]) == 0
    assert "1 dead letters replayed" in capsys.readouterr().out
    assert len(fake_es.docs) == 4 and dead.read_text() == "not json\n"
    assert sorted(d["ftwatch"]["rank"] for d in fake_es.docs.values()) == [0, 1, 2, 3]


def test_es_flush_on_a_buffer_in_use_says_so_in_one_line_and_closes_its_client(fake_es, tmp_path, capsys,
                                                                               monkeypatch):
    from ftwatch.pipeline.sinks.elasticsearch import sink as es_module

    held = make_sink(fake_es.url, tmp_path / "es-buffer")
    closed = []
    real = es_module.build_client

    def recording(cfg):
        client = real(cfg)
        close = client.close
        client.close = lambda: (closed.append(True), close())
        return client

    monkeypatch.setattr(es_module, "build_client", recording)
    assert main(["es", "flush", "--url", fake_es.url, "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "in use by another ftwatch process" in err
    assert "Traceback" not in err and closed == [True]
    held.close()


def test_a_full_buffer_drops_new_documents_counts_them_and_says_so(tmp_path, caplog):
    sink = make_sink("http://127.0.0.1:9", tmp_path / "buf", max_buffer_bytes=4000)   # nobody listens
    with caplog.at_level(logging.ERROR, logger="ftwatch.pipeline.sinks.elasticsearch.sink"):
        write_some(sink, 40)
    kept = sink.pending()
    assert 0 < kept < 40 and sink.stats.dropped == 40 - kept
    assert sink.buffer.bytes <= 4000
    size = sum(f.stat().st_size for f in (tmp_path / "buf").glob("*.jsonl"))
    assert size <= 4000
    assert len([r for r in caplog.records if "DROPPED" in r.getMessage()]) == 1
    sink.close()
    assert (tmp_path / "buf" / "dropped.count").read_text().strip() == str(40 - kept)
    assert ("dropped", 40 - kept, 0) in _jsonl_usage(tmp_path / "buf")
    again = make_sink("http://127.0.0.1:9", tmp_path / "buf", max_buffer_bytes=4000)
    write_some(again, 1)
    assert again.pending() == kept and again.buffer.dropped == 41 - kept      # still full, across restarts
    again.close()


def test_the_buffer_takes_documents_again_once_the_cluster_took_what_waited(fake_es, tmp_path):
    sink = make_sink(fake_es.url, tmp_path / "buf", max_buffer_bytes=4000)
    fake_es.fail_next = [503]
    write_some(sink, 40)
    kept = sink.pending()
    assert sink.flush(retries=0) == kept
    assert sink.flush() == 0 and sink.buffer.bytes == 0
    write_some(sink, 3, 1_795_300_000.0)
    assert sink.pending() == 3 and sink.flush() == 0
    assert len(fake_es.docs) == kept + 3
    sink.close()


def test_the_config_caps_the_buffer_at_one_gib_by_default():
    from ftwatch.config.storage import ElasticsearchConfig

    cfg = ElasticsearchConfig(url="http://localhost:9200")
    assert cfg.max_buffer_bytes == 1 << 30
    assert "dead_letter_after" not in ElasticsearchConfig.model_fields
    assert json.dumps(cfg.model_dump(mode="json"))


def test_a_cluster_before_8_13_gets_bulk_requests_without_require_data_stream(fake_es, tmp_path, caplog):
    """Its 400 for the unknown parameter is no reason to dead-letter anything."""
    fake_es.before_8_13 = True
    sink = make_sink(fake_es.url, tmp_path / "buf")
    write_some(sink, 2)
    with caplog.at_level(logging.WARNING, logger="ftwatch.pipeline.sinks.elasticsearch.sink"):
        assert sink.flush() == 0
        write_some(sink, 1, 1_795_300_000.0)
        assert sink.flush() == 0
    assert len(fake_es.docs) == 3 and sink.stats.dead_lettered == 0
    assert set(fake_es.streams) == {"ftwatch-events"}          # the template (installed) made it
    assert len([r for r in caplog.records if "before 8.13" in r.getMessage()]) == 1
    paths = [r["path"] for r in fake_es.bulk_requests()]
    assert "require_data_stream=true" in paths[0] and all("require_data_stream" not in p for p in paths[1:])
    sink.close()
