"""One node's agent in a multi-node job: the run loop's link to the others.

``ftwatch run`` on every node builds one :class:`ClusterAgent` and hands it to its run loop
(``RunParts.cluster``), which calls it at four places and nowhere else:

    join(attempt)            before each start: arrive for the next generation, wait for its world
                             (``rendezvous``), place this node's workers in it (RANK, WORLD_SIZE,
                             GROUP_RANK, MASTER_ADDR/PORT); or this node's end (left out)
    poll()                   every step while the workers run: leader duty when leading, and the
                             job's decision for this generation once one is published
    decide(trigger, facts)   an incident on this node: report it to the leader and wait for the
                             job's decision (or take one already published: this is fallout)
    close(status)            ``done/<node>``, heartbeats stop (``ftwatch run`` calls it at the end)

Under ``--actuator slurm`` the scheduler's stand-in (``handover.JobHandOver``) reads the decision
this node took up last (``carrying``) and waits on the others with :meth:`ClusterAgent.keep_up`.

A thread beats ``hb/<node>`` every ``heartbeat`` seconds on a store client of its own; every
other store access is on the run loop's thread, so the leader's desk needs no lock. The keys are
drawn in ``ftwatch.pipeline.cluster`` (package docstring).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Any, Callable

from ftwatch.alerting.spool import finding_to_dict
from ftwatch.config.cluster import ClusterConfig
from ftwatch.events import Action, Decision, Finding
from ftwatch.pipeline.cluster.leader import Beats, Leader, job_decision, lead
from ftwatch.pipeline.cluster.rendezvous import Rendezvous, World
from ftwatch.pipeline.cluster.store import KV
from ftwatch.policy.plan import Plan, RunFacts, Verdict

REPORT_FINDINGS = 40      # the last findings of the attempt a report carries besides its trigger


class ClusterAgent:
    """This node's agent.

    Args:
        config: the multi-node settings.
        kv: the job's store (the run loop's client).
        beat_kv: a second client for the heartbeat thread (None: no thread; tests call :meth:`beat`).
        node: this node's id (``Rendezvous.node_id``).
        host: this machine's name (in findings and lines).
        addr: the address the other nodes reach this one at (its workers' MASTER_ADDR when first).
        job: the job id.
        clock: ``time()`` and ``mono()``.
        say: a line for the person watching.
        wait: sleeps between looks at the store while blocked (tests: advance a FakeClock).
        vet: the node check of generation 0's members (``nodecheck``), or None.
        checks: serves the leader's node-check requests on this node (``nodecheck``), or None.
    """

    def __init__(self, config: ClusterConfig, kv: KV, beat_kv: KV | None, node: int, *, host: str, addr: str,
                 job: str, clock: Any, say: Callable[[str], None] = print,
                 wait: Callable[[float], None] = time.sleep, vet=None, checks=None):
        self.config, self.kv, self.node, self.host, self.addr = config, kv, node, host, addr
        self.job, self.clock, self.say, self.wait = job, clock, say, wait
        self.vet, self.checks = vet, checks
        self.token = f"{node}:{uuid.uuid4().hex[:8]}"
        self.rdzv = Rendezvous(kv, config)
        self.beats = Beats(kv, config.lost_after)
        self.world: World | None = None
        self.leader: Leader | None = None
        self._make_desk: Callable[[], Any] | None = None
        self.runner: Any = None
        self._looked = float("-inf")      # mono of the last look at the lead
        self._done = threading.Event()
        self._carried = -1                # the generation whose decision this node has taken up
        self.carrying: dict | None = None  # the last job decision (not ``none``) this node took up
        self.requeues: Callable[[Action], bool] = lambda action: False   # Leader.requeues (handover.py)
        kv.put(f"host/{node}", host)
        self.beat_kv = beat_kv
        self.beat()
        if beat_kv is not None:
            threading.Thread(target=self._beating, name="ftwatch-heartbeat", daemon=True).start()

    def bind(self, runner: Any, make_desk: Callable[[], Any]) -> None:
        """The run loop this agent serves (its supervisor, desk, recorder, budgets) and how to
        build the job's desk should this agent lead (``ftwatch.pipeline.build``)."""
        self.runner, self._make_desk = runner, make_desk

    # -- the run loop's hooks --------------------------------------------------------------------

    def join(self, attempt: int) -> Decision | None:
        """Arrive for the next generation and wait for its world; place the workers in it.
        Returns None to start them, or the decision that ends this node (left out, too few nodes)."""
        gen = self.world.gen + 1 if self.world is not None else int(self.kv.read("gen", 0))
        self.rdzv.arrive(gen, self.node, self.addr, self.runner.nproc)
        if self.checks is not None:
            self.checks.nproc = self.runner.nproc
        self.say(f"ftwatch: cluster: node {self.node} waiting for generation {gen} "
                 f"(--nnodes={self.config.nnodes})")
        while (world := self.rdzv.world(gen)) is None:
            self._duty()
            if self.checks is not None:
                self.checks.serve(self.node)
            if self.stop_requested():
                return None
            self.wait(self.config.heartbeat / 4)
        if self.checks is not None:
            self.checks.close()                # the node check ran before generation 0's world
        if self.node not in world.nodes:
            why = self.kv.read(f"left/{self.node}") or world.reason or "not in the job's world (it had MAX nodes)"
            decision = self._leave(f"node {self.node} left out of generation {gen}: {why}")
            self.runner.recorder.decision(decision)
            return decision
        self.world = world
        offset = world.rank_offset(self.node)
        self.runner.supervisor.place(group_rank=world.group_rank(self.node), group_world_size=len(world.nodes),
                                     rank_offset=offset, world_size=world.size, master_addr=world.master_addr,
                                     master_port=world.master_port)
        self.say(f"ftwatch: cluster: generation {gen}: nodes {list(world.nodes)}, this node's group rank "
                 f"{world.group_rank(self.node)}, ranks {offset}..{offset + world.nproc[self.node] - 1} of {world.size}, "
                 f"master {world.master_addr}:{world.master_port}")
        return None

    def poll(self) -> Decision | None:
        """Leader duty, then the job's decision that ends this generation, once published (the
        run loop stops its workers and goes on with it: restart, or end)."""
        self._duty()
        record = self._published()
        if record is None or record.get("gen") == self._carried:
            return None
        decision = self._carry(record).decision
        self.runner.recorder.decision(decision)
        return decision

    def decide(self, trigger: Finding, facts: RunFacts | None = None) -> Verdict:
        """Report an incident of this node to the leader and return the job's decision (a
        decision published meanwhile answers it at once: this node's failure is fallout)."""
        record = self._published()
        if record is None:
            desk = self.runner.desk
            gen = self.world.gen if self.world is not None else 0
            evidence = [f for f in desk.findings[-REPORT_FINDINGS:] if f is not trigger]
            k = self.kv.count(f"reports/{gen}/{self.node}")
            self.kv.put(f"report/{gen}/{self.node}/{k}", {
                "findings": [finding_to_dict(f) for f in [trigger, *evidence]], "failed": sorted(desk.failed)})
            self.say(f"ftwatch: cluster: reported {trigger.rule_id} to the leader; waiting for the job's decision")
            while (record := self._published() or self.kv.read(f"answer/{gen}/{self.node}/{k}")) is None:
                if self.stop_requested():      # interrupted while waiting: this node ends
                    return Verdict(self._leave("interrupted while waiting for the job's decision"), Plan("fail"))
                self._duty()
                self.wait(self.config.heartbeat / 4)
        return self._carry(record)

    def close(self, status: int) -> None:
        """This node is done (its exit status): it is not lost when its heartbeat stops."""
        self._done.set()
        try:
            self.kv.put(f"done/{self.node}", status)
        except Exception:         # noqa: BLE001 - the store ended with the job (this node was left out)
            pass
        if self.leader is not None:           # the job's budgets end with it (a later run starts afresh)
            self.leader.desk.policy.budgets.close("succeeded" if status == 0 else "failed")

    def keep_up(self) -> None:
        """One look while this node waits on the others (leader duty, the lead taken over when
        its holder is lost), then a quarter heartbeat's wait."""
        self._duty()
        self.wait(self.config.heartbeat / 4)

    def stop_requested(self) -> bool:
        """Whether ftwatch was asked to stop (SIGINT, SIGTERM): every wait ends."""
        return self.runner is not None and self.runner.act.stop_requested.is_set()

    def beat(self) -> None:
        """One heartbeat (``hb/<node>`` + 1)."""
        (self.beat_kv or self.kv).count(f"hb/{self.node}")

    # -- internals -------------------------------------------------------------------------------

    def _beating(self) -> None:
        while not self._done.wait(self.config.heartbeat):
            try:
                self.beat()
            except Exception:       # noqa: BLE001 - the store went away: the job is ending
                return

    def _duty(self) -> None:
        """Take or keep the lead (every ``heartbeat`` seconds); lead: close the pending
        rendezvous, or tend the current generation's reports and heartbeats."""
        mono, now = self.clock.mono(), self.clock.time()
        if mono - self._looked >= self.config.heartbeat:
            self._looked = mono
            if lead(self.kv, self.token, self.beats, mono):
                if self.leader is None:
                    self.leader = Leader(self.kv, self.config, self._job_desk(), self.token, self.job, self.say)
                    self.leader.requeues = self.requeues
                    self.say(f"ftwatch: cluster: node {self.node} leads the job")
            elif self.leader is not None:
                self.say(f"ftwatch: cluster: node {self.node} no longer leads")
                self.leader = None
        if self.leader is None:
            return
        gen = int(self.kv.read("gen", 0))
        world = self.rdzv.world(gen)
        if world is None:
            before = self.kv.read(f"decision/{gen - 1}") if gen else None
            self.rdzv.close(gen, mono, None if before is None else before["next"],
                            lambda n: self.beats.alive(n, mono), self.vet)
        elif world.nodes:
            self.leader.tend(world, self.beats, now, mono)

    def _job_desk(self):
        desk = self._make_desk()
        last = None
        for g in range(int(self.kv.read("gen", 0)) - 1, -1, -1):     # the job's restarts so far
            last = self.kv.read(f"decision/{g}")
            if last is not None:
                break
        used = job_decision(last).restarts_used if last else 0
        while desk.policy.budgets.restarts_used < used:
            desk.policy.budgets.use_job_restart()
        return desk

    def _published(self) -> dict | None:
        return self.kv.read(f"decision/{self.world.gen}") if self.world is not None else None

    def _carry(self, record: dict) -> Verdict:
        """This node's part of the job's decision, as the local run loop's verdict."""
        decision = job_decision(record)
        kind = record["kind"]
        self.runner.desk.forget_incident(self.clock.mono(), decision.action)
        if kind == "none":
            return Verdict(decision, Plan("none"))
        self.carrying = record
        if kind == "fail":
            self._carried = record["gen"]
            return Verdict(decision, Plan("fail"))
        if self.node not in record["next"]:
            return Verdict(self._leave(f"node {self.node} excluded from the job by decision "
                                       f"{record['gen']} ({decision.action.label})", decision), Plan("fail"))
        if record["gen"] != self._carried:
            self.runner.budgets.use_job_restart()    # TORCHELASTIC_RESTART_COUNT of the next start
        self._carried = record["gen"]
        if decision.action not in (Action.RESTART_JOB, Action.ISOLATE_NODE):
            decision = dataclasses.replace(decision, action=Action.RESTART_JOB)
        return Verdict(decision, Plan("job"))

    def _leave(self, why: str, decision: Decision | None = None) -> Decision:
        """The decision that ends this node: ``fail_job`` for this node (exit status 1)."""
        self.say(f"ftwatch: cluster: {why}")
        base = decision or self.runner.policy.finished(self.clock.time(), ok=False)
        return dataclasses.replace(base, action=Action.FAIL_JOB, policy_clause=f"cluster: {why}")


def connect(config: ClusterConfig, job: str, say: Callable[[str], None] = print, *, network_check: bool = False,
            exclude_straggler: bool = False, nodecheck: Any = None, clock: Any = None) -> ClusterAgent:
    """This node's agent, connected: the store started when this node hosts it (node rank 0, or
    any agent of a c10d job whose endpoint is this machine: the first to bind serves), two
    clients opened (the run loop's and the heartbeat's), the node id taken.

    Raises:
        RuntimeError: torch is missing (how to install it), or no store answered in time.
    """
    import socket

    from ftwatch.clock import SystemClock
    from ftwatch.pipeline.cluster.store import is_local, open_store, start_server
    local = is_local(config.endpoint_host)
    if config.hosts_store or (config.node_rank is None and local):
        start_server(config.endpoint_host, config.endpoint_port, config.run_id, config.lost_after)
    timeout = max(60.0, 3 * config.lost_after)
    kv = KV(open_store(config.endpoint_host, config.endpoint_port, timeout), config.run_id)
    beat_kv = KV(open_store(config.endpoint_host, config.endpoint_port, timeout), config.run_id)
    node = Rendezvous(kv, config).node_id(config.node_rank)
    addr = config.local_addr or ("127.0.0.1" if local else socket.gethostname())
    vet = checks = None
    if network_check:
        from ftwatch.pipeline.cluster.nodecheck import ClusterCheck
        checks = ClusterCheck(kv, node, addr, nodecheck, exclude_straggler, say, min_nodes=config.min_nodes)
        vet = checks.vet
    say(f"ftwatch: cluster: node {node} of --nnodes={config.nnodes}, store "
        f"{config.endpoint_host}:{config.endpoint_port} (run id {config.run_id})")
    return ClusterAgent(config, kv, beat_kv, node, host=socket.gethostname(), addr=addr, job=job,
                        clock=clock or SystemClock(), say=say, vet=vet, checks=checks)
