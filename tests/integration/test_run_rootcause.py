"""End to end: the root cause `ftwatch run` names when a worker reports an NCCL system error and
exits 1 (SPEC R7, D2), with tiny real workers (no torch needed).

The reported bug: rank 1 printed NCCL's "unhandled system error" and exited 1, rank 0 exited 1
without a word a moment later; the decision was fail_job with root cause exit.1 (user_code) on
rank 0, the NCCL line filed as fallout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

NCCL = ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error "
        "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
WORKER = {
    "printed": ("import os, sys, time\n"
                "if os.environ['RANK'] == '1':\n"
                f"    print('torch.distributed.DistBackendError: {NCCL}', file=sys.stderr, flush=True)\n"
                "    sys.exit(1)\n"
                "time.sleep(0.5)\n"
                "sys.exit(1)\n"),
    "raised": ("import os, time\n"
               "if os.environ['RANK'] == '1':\n"
               f"    raise RuntimeError('{NCCL}')\n"
               "time.sleep(0.5)\n"
               "raise SystemExit(1)\n"),
}


@pytest.mark.parametrize("form", sorted(WORKER))
def test_nccl_system_error_then_exit_1_is_a_retryable_root_cause(tmp_path: Path, form: str):
    decisions = tmp_path / "decisions.jsonl"
    argv = [sys.executable, "-m", "ftwatch", "run", "--nproc-per-node", "2", "--state-dir", str(tmp_path / "st"),
            "--decisions-file", str(decisions), "--grace-period", "2",
            "--enable-job-restart=True", "--max-num-of-job-restart=1",
            "--", sys.executable, "-c", WORKER[form]]
    proc = subprocess.run(argv, cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0, proc.stdout + proc.stderr           # the job failed in the end
    made = [json.loads(line) for line in decisions.read_text().splitlines()]
    assert [d["action"] for d in made] == ["restart_job", "fail_job"], proc.stdout
    for d in made:
        assert (d["root_cause"]["rule_id"], d["root_cause"]["rank"], d["root_cause"]["failure_class"]) == \
            ("nccl.unhandled_system_error", 1, "retryable_infra"), d["policy_clause"]
    assert "max_num_of_job_restart" in made[1]["policy_clause"]     # failed for the budget, not as user code
