"""``ftwatch es``: set up Elasticsearch (templates, ILM, data streams) and flush the journal."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ftwatch.cli.common import ArgumentParser, EXIT_USAGE
from ftwatch.errors import ConfigError


def _es_config(args: argparse.Namespace) -> tuple[Any, Path]:
    from ftwatch.config.model import Config, load_config
    config = load_config(args.config) if args.config else Config()
    es_cfg = config.storage.elasticsearch
    if args.url:
        from ftwatch.config.storage import ElasticsearchConfig
        data = es_cfg.model_dump() if es_cfg is not None else {}
        es_cfg = ElasticsearchConfig.model_validate({**data, "url": args.url})
    if es_cfg is None:
        raise ConfigError(f"{args.config or '<argv>'}: storage.elasticsearch is not set (or give --url)")
    return es_cfg, Path(args.state_dir or config.storage.state_dir)

def cmd_es(argv: list[str]) -> int:
    """``ftwatch es setup|flush``: install the ILM policy and index templates (and bring the
    mappings of existing data streams up to date); send what the disk buffer holds (with
    ``--dead-letters``, the dead-letter file's documents too)."""
    p = ArgumentParser(prog="ftwatch es", description="The Elasticsearch sink (storage.elasticsearch).")
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
    from ftwatch.pipeline.sinks.elasticsearch import setup as essetup
    from ftwatch.pipeline.sinks.elasticsearch.sink import ElasticsearchSink, build_client
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
