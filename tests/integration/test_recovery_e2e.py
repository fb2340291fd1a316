"""End to end: `ftwatch run` carrying out MindCluster strategies (D5), keeping the scene (A3) and
isolating devices within an elastic range (A1), with real worker processes (recovery_worker.py,
no torch) and the real command line.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from ftwatch.pipeline.sinks.sqlite import SqliteStore

from .test_run_e2e import Job

WORKER = [sys.executable, str(Path(__file__).with_name("recovery_worker.py"))]
pytestmark = pytest.mark.slow


def events(job: Job, kind: str) -> list[dict]:
    return [e["detail"] for e in SqliteStore(job.state / "ftwatch.db").events() if e["kind"] == kind]


def run(tmp: Path, flags: list[str], mode: str, nproc: int | str = 2, **env: str) -> Job:
    """``ftwatch run`` of the recovery worker; no visible-devices variable unless ``env`` sets one
    (the slots are then modelled devices 0..MAX-1)."""
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    full = {"RW_MODE": mode, "RW_DIR": str(out), "CUDA_VISIBLE_DEVICES": None, "ASCEND_RT_VISIBLE_DEVICES": None, **env}
    return Job(tmp, flags, WORKER, full, nproc=nproc)


def test_gpus_hidden_by_the_environment_stay_hidden_across_an_isolation(tmp_path):
    """CUDA_VISIBLE_DEVICES= (no GPU, as torchrun passes it): the workers see it empty at every
    start, also after slot 1's Xid isolates a modelled device and the job goes on with one worker."""
    job = run(tmp_path, ["--enable-job-restart=True"], "xid", nproc="1:2", CUDA_VISIBLE_DEVICES="", RW_BAD_SLOT="1")
    assert job.wait() == 0, job.output
    assert [d["action"] for d in job.decisions()] == ["isolate_node", "none"], job.output
    starts = re.findall(r"world (\d) devices (\S*) start", job.output)
    assert starts[:2] == [("2", ""), ("2", "")] and starts[2:] == [("1", "")], job.output


def test_isolated_device_leaves_the_slots_and_the_job_finishes_with_fewer_workers(tmp_path):
    """2:3 on modelled devices 0,1,2: device 1's worker prints Xid 79 -> isolate_node -> 2 workers
    on 0,2 (WORLD_SIZE 2) -> success; the isolation is kept in the state dir."""
    job = run(tmp_path, ["--enable-job-restart=True"], "xid", nproc="2:3")
    assert job.wait() == 0, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["isolate_node", "none"], job.output
    assert decisions[0]["root_cause"]["rule_id"].startswith("xid.79")
    assert "isolated device 1 (rank 1); restart with 2 worker(s) on 0,2 (--nproc-per-node 2:3)" in \
        decisions[0]["policy_clause"]
    assert "world 3 devices 0,1,2" in job.output
    second = [line for _, line in job.lines if "world 2" in line]
    assert len(second) == 2 and all("devices 0,2 start 1 sched 2" in line for line in second), job.output
    saved = json.loads(next((job.state / "isolation").glob("*.json")).read_text())
    assert list(saved["isolated"]) == ["1"] and saved["isolated"]["1"]["rule"].startswith("xid.79")
    assert [e["device"] for e in events(job, "device_isolated")] == ["1"]


def test_second_isolation_below_min_fails_the_job_with_that_reason(tmp_path):
    """The worker in slot 1 always loses its device: 1 is isolated, then 2: one left < MIN 2."""
    job = run(tmp_path, ["--enable-job-restart=True"], "xid", nproc="2:3", RW_BAD_SLOT="1")
    assert job.wait() == 1, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["isolate_node", "fail_job"], job.output
    assert "below the minimum 2 of --nproc-per-node 2:3 → fail_job" in decisions[1]["policy_clause"]
    assert "isolated device 2 (rank 1)" in decisions[1]["policy_clause"]
    assert "FAILED (exit 1)" in job.output


