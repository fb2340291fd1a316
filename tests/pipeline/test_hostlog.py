"""Host evidence joins the job (issue 12 item 5): a node's kernel lines, which name no job, reach the
jobs running on that node under ``watch``, the local job under ``run`` (``--kernel-log``), and the
job of a replayed ``kern.log``. FakeClock throughout; the file tails are real files."""

from __future__ import annotations

import io
import os
import queue
from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Action
from ftwatch.pipeline.build import build_policy, build_run
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.replay import origin_for, replay
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sources import build_source
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.hostlog import (HostQueue, KernelLog, is_host, is_host_file, line_device,
                                              open_kernel_log, pci_bus_id)
from ftwatch.pipeline.sources.identity import Identity
from ftwatch.pipeline.watch import Watcher
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.testing import Exit, FakeClock, FakeControl, FakeSupervisor, ListSource, Say, script_of

RULES = load_rules()
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, name=python, GPU has fallen off the bus."


# -- watch ----------------------------------------------------------------------------------------

def pod(clock, job, node, rank, text="step 10 loss 0.5", devices=None):
    """A fluent-bit record of a Kubeflow worker pod (the real Identity names it)."""
    meta = {"kubernetes": {"pod_name": f"{job}-worker-{rank}", "namespace_name": "team", "host": node,
                           "labels": {"training.kubeflow.org/job-name": job,
                                      "training.kubeflow.org/replica-index": str(rank),
                                      "training.kubeflow.org/replica-type": "worker"}},
            "stream": "stderr"}
    if devices is not None:
        meta["pci_bus_ids"] = devices
    return Shipped(clock.time(), text.encode(), meta)


def kernel(clock, node, text=XID_79, **extra):
    """A host line as fluent-bit's kmsg input ships it: a hostname, no pod, no job."""
    return Shipped(clock.time(), text.encode(), {"hostname": node, "tag": "kmsg.0", **extra})


def watcher(tmp_path, clock, identity):
    config = Config.model_validate({
        "storage": {"state_dir": str(tmp_path / "state")},
        "policy": {"enable_job_restart": True},
        "watch": {"settle": 5.0, "cooldown": 60.0},
    })
    store = SqliteStore(tmp_path / "state" / "ftwatch.db")
    recorder = Recorder(store, tmp_path / "decisions.jsonl", out=io.StringIO(), resolve_after=300.0)
    return Watcher(config, Engine(RULES), recorder, identity.resolve, clock=clock, devices=identity.devices), \
        recorder, store


def settle(w, clock):
    clock.advance(5.01)
    w.tick()


def test_a_host_xid79_isolates_the_job_on_that_node_and_leaves_the_other_job_alone(tmp_path):
    """Job A runs ranks on node-2 (and node-1), job B on node-3; a kernel Xid 79 line of node-2,
    carried by the kmsg tag only, isolates node-2 for job A with the host line as root cause."""
    clock = FakeClock()
    ident = Identity(host_tags=("kmsg*",))
    w, rec, store = watcher(tmp_path, clock, ident)
    w.ingest([pod(clock, "a", "node-1", 1), pod(clock, "a", "node-2", 2), pod(clock, "b", "node-3", 1)])
    clock.advance(1)
    w.ingest([kernel(clock, "node-2")])
    settle(w, clock)
    [d] = rec.decisions
    assert d.target.job == "team/a" and d.action is Action.ISOLATE_NODE
    assert d.target.node == "node-2" and d.root_cause.rule_id.startswith("xid.79")
    assert d.root_cause.origin.instance == "host/node-2" and d.root_cause.rank is None
    assert "isolate_node node-2" in d.policy_clause
    assert "team/b" not in {x.target.job for x in rec.decisions}
    assert "team/a" in w.jobs and not any(is_host(o) for o in w.jobs["team/a"].instances.values())


def test_a_host_line_counts_by_its_time_before_the_jobs_cuda_error(tmp_path):
    """The worker's CUDA error arrives first, the node's Xid 79 (one second older, by its own stamp)
    after it: the incident's root cause is the host line, so the node is isolated."""
    clock = FakeClock()
    ident = Identity(host_tags=("kmsg*",))
    w, rec, _ = watcher(tmp_path, clock, ident)
    w.ingest([pod(clock, "a", "node-2", 1)])
    clock.advance(2)
    w.ingest([pod(clock, "a", "node-2", 1, "RuntimeError: CUDA error: unspecified launch failure")])
    stamp = clock.time() - 1
    w.ingest([Shipped(stamp, XID_79.encode(), {"hostname": "node-2", "tag": "kmsg.0"})])
    settle(w, clock)
    [d] = rec.decisions
    assert d.action is Action.ISOLATE_NODE and d.target.node == "node-2"
    assert d.root_cause.rule_id.startswith("xid.79")


