"""Issue 16 (bounds): ``watch`` keeps a budget file per job it ever met; those of jobs it keeps no
state for, not written for ``limits.budget_retention``, are deleted (``policy.budgets.prune_budgets``)."""

from __future__ import annotations

import io
import os
from pathlib import Path

from ftwatch.bounded import EVICTIONS
from ftwatch.clock import FakeClock
from ftwatch.config.model import Config
from ftwatch.events import Origin
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.watch import BUDGET_SWEEP_SECONDS, Watcher
from ftwatch.policy.budgets import BudgetStore, budget_path, prune_budgets
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

DAY = 86400.0
RULES = load_rules()


def age(path: Path, mtime: float) -> None:
    os.utime(path, (mtime, mtime))


def test_stale_budget_files_go_and_fresh_or_kept_ones_stay(tmp_path: Path):
    now = 1_800_000_000.0
    for job, days in (("old", 91), ("team-a/old", 200), ("recent", 30), ("in-use", 400)):
        store = BudgetStore.for_job(tmp_path, job)
        age(store.path, now - days * DAY)
    (tmp_path / "budgets" / "notes.txt").write_text("not a budget file")
    age(tmp_path / "budgets" / "notes.txt", now - 400 * DAY)
    assert prune_budgets(tmp_path, now - 90 * DAY, keep={"in-use"}) == 2
    assert sorted(p.name for p in (tmp_path / "budgets").iterdir()) == ["in-use.json", "notes.txt", "recent.json"]
    assert not budget_path(tmp_path, "team-a/old").exists()
    assert prune_budgets(tmp_path / "nowhere", now) == 0          # no folder: nothing to do


def resolve(batch):
    for s in batch:
        yield Origin(s.meta["pod"], 0, s.meta["job"], "n0", "stderr", "forward"), s.line, s.time


def test_watch_sweeps_the_budget_files_of_jobs_gone_long_ago_hourly(tmp_path: Path):
    clock = FakeClock()
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}, "limits": {"budget_retention": "30d"}})
    w = Watcher(config, Engine(RULES), Recorder(SqliteStore(tmp_path / "ftwatch.db"), None, None, out=io.StringIO()),
                resolve, None, clock)
    gone_job = budget_path(tmp_path, "finished-long-ago")
    BudgetStore.for_job(tmp_path, "finished-long-ago")
    age(gone_job, clock.time() - 31 * DAY)
    w.ingest([Shipped(clock.time(), b"step 1", {"job": "live", "pod": "live-w0"})])
    live = budget_path(tmp_path, "live")
    age(live, clock.time() - 31 * DAY)          # written long ago, but watch keeps the job: it stays
    before = EVICTIONS.get("budget_file")
    w.tick()
    assert not gone_job.exists() and live.exists() and EVICTIONS.get("budget_file") == before + 1
    BudgetStore.for_job(tmp_path, "finished-long-ago")
    age(gone_job, clock.time() - 31 * DAY)
    clock.advance(BUDGET_SWEEP_SECONDS - 1)
    w.tick()
    assert gone_job.exists()                     # the next sweep is an hour after the last
    clock.advance(1)
    w.tick()
    assert not gone_job.exists()


def test_null_keeps_every_budget_file(tmp_path: Path):
    clock = FakeClock()
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}, "limits": {"budget_retention": None}})
    w = Watcher(config, Engine(RULES), Recorder(SqliteStore(tmp_path / "ftwatch.db"), None, None, out=io.StringIO()),
                resolve, None, clock)
    BudgetStore.for_job(tmp_path, "old")
    age(budget_path(tmp_path, "old"), clock.time() - 1000 * DAY)
    w.tick()
    assert budget_path(tmp_path, "old").exists()


def test_a_store_in_memory_counts_as_one_on_a_file_and_writes_nothing(tmp_path: Path, monkeypatch):
    """``BudgetStore(None, job)`` (replay without --state-dir, evaluate, mine): the same budgets as
    a file's store after the same steps, and no file written (nor a temporary one)."""
    from ftwatch.policy import budgets as module
    writes = []
    real = module.write_state
    monkeypatch.setattr(module, "write_state", lambda path, data: writes.append(path) or real(path, data))

    def steps(store: BudgetStore) -> dict:
        store.count_errors(["xid.79@worker-3"], "0:1")
        store.use_job_restart()
        store.next_attempt()
        store.use_instance_restart("worker-3")
        store.set_streaks(hang=2)
        store.set_memo("in_place", {"step": 7})
        store.close("failed")
        return store.to_dict()

    on_file = steps(BudgetStore(tmp_path / "b.json", "train-1"))
    assert writes and (tmp_path / "b.json").exists()
    writes.clear()
    in_memory = steps(BudgetStore(None, "train-1"))
    assert in_memory == on_file and writes == [] and sorted(os.listdir(tmp_path)) == ["b.json"]