def test_dump_signals_the_survivors_who_write_last_words_before_the_stop(tmp_path):
    """dump,exit: rank 1 exits 1; ranks 0 and 2 get SIGUSR1, write last words through the SDK's
    on_dump within the grace period, ftwatch records it, stops them and fails the job."""
    job = run(tmp_path, ["--recover-strategy", "dump,exit"], "dump", nproc=3)
    assert job.wait() == 1, job.output
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("last-words-*")) == ["last-words-rank0.txt", "last-words-rank2.txt"]
    asked = job.first("asking worker-0, worker-2 for last words (SIGUSR1, 30 s)")
    recorded = job.first(f"worker-0 dumped {out / 'last-words-rank0.txt'}")
    stopped = job.first("stopping all workers")
    assert asked <= recorded <= stopped
    [dump] = events(job, "dump")
    assert dump["outcomes"] == {"worker-0": f"dumped {out / 'last-words-rank0.txt'}",
                                "worker-2": f"dumped {out / 'last-words-rank2.txt'}"}
    [d] = job.decisions()
    assert d["action"] == "fail_job" and "exit: stop and fail" in d["policy_clause"]


def test_keep_scene_leaves_the_survivor_alive_for_the_window_and_prints_how_to_attach(tmp_path):
    job = run(tmp_path, ["--keep-scene", "5"], "scene")
    job.first("keeping the scene for 5 s")
    text = job.first("py-spy dump --pid")
    pids = [int(p) for p in re.findall(r"worker-0 \(rank 0\)  pid (\d+)  running", job.output)]
    assert len(pids) == 1, job.output
    os.kill(pids[0], 0)                       # the survivor is still there during the window
    assert f"gdb -p {pids[0]}" in job.output and "state dir" in job.output
    assert re.search(r"worker-1 \(rank 1\)  pid \d+  exit 1", job.output)
    assert job.wait() == 1, job.output
    released = job.first("ftwatch: scene released")
    assert released - text >= 3.0             # the window was held (5 s, minus output latency)
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
    [d] = job.decisions()
    assert d["action"] == "fail_job" and d["root_cause"]["rule_id"] == "python.key_error"


