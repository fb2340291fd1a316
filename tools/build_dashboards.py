#!/usr/bin/env python3
"""Build dashboards/ftwatch.ndjson from the readable sources in dashboards/src/, or split a Kibana
export back into sources.

    tools/build_dashboards.py             # src/*.json -> ftwatch.ndjson
    tools/build_dashboards.py --check     # exit 1 when ftwatch.ndjson is not what src/ gives
    tools/build_dashboards.py --split export.ndjson   # an export from Kibana -> src/*.json

Every build checks that each reference resolves (ftwatch.report.dashboards.dangling_references).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftwatch.report.dashboards import (dangling_references, load_sources, parse_ndjson, to_ndjson,  # noqa: E402
                                write_sources)

SRC = ROOT / "dashboards" / "src"
OUT = ROOT / "dashboards" / "ftwatch.ndjson"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only check that the NDJSON is up to date")
    p.add_argument("--split", type=Path, help="write the objects of this NDJSON export into src/")
    args = p.parse_args(argv)
    if args.split:
        paths = write_sources(parse_ndjson(args.split.read_text(encoding="utf-8"), str(args.split)), SRC)
        print(f"wrote {len(paths)} sources into {SRC.relative_to(ROOT)}")
        return 0
    objects = load_sources(SRC)
    bad = dangling_references(objects)
    for line in bad:
        print(f"dangling reference: {line}", file=sys.stderr)
    if bad:
        return 1
    text = to_ndjson(objects)
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run tools/build_dashboards.py", file=sys.stderr)
            return 1
        print(f"{OUT.relative_to(ROOT)} is up to date ({len(objects)} objects)")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {len(objects)} objects to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
