"""The job's scheduler told once per decision, by the leader (``srun ftwatch run --actuator slurm``
on several nodes; README "Slurm").

Every agent of the job takes up the same decision of generation ``g`` and its run loop, once it has
stopped its workers, hands it over to the scheduler (``pipeline/respond.py``,
``Responder.hand_over``). Were each agent to call Slurm, the job would be requeued once per node
and the wrong node drained (each agent's own).
:class:`JobHandOver` stands in for the scheduler's actuator on every node (same ``handles`` /
``act``): the node says it stopped and waits; the leader waits for the others to stop (at most
``lost_after`` seconds; lost and ended nodes are not waited for), claims the act, carries the
*job's* decision out once (an ``isolate_node`` drains the node the decision blames, by its name in
the scheduler) and publishes the outcome; every agent returns that outcome, so all end together
when the job was requeued or cancelled, or restart together as without a scheduler when it was
not done (dry run, held by the breaker, failed).

A leader that dies while acting leaves its claim and the commands it completed: the next leader
takes the claim over (its holder's heartbeat stale, as the lead itself) and skips those commands
(``slurm.Ledger``), so a requeue or a drain is never run twice for one decision.

Keys (next to those of the package docstring):

    sched/<n>           node n's name in the scheduler (``$SLURMD_NODENAME``, else its host name)
    stopped/<g>/<n>     node n has stopped its workers for decision g and waits at the hand-over
    acting/<g>          ``"<node>:<token>"`` of the agent carrying decision g out (compare-and-set)
    step/<g>/<what>     a command of decision g's act that succeeded (``what``: "drain the node" ...)
    acted/<g>           the outcome: {status, output, calls}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from ftwatch.events import Action, Decision
from ftwatch.pipeline.actuators.exec import ActResult
from ftwatch.pipeline.cluster.leader import job_decision, lead
from ftwatch.pipeline.cluster.store import KV

# what the scheduler does for each kind of job decision (``decision/<g>``'s ``kind``)
ACT_OF_KIND = {"restart": Action.RESTART_JOB, "exclude": Action.ISOLATE_NODE, "fail": Action.FAIL_JOB}


class Scheduler(Protocol):
    """The scheduler's actuator (``actuators.slurm.SlurmActuator``)."""

    node: str | None

    def handles(self, action: Action) -> bool: ...

    def act(self, decision: Decision, *, node: str | None = None, ledger: Any = None) -> ActResult: ...


class StepLedger:
    """The commands of generation ``gen``'s act that are done, in the store (``step/<g>/<what>``)."""

    def __init__(self, kv: KV, gen: int):
        self.kv, self.gen = kv, gen

    def done(self, what: str) -> bool:
        return self.kv.has(f"step/{self.gen}/{what}")

    def mark(self, what: str) -> None:
        self.kv.put(f"step/{self.gen}/{what}", 1)


def job_act(record: dict) -> Decision | None:
    """The decision the scheduler carries out for a published record: its action by the record's
    kind (a restart of any sort is the job's restart), or None for a kind that stops nothing."""
    action = ACT_OF_KIND.get(record.get("kind", ""))
    if action is None:
        return None
    decision = job_decision(record)
    return decision if decision.action is action else dataclasses.replace(decision, action=action)


class JobHandOver:
    """The scheduler's actuator as every node of a multi-node job sees it (module docstring).

    Args:
        agent: this node's ``ClusterAgent`` (its store, node id, token, heartbeats, the decision
            it took up last: ``carrying``).
        scheduler: the scheduler's actuator; its ``node`` (``$SLURMD_NODENAME``) is this node's
            name there, published as ``sched/<node>`` (else the host name).
    """

    def __init__(self, agent: Any, scheduler: Scheduler):
        self.agent, self.scheduler = agent, scheduler
        agent.kv.put(f"sched/{agent.node}", scheduler.node or agent.host)
        scheduler.node = None                   # the node to drain is the decision's, not this agent's
        agent.requeues = scheduler.handles      # a requeue brings the job back whole: below MIN is no failure
        self._handed: set[int] = set()          # generations this node handed over

    def handles(self, action: Action) -> bool:
        return self.scheduler.handles(action)

    def act(self, decision: Decision) -> ActResult:
        """Hand generation g's decision over: the leader acts once, every node returns its outcome.

        ``decision`` is this node's part (a node the decision excludes ends with ``fail_job``);
        the scheduler is told the job's decision. A node's end that is no job decision (left out
        by the rendezvous, interrupted) tells the scheduler nothing (``skipped``)."""
        record = self.agent.carrying
        if record is None or record["gen"] in self._handed:
            return ActResult("skipped", None, "not a decision of the job: the scheduler is not told")
        gen = record["gen"]
        self._handed.add(gen)
        job = job_act(record)
        if job is None or not self.scheduler.handles(job.action):
            return ActResult("skipped", None, f"{record['kind']}: carried out by the nodes, not the scheduler")
        a, kv = self.agent, self.agent.kv
        kv.put(f"stopped/{gen}/{a.node}", 1)
        while not kv.has(f"acted/{gen}"):
            if a.leader is not None and lead(kv, a.token, a.beats, a.clock.mono(), key=f"acting/{gen}"):
                return self._carry_out(gen, record, job)
            if a.stop_requested():
                # Slurm's requeue or cancel stops every task of the job: no failure to alert
                return ActResult("skipped", None, f"interrupted while waiting for the leader to act on decision {gen}")
            a.keep_up()
        done = kv.read(f"acted/{gen}")
        a.say(f"ftwatch: cluster: decision {gen} carried out through the scheduler by node "
              f"{kv.text(f'acting/{gen}').split(':', 1)[0]}: {done['status']}")
        return ActResult(done["status"], None, done["output"], tuple(done["calls"]))

    # -- the leader -------------------------------------------------------------------------------

    def _carry_out(self, gen: int, record: dict, job: Decision) -> ActResult:
        a, kv = self.agent, self.agent.kv
        world = a.world
        deadline = a.clock.mono() + a.config.lost_after
        while a.clock.mono() < deadline and not a.stop_requested():
            mono = a.clock.mono()
            waiting = [n for n in (world.nodes if world is not None else ()) if not kv.has(f"stopped/{gen}/{n}")
                       and a.beats.alive(n, mono)]
            if not waiting:
                break
            a.keep_up()
        node = None
        if job.action is Action.ISOLATE_NODE:      # the blamed node's name there, else the root cause's host
            blamed = record.get("blamed")
            node = (kv.read(f"sched/{blamed}") or kv.read(f"host/{blamed}") if blamed is not None
                    else job.target.node) or None
        a.say(f"ftwatch: cluster: node {a.node} carries out decision {gen} through the scheduler"
              f"{f' (node {node})' if node else ''}")
        result = self.scheduler.act(job, node=node, ledger=StepLedger(kv, gen))
        kv.put(f"acted/{gen}", {"status": result.status, "output": result.output, "calls": list(result.calls)})
        return result
