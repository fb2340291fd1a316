"""``ftwatch mine``: failure signatures (SPEC T5), ranked by the jobs they hit; ``--draft`` rules.

Without files: the signatures ``run`` and ``watch`` mined into ``<state-dir>/mining/`` from their
catch-all decisions; ``--from-store``: mined afresh from the stored decisions (SQLite, or
Elasticsearch with ``--es-url``), e.g. a store older than the miner. With files: the files of each job (:func:`jobs_of`) are replayed with the
configured rules and the evidence of the job's catch-all decision is mined (``--all-lines``: every
line, no replay).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from ftwatch.cli.common import ArgumentParser, load_config_from_args, split_flags, with_rule_files


GENERIC = frozenset({"combined", "train", "log", "output", "stdout", "stderr", "rank0"})


def jobs_of(paths: list[Path]) -> dict[str, list[Path]]:
    """The files of each job: one job per folder (a corpus case, a job's log folder), or, when
    every file is in one folder, one job per file (named by its stem; a lone ``combined.log``
    and the like by its folder)."""
    by_folder = len({p.resolve().parent for p in paths}) > 1 or (len(paths) == 1 and paths[0].stem in GENERIC)
    jobs: dict[str, list[Path]] = {}
    for path in paths:
        jobs.setdefault(path.resolve().parent.name if by_folder else path.stem, []).append(path)
    return jobs


def mine_files(files: list[Path], config, all_lines: bool = False):
    """A fresh miner fed from ``files`` (see the module docstring). Returns the Miner."""
    import tempfile

    from ftwatch.mining.miner import Miner, catch_all_ids
    from ftwatch.pipeline.build import build_engine, build_policy, build_rules
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.replay import replay
    from ftwatch.policy.budgets import BudgetStore
    rules = build_rules(config)
    miner = Miner(catch_all=catch_all_ids(rules), new_jobs=config.storage.mining.new_signature_jobs)
    jobs = jobs_of(files)
    if all_lines:
        for job, paths in jobs.items():
            for path in paths:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        miner.add(line, 0.0, job)
        return miner
    engine = build_engine(config, rules=rules)
    with tempfile.TemporaryDirectory() as tmp:
        for job, paths in jobs.items():
            policy = build_policy(config, job, BudgetStore(None, job), state_dir=Path(tmp), in_memory=True)
            recorder = Recorder(out=io.StringIO(), resolve_after=None)
            recorder.miner = miner
            replay(paths, engine, policy, job, recorder=recorder)
    return miner


def mine_store(reader, config):
    """A fresh miner fed with every stored decision of ``reader`` (``ftwatch.report.reader``'s
    SQLite reader or the Elasticsearch one) whose root cause is a catch-all. Returns the Miner."""
    from ftwatch.mining.miner import Miner, catch_all_ids
    from ftwatch.pipeline.build import build_rules
    miner = Miner(catch_all=catch_all_ids(build_rules(config)), new_jobs=config.storage.mining.new_signature_jobs)
    for job in reader.jobs():
        for row in reader.decisions(job):
            miner.stored(row)
    return miner


def _store_miner(args, config):
    """:func:`mine_store` over the SQLite store of the state dir, or Elasticsearch (``--es-url``)."""
    if args.es_url:
        from ftwatch.config.storage import ElasticsearchConfig
        from ftwatch.report.esreader import EsReader
        with EsReader.from_config(ElasticsearchConfig.model_validate({"url": args.es_url})) as reader:
            return mine_store(reader, config)
    from ftwatch.report.reader import SqliteReader
    db = Path(args.state_dir) / "ftwatch.db" if args.state_dir else config.storage.sqlite_path
    with SqliteReader(db) as reader:
        return mine_store(reader, config)


def cmd_mine(argv: list[str]) -> int:
    flags, rest, tail = split_flags(argv)
    p = ArgumentParser(prog="ftwatch mine", description="Failure signatures of catch-all decisions, "
                                                         "ranked by the jobs they hit; --draft writes rules.")
    p.add_argument("files", nargs="*", type=Path,
                   help="log files: one job per folder, or per file when all share one folder "
                        "(default: the state dir's signatures)")
    p.add_argument("--config")
    p.add_argument("--aimaster-args")
    p.add_argument("--state-dir", type=Path, help="default: storage.state_dir")
    p.add_argument("--all-lines", action="store_true", help="mine every line of the files (no replay)")
    p.add_argument("--from-store", action="store_true",
                   help="mine the stored decisions again (SQLite of the state dir, or --es-url) instead of "
                        "reading the state dir's signatures")
    p.add_argument("--es-url", action="append", help="with --from-store: read Elasticsearch (repeatable)")
    p.add_argument("--no-builtin", action="store_true", help="replay without the built-in rule packs")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="another rule file for the replay (repeat it)")
    p.add_argument("--min-jobs", type=int, default=1, help="only signatures hitting at least this many jobs")
    p.add_argument("--top", type=int, default=20, help="show this many (0: all)")
    p.add_argument("--draft", type=Path, metavar="DIR", help="write one rule file per signature shown here")
    p.add_argument("--clean", type=Path, action="append", default=[], metavar="FILE",
                   help="a clean run's output (repeat it): drafts must not hit it (their counterexamples)")
    p.add_argument("--json", action="store_true", help="print the signatures as JSON lines")
    args = p.parse_args(rest + tail)
    for f in [*args.files, *args.clean, *map(Path, args.rules)]:
        if not f.is_file():
            p.error(f"{f}: no such file")
    config = load_config_from_args(args, flags)
    config = with_rule_files(config, args.rules, builtin=not args.no_builtin)
    if args.files:
        miner = mine_files(args.files, config, args.all_lines)
    elif args.from_store:
        try:
            miner = _store_miner(args, config)
        except (FileNotFoundError, LookupError) as exc:
            print(f"ftwatch mine: {exc}", file=sys.stderr)
            return 1
    else:
        from ftwatch.mining.miner import Miner
        miner = Miner.in_state_dir(args.state_dir or config.storage.state_dir)
    shown = miner.ranked(args.min_jobs)
    shown = shown[: args.top] if args.top else shown
    for sig in shown:
        if args.json:
            print(json.dumps(sig.to_dict(), ensure_ascii=False))
        else:
            print(f"{len(sig.jobs):4d} jobs {sig.count:6d} lines  [{sig.id}] {sig.template}")
    if not shown and not args.json:
        print("no signatures")
    if args.draft:
        from ftwatch.mining.draft import write_drafts
        clean = [line for f in args.clean for line in f.read_text(encoding="utf-8", errors="replace").splitlines()]
        paths = write_drafts(shown, args.draft, clean)
        for path in paths:
            print(f"draft: {path}")
        if len(paths) < len(shown):
            print(f"{len(shown) - len(paths)} signature(s) not drafted: too little literal text to match on")
    return 0
