"""`make bench`: engine throughput on real log text, as ratios measured in one run.

The corpus is the recorded multi-rank logs under tests/golden/ (real runs of the example
trainer, real failure tracebacks) repeated to about 1 M lines. Measured, on the same file:

- the replay path (chunks read from the file, scanned, findings made) with the built-in packs;
- the same with 1,000 rules (the packs plus generated literals and regexes that never hit);
- `grep -F -c -f` on the built-in packs' literal keywords (the C floor for literals);
- one stdlib ``re`` alternation of the built-in patterns, line by line (the naive design);
- the plain read floor (``for line in open(path, 'rb')``).

Prints lines/s and the ratios; asserts nothing (tests never assert speed).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ftwatch.config.model import PolicyConfig  # noqa: E402
from ftwatch.events import Action, FailureClass  # noqa: E402
from ftwatch.pipeline.replay import replay  # noqa: E402
from ftwatch.policy.budgets import BudgetStore  # noqa: E402
from ftwatch.rules.engine import Engine  # noqa: E402
from ftwatch.rules.loader import load_rules  # noqa: E402
from ftwatch.rules.model import Pattern, Rule  # noqa: E402
from ftwatch.policy.policy import Policy  # noqa: E402


def corpus(path: Path, lines: int, clean_per_failure: int = 300) -> int:
    """Write ~``lines`` lines of recorded real log text to ``path``; returns the line count.

    The recordings under tests/golden/ are failure runs, dense with tracebacks (a third of
    their lines hit a rule); a real job's log is mostly step lines. So the corpus repeats the
    recorded clean run ``clean_per_failure`` times for each copy of the failure recordings,
    which makes about 1 % of the lines hit, as in a real training log.
    """
    golden = ROOT / "tests" / "golden"
    clean = b"".join(p.read_bytes() for p in sorted(golden.glob("*clean*/*.log")))
    failures = b"".join(p.read_bytes() for p in sorted(golden.rglob("*.log")) if "clean" not in p.parent.name)
    unit = clean * clean_per_failure + failures
    per = unit.count(b"\n")
    reps = max(1, lines // max(per, 1))
    with path.open("wb") as fh:
        for _ in range(reps):
            fh.write(unit)
    return per * reps


def synthetic_rules(n: int) -> list[Rule]:
    """``n`` rules that never hit: half literals, half regexes (the RE2/Hyperscan subset)."""
    out = []
    for i in range(n):
        if i % 2:
            pattern = Pattern(f"zzfault{i:05d} in module q{i % 97}")
        else:
            pattern = Pattern(rf"zzerr{i:05d}: code=[0-9]{{3}} dev[0-9]+", regex=True)
        out.append(Rule(f"bench.r{i}", (pattern,), FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB))
    return out


def time_replay(path: Path, rules: list[Rule], state: Path) -> float:
    engine = Engine(rules)
    policy = Policy(PolicyConfig(), BudgetStore(state / f"b{len(rules)}.json", "bench"), "bench")
    start = time.perf_counter()
    replay([path], engine, policy, "bench")
    return time.perf_counter() - start


def time_read(path: Path) -> float:
    start = time.perf_counter()
    n = 0
    with path.open("rb") as fh:
        for _ in fh:
            n += 1
    return time.perf_counter() - start


def time_grep(path: Path, rules: list[Rule], tmp: Path) -> float | None:
    if not shutil.which("grep"):
        return None
    literals = [p.text for r in rules for p in r.patterns if not p.regex]
    words = tmp / "literals.txt"
    words.write_text("\n".join(literals) + "\n")
    start = time.perf_counter()
    proc = subprocess.run(["grep", "-F", "-c", "-f", str(words), str(path)], capture_output=True, check=False)
    if proc.returncode > 1:
        print(f"grep failed: {proc.stderr.decode(errors='replace').strip()}")
        return None
    return time.perf_counter() - start


def time_re_alternation(path: Path, rules: list[Rule], sample_lines: int) -> tuple[float, int]:
    parts = []
    for r in rules:
        for p in r.patterns:
            body = p.text if p.regex else re.escape(p.text)
            parts.append(f"(?i:{body})" if p.caseless else f"(?:{body})")
    big = re.compile("|".join(parts).encode())
    with path.open("rb") as fh:
        lines = [line for _, line in zip(range(sample_lines), fh)]
    start = time.perf_counter()
    for line in lines:
        big.search(line)
    return time.perf_counter() - start, len(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--re-sample", type=int, default=100_000, help="lines the re alternation is timed on")
    args = ap.parse_args()
    builtin = load_rules()
    thousand = builtin + synthetic_rules(max(0, 1000 - len(builtin)))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "corpus.log"
        n = corpus(path, args.lines)
        size = path.stat().st_size
        read = time_read(path)
        t_builtin = time_replay(path, builtin, tmp)
        t_thousand = time_replay(path, thousand, tmp)
        t_grep = time_grep(path, builtin, tmp)
        t_re, re_lines = time_re_alternation(path, builtin, args.re_sample)

    def rate(seconds: float, lines: int = n) -> float:
        return lines / seconds

    from ftwatch.rules.matcher import Matcher
    backend = Matcher([Pattern("x")]).backend
    print(f"corpus: {n:,} lines, {size / 1e6:.1f} MB of recorded logs (tests/golden), matcher backend {backend}")
    print(f"{'what':44} {'lines/s':>12} {'MB/s':>8}")
    rows = [("read floor (for line in file)", rate(read)),
            (f"engine replay, built-in packs ({len(builtin)} rules)", rate(t_builtin)),
            (f"engine replay, {len(thousand)} rules", rate(t_thousand))]
    if t_grep:
        rows.append(("grep -F -c -f (built-in literals)", rate(t_grep)))
    rows.append((f"stdlib re alternation ({len(builtin)} rules, {re_lines:,} lines)", rate(t_re, re_lines)))
    for name, lps in rows:
        print(f"{name:44} {lps:12,.0f} {lps * size / n / 1e6:8.1f}")
    print()
    e1, e2 = rate(t_builtin), rate(t_thousand)
    print(f"engine (built-in) / read floor       {e1 / rate(read):6.2f}")
    if t_grep:
        print(f"engine (built-in) / grep -F          {e1 / rate(t_grep):6.2f}")
        print(f"engine (1,000 rules) / grep -F       {e2 / rate(t_grep):6.2f}")
    print(f"engine (built-in) / re alternation   {e1 / rate(t_re, re_lines):6.2f}")
    print(f"engine (1,000) / engine (built-in)   {e2 / e1:6.2f}")
    print(f"target >= 1,000,000 lines/s with the built-in packs: {'met' if e1 >= 1e6 else 'NOT met'}")


if __name__ == "__main__":
    main()
