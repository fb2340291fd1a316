"""``srun ftwatch run --actuator slurm`` on several nodes without processes: the leader tells Slurm
once per decision (``ftwatch.pipeline.cluster.handover``), draining the node the decision blames
by its Slurm name; a next leader skips what a dead one did; the flags a Slurm step's environment
gives (``config.cluster.slurm_flags``). Two agents over an in-memory store with a FakeClock; the
real agents with fake Slurm commands: tests/integration/test_slurm_multinode.py."""

from __future__ import annotations

import pytest

from ftwatch.config.cluster import slurm_flags, slurm_port
from ftwatch.config.slurm import SlurmConfig
from ftwatch.events import Action, FailureClass, Severity
from ftwatch.pipeline.actuators.slurm import SlurmActuator
from ftwatch.pipeline.cluster.agent import ClusterAgent
from ftwatch.pipeline.cluster.handover import JobHandOver
from ftwatch.pipeline.cluster.store import KV
from ftwatch.testing import FakeClock, finding
from tests.pipeline.test_cluster import JOB, FakeRunner, MemoryStore, cfg, job_desk, parse

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
SINFO = "".join(f"gpu-{c}|mixed|Unknown|none\n" for c in "abcd")


class Died(BaseException):
    """The leader's process ends in the middle of a command (kill -9)."""


class FakeCommands:
    """Slurm's commands for every agent: what they were asked, in order (sinfo answers SINFO)."""

    def __init__(self):
        self.calls: list[tuple[str, ...]] = []
        self.die_on: str | None = None     # the leader dies when asked this (not run)

    def runner(self, argv, timeout):
        if self.die_on is not None and self.die_on in argv:
            raise Died()
        self.calls.append(tuple(argv))
        return 0, SINFO if argv[0] == "sinfo" else ""

    def writes(self):
        return [c[:3] for c in self.calls if c[0] != "sinfo"]


def two_agents(tmp_path, commands: FakeCommands, beating: set[int]):
    """Two agents of one job, joined to generation 0, each with its hand-over to Slurm (node 0:
    gpu-a, node 1: gpu-b). While one waits, time passes and the beating ones beat."""
    store, clock = MemoryStore(), FakeClock()
    config = cfg(nnodes="2", heartbeat=1.0)
    agents: dict[int, ClusterAgent] = {}
    others: list = []                      # what runs while an agent waits (the other node's loop)

    def wait(seconds):
        clock.advance(seconds)
        for n in beating:
            agents[n].beat()
        for step in list(others):
            step()

    for n in (0, 1):
        agents[n] = ClusterAgent(config, KV(store, "j"), None, n, host="localhost", addr="127.0.0.1", job=JOB,
                                 clock=clock, say=lambda s: None, wait=wait)
        agents[n].bind(FakeRunner(tmp_path / f"n{n}"), lambda: job_desk(tmp_path / "leader"))
    hands = {n: JobHandOver(agents[n], SlurmActuator(SlurmConfig(retries=0), job_id="77", node=f"gpu-{'ab'[n]}",
                                                     clock=clock, runner=commands.runner, sleep=lambda s: None))
             for n in (0, 1)}                  # built with the run loop (build_run), before the first join
    agents[1].rdzv.arrive(0, 1, "127.0.0.1", 2)
    assert agents[0].join(0) is None and agents[1].join(0) is None
    return agents, hands, others, clock


def xid(rank: int):
    return finding("xid.79", line=XID, rank=rank, action=Action.ISOLATE_NODE, kind="keyword",
                   failure_class=FailureClass.HARDWARE_NODE, severity=Severity.CRITICAL, node="localhost")


def test_two_agents_one_decision_one_drain_of_the_failing_node_and_one_requeue(tmp_path):
    commands = FakeCommands()
    agents, hands, others, _ = two_agents(tmp_path, commands, beating={0, 1})
    polled: list = []
    others.append(lambda: polled.append(agents[0].poll()))        # node 0's run loop: leader, then the decision
    mine, _plan = agents[1].decide(xid(3))                          # node 1's rank 3 printed the Xid
    assert agents[0].leader is not None and agents[1].leader is None
    assert mine.action is Action.FAIL_JOB                           # node 1 leaves the job ...
    theirs = next(d for d in polled if d is not None)
    assert theirs.action is Action.ISOLATE_NODE and agents[0].carrying["blamed"] == 1   # ... node 0 goes on
    others.clear()
    results: dict = {}
    others.append(lambda: results.setdefault(0, hands[0].act(theirs)))   # node 0 reaches its hand-over meanwhile
    results[1] = hands[1].act(mine)                                 # node 1 waits for the leader's act
    assert results[0].status == results[1].status == "done"
    assert commands.writes() == [("scontrol", "update", "NodeName=gpu-b"), ("scontrol", "requeue", "77")]
    drain = next(c for c in commands.calls if c[1] == "update")
    assert drain[4].startswith("Reason=ftwatch ") and drain[4].endswith(f": xid.79: {XID}")
    assert results[1].calls == results[0].calls                     # every node stores the same outcome
    assert hands[0].act(theirs).status == "skipped"                 # handed over once per generation


