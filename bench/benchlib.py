"""What every ``make bench`` part shares: figures against goals, CPU clocks, the corpus, rule sets.

A part (``bench/bench_*.py``) prints its own table and, for the driver (``bench/run.py``), one
``FIGURE {json}`` line per figure; the driver gathers them into the final table. Speeds are lines
(or records) per CPU-second of the measured process (its children included for ``rg``/``grep``),
so helpers sharing the machine change them less than wall-clock rates; every figure that has a
goal is a ratio measured in the same run, or a bound in seconds / MiB.

The corpus (``build_corpus``) is real log text: the recorded runs under ``tests/golden/`` (the
example trainer under torchrun, NCCL and KeyError failures) plus Megatron-style step lines of 8
ranks (28 % of the lines, as in the issue's measurement), repeated so that about 1 % of the lines
hit a rule.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ftwatch.events import Action, FailureClass  # noqa: E402
from ftwatch.rules.model import Pattern, Rule  # noqa: E402

RULE_COUNTS = (10, 100, 1_000, 10_000)


@dataclass(frozen=True)
class Figure:
    """One measured figure.

    Attributes:
        name: what was measured.
        value: the number (a ratio, lines/s, seconds, MiB).
        unit: how ``value`` reads (``x``, ``lines/s``, ``s``, ``MiB``, ``%``).
        goal: the goal as printed (``>= 1.5``), or "" for context figures.
        ok: whether the goal is met (None: no goal).
        note: what the ratio is made of.
    """

    name: str
    value: float
    unit: str
    goal: str = ""
    ok: bool | None = None
    note: str = ""


def at_least(name: str, value: float, unit: str, goal: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f">= {goal:g}", value >= goal, note)


def at_most(name: str, value: float, unit: str, goal: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f"<= {goal:g}", value <= goal, note)


def info(name: str, value: float, unit: str, note: str = "") -> Figure:
    return Figure(name, value, unit, "", None, note)


def fmt(value: float, unit: str) -> str:
    if unit in ("lines/s", "records/s"):
        return f"{value:,.0f} {unit}"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f} %"
    return f"{value:.3g} {unit}"


def table(figures: list[Figure]) -> str:
    """Figures as an aligned table: value, goal, met / NOT met (blank for context rows)."""
    width = max([len(f.name) for f in figures] + [6])
    rows = [f"{'figure':<{width}}  {'value':>18}  {'goal':<10}  result", "-" * (width + 44)]
    for f in figures:
        result = "" if f.ok is None else ("met" if f.ok else "NOT met")
        rows.append(f"{f.name:<{width}}  {fmt(f.value, f.unit):>18}  {f.goal:<10}  {result}")
        if f.note:
            rows.append(f"{'':<{width}}    ({f.note})")
    return "\n".join(rows)


def report(part: str, figures: list[Figure]) -> None:
    """Print a part's table and its ``FIGURE`` lines for the driver."""
    print(f"\n== {part}")
    print(table(figures))
    for f in figures:
        print("FIGURE " + json.dumps({"part": part, **asdict(f)}))
    sys.stdout.flush()


