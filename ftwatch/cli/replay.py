"""``ftwatch replay``: recorded logs through the engine and policy (T3)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ftwatch.cli.common import ArgumentParser, aimaster_epilog, load_config_from_args, split_flags, with_rule_files


def cmd_replay(argv: list[str]) -> int:
    flags, rest, tail = split_flags(argv)
    p = ArgumentParser(prog="ftwatch replay", description="Run recorded logs through the engine.",
                       epilog=aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--config")
    p.add_argument("--aimaster-args")
    p.add_argument("--json", action="store_true", help="print decisions as JSON lines")
    p.add_argument("--job-id", default="replay")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="another rule file (after rules.files; repeat it), e.g. a draft of ftwatch mine")
    p.add_argument("--state-dir", help="keep budgets in a file here (default: in memory); the chip-fault "
                                       "history and node blame always stay in memory, so a replay never "
                                       "counts against real jobs")
    args = p.parse_args(rest + tail)
    if not args.files:
        p.error("give at least one log file")
    for f in args.files:                 # before any work: a mistyped name is a usage error, not a traceback
        if not f.exists() or f.is_dir():     # (a pipe, as from <(zcat log.gz), is fine)
            p.error(f"{f}: {'a directory' if f.exists() else 'no such file'}")
    import tempfile
    from ftwatch.pipeline.build import build_engine, build_policy
    from ftwatch.pipeline.replay import replay
    from ftwatch.policy.budgets import BudgetStore
    for f in args.rules:
        if not Path(f).is_file():
            p.error(f"{f}: no such file")
    config = with_rule_files(load_config_from_args(args, flags), args.rules)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(args.state_dir or tmp)
        state.mkdir(parents=True, exist_ok=True)
        # Fault history and blame stay in memory: a replay must not count against the real jobs.
        budgets = BudgetStore(state / "budgets-replay.json" if args.state_dir else None, args.job_id)
        policy = build_policy(config, args.job_id, budgets, state_dir=state, in_memory=True)
        engine = build_engine(config)           # H3: stragglers in replayed logs too (like watch)
        total = sum(f.stat().st_size for f in args.files)
        result = _with_progress(total, lambda cb: replay(args.files, engine, policy, args.job_id, cb,
                                                         phases=config.phases))
    for note in result.notes:
        print(f"ftwatch replay: note: {note}", file=sys.stderr)
    for f in result.findings:            # H3: stragglers and slowdowns are notices, never the root cause
        if f.rule_id.startswith("straggler."):
            print(f"{f.kind}: {f.line}", file=sys.stderr if args.json else sys.stdout)
    d = result.decision
    if args.json:
        print(json.dumps(d.to_json(), ensure_ascii=False))
    else:
        print(f"{result.lines} lines, {len(result.findings)} findings")
        rc = d.root_cause
        print(f"decision: {d.action.label}  ({d.policy_clause})")
        if rc is not None:
            print(f"root cause: [{rc.failure_class.value}] {rc.rule_id} rank {rc.rank}: {rc.line}")
    return 0

def _with_progress(total: int, work):
    if total < (64 << 20) or not sys.stderr.isatty():
        return work(None)
    from rich.progress import Progress
    with Progress(transient=True) as progress:
        task = progress.add_task("replaying", total=total)
        return work(lambda n: progress.advance(task, n))
