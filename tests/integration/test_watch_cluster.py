"""`ftwatch watch` on a simulated cluster: 4 nodes x 8 ranks shipped over TCP by the real
fluent-logger client, as fluent-bit's kubernetes filter would label them."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fluent import sender

JOB_LABEL = "training.kubeflow.org/job-name"
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, GPU has fallen off the bus."


def record(job: str, node: int, rank: int, log: str) -> dict:
    pod = f"{job}-worker-{rank}"
    return {"log": log, "stream": "stderr",
            "kubernetes": {"pod_name": pod, "namespace_name": "train", "host": f"node-{node}",
                           "container_name": "pytorch",
                           "labels": {JOB_LABEL: job, "training.kubeflow.org/replica-index": str(rank)}}}


class Watch:
    """A running `ftwatch watch` whose output is read line by line."""

    def __init__(self, tmp: Path, config: dict):
        path = tmp / "ftwatch.yaml"
        path.write_text(json.dumps(config))      # JSON is YAML
        self.decisions = tmp / "decisions.jsonl"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ftwatch", "watch", "--config", str(path), "--state-dir", str(tmp / "state"),
             "--decisions-file", str(self.decisions)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def wait_for(self, pattern: str, deadline: float = 30) -> re.Match:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} never appeared:\n{''.join(self.lines)}")

    def decisions_now(self) -> list[dict]:
        if not self.decisions.exists():
            return []
        return [json.loads(x) for x in self.decisions.read_text().splitlines() if x.strip()]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self.reader.join(5)
        return code


def test_xid79_on_one_node_isolates_it_and_restarts_that_job_only(tmp_path):
    """Node 2's ranks print Xid 79 -> isolate_node for that node and job; the other job is untouched;
    the exec actuator gets the decision JSON."""
    acted = tmp_path / "acted.jsonl"
    act = tmp_path / "act.py"
    act.write_text(f"import sys\nopen({str(acted)!r}, 'a').write(sys.stdin.read())\n")
    config = {
        "policy": {"enable_job_restart": True},
        "watch": {"sources": [{"type": "forward", "port": 0}], "settle": 1.0, "cooldown": 30.0,
                  "actuator": {"type": "exec", "command": [sys.executable, str(act)], "timeout": 30}},
    }
    watch = Watch(tmp_path, config)
    try:
        port = int(watch.wait_for(r"source forward started on port (\d+)").group(1))
        senders = [sender.FluentSender("kube", host="127.0.0.1", port=port, nanosecond_precision=True)
                   for _ in range(4)]
        for step in range(3):
            for job in ("llm-a", "llm-b"):
                for node in range(4):
                    for local in range(8):
                        rank = node * 8 + local
                        assert senders[node].emit("var.log.containers", record(job, node, rank,
                                                  f"[rank{rank}]: step {step} loss 0.{rank}"))
        for local in range(8):
            rank = 16 + local
            assert senders[2].emit("var.log.containers", record("llm-a", 2, rank, XID_79))
        for node in range(4):                                  # llm-b goes on training
            for local in range(8):
                senders[node].emit("var.log.containers", record("llm-b", node, node * 8 + local, "step 3 loss 0.1"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not watch.decisions_now():
            time.sleep(0.1)
        for s in senders:
            s.close()
    finally:
        code = watch.stop()
    assert code == 0, "".join(watch.lines)
    decisions = watch.decisions_now()                          # after the stop: nothing else came
    assert len(decisions) == 1, decisions
    d = decisions[0]
    assert d["action"] == "isolate_node"
    assert d["target"]["job"].endswith("llm-a") and d["target"]["node"] == "node-2"
    assert d["root_cause"]["rule_id"].startswith("xid.79")
    assert json.loads(acted.read_text())["target"]["node"] == "node-2"