def say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def cpu_of(fn: Callable[[], object], repeat: int = 1) -> float:
    """The least CPU seconds (this process and its finished children) of ``repeat`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeat):
        own, kids = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        fn()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent = time.process_time() - own + (after.ru_utime - kids.ru_utime) + (after.ru_stime - kids.ru_stime)
        best = min(best, spent)
    return best


def scale() -> float:
    """``BENCH_SCALE`` (default 1): multiplies the corpus size."""
    return float(os.environ.get("BENCH_SCALE", "1") or 1)


def workdir() -> Path:
    """Where the parts share the corpus and rule files (``BENCH_DIR``, set by the driver)."""
    path = Path(os.environ.get("BENCH_DIR") or "/tmp/ftwatch-bench")
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- the corpus --------------------------------------------------------------------------------

STEP_BASE = (2026, 11, 21, 9, 0, 0)      # the step clock's start: one iteration a second from here
STEP_LINE = ("[rank{r}]: [{when}] iteration {it:>8}/ 1000000 | consumed samples: {cs:>10} | "
             "elapsed time per iteration (ms): {ms:.1f} | learning rate: 2.999E-04 | global batch size:  1024 | "
             "lm loss: 2.{loss:04d}E+00 | loss scale: 65536.0 | grad norm: 1.{g:03d} |")


def step_lines(count: int, ranks: int = 8, first: int = 1) -> list[bytes]:
    """``count`` Megatron step lines of ``ranks`` ranks (every rank prints each iteration), one
    iteration a second from 2026-11-21 09:00:00 on: a training log's clock moves forward (one that
    wrapped every hour, as this one once did, kept every error waiting for progress for ever: the
    pathology of a log whose clock runs back, which ``policy/waiting.py`` bounds, not a training run)."""
    import datetime
    base = datetime.datetime(*STEP_BASE)
    out = []
    for k in range(count):
        it, r = first + k // ranks, k % ranks
        when = (base + datetime.timedelta(seconds=it)).strftime("%Y-%m-%d %H:%M:%S")
        out.append(STEP_LINE.format(r=r, when=when, it=it, cs=it * 1024,
                                    ms=1200.0 + (it * 7 + r * 13) % 50, loss=(it * 31) % 9999,
                                    g=(it + r) % 999).encode())
    return out


# the stamps the recorded failure runs carry: glog's (``E1121 11:02:23.661000`` at a line's start,
# torchelastic's log lines; ``[W1127 07:30:17.368235521 ProcessGroupNCCL.cpp:1575]`` behind a rank
# prefix, c10d's), torchelastic's failure summary (``time      : 2026-11-21_11:02:23``) and NCCL's
# WARN lines (``[2026-11-27 07:30:17] host:pid:tid [0] bootstrap.cc:114 NCCL WARN``)
# (each with the strftime form it is written in again)
_STAMPS = ((re.compile(rb"(?P<head>(?:^|\]:\[|^\[)[IWEF])\d{4} (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)", re.M),
            "%m%d %H:%M:%S"),
           (re.compile(rb"(?P<head>time\s+: )\d{4}-\d\d-\d\d_(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"),
            "%Y-%m-%d_%H:%M:%S"),
           (re.compile(rb"(?P<head>\[)\d{4}-\d\d-\d\d (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?=\])"),
            "%Y-%m-%d %H:%M:%S"))


def step_time(first: int, before: int, ranks: int = 8) -> float:
    """The step clock (epoch seconds) at the ``before``-th step line of a unit whose first
    iteration is ``first``."""
    import datetime
    return (datetime.datetime(*STEP_BASE) + datetime.timedelta(seconds=first + before // ranks)).timestamp()


def dated(runs: list[bytes], at: float) -> bytes:
    """The recorded failure runs, each with its stamps (``_STAMPS``) moved to ``at`` (epoch seconds)
    and on, its own spacing kept, joined: in a real log a failure happens at the time of the
    training around it, not hours or days ahead of it. (A stamp left where it was recorded, days
    after the corpus's step clock, keeps its error waiting for progress through the whole corpus:
    the pathology of a log whose clock runs back, which ``policy/waiting.py`` bounds, not a training
    run; each run was recorded on its own day, so each is moved from its own first stamp.)"""
    import datetime

    def secs(m: re.Match) -> int:
        return int(m["h"]) * 3600 + int(m["mi"]) * 60 + int(m["s"])
    out = []
    for run in runs:
        found = [secs(m) for rx, _ in _STAMPS for m in rx.finditer(run)]
        if not found:
            out.append(run)
            continue
        zero = min(found)
        for rx, form in _STAMPS:
            run = rx.sub(lambda m, form=form, zero=zero: m["head"] + datetime.datetime.fromtimestamp(
                at + secs(m) - zero).strftime(form).encode(), run)
        out.append(run)
    return b"".join(out)


def build_corpus(path: Path, lines: int, hit_share: float = 0.01, step_share: float = 0.28) -> dict:
    """Write ~``lines`` lines of real log text to ``path`` (module doc) and return what it holds.

    The recorded failure runs are dense with hits; the recorded clean run, its quiet lines
    (those that hit no built-in rule) and step lines fill each unit so that ``hit_share`` of its
    lines hit a rule. Returns ``{"lines", "bytes", "hit_lines", "step_lines"}``.
    """
    from ftwatch.config.health import StragglerConfig
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.loader import load_rules
    from ftwatch.rules.stragglers import StepTracker
    golden = ROOT / "tests" / "golden"
    logs = sorted(p for p in golden.rglob("*") if p.suffix in (".log", ".err", ".out"))
    runs = [p.read_bytes() for p in logs if "clean" not in p.parent.name]
    failures = b"".join(runs)
    quiet_all = b"".join(p.read_bytes() for p in logs if "clean" in p.parent.name).splitlines()
    matcher = Engine(load_rules()).matcher
    hit_starts = {s for s, _ in matcher.scan(failures)}
    fail_lines = failures.count(b"\n")
    quiet_text = b"\n".join(quiet_all) + b"\n"
    # quiet: hits no rule and is no step line (the clean run's own step lines would pass 28 %)
    tracker = StepTracker(StragglerConfig())
    quiet_hits = {s for s, _ in Engine(load_rules(), steps=tracker).matcher.scan(quiet_text)}
    quiet_hits |= {s for s, _, _ in tracker.find(quiet_text)}   # the tap finds its lines itself, not the matcher
    quiet, pos = [], 0
    for line in quiet_all:
        if pos not in quiet_hits:
            quiet.append(line)
        pos += len(line) + 1
    per_unit = int(len(hit_starts) / hit_share)
    steps_n = int(per_unit * step_share)
    fill = max(0, per_unit - fail_lines - steps_n)
    units = max(1, lines // per_unit)
    with path.open("wb") as fh:
        for u in range(units):
            steps = step_lines(steps_n, first=1 + u * (steps_n // 8 + 1))
            filler = [quiet[(u * fill + i) % len(quiet)] for i in range(fill)]
            body, si = [], 0
            gap = max(1, len(filler) // max(1, len(steps)))
            for i, line in enumerate(filler):
                body.append(line)
                if i % gap == 0 and si < len(steps):
                    body.append(steps[si])
                    si += 1
            body.extend(steps[si:])
            cut = len(body) // 2
            before = sum(1 for line in body[:cut] if line.startswith(b"[rank") and b" iteration " in line)
            at = step_time(first=1 + u * (steps_n // 8 + 1), before=before)
            fh.write(b"\n".join(body[:cut]) + b"\n" + dated(runs, at) + b"\n".join(body[cut:]) + b"\n")
    data = path.read_bytes()
    n = data.count(b"\n")
    return {"lines": n, "bytes": len(data), "hit_lines": len(hit_starts) * units, "step_lines": steps_n * units}


def corpus() -> tuple[Path, dict]:
    """The shared corpus (built once per driver run): its path and ``build_corpus``'s counts."""
    path = workdir() / "corpus.log"
    meta = workdir() / "corpus.json"
    if not (path.exists() and meta.exists()):
        say("building the corpus")
        json.dump(build_corpus(path, int(300_000 * scale())), meta.open("w"))
    return path, json.load(meta.open())