def test_keep_scene_after_a_hang_leaves_the_sigstopped_worker_stopped(tmp_path):
    """A job hang with restarts off: the scene shows (and keeps) rank 1 in its SIGSTOPped state."""
    job = run(tmp_path, ["--keep-scene", "5", "--enable-job-hang-detection=True", "--job-hang-interval=2"], "hang")
    job.first("py-spy dump --pid")
    [pid] = [int(p) for p in re.findall(r"worker-1 \(rank 1\)  pid (\d+)  stopped \(SIGSTOP\)", job.output)]
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state == "T"                       # still stopped: nobody sent SIGCONT yet
    assert job.wait() == 1, job.output
    assert [d["root_cause"]["rule_id"] for d in job.decisions()] == ["hang.job"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_retry_asks_the_live_workers_to_recover_in_place_and_training_goes_on(tmp_path):
    config = tmp_path / "ftwatch.yaml"
    config.write_text("rules:\n  retryable_errors: ['transient link flap']\n"
                      "mindcluster:\n  recover_strategy: retry,recover\n  retry_timeout: 20\n")
    job = run(tmp_path, ["--config", str(config)], "retry")
    assert job.wait() == 0, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["notify", "none"], job.output
    assert decisions[0]["policy_clause"].startswith("D5 MindCluster retry: 2 worker(s) recovered in place")
    out = tmp_path / "out"
    ids = {(out / f"retry-rank{r}.txt").read_text() for r in (0, 1)}
    assert len(ids) == 1
    assert [e["outcome"] for e in events(job, "retry")] == ["recovered"]
    assert "rank 1 finished at step 30" in job.output and "restarting" not in job.output


def test_recover_in_place_restarts_only_the_failed_rank(tmp_path):
    job = run(tmp_path, ["--recover-strategy", "recover-in-place", "--max-restarts", "2"], "inplace")
    assert job.wait() == 0, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["restart_in_place", "none"], job.output
    assert decisions[0]["target"]["rank"] == 1 and decisions[0]["restarts_left"] == 1
    starts = re.findall(r"rank (\d) pid (\d+) world 2 devices 0,1 start (\d) sched 1", job.output)
    assert sorted((r, s) for r, _, s in starts) == [("0", "1"), ("1", "1"), ("1", "2")], job.output
    assert len({pid for r, pid, _ in starts if r == "0"}) == 1
    assert "stopping all workers" not in job.output


MODELARTS = "modelarts:\n  annotations:\n    fault-tolerance/job-retry-num: '3'\n"


def test_modelarts_hang_without_hang_retry_notifies_once_and_the_job_runs_on(tmp_path):
    """D4 with hang-retry off: a hang is a notify decision; no worker is stopped or restarted and
    no budget is spent; the job ends by itself."""
    config = tmp_path / "ftwatch.yaml"
    config.write_text(MODELARTS)
    job = run(tmp_path, ["--config", str(config), "--enable-job-hang-detection=True", "--job-hang-interval=1"],
              "quiet")
    assert job.wait() == 0, job.output
    assert [d["action"] for d in job.decisions()] == ["notify", "none"], job.output
    assert "hang-retry is off" in job.decisions()[0]["policy_clause"]
    assert "stopping all workers" not in job.output and "restarting" not in job.output
    assert len([l for _, l in job.lines if l.endswith(" done")]) == 2, job.output


def test_c4d_warn_notifies_and_a_c4d_error_isolates_at_once_under_run(tmp_path):
    """R8 live: rank 0 prints a C4D Warn (notify: the job runs on), then an Error naming rank 1
    (c4d + hang detection on: isolate_node and restart at once, no exit needed: rank 1's device
    leaves the slots, 2:3 goes on with two)."""
    job = run(tmp_path, ["--enable-job-restart=True", "--enable-job-hang-detection=True",
                         "--enable-c4d-hang-detection=True"], "c4d", nproc="2:3")
    assert job.wait() == 0, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["notify", "isolate_node", "none"], job.output
    assert decisions[1]["target"]["node"] == "c4d-node-1"
    assert "R8 C4D Error RankCommHang on node c4d-node-1 rank 1" in decisions[1]["policy_clause"]
    assert job.first("[C4D] Warn") < job.first("[C4D] Error") < job.first("stopping all workers")


def test_modelarts_unconditional_reschedule_raises_ma_schedule_cnt(tmp_path):
    """Seed 002: a job reschedule rebuilds the job: MA_SCHEDULE_CNT + 1, MA_PROC_START_CNT back to 1."""
    config = tmp_path / "ftwatch.yaml"
    config.write_text(MODELARTS + "    fault-tolerance/job-unconditional-retry: 'true'\n")
    job = run(tmp_path, ["--config", str(config)], "once")
    assert job.wait() == 0, job.output
    assert [d["action"] for d in job.decisions()] == ["restart_job", "none"], job.output
    starts = [line for _, line in job.lines if " pid " in line and "world" in line]
    assert len(starts) == 4 and all("start 1 sched 1" in l for l in starts[:2]), job.output
    assert all("start 1 sched 2" in l for l in starts[2:]), job.output


def test_two_bad_devices_in_one_incident_are_isolated_together(tmp_path):
    """CUDA_VISIBLE_DEVICES=4,5,6,7, 2:3: the workers on devices 5 and 6 print Xid 79 in the same
    attempt; both devices leave the slots at once and the job finishes on 4,7."""
    job = run(tmp_path, ["--enable-job-restart=True"], "xid", nproc="2:3",
              CUDA_VISIBLE_DEVICES="4,5,6,7", RW_BAD_DEVICES="5,6")
    assert job.wait() == 0, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions] == ["isolate_node", "none"], job.output
    # the root cause's device comes first (policy.plan.isolation), and which of the two Xids the
    # monitor reads first is a race between the workers
    clause = decisions[0]["policy_clause"]
    assert any(f"isolated {a}, {b}; restart with 2 worker(s) on 4,7" in clause
               for a, b in [("device 5 (rank 1)", "device 6 (rank 2)"),
                            ("device 6 (rank 2)", "device 5 (rank 1)")]), clause
    assert sorted(e["device"] for e in events(job, "device_isolated")) == ["5", "6"]


def test_dump_signals_only_workers_with_an_on_dump_handler(tmp_path):
    """Rank 2 has no on_dump handler: SIGUSR1 would kill it and count it failed (2 of 3 failed >
    max_tolerated_failure_rate 0.4 → fail_job). It is left alone and stopped like any survivor, so
    the policy sees one failed instance and restarts."""
    job = run(tmp_path, ["--recover-strategy", "dump,recover", "--enable-job-restart=True",
                         "--max-num-of-job-restart=1", "--max-tolerated-failure-rate=0.4",
                         "--fault-tolerant-policy=OnFailure"], "dump", nproc=3,
              RW_NO_DUMP_RANK="2")
    assert job.wait() == 1, job.output
    decisions = job.decisions()
    assert [d["action"] for d in decisions][:1] == ["restart_job"], job.output
    assert "not asking worker-2 for last words (no on_dump handler)" in job.output
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("last-words-*")) == ["last-words-rank0.txt"]
    assert events(job, "dump")[0]["outcomes"] == {"worker-0": f"dumped {out / 'last-words-rank0.txt'}"}
