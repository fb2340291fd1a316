"""``make soak`` (``python -m bench.soak``): ftwatch under abuse, each result a figure against its goal.

Parts, in order (each module's doc says what it does and counts):

1. ``listeners``: the Forward and HTTP listeners of a real ``watch`` fuzzed while valid clients
   send a fixed count of lines: crashes, lines lost, lines duplicated;
2. ``rotation``: ``kill -9`` of ``watch`` following a rotating file, x5: lines lost, duplicated;
3. ``orphans``: ``kill -9`` of ``run`` mid-job: workers alive after the kill, orphans after the
   next start, budget resets;
4. ``outage``: a webhook receiver and an Elasticsearch stand-in down for 120 s: alerts and
   documents lost or duplicated;
5. ``rss``: VmRSS of ``watch`` under a steady load: growth of the last third over the middle.

``SOAK_SCALE`` (default 1) multiplies counts and durations; ``SOAK_PARTS`` (e.g. ``1,4``) runs
some parts only. Scale 1 takes about 6 minutes on two cores. Prints a table (figure, value,
goal, ok/MISSED) and exits 1 when any goal is missed (2 when a part failed to run at all).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.soak import listeners, orphans, outage, rotation, rss  # noqa: E402
from bench.soak.common import Figure, say, scale  # noqa: E402

PARTS = {"1": ("listeners", listeners.run), "2": ("rotation", rotation.run), "3": ("orphans", orphans.run),
         "4": ("outage", outage.run), "5": ("rss", rss.run)}


def table(figures: list[Figure]) -> str:
    """The figures as an aligned text table, notes on the line below their row."""
    width = max([len(f.name) for f in figures] + [6])
    rows = [f"{'figure':<{width}}  {'value':>10}  {'goal':<8}  result", "-" * (width + 32)]
    for f in figures:
        value = f"{f.value:g}" if isinstance(f.value, (int, float)) and f.value is not None else str(f.value)
        rows.append(f"{f.name:<{width}}  {value:>10}  {f.goal:<8}  {'ok' if f.ok else 'MISSED'}")
        if f.note:
            rows.append(f"{'':<{width}}    ({f.note})")
    return "\n".join(rows)


def main() -> int:
    chosen = [p.strip() for p in os.environ.get("SOAK_PARTS", ",".join(PARTS)).split(",") if p.strip()]
    figures: list[Figure] = []
    broken = False
    started = time.monotonic()
    say(f"SOAK_SCALE={scale():g}, parts {','.join(chosen)}")
    with tempfile.TemporaryDirectory(prefix="ftwatch-soak-") as tmp:
        for key in chosen:
            name, part = PARTS[key]
            t0 = time.monotonic()
            try:
                figures += part(Path(tmp) / name)
            except Exception:                       # a part that could not run is a missed goal, shown
                broken = True
                traceback.print_exc()
                figures.append(Figure(f"{name}: the part ran to its end", 0, "1", False,
                                      traceback.format_exc().strip().splitlines()[-1]))
            say(f"{name}: {time.monotonic() - t0:.0f} s")
    print()
    print(table(figures))
    missed = [f for f in figures if not f.ok]
    print(f"\nsoak: {len(figures) - len(missed)} of {len(figures)} goals met in {time.monotonic() - started:.0f} s"
          f" (SOAK_SCALE={scale():g})")
    return 2 if broken else (1 if missed else 0)


if __name__ == "__main__":
    sys.exit(main())
