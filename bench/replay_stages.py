"""Where ``ftwatch replay``'s CPU goes, by stage, on the ``make bench`` corpus (issue 16: profile first).

Usage::

    PYTHONPATH=$PWD python bench/replay_stages.py [--rules 1000] [--runs 5] [--no-tap]

Replays the shared corpus (``benchlib.corpus``) as ``bench_engine.time_replay`` does, ``--runs``
times in one process, with CPU timers around the stages of the path (no profiler: its per-call
cost shifts the shares toward the Python-heavy stages), and prints each stage's least CPU seconds
over the runs and its share of the replay's. Stages nest as printed (``feed`` holds the scan, the
blocks, the judging and the step tap); ``rest`` is what no timer covers (reading, counting lines,
the recorder, the desk's bookkeeping). A diagnostic, not a ``make bench`` part (it sets no goal);
compare two trees by running it in each, on the same machine, one after the other.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import corpus, rule_set  # noqa: E402

from ftwatch.config.health import StragglerConfig  # noqa: E402
from ftwatch.config.model import PolicyConfig  # noqa: E402
from ftwatch.pipeline import exits, incidents  # noqa: E402
from ftwatch.pipeline.recorder import Recorder  # noqa: E402
from ftwatch.pipeline.replay import replay  # noqa: E402
from ftwatch.policy import progress, progresslines  # noqa: E402
from ftwatch.policy.budgets import BudgetStore  # noqa: E402
from ftwatch.policy.policy import Policy  # noqa: E402
from ftwatch.rules import engine as engine_module, judge, matcher  # noqa: E402
from ftwatch.rules.engine import Engine  # noqa: E402
from ftwatch.rules.stragglers import StepTracker  # noqa: E402

#: (label, depth, owner, attribute): the stages timed, in print order
STAGES = (
    ("feed (Engine.feed)", 0, Engine, "feed"),
    ("matcher scan", 1, matcher.Matcher, "scan"),
    ("blocks (collect_block)", 1, engine_module, "collect_block"),
    ("records (Engine._record)", 1, Engine, "_record"),
    ("judging (Judge.judge)", 1, judge.Judge, "judge"),
    ("step tap (Engine._steps)", 1, Engine, "_steps"),
    ("progress after errors (Survival.outlived)", 0, progress.Survival, "outlived"),
    ("its line scan (progresslines._ends)", 1, progresslines, "_ends"),
    ("torchelastic summaries (ExitReader.summary)", 0, exits.ExitReader, "summary"),
    ("decision (IncidentDesk.close)", 0, incidents.IncidentDesk, "close"),
)


def timed(spent: dict[str, float], label: str, fn: Callable) -> Callable:
    """``fn`` adding its CPU seconds to ``spent[label]`` (an outer call only, when it recurses)."""
    depth = [0]

    def wrapper(*args, **kwargs):
        depth[0] += 1
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                spent[label] = spent.get(label, 0.0) + time.process_time() - start
    return wrapper


def run(rules_n: int, runs: int, tap: bool) -> list[tuple[str, int, float, float]]:
    """``runs`` replays of the corpus; per stage (label, depth, least seconds, share of the total)."""
    path, _ = corpus()
    rules = rule_set(rules_n)
    spent: dict[str, float] = {}
    for label, _, owner, name in STAGES:
        setattr(owner, name, timed(spent, label, getattr(owner, name)))
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(runs):
            engine = Engine(rules, steps=StepTracker(StragglerConfig()) if tap else None)
            policy = Policy(PolicyConfig(), BudgetStore(Path(tmp) / f"b{k}.json", "bench"), "bench")
            recorder = Recorder(out=io.StringIO(), resolve_after=None)
            spent.clear()
            start = time.process_time()
            replay([path], engine, policy, "bench", recorder=recorder)
            spent["total"] = time.process_time() - start
            for label, value in spent.items():
                best[label] = min(best.get(label, value), value)
    total = best["total"]
    top = sum(best.get(label, 0.0) for label, depth, _, _ in STAGES if depth == 0)
    rows = [(label, depth, best.get(label, 0.0), best.get(label, 0.0) / total) for label, depth, _, _ in STAGES]
    rows.append(("rest", 0, max(0.0, total - top), max(0.0, total - top) / total))
    rows.append(("replay", 0, total, 1.0))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-tap", action="store_true", help="replay without the step tap")
    args = ap.parse_args()
    _, meta = corpus()
    rows = run(args.rules, args.runs, not args.no_tap)
    print(f"replay of {meta['lines']:,} lines, {args.rules:,} rules, step tap {'off' if args.no_tap else 'on'}: "
          f"least CPU of {args.runs} runs per stage")
    for label, depth, seconds, share in rows:
        print(f"{'  ' * depth}{label:<{48 - 2 * depth}} {seconds:8.4f} s {share:7.1%}")


if __name__ == "__main__":
    main()
