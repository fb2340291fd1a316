"""Issue 16 (bounds): the SQLite store merges each job's old output counts into coarser buckets,
so a long ``watch`` stops growing the file by a row per instance and bucket; the sums stay exact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ftwatch.config.metrics import MetricsConfig
from ftwatch.pipeline.sinks import downsample
from ftwatch.pipeline.sinks.base import OutputBatch
from ftwatch.pipeline.sinks.downsample import OutputDownsampler
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.report import model
from ftwatch.report.reader import SqliteReader

T0 = 1_795_219_200.0          # a multiple of 300 s
HOUR = 3600.0


def write_buckets(store: SqliteStore, job: str, start: float, end: float, step: float = 5.0,
                  instances: int = 3) -> dict[str, tuple[int, int]]:
    """One batch per ``step`` long bucket from ``start`` to ``end`` (as ``watch`` writes them);
    returns each instance's lines and bytes written."""
    sums: dict[str, list[int]] = {}
    t = start
    while t < end:
        rows = [(job, f"w{i}", i, t, step, 1 + i + int(t) % 7, 10 * (i + 1)) for i in range(instances)]
        store.write([OutputBatch(rows)])
        for r in rows:
            s = sums.setdefault(r[1], [0, 0])
            s[0] += r[5]
            s[1] += r[6]
        t += step
    return {k: (v[0], v[1]) for k, v in sums.items()}


