"""The ``ftwatch report`` subcommand (``ftwatch.cli`` hands it its argv)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_report(argv: list[str]) -> int:
    """``ftwatch report [--state-dir DIR] [--db FILE] [-o FILE] [--job JOB]...``: writes the page.

    Returns:
        0 written; 1 no store, or a job asked for is not in it (the message on stderr).
    """
    p = argparse.ArgumentParser(prog="ftwatch report", description="Write a self-contained HTML page "
                                "of the store: timelines, decisions, failure classes, root causes.")
    p.add_argument("--state-dir", default=".ftwatch-state")
    p.add_argument("--db", help="SQLite file (default: <state-dir>/ftwatch.db)")
    p.add_argument("-o", "--output", type=Path, help="the HTML file (default: <state-dir>/report.html)")
    p.add_argument("--job", action="append", help="only this job (repeatable; default: all)")
    args = p.parse_args(argv)
    from ftwatch.report.reader import SqliteReader
    from ftwatch.report.render import write_report
    db = Path(args.db) if args.db else Path(args.state_dir) / "ftwatch.db"
    out = args.output or Path(args.state_dir) / "report.html"
    try:
        with SqliteReader(db) as reader:
            data = write_report(reader, out, args.job)
    except (FileNotFoundError, LookupError) as exc:
        print(f"ftwatch report: {exc}", file=sys.stderr)
        return 1
    print(f"ftwatch report: {len(data['jobs'])} job(s) -> {out.resolve()}")
    return 0
