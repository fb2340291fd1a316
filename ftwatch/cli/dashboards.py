"""``ftwatch dashboards import``: the Kibana saved objects, through Kibana's API (E3)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ftwatch.cli.common import ArgumentParser, EXIT_USAGE


def _default_ndjson() -> Any:
    """The Kibana objects: packaged in the wheel (``ftwatch/dashboards_data/``, put there at build
    time from ``dashboards/ftwatch.ndjson``, pyproject ``force-include``), else the source
    checkout's ``dashboards/ftwatch.ndjson``."""
    from importlib.resources import files
    packaged = files("ftwatch").joinpath("dashboards_data", "ftwatch.ndjson")
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parents[2] / "dashboards" / "ftwatch.ndjson"

def cmd_dashboards(argv: list[str]) -> int:
    """``ftwatch dashboards import``: the saved objects into Kibana (overwrite)."""
    p = ArgumentParser(prog="ftwatch dashboards", description="Kibana dashboards (dashboards/).")
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
    from ftwatch.report.dashboards import parse_ndjson, to_ndjson, with_prefix
    from ftwatch.report.kibana import KibanaError, import_objects
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
