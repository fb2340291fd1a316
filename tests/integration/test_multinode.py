"""Multi-node ``ftwatch run`` with real parts on localhost (``pytest -m multinode``): each node an
``ftwatch run`` agent process with its own gloo workers (examples/train_ddp.py, an all-reduce
every step), the agents meeting at a real c10d TCPStore (issue 14 item 4).

(a) one node's rank is killed -> one decision, every node restarts, the job finishes;
(b) the leading node's agent is killed (kill -9) -> node lost, another agent leads, the job goes on
    without it within MIN:MAX and finishes;
(c) one node straggles in the node check -> it is named and leaves, the others run the job.

Time reaches the agents as real time here (heartbeats every 0.5 s, a node lost after 3 s); the
same logic under a FakeClock: tests/pipeline/test_cluster.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from ftwatch.pipeline.cluster.rendezvous import free_port

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train_ddp.py"
FAST = "heartbeat=0.5,node_timeout=3,last_call_timeout=1"


def start_nodes(tmp_path: Path, count: int, nnodes: str, *, nproc: int = 2, steps: int = 10, extra=(), env=None):
    """``count`` agents of one job; returns their processes (stdout+stderr to ``out<N>``)."""
    port = free_port("127.0.0.1")
    config = tmp_path / "ftwatch.yaml"
    config.write_text("health:\n  bootcheck: false\n  troubleshooting: false\n")
    procs = []
    for n in range(count):
        cmd = [sys.executable, "-m", "ftwatch", "run", "--config", str(config), "--nnodes", nnodes,
               "--nproc-per-node", str(nproc), "--node_rank", str(n), "--master_addr", "127.0.0.1",
               "--master-port", str(port), "--max_restarts", "2", "--rdzv-conf", FAST,
               "--state-dir", str(tmp_path / f"state{n}"), "--decisions-file", str(tmp_path / f"decisions{n}"),
               "--kernel-log", os.devnull, *extra,
               str(TRAIN), "--steps", str(steps), "--step-time", "0.1", "--timeout", "20",
               "--checkpoint-dir", str(tmp_path / "ckpt")]
        out = open(tmp_path / f"out{n}", "wb")
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                      env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}))
        out.close()
    return procs


def finish(procs, timeout: float = 150.0) -> list[int | None]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def output(tmp_path: Path, n: int) -> str:
    return (tmp_path / f"out{n}").read_text(errors="replace")


def decisions(tmp_path: Path, n: int) -> list[dict]:
    path = tmp_path / f"decisions{n}"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(tmp_path: Path, nodes, text: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(text in output(tmp_path, n) for n in nodes):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not seen in every node's output:\n" + "\n".join(output(tmp_path, n) for n in nodes))


def test_a_killed_rank_on_one_node_restarts_every_node_once_and_the_job_finishes(tmp_path):
    procs = start_nodes(tmp_path, 2, "2", env={"FTWATCH_INJECT_FAULT": "sigkill", "FTWATCH_INJECT_RANK": "3",
                                               "FTWATCH_INJECT_STEP": "4"})
    codes = finish(procs)
    outs = [output(tmp_path, n) for n in range(2)]
    assert codes == [0, 0], "\n=====\n".join(outs)
    decided = [decisions(tmp_path, n) for n in range(2)]
    acted = [[d for d in ds if d["action"] != "none"] for ds in decided]
    assert [len(a) for a in acted] == [1, 1]                  # one decision, carried out on both nodes
    assert acted[0][0] == acted[1][0]                          # the same decision (time, target, root cause)
    assert acted[0][0]["action"] == "restart_job" and acted[0][0]["root_cause"]["rule_id"] == "exit.sigkill"
    assert acted[0][0]["root_cause"]["rank"] == 3              # node 1's local rank 1: global rank 3
    for out in outs:
        assert "generation 1: nodes [0, 1]" in out and "training finished at step 10" in outs[0] + outs[1]
    assert sum("decision 0: restart_job -> restart" in out for out in outs) == 1     # by the leader only


def test_the_leaders_agent_killed_is_a_lost_node_another_leads_and_the_job_finishes_without_it(tmp_path):
    procs = start_nodes(tmp_path, 3, "2:3", steps=30)
    wait_for(tmp_path, range(3), "generation 0: nodes [0, 1, 2]")
    wait_for(tmp_path, [0], "step 3/")
    leader = next(n for n in range(3) if "leads the job" in output(tmp_path, n))
    procs[leader].send_signal(signal.SIGKILL)
    rest = [n for n in range(3) if n != leader]
    codes = finish([procs[n] for n in rest])
    outs = {n: output(tmp_path, n) for n in rest}
    assert codes == [0, 0], "\n=====\n".join(outs.values())
    new = [n for n in rest if "leads the job" in outs[n]]
    assert len(new) == 1 and f"node {leader} (" in outs[new[0]] and "lost" in outs[new[0]]
    for n in rest:
        acted = [d for d in decisions(tmp_path, n) if d["action"] != "none"]
        assert len(acted) == 1 and acted[0]["root_cause"]["rule_id"] == "cluster.node_lost", acted
        assert f"generation 1: nodes {rest}" in outs[n]
        assert "training finished at step 30" in outs[rest[0]] + outs[rest[1]]


def test_a_straggling_node_is_named_by_the_node_check_and_leaves_within_min_max(tmp_path):
    procs = start_nodes(tmp_path, 3, "2:3", nproc=1, steps=5, extra=["--network-check", "--exclude-straggler"],
                        env={"FTWATCH_HEALTH_SLOW": "2:1.5"})
    codes = finish(procs)
    outs = [output(tmp_path, n) for n in range(3)]
    assert codes == [0, 0, 1], "\n=====\n".join(outs)
    assert "node 2 left out of generation 0: The node is a straggler and exits." in outs[2]
    # the node that ran the check led the job then; it may be node 2 itself, which then leaves,
    # and another node takes the lead (also "leads the job"), so look at every leader's output
    leads = [o for o in outs if "leads the job" in o]
    assert any("Node Check round 2" in o and "Node Check node 2: straggler" in o for o in leads), \
        "\n=====\n".join(outs)
    for out in outs[:2]:
        assert "generation 0: nodes [0, 1]" in out


# -- README "Multi-node jobs": its command lines, as written, two nodes on localhost ----------------

def readme_blocks() -> list[list[str]]:
    """The fenced blocks of README "Multi-node jobs" (up to its next ``###``/``##``), their lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Multi-node jobs\n", 1)[1]
    text = text.split("\n## ", 1)[0].split("\n### ", 1)[0]
    return [[line for line in block.splitlines()[1:] if line.strip()] for block in text.split("```")[1::2]]


@pytest.mark.parametrize("block", [0, 1, 2], ids=["torchrun", "ftwatch-static", "ftwatch-c10d-elastic"])
def test_readme_multinode_commands_work_as_written(tmp_path, block):
    """Each block launches one two-node job: a line per node, or the same line on both. On one
    machine each node gets its own directory (its own ./checkpoints and state, as two machines
    have) and the fixed ports become free ones; ``$NODE0`` is 127.0.0.1."""
    lines = readme_blocks()[block]
    assert len(readme_blocks()) == 3 and all(line.split()[0] in ("torchrun", "ftwatch") for line in lines)
    lines = lines if len(lines) == 2 else lines * 2
    ports = {p: str(free_port("127.0.0.1")) for p in ("29500", "29400")}
    procs = []
    for n, line in enumerate(lines):
        for fixed, free in ports.items():
            line = line.replace(fixed, free)
        line = line.replace("examples/train_ddp.py", str(TRAIN))
        line = line.replace("torchrun ", f"{sys.executable} -m torch.distributed.run ", 1)
        line = line.replace("ftwatch ", f"{sys.executable} -m ftwatch ", 1)
        where = tmp_path / f"node{n}"
        where.mkdir()
        out = open(tmp_path / f"out{n}", "wb")
        procs.append(subprocess.Popen(line, shell=True, stdout=out, stderr=subprocess.STDOUT, cwd=where,
                                      env={**os.environ, "PYTHONPATH": str(ROOT), "NODE0": "127.0.0.1"}))
        out.close()
    codes = finish(procs)
    outs = [output(tmp_path, n) for n in range(2)]
    assert codes == [0, 0], "\n=====\n".join(outs)
    assert "training finished at step 20" in outs[0] + outs[1]
    if block:
        assert all("generation 0: nodes [0, 1]" in out for out in outs)
