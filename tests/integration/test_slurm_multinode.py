"""``srun ftwatch run --actuator slurm --nnodes 2 ...`` as Slurm starts it, on localhost: two real
``ftwatch run`` agents, each with the environment srun gives its task (``SLURM_JOB_ID``,
``SLURM_NNODES``, ``SLURM_NODEID``, ``SLURM_PROCID``, ``SLURM_JOB_NODELIST``,
``SLURMD_NODENAME``) and no other multi-node flag, fake ``scontrol`` / ``scancel`` / ``sinfo`` on
PATH (tests/slurmfake.py; ``scontrol show hostnames`` names the store's host), each running the
``ftwatch run`` of the ``srun`` line in README "Slurm"'s multi-node batch script as written (this
test's own flags added after ``run``: config, state, short waits). Node 1's local rank 1 prints an
Xid 79: Slurm is told once, by the leader: one drain of node 1's Slurm name, one requeue (issue 14). The same logic under a FakeClock: tests/pipeline/test_slurm_cluster.py."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from ftwatch.config.cluster import slurm_port
from tests.slurmfake import FakeSlurm

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

ROOT = Path(__file__).resolve().parents[2]
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
# node 1's local rank 1 prints the Xid and fails; the others run on until they are stopped
WORKER = f"""
import os, sys, time
if os.environ["GROUP_RANK"] == "1" and os.environ["LOCAL_RANK"] == "1":
    time.sleep(0.5)
    print({XID!r}, flush=True)
    sys.exit(1)
for step in range(600):
    print(f"step {{step}}", flush=True)
    time.sleep(0.1)
"""


def readme_srun() -> list[str]:
    """The ``ftwatch run ...`` of the ``srun`` line in README "Slurm"'s multi-node batch script."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("\n### Slurm\n"):].split("\n## ", 1)[0]
    line = next(m.group(1) for m in re.finditer(r"^srun (?:--\S+ )*(ftwatch run .*)$", section, re.M))
    return shlex.split(line)


def free_job_id() -> str:
    """A Slurm job id whose store port (``slurm_port``) is free here."""
    for job in range(4471000, 4480000, 7):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", slurm_port(str(job))))
            except OSError:
                continue
        return str(job)
    raise AssertionError("no free port in 15000..24999")


def test_srun_on_two_nodes_drains_the_failing_node_once_and_requeues_once(tmp_path):
    fake = FakeSlurm(tmp_path / "bin")
    fake.hosts(["127.0.0.1", "127.0.0.1"])                     # SLURM_JOB_NODELIST gpu-[0-1]: node 0 first
    fake.nodes([(f"gpu-{n}", "mixed", "Unknown", "none") for n in range(4)])
    line = readme_srun()
    assert line[:2] == ["ftwatch", "run"] and line[-1] == "train.py", line
    (tmp_path / "train.py").write_text(WORKER)
    (tmp_path / "ftwatch.yaml").write_text("health:\n  bootcheck: false\n  troubleshooting: false\n")
    job = free_job_id()
    procs = []
    for n in range(2):
        env = {**os.environ, "PATH": f"{fake.dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
               "PYTHONUNBUFFERED": "1", "SLURM_JOB_ID": job, "SLURM_NNODES": "2", "SLURM_NODEID": str(n),
               "SLURM_PROCID": str(n), "SLURM_JOB_NODELIST": "gpu-[0-1]", "SLURMD_NODENAME": f"gpu-{n}"}
        argv = [sys.executable, "-m", "ftwatch", "run",
                # this test's own: its config, state and kernel log per node, short waits
                "--config", "ftwatch.yaml", "--state-dir", f"state{n}", "--kernel-log", os.devnull,
                "--grace-period", "2", "--rdzv-conf", "heartbeat=0.5,node_timeout=3,last_call_timeout=1",
                *[arg.replace("$SLURM_NNODES", env["SLURM_NNODES"]) for arg in line[2:]]]
        out = open(tmp_path / f"out{n}", "wb")
        procs.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT))
        out.close()
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=60))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    outs = [(tmp_path / f"out{n}").read_text(errors="replace") for n in range(2)]
    said = "\n=====\n".join(outs)
    assert codes == [0, 1], said          # node 0 ends with the requeue; node 1, excluded, with 1
    writes = fake.writes()
    assert [w[:4] for w in writes] == [["scontrol", "update", "NodeName=gpu-1", "State=DRAIN"],
                                       ["scontrol", "requeue", job]], said
    assert writes[0][4].startswith("Reason=ftwatch ") and writes[0][4].endswith(f": xid.79: {XID}")
    assert all(f"store 127.0.0.1:{slurm_port(job)} (run id slurm-{job})" in out for out in outs), said
    assert "REQUEUED (exit 0)" in outs[0]
    acting = [n for n in range(2) if "carries out decision 0 through the scheduler (node gpu-1)" in outs[n]]
    assert len(acting) == 1 and f"slurm scontrol requeue {job} (requeue the job): ok" in outs[acting[0]]
    other = 1 - acting[0]                 # the other node ends by the outcome the leader published
    assert f"decision 0 carried out through the scheduler by node {acting[0]}: done" in outs[other], said