# -- rule sets ----------------------------------------------------------------------------------

_WORDS = ("device", "allocator", "collective", "checkpoint", "dataloader", "optimizer", "kernel", "stream",
          "transport", "socket", "barrier", "shard", "tensor", "scheduler", "launcher", "watchdog")


def synthetic_rule(i: int) -> Rule:
    """Rule ``i`` of a generated set that never hits the corpus: 9 in 10 literals, the rest regexes."""
    w1, w2 = _WORDS[i % len(_WORDS)], _WORDS[(i // len(_WORDS)) % len(_WORDS)]
    if i % 10:
        pattern = Pattern(f"E{i:05d}: {w1} {w2} failed")
    else:
        pattern = Pattern(rf"{w1} error Z{i:05d}: code=[0-9]{{3}} on dev[0-9]+", regex=True)
    return Rule(f"bench.r{i}", (pattern,), FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


def rule_set(n: int) -> list[Rule]:
    """``n`` rules: the first ``n`` built-in rules, then generated ones (``synthetic_rule``)."""
    from ftwatch.rules.loader import load_rules
    builtin = load_rules()
    if n <= len(builtin):
        return builtin[:n]
    return builtin + [synthetic_rule(i) for i in range(n - len(builtin))]


def rule_yaml(n: int, path: Path) -> Path:
    """A rule file of ``n`` generated rules (for start-up: loaded beside the built-in packs)."""
    with path.open("w") as fh:
        fh.write("rules:\n")
        for i in range(n):
            rule = synthetic_rule(i)
            p = rule.patterns[0]
            key = "regex" if p.regex else "keywords"
            fh.write(f"  - id: {rule.id}\n    {key}: [{json.dumps(p.text)}]\n"
                     f"    class: retryable_infra\n    action: restart_job\n")
    return path


def max_rss_mib() -> float:
    """This process's peak RSS in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