def test_a_host_line_of_a_node_with_no_job_is_stored_and_opens_nothing(tmp_path):
    clock = FakeClock()
    ident = Identity()
    w, rec, store = watcher(tmp_path, clock, ident)
    w.ingest([pod(clock, "a", "node-2", 1)])
    w.ingest([kernel(clock, "node-9", host_log="true")])       # a record_modifier's host_log field
    settle(w, clock)
    clock.advance(60)
    w.tick()
    assert rec.decisions == [] and set(w.jobs) == {"team/a"}
    stored = [f for f in store.findings_for("") if f["rule_id"].startswith("xid.79")]
    assert len(stored) == 1


def test_a_host_line_naming_a_device_joins_only_the_job_on_that_device(tmp_path):
    """Two jobs share node-2, each on its own GPU (the records' pci_bus_ids field): the Xid names
    0000:3b:00, job A's device, so only A is isolated; B, on 0000:5e:00, runs on."""
    clock = FakeClock()
    ident = Identity(host_tags=("kmsg*",))
    w, rec, _ = watcher(tmp_path, clock, ident)
    w.ingest([pod(clock, "a", "node-2", 1, devices="00000000:3B:00.0"),
              pod(clock, "b", "node-2", 1, devices=["00000000:5E:00.0"])])
    w.ingest([kernel(clock, "node-2")])
    settle(w, clock)
    assert [(d.target.job, d.action) for d in rec.decisions] == [("team/a", Action.ISOLATE_NODE)]


def test_a_host_role_source_marks_every_line_through_a_listsource(tmp_path):
    """A ``role: host`` source's lines (a kern.log tail) are host evidence: through the queue
    build_source wraps, a ListSource's kernel line isolates the job on its node."""
    clock = FakeClock()
    ident = Identity()
    w, rec, _ = watcher(tmp_path, clock, ident)
    w.ingest([pod(clock, "a", "node-2", 1)])
    plain = Shipped(clock.time(), XID_79.encode(), {"hostname": "node-2", "path": "/var/log/kern.log"})
    src = ListSource([[plain]], out=HostQueue(w.queue))
    src.start()
    src.stop()
    w.ingest(w.queue.get(timeout=5))
    settle(w, clock)
    [d] = rec.decisions
    assert d.action is Action.ISOLATE_NODE and d.target.node == "node-2"


def test_build_source_wraps_the_queue_of_a_host_role_source(tmp_path):
    from ftwatch.config.watch import FileSourceConfig
    out: queue.Queue = queue.Queue()
    src = build_source(FileSourceConfig(type="file", paths=[str(tmp_path / "kern.log")], role="host"),
                       out, tmp_path)
    assert isinstance(src._out, HostQueue)


def test_identity_names_host_lines_and_devices():
    ident = Identity(host_tags=("kmsg*",))
    host = ident.origin({"hostname": "node-2", "tag": "kmsg.0"})
    assert is_host(host) and host.node == "node-2" and host.job == "" and host.rank is None
    assert not is_host(ident.origin({"hostname": "node-2", "tag": "app"}))
    worker = ident.origin({"kubernetes": {"pod_name": "a-worker-0", "host": "n"}, "env": {"pci_bus_ids": "0000:3b:00.0"}})
    assert ident.devices[worker.key] == frozenset({"0000:3b:00"})


def test_pci_bus_ids_compare_in_one_form():
    assert pci_bus_id("00000000:3B:00.0") == pci_bus_id("0000:3b:00") == "0000:3b:00"
    assert pci_bus_id("GPU-1234") is None
    assert line_device(XID_79.encode()) == "0000:3b:00"
    assert line_device(b"NVRM: GPU at PCI:0000:3b:00: GPU-abc") is None


# -- run ------------------------------------------------------------------------------------------

class _Appending(KernelLog):
    """The real file tail, with a line appended to the file when the fake clock reaches ``at``."""

    def __init__(self, path: Path, clock: FakeClock, at: float, text: str):
        super().__init__("file", str(path))
        self.clock, self.at, self.text = clock, at, text

    def read(self) -> bytes:
        if self.text and self.clock.time() >= self.at:
            with open(self.path, "a") as fh:
                fh.write(self.text + "\n")
            self.text = ""
        return super().read()


