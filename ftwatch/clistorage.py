"""The storage side of the command line: the store ``run``/``watch`` write to, ``ftwatch es``
(set-up and flush of the Elasticsearch sink) and ``ftwatch dashboards import`` (Kibana).

A hub (tests/test_layering.py): it joins the config to the pipeline's sinks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ftwatch.errors import ConfigError


def build_store(config: Any, state_dir: Path) -> Any:
    """The store the recorder writes to: the SQLite store, fanned out to Elasticsearch when
    ``storage.elasticsearch`` is set (its background flusher started).

    Raises:
        ConfigError: the Elasticsearch buffer directory cannot be used (e.g. another ftwatch
            holds it).
    """
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    sqlite = SqliteStore(Path(config.storage.sqlite) if config.storage.sqlite else state_dir / "ftwatch.db")
    es_cfg = config.storage.elasticsearch
    if es_cfg is None:
        return sqlite
    from ftwatch.pipeline.sinks.elasticsearch import ElasticsearchSink
    from ftwatch.pipeline.sinks.fanout import FanOut
    from ftwatch.errors import SinkError
    try:
        sink = ElasticsearchSink.from_config(es_cfg, state_dir)
    except SinkError as exc:
        sqlite.close()
        raise ConfigError(f"storage.elasticsearch: {exc}") from None
    sink.start(es_cfg.flush_interval)
    return FanOut(sqlite, [sink])


def _es_config(args: argparse.Namespace) -> tuple[Any, Path]:
    from ftwatch.config import Config, load_config
    config = load_config(args.config) if args.config else Config()
    es_cfg = config.storage.elasticsearch
    if args.url:
        from ftwatch.configstorage import ElasticsearchConfig
        data = es_cfg.model_dump() if es_cfg is not None else {}
        es_cfg = ElasticsearchConfig.model_validate({**data, "url": args.url})
    if es_cfg is None:
        raise ConfigError(f"{args.config or '<argv>'}: storage.elasticsearch is not set (or give --url)")
    return es_cfg, Path(args.state_dir or config.storage.state_dir)


def cmd_es(argv: list[str]) -> int:
    """``ftwatch es setup|flush``: install the ILM policy and index templates (and bring the
    mappings of existing data streams up to date); send what the disk buffer holds (with
    ``--dead-letters``, the dead-letter file's documents too)."""
    p = argparse.ArgumentParser(prog="ftwatch es", description="The Elasticsearch sink (storage.elasticsearch).")
    p.add_argument("action", choices=["setup", "flush"],
                   help="setup: ILM policy + index templates; flush: send the disk buffer now")
    p.add_argument("--config", help="YAML config with storage.elasticsearch")
    p.add_argument("--url", help="Elasticsearch URL (overrides the config's)")
    p.add_argument("--state-dir", help="where the buffer lives (flush)")
    p.add_argument("--retries", type=int, help="flush: retries per bulk request (default: max_retries)")
    p.add_argument("--dead-letters", action="store_true",
                   help="flush: also send dead-letter.jsonl again (what is taken leaves the file)")
    args = p.parse_args(argv)
    es_cfg, state_dir = _es_config(args)
    from elastic_transport import TransportError
    from elasticsearch import ApiError
    from ftwatch.errors import SinkError
    from ftwatch.pipeline.sinks import essetup
    from ftwatch.pipeline.sinks.elasticsearch import ElasticsearchSink, build_client
    try:
        if args.action == "setup":
            client = build_client(es_cfg)
            try:
                done = essetup.install(client, es_cfg.data_stream_prefix, es_cfg.rollover_max_age,
                                       es_cfg.retention)
            finally:
                client.close()
            for line in done:
                print(f"ftwatch es setup: {line}")
            print(f"ftwatch es setup: data streams {', '.join(essetup.data_streams(es_cfg.data_stream_prefix))} "
                  "are created on the first write")
            return 0
        try:
            sink = ElasticsearchSink.from_config(es_cfg, state_dir)    # closes its client if it fails
        except SinkError as exc:
            print(f"ftwatch es flush: {exc}", file=sys.stderr)
            return 1
        try:
            replayed = sink.replay_dead_letters() if args.dead_letters else 0
            left = sink.flush(args.retries)
            stats = sink.stats
        finally:
            sink.close()
        print(f"ftwatch es flush: {stats.sent} sent, {stats.duplicates} already there, "
              + (f"{replayed} dead letters replayed, " if args.dead_letters else "")
              + f"{stats.dead_lettered} dead-lettered, {left} left in {sink.buffer.directory}"
              + (f" ({stats.last_error})" if left else ""))
        return 1 if left else 0
    except (ApiError, TransportError) as exc:
        print(f"ftwatch es {args.action}: Elasticsearch at {', '.join(es_cfg.url)}: {exc}", file=sys.stderr)
        return 1


def _default_ndjson() -> Any:
    """The Kibana objects: packaged in the wheel (``ftwatch/dashboards_data/``, put there at build
    time from ``dashboards/ftwatch.ndjson``, pyproject ``force-include``), else the source
    checkout's ``dashboards/ftwatch.ndjson``."""
    from importlib.resources import files
    packaged = files("ftwatch").joinpath("dashboards_data", "ftwatch.ndjson")
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parents[1] / "dashboards" / "ftwatch.ndjson"


def cmd_dashboards(argv: list[str]) -> int:
    """``ftwatch dashboards import``: the saved objects into Kibana (overwrite)."""
    p = argparse.ArgumentParser(prog="ftwatch dashboards", description="Kibana dashboards (dashboards/).")
    p.add_argument("action", choices=["import"])
    p.add_argument("--kibana-url", required=True, help="e.g. http://localhost:5601")
    p.add_argument("--space", help="Kibana space id (default: the default space)")
    p.add_argument("--file", type=Path, help="NDJSON to import (default: the one shipped with ftwatch)")
    p.add_argument("--api-key", default=os.environ.get("FTWATCH_KIBANA_API_KEY"),
                   help="API key (default: $FTWATCH_KIBANA_API_KEY)")
    p.add_argument("--username", default=os.environ.get("FTWATCH_KIBANA_USERNAME"))
    p.add_argument("--password", default=os.environ.get("FTWATCH_KIBANA_PASSWORD"),
                   help="(default: $FTWATCH_KIBANA_PASSWORD)")
    p.add_argument("--ca-certs", help="PEM CA bundle for https")
    p.add_argument("--insecure", action="store_true", help="do not check the TLS certificate")
    p.add_argument("--data-stream-prefix", default="ftwatch",
                   help="storage.elasticsearch.data_stream_prefix, if not ftwatch")
    args = p.parse_args(argv)
    from ftwatch.dashboards import parse_ndjson, to_ndjson, with_prefix
    from ftwatch.kibana import KibanaError, import_objects
    path = args.file or _default_ndjson()
    try:
        objects = parse_ndjson(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError) as exc:
        print(f"ftwatch dashboards import: {exc}", file=sys.stderr)
        return 1
    verify: bool | str = False if args.insecure else (args.ca_certs or True)
    try:
        result = import_objects(args.kibana_url, to_ndjson(with_prefix(objects, args.data_stream_prefix)),
                                space=args.space, api_key=args.api_key, username=args.username,
                                password=args.password, verify=verify)
    except KibanaError as exc:
        print(f"ftwatch dashboards import: {exc}", file=sys.stderr)
        return 1
    for err in result.errors:
        print(f"ftwatch dashboards import: {err.get('type')}/{err.get('id')}: {err.get('error')}",
              file=sys.stderr)
    print(f"ftwatch dashboards import: {result.success_count} of {len(objects)} objects imported "
          f"into {args.kibana_url}" + (f" (space {args.space})" if args.space else ""))
    return 0 if result.success else 1
