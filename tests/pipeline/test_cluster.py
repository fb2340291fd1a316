"""Multi-node ``ftwatch run`` (``ftwatch.pipeline.cluster``) without processes: torchrun's flags,
the rendezvous, the election and the leader's one decision, over an in-memory store with a
FakeClock. The real agents, workers and TCPStore: tests/integration/test_multinode.py."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import msgpack
import pytest

from ftwatch.cli.run import add_cluster_flags, cluster_from_args, torchrun_argv
from ftwatch.config.cluster import ClusterConfig, cluster_from_flags, split_endpoint
from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Origin, Severity
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.cluster.leader import NODE_LOST, Beats, Leader, job_decision, lead
from ftwatch.pipeline.cluster.rendezvous import Rendezvous, World
from ftwatch.pipeline.cluster.store import KV
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.alerting.spool import finding_to_dict
from ftwatch.testing import CaptureSink, FakeClock, finding

JOB = "mn-test"


class MemoryStore:
    """The c10d Store calls the agents make, in a dict (TCPStore's semantics)."""

    def __init__(self):
        self.data: dict[str, bytes] = {}

    def set(self, key, value):
        self.data[key] = value if isinstance(value, bytes) else value.encode()

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(k in self.data for k in keys)

    def add(self, key, amount):
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def compare_set(self, key, expected, desired):
        current = self.data.get(key)
        if (current is None and expected == "") or (current is not None and current == expected.encode()):
            self.data[key] = desired.encode()
        return self.data.get(key, expected.encode())


def cfg(**kw) -> ClusterConfig:
    return ClusterConfig(**{"nnodes": "2:3", "last_call": 5.0, "settle": 1.0, "lost_after": 3.0, **kw})


# -- torchrun's flags ---------------------------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int)
    add_cluster_flags(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("argv", [
    ["--nnodes", "2:3", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501"],
    ["--nnodes=2:3", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29501"],
])
def test_torchrun_static_flags_in_both_spellings(argv):
    c = cluster_from_args(parse(argv))
    assert (c.min_nodes, c.max_nodes, c.node_rank) == (2, 3, 1)
    assert (c.endpoint_host, c.endpoint_port, c.hosts_store) == ("10.0.0.1", 29501, False)


def test_c10d_endpoint_id_and_conf():
    c = cluster_from_args(parse(["--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "node0:29400",
                                 "--rdzv_id", "job42", "--rdzv-conf", "last_call_timeout=2,node_timeout=7"]))
    assert (c.endpoint_host, c.endpoint_port, c.run_id, c.node_rank) == ("node0", 29400, "job42", None)
    assert (c.last_call, c.lost_after) == (2.0, 7.0)


def test_one_node_or_standalone_is_the_local_run_and_bad_values_name_their_flag():
    assert cluster_from_args(parse(["--standalone"])) is None
    assert cluster_from_args(parse([])) is None
    with pytest.raises(ValueError, match="--rdzv-backend=etcd"):
        cluster_from_args(parse(["--nnodes", "2", "--rdzv-backend", "etcd"]))
    with pytest.raises(ValueError, match="--nnodes=3:2"):
        cluster_from_flags(nnodes="3:2", node_rank=None, master_addr=None, master_port=None,
                           rdzv_endpoint=None, rdzv_id=None, rdzv_backend=None, standalone=False)
    assert split_endpoint("[::1]:5") == ("::1", 5) and split_endpoint("h") == ("h", 29500)


def test_torchrun_form_script_and_args_become_the_command():
    argv, torchrun = torchrun_argv(["--nnodes", "2", "--standalone", "--max_restarts=3", "train.py", "--lr", "1"])
    assert torchrun and argv == ["--nnodes", "2", "--standalone", "--max_restarts=3", "--", "train.py", "--lr", "1"]
    assert torchrun_argv(["--nnodes", "2", "--", "python", "t.py"]) == (["--nnodes", "2", "--", "python", "t.py"],
                                                                        False)


# -- the world and the workers' environment ----------------------------------------------------------------

def test_world_layout_gives_global_ranks_in_group_rank_order():
    w = World(1, (2, 0), {0: 2, 2: 3}, "10.0.0.3", 40000)
    assert w.size == 5 and w.group_rank(0) == 1 and w.rank_offset(0) == 3 and w.rank_offset(2) == 0
    assert World.from_msg(msgpack.unpackb(msgpack.packb(w.to_msg()))) == w


def test_placed_supervisor_gives_workers_torchrun_environment():
    from ftwatch.pipeline.sources.supervisor import Output, Supervisor
    code = ("import os; print(' '.join(os.environ[k] for k in ('RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE',"
            "'GROUP_RANK','GROUP_WORLD_SIZE','ROLE_RANK','MASTER_ADDR','MASTER_PORT','TORCHELASTIC_RUN_ID')))")
    with Supervisor([sys.executable, "-c", code], 2, job=JOB) as sup:
        sup.place(group_rank=1, group_world_size=2, rank_offset=2, world_size=4, master_addr="127.0.0.2",
                  master_port=40001)
        sup.start_all(restart_count=0)
        lines: list[str] = []
        origins = set()
        while sup.running() or len(lines) < 2:
            for item in sup.poll(1.0):
                if isinstance(item, Output):
                    lines.append(item.data.decode().strip())
                    origins.add((item.origin.instance, item.origin.rank))
    assert sorted(lines) == [f"2 0 4 2 1 2 2 127.0.0.2 40001 {JOB}", f"3 1 4 2 1 2 3 127.0.0.2 40001 {JOB}"]
    assert origins == {("worker-0", 2), ("worker-1", 3)}     # the global rank; the local instance


# -- rendezvous ---------------------------------------------------------------------------------------

def test_first_generation_closes_at_max_or_at_min_after_last_call():
    kv, clock = KV(MemoryStore(), "r"), FakeClock()
    r = Rendezvous(kv, cfg())
    r.arrive(0, 0, "127.0.0.1", 2)
    assert r.close(0, clock.mono(), None, lambda n: True) is None        # below MIN
    r.arrive(0, 1, "127.0.0.1", 2)
    assert r.close(0, clock.mono(), None, lambda n: True) is None        # MIN: last call runs
    clock.advance(5.0)
    w = r.close(0, clock.mono(), None, lambda n: True)
    assert w.nodes == (0, 1) and w.size == 4 and r.world(0) == w
    r.arrive(0, 2, "127.0.0.1", 2)                                      # too late: not in the world
    assert r.world(0).nodes == (0, 1)
    for n in (0, 1, 2):
        r.arrive(1, n, "127.0.0.1", 2)
    assert r.close(1, clock.mono(), [0, 1, 2], lambda n: True).nodes == (0, 1, 2)


def test_later_generation_waits_for_the_kept_nodes_unless_lost_and_fails_below_min():
    kv, clock = KV(MemoryStore(), "r"), FakeClock()
    r = Rendezvous(kv, cfg())
    r.arrive(3, 1, "127.0.0.1", 2)
    assert r.close(3, clock.mono(), [0, 1], lambda n: True) is None      # node 0 alive: wait for it
    w = r.close(3, clock.mono(), [0, 1], lambda n: n != 0)               # node 0 lost
    assert w.nodes == () and "fewer than the 2" in w.reason


def test_dynamic_node_ids_by_arrival():
    r = Rendezvous(KV(MemoryStore(), "r"), cfg())
    assert [r.node_id(None), r.node_id(None), r.node_id(5)] == [0, 1, 5]


# -- election ------------------------------------------------------------------------------------------

def test_first_agent_leads_and_another_takes_over_when_its_heartbeat_stands_still():
    kv, clock = KV(MemoryStore(), "r"), FakeClock()
    beats = Beats(kv, lost_after=3.0)
    assert lead(kv, "0:a", Beats(kv, 3.0), clock.mono())
    assert not lead(kv, "1:b", beats, clock.mono())
    for _ in range(4):                                 # node 0 beats: it keeps the lead
        kv.count("hb/0")
        clock.advance(1.0)
        assert not lead(kv, "1:b", beats, clock.mono())
    clock.advance(3.5)                                 # silent for longer than lost_after
    assert lead(kv, "1:b", beats, clock.mono()) and kv.text("leader") == "1:b"
    assert not lead(kv, "2:c", Beats(kv, 3.0), clock.mono())      # a fresh observer gives node 1 its time


# -- the leader's decision ----------------------------------------------------------------------------------

def job_desk(tmp_path):
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}}).with_policy(enable_job_restart=True)
    recorder = Recorder(CaptureSink(), out=io.StringIO(), resolve_after=None)
    return IncidentDesk(JOB, build_engine(config), build_policy(config, JOB), recorder, exits=True)


def report(kv, gen, node, *findings, failed=()):
    k = kv.count(f"reports/{gen}/{node}")
    kv.put(f"report/{gen}/{node}/{k}", {"findings": [finding_to_dict(f) for f in findings], "failed": list(failed)})


def sigkill(rank: int, node: str):
    return finding("exit.sigkill", kind="exit_code", failure_class=FailureClass.RETRYABLE_INFRA,
                   action=Action.RESTART_JOB, severity=Severity.CRITICAL, rank=rank,
                   line=f"worker-{rank} (rank {rank}) was killed by signal 9 (SIGKILL)")


def setup_leader(tmp_path, **kw):
    kv, clock = KV(MemoryStore(), "r"), FakeClock()
    world = World(0, (0, 1, 2), {0: 2, 1: 2, 2: 2}, "127.0.0.1", 40000)
    says: list[str] = []
    leader = Leader(kv, cfg(**kw), job_desk(tmp_path), "0:a", JOB, says.append)
    beats = Beats(kv, 3.0)
    return kv, clock, world, leader, beats, says


def beat_all(kv, nodes=(0, 1, 2)):
    for n in nodes:
        kv.count(f"hb/{n}")


def test_reports_of_two_nodes_make_one_decision_for_every_node(tmp_path):
    kv, clock, world, leader, beats, _ = setup_leader(tmp_path)
    beat_all(kv)
    report(kv, 0, 1, sigkill(3, "b"), failed=["worker-3"])
    assert leader.tend(world, beats, clock.time(), clock.mono()) is None      # settling
    clock.advance(0.5)
    beat_all(kv)
    report(kv, 0, 2, finding("python.exception.RuntimeError", rank=0,
                             line="RuntimeError: Connection closed by peer"))
    assert leader.tend(world, beats, clock.time(), clock.mono()) is None
    clock.advance(0.6)
    beat_all(kv)
    record = leader.tend(world, beats, clock.time(), clock.mono())
    decision = job_decision(record)
    assert record["kind"] == "restart" and record["next"] == [0, 1, 2] and decision.action is Action.RESTART_JOB
    assert decision.root_cause.rule_id == "exit.sigkill" and decision.root_cause.rank == 3
    assert decision.root_cause.origin.instance == "node1/worker-3"
    assert kv.read("decision/0") == record and kv.read("gen") == 1
    clock.advance(2.0)
    report(kv, 0, 0, sigkill(0, "a"))                  # fallout after the decision: nothing more
    assert leader.tend(world, beats, clock.time(), clock.mono()) is None


def test_a_node_whose_heartbeat_stops_is_lost_and_left_out_within_min_max(tmp_path):
    kv, clock, world, leader, beats, says = setup_leader(tmp_path)
    for _ in range(4):
        beat_all(kv, (0, 1))                           # node 2 beats no more
        assert leader.tend(world, beats, clock.time(), clock.mono()) is None
        clock.advance(1.0)
    record = leader.tend(world, beats, clock.time(), clock.mono())
    decision = job_decision(record)
    assert decision.root_cause.rule_id == NODE_LOST and decision.root_cause.fields["node_rank"] == 2
    assert record["kind"] == "exclude" and record["next"] == [0, 1] and record["lost"] == [2]
    assert any("node 2 (?) lost" in s for s in says)


def test_losing_more_nodes_than_min_allows_fails_the_job(tmp_path):
    kv, clock, world, leader, beats, _ = setup_leader(tmp_path, nnodes="3")
    leader.tend(world, beats, clock.time(), clock.mono())
    clock.advance(4.0)
    beat_all(kv, (0, 1))
    record = leader.tend(world, beats, clock.time(), clock.mono())
    assert record["kind"] == "fail" and job_decision(record).action is Action.FAIL_JOB
    assert "fewer than --nnodes=3 allows" in job_decision(record).policy_clause


def test_a_generation_is_decided_once_even_by_two_leaders(tmp_path):
    kv, clock, world, leader, beats, _ = setup_leader(tmp_path)
    other = Leader(kv, cfg(), job_desk(tmp_path / "b"), "1:b", JOB, lambda s: None)
    beat_all(kv)
    report(kv, 0, 1, sigkill(1, "b"))
    clock.advance(0.0)
    leader.tend(world, beats, clock.time(), clock.mono())
    other.tend(world, Beats(kv, 3.0), clock.time(), clock.mono())
    clock.advance(1.5)
    beat_all(kv)
    kv.claim("decided/0", "1:b")                        # the other one got there first
    assert leader.tend(world, beats, clock.time(), clock.mono()) is None and not kv.has("decision/0")


def test_forget_incident_closes_the_desk_incident_decided_elsewhere(tmp_path):
    d = job_desk(tmp_path)
    d.new_attempt(0.0, world_size=2)
    assert d.add([sigkill(1, "b")], 0.0) is not None and d.open is not None
    d.forget_incident(0.0, Action.RESTART_JOB)
    assert d.open is None and d.tick(10.0, 10.0) is None


def test_without_torch_the_store_says_how_to_install_it(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name.startswith("torch"):
            raise ImportError("No module named 'torch'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    from ftwatch.pipeline.cluster.store import open_store
    with pytest.raises(RuntimeError, match=r"pip install 'ftwatch\[torch\]'"):
        open_store("127.0.0.1", 1, 1.0)


def test_a_node_that_is_done_is_not_waited_for_and_gives_up_the_lead():
    kv, clock = KV(MemoryStore(), "r"), FakeClock()
    r = Rendezvous(kv, cfg())
    beats = Beats(kv, 3.0)
    assert lead(kv, "0:a", beats, clock.mono())
    kv.put("done/0", 0)                                 # node 0 finished: its agent ended
    assert lead(kv, "1:b", beats, clock.mono())
    for n in (1, 2):
        r.arrive(1, n, "127.0.0.1", 2)
    assert r.close(1, clock.mono(), [0, 1, 2], lambda n: beats.alive(n, clock.mono())).nodes == (1, 2)


# -- two agents' run-loop hooks, one thread, a FakeClock -----------------------------------------------------

class FakeRunner:
    """What an agent uses of the run loop: supervisor.place, nproc, desk, budgets, policy, recorder."""

    def __init__(self, tmp_path):
        import threading
        from types import SimpleNamespace
        self.desk = job_desk(tmp_path)
        self.desk.new_attempt(0.0, world_size=2)
        self.policy, self.budgets, self.recorder = self.desk.policy, self.desk.policy.budgets, self.desk.recorder
        self.nproc = 2
        self.placed: dict = {}
        self.supervisor = SimpleNamespace(place=lambda **kw: self.placed.update(kw))
        self.act = SimpleNamespace(stop_requested=threading.Event())


def test_two_agents_join_one_reports_and_both_carry_out_the_leaders_decision(tmp_path):
    from ftwatch.pipeline.cluster.agent import ClusterAgent
    store, clock = MemoryStore(), FakeClock()
    config = cfg(nnodes="2", heartbeat=1.0)
    agents, polled = {}, []

    def wait(seconds):                    # while one agent waits, time passes and the other works
        clock.advance(seconds)
        for a in agents.values():
            a.beat()
        polled.append(agents[0].poll())   # node 0's run loop: leader duty, then the job's decision

    for n in (0, 1):
        agents[n] = ClusterAgent(config, KV(store, "j"), None, n, host=f"h{n}", addr="127.0.0.1", job=JOB,
                                 clock=clock, say=lambda s: None, wait=wait)
        runner = FakeRunner(tmp_path / f"n{n}")
        agents[n].bind(runner, lambda: job_desk(tmp_path / "leader"))
    agents[1].rdzv.arrive(0, 1, "127.0.0.1", 2)
    assert agents[0].join(0) is None and agents[1].join(0) is None
    r0, r1 = agents[0].runner, agents[1].runner
    assert (r0.placed["group_rank"], r1.placed["group_rank"], r1.placed["rank_offset"], r1.placed["world_size"]) \
        == (0, 1, 2, 4)
    assert r0.placed["master_port"] == r1.placed["master_port"] != 0
    decision, plan = agents[1].decide(sigkill(3, "h1"))
    assert decision.action is Action.RESTART_JOB and plan.kind == "job" and decision.root_cause.rank == 3
    assert r1.budgets.attempt == 1                       # TORCHELASTIC_RESTART_COUNT of the next start
    polled.append(agents[0].poll())
    seen = [d for d in polled if d is not None]          # node 0 takes up the same decision, once
    assert len(seen) == 1 and seen[0].time == decision.time and r0.budgets.attempt == 1
    agents[1].rdzv.arrive(1, 1, "127.0.0.1", 2)
    assert agents[0].join(1) is None and agents[0].world.gen == 1 and agents[0].world.nodes == (0, 1)
