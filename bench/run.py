"""``make bench``: every ``bench/bench_*.py`` (or the ones named) in one run, one final table.

Usage::

    python bench/run.py [engine ingest decide run ...]   # names without bench_ / .py

Each part runs as its own process, in name order (another part, e.g. ``bench_run.py`` for
``run``'s latency, only has to be dropped into ``bench/``), sharing one work folder (the corpus
is built once). A part prints its own table and ``FIGURE {json}`` lines (``benchlib.report``);
this driver prints all figures at the end, each against its goal as met / NOT met. Exit status
0 always (speed is reported, not asserted); 2 when a part failed to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import Figure, table  # noqa: E402


def parts(names: list[str]) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if not names:
        return found
    chosen = [HERE / f"bench_{n.removeprefix('bench_').removesuffix('.py')}.py" for n in names]
    missing = [p.name for p in chosen if not p.exists()]
    if missing:
        raise SystemExit(f"no such bench part: {', '.join(missing)}")
    return chosen


def main() -> int:
    failed = []
    figures: list[tuple[str, Figure]] = []
    with tempfile.TemporaryDirectory(prefix="ftwatch-bench-") as tmp:
        env = {**os.environ, "BENCH_DIR": os.environ.get("BENCH_DIR") or tmp}
        for part in parts(sys.argv[1:]):
            print(f"\n### {part.name}", flush=True)
            proc = subprocess.Popen([sys.executable, str(part)], stdout=subprocess.PIPE, text=True, env=env)
            for line in proc.stdout:
                if line.startswith("FIGURE "):
                    row = json.loads(line[len("FIGURE "):])
                    figures.append((row.pop("part"), Figure(**row)))
                else:
                    print(line, end="", flush=True)
            if proc.wait():
                failed.append(part.name)
    print("\n" + "=" * 30 + " all figures " + "=" * 30)
    for part in dict.fromkeys(p for p, _ in figures):
        print(f"\n{part}")
        print(table([f for p, f in figures if p == part]))
    goals = [f for _, f in figures if f.ok is not None]
    print(f"\ngoals met: {sum(1 for f in goals if f.ok)}/{len(goals)}"
          + (f"; parts that failed: {', '.join(failed)}" if failed else ""))
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