def test_run_a_line_appended_to_the_kernel_log_isolates(tmp_path):
    """``ftwatch run --kernel-log``: an old Xid 79 already in the file is not read (tailed from its
    end); one appended 3 s into the run opens an incident and the policy isolates this node."""
    log = tmp_path / "kern.log"
    log.write_text(XID_79 + "  (old: before the run)\n")
    clock = FakeClock()
    t0 = clock.time()
    kern = _Appending(log, clock, t0 + 3, f"[ 1234.5] {XID_79}")
    kern.open()
    cfg = Config.model_validate({
        "policy": {"fault_tolerant_policy": "OnFailure", "enable_job_restart": True, "max_num_of_job_restart": 1},
        "supervisor": {"nproc_per_node": "2", "restart_delay": 0, "devices": ["0", "1"]},
        "health": {"bootcheck": False, "troubleshooting": False},
        "storage": {"state_dir": str(tmp_path)},
    })
    script = script_of({}, default=[Say(1, "step 1"), Say(10, "step 2"), Exit(11)])
    sup = FakeSupervisor(clock, script, job="job", node="gpu-7")
    recorder = Recorder(SqliteStore(tmp_path / "ftwatch.db"), out=io.StringIO())
    runner = build_run(cfg, ["train"], "job", recorder, out=io.StringIO(), clock=clock, supervisor=sup,
                       control=FakeControl(), node="gpu-7", kernel=kern)
    runner.run()
    first = recorder.decisions[0]
    assert first.action is Action.ISOLATE_NODE, first.policy_clause
    assert first.root_cause.rule_id.startswith("xid.79") and first.root_cause.origin.node == "gpu-7"
    assert first.root_cause.rank is None and first.root_cause.time >= t0 + 3
    assert kern._fd is None                      # closed when the run ended


def _run_with_kernel(tmp_path, text, nproc="1:2", bus_ids=None, at=3.0, ends=11):
    log = tmp_path / "kern.log"
    log.write_text("")
    clock = FakeClock()
    kern = _Appending(log, clock, clock.time() + at, text)
    kern.open()
    cfg = Config.model_validate({
        "policy": {"fault_tolerant_policy": "OnFailure", "enable_job_restart": True, "max_num_of_job_restart": 1},
        "supervisor": {"nproc_per_node": nproc, "restart_delay": 0, "devices": ["0", "1"]},
        "health": {"bootcheck": False, "troubleshooting": False},
        "storage": {"state_dir": str(tmp_path)},
    })
    script = script_of({}, default=[Say(1, "step 1"), Exit(ends)])
    sup = FakeSupervisor(clock, script, job="job", node="gpu-7")
    store = SqliteStore(tmp_path / "ftwatch.db")
    recorder = Recorder(store, out=io.StringIO())
    runner = build_run(cfg, ["train"], "job", recorder, out=io.StringIO(), clock=clock, supervisor=sup,
                       control=FakeControl(), node="gpu-7", kernel=kern, bus_ids=bus_ids)
    return runner.run(), recorder, sup, store


def test_run_a_kernel_line_naming_a_slot_gpu_isolates_that_device(tmp_path):
    """nvidia-smi maps 0000:3b:00 to GPU 1, the job's second slot: the host Xid 79 excludes
    device 1 (A1) and the job restarts with one worker on device 0."""
    status, recorder, sup, store = _run_with_kernel(tmp_path, XID_79, bus_ids={"0000:3b:00": ("GPU-b", "1")})
    assert status == 0
    isolate = recorder.decisions[0]
    assert isolate.action is Action.ISOLATE_NODE
    assert "A1 local: isolated device 1" in isolate.policy_clause
    resizes = [c for c in sup.calls if c[0] == "resize"]
    assert [(n, env["CUDA_VISIBLE_DEVICES"]) for _, n, env in resizes] == [(2, "0,1"), (1, "0")]


def test_run_a_kernel_line_naming_another_gpu_is_stored_and_opens_nothing(tmp_path):
    """The Xid names a GPU of this host that is not among the job's slots (another job's)."""
    status, recorder, sup, store = _run_with_kernel(tmp_path, XID_79, bus_ids={"0000:3b:00": ("GPU-f", "5")})
    assert status == 0 and [d.action for d in recorder.decisions] == [Action.NONE]
    assert [f["rule_id"] for f in store.findings_for("job") if f["rule_id"].startswith("xid")] == ["xid.79"]


def test_gpu_bus_ids_reads_nvidia_smi_and_gives_indices_only_where_cuda_means_the_same(monkeypatch):
    from ftwatch.pipeline.sources.hostlog import gpu_bus_ids
    same = "0, GPU-a, NVIDIA H100 80GB HBM3, 00000000:18:00.0\n1, GPU-b, NVIDIA H100 80GB HBM3, 00000000:3B:00.0\n"
    mixed = "0, GPU-a, NVIDIA A100, 00000000:18:00.0\n1, GPU-b, NVIDIA T4, 00000000:3B:00.0\n"
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert gpu_bus_ids(lambda argv: same)["0000:3b:00"] == ("GPU-b", "1")
    assert gpu_bus_ids(lambda argv: mixed)["0000:3b:00"] == ("GPU-b",)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert gpu_bus_ids(lambda argv: mixed)["0000:3b:00"] == ("GPU-b", "1")