def totals(store: SqliteStore, job: str) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for r in store.output(job):
        s = out.setdefault(r["instance"], [0, 0])
        s[0] += r["lines"]
        s[1] += r["bytes"]
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_counts_older_than_the_full_window_become_coarse_rows_with_the_same_sums(tmp_path: Path):
    store = SqliteStore(tmp_path / "ftwatch.db", OutputDownsampler(HOUR, 300.0))
    written = write_buckets(store, "j", T0, T0 + 3 * HOUR)
    rows = store.output("j")
    newest = max(r["bucket"] for r in rows)
    cut = store.downsample.cutoff(newest)
    assert cut == T0 + 2 * HOUR - 300       # the newest bucket starts 5 s before 3 h
    assert totals(store, "j") == written
    fine = [r for r in rows if r["seconds"] == 5.0]
    coarse = [r for r in rows if r["seconds"] == 300.0]
    assert len(coarse) == 3 * (cut - T0) / 300
    assert all(r["bucket"] % 300 == 0 for r in coarse) and max(r["bucket"] for r in coarse) < cut
    assert min(r["bucket"] for r in fine) == cut and len(fine) == 3 * (T0 + 3 * HOUR - cut) / 5
    assert [r["rank"] for r in coarse if r["instance"] == "w2"] == [2] * (len(coarse) // 3)
    one = next(r for r in coarse if r["instance"] == "w1" and r["bucket"] == T0 + 300)
    assert one["lines"] == sum(2 + int(t) % 7 for t in range(int(T0) + 300, int(T0) + 600, 5))
    store.close()
    with SqliteReader(tmp_path / "ftwatch.db") as reader:     # the report: paged rows, bounds asked first
        view = model.build(reader)["jobs"][0]
    assert view["totals"]["lines"] == sum(v[0] for v in written.values())
    assert view["output"]["bucket"] == 10.0                   # 2,160 five-second buckets, 2,000 points at most
    plotted = next(s["points"] for s in view["output"]["series"] if s["instance"] == "w0")
    assert sum(p[1] for p in plotted[:-1]) == pytest.approx(written["w0"][0], abs=0.005 * len(plotted))  # to 0.01 a point


def test_a_late_write_into_a_merged_bucket_adds_to_it(tmp_path: Path):
    store = SqliteStore(tmp_path / "ftwatch.db", OutputDownsampler(HOUR, 300.0))
    write_buckets(store, "j", T0, T0 + 2 * HOUR, instances=1)
    before = {r["bucket"]: r["lines"] for r in store.output("j") if r["seconds"] == 300.0}
    store.write([OutputBatch([("j", "w0", 0, T0, 5.0, 1000, 1), ("j", "w0", 0, T0 + 310, 5.0, 500, 1)])])
    write_buckets(store, "j", T0 + 2 * HOUR, T0 + 2 * HOUR + 300, instances=1)   # the cutoff moves on
    after = {r["bucket"]: (r["lines"], r["seconds"]) for r in store.output("j") if r["bucket"] < T0 + 600}
    assert after == {T0: (before[T0] + 1000, 300.0), T0 + 300: (before[T0 + 300] + 500, 300.0)}


def test_the_window_counts_back_from_each_jobs_own_newest_bucket_not_the_clock(tmp_path: Path):
    store = SqliteStore(tmp_path / "ftwatch.db", OutputDownsampler(HOUR, 300.0))
    old = T0 - 3 * 365 * 86400                  # a replay of a three-year-old log
    write_buckets(store, "old", old, old + 0.5 * HOUR)
    write_buckets(store, "new", T0, T0 + 2 * HOUR)
    assert {r["seconds"] for r in store.output("old")} == {5.0}
    assert {r["seconds"] for r in store.output("new")} == {5.0, 300.0}


def test_a_store_that_grew_before_catches_up_a_bounded_number_of_rows_per_write(tmp_path: Path, monkeypatch):
    path = tmp_path / "ftwatch.db"
    written = write_buckets(SqliteStore(path), "j", T0, T0 + 3 * HOUR)   # written with no merging
    monkeypatch.setattr(downsample, "MAX_ROWS", 600)
    store = SqliteStore(path, OutputDownsampler(HOUR, 300.0))
    fine_before = 3 * 3 * HOUR / 5
    passes = []
    t = T0 + 3 * HOUR
    while not passes or passes[-1]:
        store.write([OutputBatch([("j", "w9", 9, t, 5.0, 1, 1)])])
        passes.append(fine_before - sum(r["seconds"] == 5.0 for r in store.output("j") if r["instance"] != "w9"))
        fine_before -= passes[-1]
        t += 5
    assert max(passes) <= 600 + 3 * 60 and len(passes) > 5       # whole 300 s buckets, about MAX_ROWS
    rows = store.output("j")
    assert totals(store, "j") == {**written, "w9": (len(passes), len(passes))}
    assert min(r["bucket"] for r in rows if r["seconds"] == 5.0) == store.downsample.cutoff(t - 5)


def test_rows_as_long_as_a_coarse_bucket_are_left_as_they_are_and_do_not_stall_the_merging(
        tmp_path: Path, monkeypatch):
    monkeypatch.setattr(downsample, "MAX_ROWS", 10)
    store = SqliteStore(tmp_path / "ftwatch.db", OutputDownsampler(HOUR, 300.0))
    long = [("j", "w0", 0, T0 + 60 + 600 * k, 600.0, 7, 7) for k in range(30)]   # an older config's rows
    store.write([OutputBatch(long)])
    write_buckets(store, "j", T0 + 6 * HOUR, T0 + 8 * HOUR, instances=1)
    rows = store.output("j")
    assert [(r["bucket"], r["seconds"], r["lines"]) for r in rows if r["seconds"] == 600.0] == [r[3:6] for r in long]
    assert min(r["bucket"] for r in rows if r["seconds"] == 5.0) == store.downsample.cutoff(T0 + 8 * HOUR - 5)


def test_a_version_4_file_gets_the_merged_mark_and_its_rows_are_merged(tmp_path: Path):
    from ftwatch.pipeline.sinks import marks, sqlite as mod
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(mod._SCHEMA_V1 + mod._SCHEMA_V2 + marks.SCHEMA_V3 + marks.SCHEMA_V4 + "PRAGMA user_version = 4;")
    conn.executemany("INSERT INTO output (job, instance, rank, bucket, seconds, lines, bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [("j", "w0", 0, T0 + 5 * k, 5.0, 1, 2) for k in range(2 * 720)])
    conn.commit()
    conn.close()
    with SqliteStore(path, OutputDownsampler(HOUR, 300.0)) as s:
        s.write([OutputBatch([("j", "w0", 0, T0 + 2 * HOUR, 5.0, 1, 2)])])
        rows = s.output("j")
        assert sum(r["lines"] for r in rows) == 2 * 720 + 1 and sum(r["bytes"] for r in rows) == 2 * (2 * 720 + 1)
        assert [r["bucket"] for r in rows if r["seconds"] == 300.0] == [T0 + 300 * k for k in range(12)]


def test_the_config_builds_the_merging_and_refuses_a_coarse_bucket_that_is_no_whole_multiple(tmp_path: Path):
    from ftwatch.config.model import Config
    from ftwatch.pipeline.build import build_store
    store = build_store(Config(), tmp_path)
    assert (store.downsample.full_window, store.downsample.coarse) == (86400.0, 300.0)
    store.close()
    store = build_store(Config.model_validate({"storage": {"metrics": {"output_full_window": None}}}), tmp_path)
    assert store.downsample is None
    store.close()
    assert MetricsConfig(output_bucket=0.5).coarse_bucket == 30.0
    with pytest.raises(ValueError, match="whole multiple"):
        MetricsConfig(output_bucket=7, output_coarse_bucket=300)


def test_the_jobs_remembered_are_capped_and_a_forgotten_one_is_still_merged(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(downsample, "MAX_JOBS", 2)
    store = SqliteStore(tmp_path / "ftwatch.db", OutputDownsampler(HOUR, 300.0))
    for job in ("a", "b", "c"):
        write_buckets(store, job, T0, T0 + HOUR + 600, instances=1)
    assert list(store.downsample._done) == ["b", "c"]
    write_buckets(store, "a", T0 + HOUR + 600, T0 + 2 * HOUR, instances=1)
    assert list(store.downsample._done) == ["c", "a"]
    for job in ("a", "b", "c"):
        fine = [r["bucket"] for r in store.output(job) if r["seconds"] == 5.0]
        assert min(fine) == store.downsample.cutoff(max(fine))
