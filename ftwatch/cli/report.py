"""The ``ftwatch report`` subcommand (``ftwatch.cli`` hands it its argv).

The page comes from the SQLite store (default) or from Elasticsearch (``--es-url``, or
``--source elasticsearch`` with the ``storage.elasticsearch`` section of ``--config``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ftwatch.cli.common import ArgumentParser

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(s|m|h|d)$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: float) -> float:
    """A ``--since`` / ``--until`` value -> epoch seconds.

    Accepts epoch seconds (``1795219200``), ISO-8601 (``2026-11-21T09:00``, no zone: UTC) or a
    duration back from ``now`` (``90m``, ``6h``, ``2d``).

    Raises:
        ValueError: none of these.
    """
    text = text.strip()
    m = _DURATION.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not epoch seconds, ISO-8601 or a duration like 6h") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="ftwatch report", description="Write a self-contained HTML page "
                       "of the store: timelines, decisions, failure classes, root causes.")
    p.add_argument("--state-dir", default=None, help="where the store is (default: the config's "
                   "storage.state_dir, else .ftwatch-state)")
    p.add_argument("--db", help="SQLite file (default: <state-dir>/ftwatch.db)")
    p.add_argument("-o", "--output", type=Path, help="the HTML file (default: <state-dir>/report.html)")
    p.add_argument("--job", action="append", help="only this job (repeatable; default: all)")
    p.add_argument("--since", help="only records from then on: epoch s, ISO-8601 (UTC) or a duration back (6h)")
    p.add_argument("--until", help="only records before then (same forms)")
    p.add_argument("--config", help="YAML config: storage.sqlite / state_dir, and storage.elasticsearch")
    p.add_argument("--source", choices=["sqlite", "elasticsearch"],
                   help="where to read (default: elasticsearch with --es-url, else sqlite)")
    es = p.add_argument_group("Elasticsearch (the storage.elasticsearch sink's data streams)")
    es.add_argument("--es-url", action="append", help="node URL (repeatable; overrides the config's)")
    es.add_argument("--api-key", default=os.environ.get("FTWATCH_ES_API_KEY"),
                    help="API key (default: $FTWATCH_ES_API_KEY)")
    es.add_argument("--username", default=os.environ.get("FTWATCH_ES_USERNAME"),
                    help="basic-auth user (default: $FTWATCH_ES_USERNAME)")
    es.add_argument("--password", default=os.environ.get("FTWATCH_ES_PASSWORD"),
                    help="basic-auth password (default: $FTWATCH_ES_PASSWORD)")
    es.add_argument("--ca-certs", type=Path, help="PEM CA bundle for https")
    es.add_argument("--insecure", action="store_true", help="do not check the TLS certificate")
    es.add_argument("--data-stream-prefix", help="storage.elasticsearch.data_stream_prefix (default: ftwatch)")
    return p


def _es_config(args: argparse.Namespace, config: Any) -> Any:
    """The ``ElasticsearchConfig`` to read with: the config's section, the flags on top."""
    from ftwatch.config.storage import ElasticsearchConfig
    base = config.storage.elasticsearch if config is not None else None
    data: dict[str, Any] = base.model_dump() if base is not None else {}
    if args.es_url:
        data["url"] = args.es_url
    if args.api_key:
        data.update(api_key=args.api_key, username=None, password=None)
    elif args.username is not None:
        data.update(api_key=None, username=args.username, password=args.password or "")
    if args.ca_certs is not None:
        data["ca_certs"] = args.ca_certs
    if args.insecure:
        data["verify_certs"] = False
    if args.data_stream_prefix:
        data["data_stream_prefix"] = args.data_stream_prefix
    if not data.get("url"):
        raise ValueError(f"{args.config or '<argv>'}: no Elasticsearch to read: give --es-url or a "
                         "config with storage.elasticsearch")
    return ElasticsearchConfig.model_validate(data)


def _signatures(state_dir: Path) -> list[dict[str, Any]]:
    """The failure signatures mined under ``state_dir`` (``ftwatch.mining``) as report rows;
    none when nothing was mined there."""
    from ftwatch.mining.miner import Miner
    from ftwatch.report.model import signature_rows
    if not (Path(state_dir) / "mining" / "signatures.json").is_file():
        return []
    return signature_rows(Miner.in_state_dir(state_dir).ranked())


def cmd_report(argv: list[str]) -> int:
    """``ftwatch report [--state-dir DIR] [--db FILE | --es-url URL ...] [-o FILE] [--job JOB]...
    [--since T] [--until T]``: writes the page.

    Returns:
        0 written; 1 no store, Elasticsearch unreachable or refusing, or a job asked for is not
        in the store (the message on stderr); 2 bad arguments or config.
    """
    args = _parser().parse_args(argv)
    from pydantic import ValidationError

    from ftwatch.errors import ConfigError
    from ftwatch.report.render import write_report
    now = time.time()
    try:
        since = parse_time(args.since, now) if args.since else None
        until = parse_time(args.until, now) if args.until else None
        config = None
        if args.config:
            from ftwatch.config.model import load_config
            config = load_config(args.config)
        source = args.source or ("elasticsearch" if args.es_url else "sqlite")
        es_cfg = _es_config(args, config) if source == "elasticsearch" else None
    except (ValueError, ValidationError, ConfigError) as exc:
        print(f"ftwatch report: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir) if args.state_dir else (
        config.storage.state_dir if config is not None else Path(".ftwatch-state"))
    out = args.output or state_dir / "report.html"
    signatures = _signatures(state_dir)
    try:
        if es_cfg is not None:
            from ftwatch.report.esreader import EsReader, EsReadError
            try:
                with EsReader.from_config(es_cfg, since=since, until=until) as reader:
                    reader.check()
                    data = write_report(reader, out, args.job, signatures)
            except EsReadError as exc:
                print(f"ftwatch report: {exc}", file=sys.stderr)
                return 1
        else:
            from ftwatch.report.reader import SqliteReader
            db = Path(args.db) if args.db else (
                config.storage.sqlite_path if config is not None and not args.state_dir
                else state_dir / "ftwatch.db")
            with SqliteReader(db, since=since, until=until) as reader:
                data = write_report(reader, out, args.job, signatures)
    except (FileNotFoundError, LookupError) as exc:
        print(f"ftwatch report: {exc}", file=sys.stderr)
        return 1
    print(f"ftwatch report: {len(data['jobs'])} job(s) from {data['source']} -> {out.resolve()}")
    return 0