def test_a_leader_that_dies_mid_act_is_not_repeated_by_the_next(tmp_path):
    commands = FakeCommands()
    beating = {0, 1}
    agents, hands, others, _ = two_agents(tmp_path, commands, beating)
    polled: list = []
    others.append(lambda: polled.append(agents[0].poll()))
    mine, _ = agents[1].decide(xid(3))
    theirs = next(d for d in polled if d is not None)
    others.clear()
    agents[1].kv.put("stopped/0/1", 1)                              # node 1 stopped its workers
    commands.die_on = "requeue"
    with pytest.raises(Died):                                       # drained, then killed before the requeue
        hands[0].act(theirs)
    commands.die_on = None
    beating.discard(0)                                              # node 0 beats no more
    result = hands[1].act(mine)                                     # node 1 leads and finishes the act
    assert agents[1].leader is not None and result.status == "done"
    assert commands.writes() == [("scontrol", "update", "NodeName=gpu-b"), ("scontrol", "requeue", "77")]
    assert any("drain the node): done before (not run again)" in line for line in result.calls)


def test_a_restart_is_one_requeue_and_restart_local_tells_slurm_nothing(tmp_path):
    commands = FakeCommands()
    agents, hands, others, _ = two_agents(tmp_path, commands, beating={0, 1})
    polled: list = []
    others.append(lambda: polled.append(agents[0].poll()))
    sigkill = finding("exit.sigkill", kind="exit_code", rank=3, action=Action.RESTART_JOB,
                      severity=Severity.CRITICAL, line="worker-1 (rank 3) was killed by signal 9 (SIGKILL)")
    mine, _ = agents[1].decide(sigkill)
    theirs = next(d for d in polled if d is not None)
    assert mine.action is theirs.action is Action.RESTART_JOB
    others.clear()
    others.append(lambda: hands[0].act(theirs))
    assert hands[1].act(mine).status == "done"
    assert commands.writes() == [("scontrol", "requeue", "77")]
    local = JobHandOver(agents[1], SlurmActuator(SlurmConfig(restart="local"), job_id="77", runner=commands.runner))
    assert not local.handles(Action.RESTART_JOB)


# -- the flags from a Slurm step's environment ------------------------------------------------------------

STEP = {"SLURM_JOB_ID": "4471023", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
        "SLURM_STEP_NODELIST": "gpu-[7-8]", "SLURM_JOB_NODELIST": "gpu-[7-9]", "SLURMD_NODENAME": "gpu-8"}


def expand(nodes):
    assert nodes == "gpu-[7-8]"                                     # the step's nodes before the job's
    return ["gpu-7", "gpu-8"]


def test_srun_with_nnodes_alone_gives_rank_endpoint_and_rendezvous_id():
    from ftwatch.cli.run import cluster_from_args
    c = cluster_from_args(parse(["--nnodes", "2"]), STEP, expand)
    assert (c.node_rank, c.endpoint_host, c.endpoint_port, c.run_id) == (1, "gpu-7", 16023, "slurm-4471023")
    assert not c.hosts_store and slurm_port("4471023") == 16023
    c = cluster_from_args(parse(["--nnodes", "2", "--rdzv-endpoint", "n0:29400", "--rdzv-id", "x"]), STEP, expand)
    assert (c.endpoint_host, c.endpoint_port, c.run_id, c.node_rank) == ("n0", 29400, "x", None)   # flags win
    c = cluster_from_args(parse(["--nnodes", "2", "--node-rank", "0", "--master-port", "29501"]), STEP, expand)
    assert (c.node_rank, c.endpoint_host, c.endpoint_port, c.hosts_store) == (0, "gpu-7", 29501, True)


def test_one_node_in_slurm_stays_the_local_run_and_two_tasks_on_a_node_are_refused():
    from ftwatch.cli.run import cluster_from_args
    assert cluster_from_args(parse([]), STEP, expand) is None
    with pytest.raises(ValueError, match="one ftwatch per node"):
        slurm_flags({**STEP, "SLURM_PROCID": "3"}, expand, nnodes="2", node_rank=None, master_addr=None,
                    master_port=None, rdzv_endpoint=None, rdzv_id=None)
    assert slurm_flags({}, expand, nnodes="2", node_rank=None, master_addr=None, master_port=None,
                       rdzv_endpoint=None, rdzv_id=None) == {}


def test_hostnames_of_a_plain_list_need_no_scontrol_and_a_missing_one_names_the_flag():
    from ftwatch.cli.run import hostnames
    assert hostnames("/nonexistent/scontrol", "a,b") == ["a", "b"]
    with pytest.raises(ValueError, match="give --rdzv-endpoint"):
        hostnames("/nonexistent/scontrol", "gpu-[1-2]")