def test_kernel_log_file_tail_reads_from_the_end_and_follows_truncation(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("old line\n")
    log, said = open_kernel_log(path)
    assert said == f"reading the kernel log from {path}"
    assert log.read() == b""
    with open(path, "a") as fh:
        fh.write("new one\npart")
    assert log.read() == b"new one\n"
    path.write_text("after truncation\n")
    assert log.read().endswith(b"after truncation\n")
    log.close()


def test_no_kernel_log_says_why_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(KernelLog, "open", lambda self: (_ for _ in ()).throw(PermissionError(1, "Operation not permitted")))
    monkeypatch.setattr("shutil.which", lambda name: None)
    log, said = open_kernel_log(None)
    assert log is None and "\n" not in said
    assert said.startswith("no kernel log (/dev/kmsg: Operation not permitted; no journalctl)")


def test_a_missing_kernel_log_is_an_error(tmp_path):
    import pytest
    with pytest.raises(FileNotFoundError):
        open_kernel_log(tmp_path / "nope.log")
    with pytest.raises(IsADirectoryError):
        open_kernel_log(tmp_path)


# -- replay ---------------------------------------------------------------------------------------

def test_a_replayed_kern_log_is_host_evidence_not_an_instance(tmp_path):
    """A kern.log side file goes in as host evidence: it is no instance (world size 1, the one
    rank), and its Xid 79 is the root cause of the job's isolate_node."""
    (tmp_path / "kern.log").write_text(f"2026-11-20T10:00:01 gpu-7 kernel: {XID_79}\n")
    (tmp_path / "rank0.log").write_text("2026-11-20T10:00:02 RuntimeError: CUDA error: unspecified launch failure\n")
    assert is_host_file(tmp_path / "kern.log") and is_host_file(Path("dmesg.txt"))
    assert not is_host_file(Path("rank0.log")) and not is_host_file(Path("kernel_test.py"))
    assert is_host(origin_for(tmp_path / "kern.log", "j"))
    config = Config.model_validate({"policy": {"enable_job_restart": True},
                                    "storage": {"state_dir": str(tmp_path / "state")}})
    policy = build_policy(config, "j")
    result = replay([tmp_path / "kern.log", tmp_path / "rank0.log"], Engine(RULES), policy, job="j")
    d = result.decision
    assert d.action is Action.ISOLATE_NODE and d.root_cause.rule_id.startswith("xid.79")
    assert is_host(d.root_cause.origin)


# -- the command line -----------------------------------------------------------------------------

def _ftwatch(*args: str, cwd: Path, timeout: float = 120):
    import subprocess
    import sys
    script = Path(sys.executable).with_name("ftwatch")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "ftwatch"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_cli_a_kernel_log_that_cannot_be_opened_is_one_line_and_status_2(tmp_path):
    proc = _ftwatch("run", "--state-dir", str(tmp_path / "st"), "--kernel-log", str(tmp_path / "none.log"),
                    "--", "true", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"ftwatch run: --kernel-log {tmp_path / 'none.log'}: No such file or directory"]


def test_cli_run_isolates_on_a_line_its_worker_appends_to_the_kernel_log(tmp_path):
    """A real short run: the first attempt's worker appends an Xid 79 to the kernel log and trains
    on; ftwatch reads it as host evidence, isolates this node (restart), the second attempt ends."""
    import json
    import sys
    kern = tmp_path / "kern.log"
    kern.write_text(f"{XID_79} (old)\n")
    code = ("import os, sys, time\n"
            "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
            f"    open({str(kern)!r}, 'a').write({XID_79!r} + '\\n')\n"
            "    time.sleep(30)\n")
    proc = _ftwatch("run", "--state-dir", str(tmp_path / "st"), "--kernel-log", str(kern),
                    "--decisions-file", str(tmp_path / "d.jsonl"), "--enable-job-restart=True",
                    "--max-num-of-job-restart=1", "--grace-period", "1", "--", sys.executable, "-c", code,
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ftwatch: reading the kernel log from {kern}" in proc.stdout
    decisions = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [d["action"] for d in decisions] == ["isolate_node", "none"]
    assert decisions[0]["root_cause"]["rule_id"].startswith("xid.79") and decisions[0]["root_cause"]["rank"] is None
