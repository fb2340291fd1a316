"""End to end (issue 17 item 5): `ftwatch run` with three real gloo workers (torch, CPU; or one
torchrun worker that starts them and prints its failure summary). One worker leaves: the test sends it SIGTERM, SIGINT or SIGHUP from outside, or it exits 0 by itself; the
other two then fail on the lost peer (gloo "Connection closed by peer" / "Connection reset by
peer", exit 1). The decision names the worker that left as the root cause, never a survivor's
fallout nor the KeyboardInterrupt a SIGINT provokes, and asks for a restart (exit_codes.tsv: 143,
130 and 129 are retryable; an early exit 0 is R5's exit hang)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

WORKER = """\
import datetime, os, sys, time
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.ones(4)
for step in range(1, 10**9):
    dist.all_reduce(t)
    if step == 20:
        print(f"rank {rank} ready", flush=True)
        open(os.path.join(os.environ["PIDDIR"], str(rank)), "w").write(str(os.getpid()))
    if rank == 1 and os.environ.get("LEAVE") == "exit0" and step == 40:
        print("rank 1 done", flush=True)
        os._exit(0)     # status 0 at once (sys.exit may end in SIGABRT: gloo's thread is still joinable)
    time.sleep(0.02)
"""

CASES = {"sigterm": (signal.SIGTERM, "exit.sigterm", "retryable_infra"),
         "sigint": (signal.SIGINT, "exit.sigint", "retryable_infra"),
         "sighup": (signal.SIGHUP, "exit.sighup", "retryable_infra"),
         "exit0": (None, "exit.left_first", "hang"),
         # ftwatch's one worker is torchrun, which prints its failure summary and exits 1
         "torchrun-sigterm": (signal.SIGTERM, "exit.sigterm", "retryable_infra")}


@pytest.mark.parametrize("leave", sorted(CASES))
def test_the_worker_that_left_first_is_the_root_cause(tmp_path: Path, leave: str):
    sig, rule_id, failure_class = CASES[leave]
    (tmp_path / "worker.py").write_text(WORKER)
    pids = tmp_path / "pids"
    pids.mkdir()
    decisions = tmp_path / "decisions.jsonl"
    workers = [sys.executable, str(tmp_path / "worker.py")]
    nproc = "3"
    if leave.startswith("torchrun"):
        workers, nproc = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3"] + workers[1:], "1"
    argv = [sys.executable, "-m", "ftwatch", "run", "--nproc-per-node", nproc, "--state-dir", str(tmp_path / "st"),
            "--decisions-file", str(decisions), "--grace-period", "2",
            "--enable-job-restart=True", "--max-num-of-job-restart=0", "--", *workers]
    env = dict(os.environ, PIDDIR=str(pids), LEAVE=leave)
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if sig is not None:
            deadline = time.monotonic() + 120
            while not (pids / "1").exists():           # rank 1 has run 20 all-reduces with its peers
                assert proc.poll() is None and time.monotonic() < deadline, "the workers never got going"
                time.sleep(0.2)
            os.kill(int((pids / "1").read_text()), sig)   # from outside, to that worker only
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out                  # no restart budget: the job fails in the end
    made = [json.loads(line) for line in decisions.read_text().splitlines()]
    assert len(made) == 1, out
    d = made[0]
    assert (d["root_cause"]["rule_id"], d["root_cause"]["rank"], d["root_cause"]["failure_class"]) == \
        (rule_id, 1, failure_class), out
    assert "→ restart; D3 max_num_of_job_restart" in d["policy_clause"], d["policy_clause"]   # retryable
    if not leave.startswith("torchrun"):
        # the peers lost it; torchrun's agent may stop them (SIGTERM) before they notice
        assert "Connection" in out
    assert ("worker-0 (rank 1)" if leave.startswith("torchrun") else "worker-1 (rank 1)") in out   # named
