"""``ftwatch explain``: a decision and its evidence, from the store."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ftwatch.cli.common import ArgumentParser
from ftwatch.errors import ConfigError


def cmd_explain(argv: list[str]) -> int:
    p = ArgumentParser(prog="ftwatch explain", description="Explain a decision (the last one by default).")
    p.add_argument("decision_id", nargs="?")
    p.add_argument("--state-dir", default=".ftwatch-state")
    p.add_argument("--db", help="SQLite file (default: <state-dir>/ftwatch.db)")
    p.add_argument("--config", help="config file whose recovery.blame window/threshold the blame report uses")
    args = p.parse_args(argv)
    from ftwatch.alerting.explain import explain
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    db = Path(args.db) if args.db else Path(args.state_dir) / "ftwatch.db"
    if not db.exists():
        print(f"ftwatch explain: no store at {db}", file=sys.stderr)
        return 1
    try:
        print(explain(SqliteStore(db), args.decision_id))
    except LookupError as exc:
        print(f"ftwatch explain: {exc}", file=sys.stderr)
        return 1
    blame = Path(args.state_dir) / "blame" / "nodes.json"
    if blame.exists():                      # node blame across jobs (ftwatch.policy.blame)
        from ftwatch.config.model import load_config
        from ftwatch.policy.blame import BlameStore
        try:
            bc = load_config(args.config).recovery.blame if args.config else None
        except ConfigError as exc:
            print(f"ftwatch explain: {exc}", file=sys.stderr)
            return 1
        store = BlameStore(blame, **({"threshold": bc.threshold, "window": bc.window, "cooldown": bc.cooldown}
                                     if bc else {}))
        print("\n" + store.report(time.time()))
    return 0
