"""ModelArts recovery strategies and degrade rules (SPEC D4, M2; seeds/002 训练作业故障恢复).

On when the job's annotations set ``fault-tolerance/job-retry-num`` (``modelarts.annotations``);
it then replaces the AIMaster clauses (D1-D3) for the job. Strategies -> ftwatch actions:

=============================  ==========================================================  ====================
ModelArts strategy             when (seed 002)                                             ftwatch
=============================  ==========================================================  ====================
原地恢复 in-place recovery      an NPU chip fault that can self-heal (MindCluster L2-L5:     restart_in_place,
                               RestartRequest ... RestartNPU): stop the processes, heal,    costs no restart
                               rerun in place. Another hardware fault below isolation
                               (a GPU Xid 94 ...) is a job reschedule (restart_job, one
                               of job-retry-num): only chip self-healing is free
无条件Job级重调度 unconditional  a non-zero exit with no node or chip fault                   restart_job
job reschedule                 (``job-unconditional-retry``)
隔离式Job级重调度 isolating     a node fault or a chip fault that cannot self-heal            isolate_node (then
job reschedule                 (SeparateNPU, escalated, blamed), or a degraded in-place     the whole job)
Pod重调度 pod reschedule         as isolating, with ``pod-retry-num``: isolate the node,       isolate_node, target
                               recreate only the failed pods                                 = the failed instance
卡死重启 hang restart            a hang (``hang-retry``): kill the processes, rerun in place  restart_in_place,
                                                                                            costs no restart
=============================  ==========================================================  ====================

Degrade rules (降级策略): self-healing fails (the chip faults again in the attempt right after its
in-place recovery) -> isolating job reschedule; the same node, device and fault (``fault_key``:
an NPU code or any other hardware rule) ``same_fault_times`` (3) times in a row within
``same_fault_window`` (24 h) in this job (seed 002: "一次训练过程中,同一节点同一芯片24小时内连续3次出现相同故障码";
"in a row": incidents of the job, any other incident in between starts the count again; SPEC D4
says only "3 times within 24 h", the seed is followed) -> isolating job reschedule, except user-input codes
(80C98002, 80CB8002) -> job reschedule without isolation; a pod reschedule that fails (its
instance fails again in the next attempt) or has no pod retries left -> job reschedule (the node
is already isolated); ``unconditional_in_a_row`` (3) unconditional reschedules in a row with no
node or chip fault between them -> the next one fails the job as a user-code problem;
``hang_restarts_in_a_row`` (3) hang restarts in a row -> the next hang fails the job. "In a row"
counts incidents of the job: a node or chip fault resets the unconditional streak, any other
incident the hang streak. Without ``job-unconditional-retry`` a failure with no node or chip fault
is not recovered (fail_job); without ``hang-retry`` a hang only notifies.

Budgets: ``job-retry-num`` bounds the reschedules (unconditional, isolating, degraded);
``pod-retry-num`` bounds pod reschedules; in-place recoveries and hang restarts cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftwatch.config.recovery import ModelArtsConfig
from ftwatch.events import Action, FailureClass, Finding
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.escalation import FaultHistory, chip_of, fault_key, is_npu, npu_code
from ftwatch.rules.faultcodes import USER_INPUT_CODES

HANG_KINDS = ("hang", "exit_hang")
#: The MindCluster chip levels that self-heal in place (L2-L5; fault-tables README "Chip levels").
SELF_HEALING_LEVELS = ("RestartRequest", "RestartBusiness", "FreeRestartNPU", "RestartNPU")


def self_healing(f: Finding) -> bool:
    """True for an NPU chip fault graded L2-L5 (its ``level`` field), the faults seed 002 recovers
    in place."""
    level = str(f.fields.get("level") or "")
    return is_npu(f) and level.split(" ", 1)[0] in SELF_HEALING_LEVELS


@dataclass(frozen=True)
class Verdict:
    """What the ModelArts policy chose.

    Attributes:
        action: the Action.
        clause: the policy clause (``D4 ...``).
        spend: ``job`` (one of job-retry-num), ``pod`` (one of pod-retry-num), ``free`` (a restart
            that costs nothing) or ``none`` (no restart).
        node: the node to isolate, if any.
        instance: the one instance to recreate (pod reschedule), if any.
    """

    action: Action
    clause: str
    spend: str = "none"
    node: str | None = None
    instance: str | None = None


class ModelArtsPolicy:
    """The D4 decision for one job (state in its BudgetStore: streaks and memos).

    Args:
        config: the ``modelarts`` section (must be ``enabled``).
        budgets: the job's budgets.
        history: the chip-fault hits of every job (MindCluster escalation, R3); the D4 same-fault
            count is the job's own streak (memo ``same_fault``), not this history.
    """

    def __init__(self, config: ModelArtsConfig, budgets: BudgetStore, history: FaultHistory):
        self.config, self.budgets, self.history = config, budgets, history
        self.job = budgets.job

    @property
    def max_restarts(self) -> int:
        """``fault-tolerance/job-retry-num``."""
        return self.config.annotations.job_retry_num or 0

    def decide(self, trigger: Finding, root: Finding | None, real: bool, failed: frozenset[str],
               attempt: int, now: float) -> Verdict:
        """Choose the strategy for one incident and update the streaks and memos.

        Args:
            trigger: the finding that opened the incident.
            root: the root cause (after escalation, C4D and blame), or None.
            real: True when ``root`` is a real error (not fallout alone).
            failed: instances that failed on their own.
            attempt: the current attempt.
            now: epoch seconds.
        """
        b = self.budgets
        if trigger.kind in HANG_KINDS:
            return self._hang()
        pod_memo, heal_memo, same_memo = b.memo("pod_reschedule"), b.memo("in_place"), b.memo("same_fault")
        b.set_memo("pod_reschedule", None)
        b.set_memo("in_place", None)
        b.set_memo("same_fault", None)      # "in a row": set again only by the same fault (_fault)
        if b.streak("hang"):
            b.set_streaks(hang=0)
        if pod_memo and pod_memo.get("attempt") == attempt - 1 and pod_memo.get("instance") in failed:
            return Verdict(Action.RESTART_JOB, f"D4 pod reschedule degrade: the pod reschedule of "
                                               f"{pod_memo['instance']} failed (it failed again in the next attempt), "
                                               "its node is already isolated → unconditional job reschedule", "job")
        node_fault = real and root is not None and (
            root.failure_class is FailureClass.HARDWARE_NODE or root.action is Action.ISOLATE_NODE)
        user_chip = real and root is not None and is_npu(root) and npu_code(root) in USER_INPUT_CODES
        if (node_fault or user_chip) and root is not None:
            b.set_streaks(unconditional=0)
            return self._fault(root, failed, attempt, now, heal_memo, same_memo)
        return self._unconditional()

    # ------------------------------------------------------------------ strategies

    def _hang(self) -> Verdict:
        b, cfg = self.budgets, self.config
        if not cfg.annotations.hang_retry:
            return Verdict(Action.NOTIFY, "D4 hang: fault-tolerance/hang-retry is off, a hang is not "
                                          "restarted → notify")
        n = b.streak("hang") + 1
        if n > cfg.hang_restarts_in_a_row:
            return Verdict(Action.FAIL_JOB, f"D4 hang restart degrade: hang {n} in a row after "
                                            f"{cfg.hang_restarts_in_a_row} hang restarts → fail_job")
        b.set_streaks(hang=n)
        return Verdict(Action.RESTART_IN_PLACE, f"D4 hang restart: kill the processes and rerun the start command "
                                                f"in the same containers ({n}/{cfg.hang_restarts_in_a_row} in a row; "
                                                "costs no restart)", "free")

    def _unconditional(self) -> Verdict:
        b, cfg = self.budgets, self.config
        if not cfg.annotations.job_unconditional_retry:
            return Verdict(Action.FAIL_JOB, "D4: no node or chip fault, and fault-tolerance/job-unconditional-retry "
                                            "is off (only in-place recovery and isolating reschedule are on) → fail_job")
        n = b.streak("unconditional")
        if n >= cfg.unconditional_in_a_row:
            return Verdict(Action.FAIL_JOB, f"D4 unconditional reschedule degrade: {n} unconditional reschedules in "
                                            "a row with no node or chip fault; this one points at the user code "
                                            "→ fail_job")
        b.set_streaks(unconditional=n + 1)
        return Verdict(Action.RESTART_JOB, f"D4 unconditional job reschedule: rebuild every pod "
                                           f"({n + 1}/{cfg.unconditional_in_a_row} in a row)", "job")

    def _fault(self, root: Finding, failed: frozenset[str], attempt: int, now: float,
               heal_memo: dict | None, same_memo: dict | None) -> Verdict:
        cfg, node = self.config, root.origin.node
        key = fault_key(root)
        code = npu_code(root) if is_npu(root) else root.rule_id
        times = [t for t in (same_memo or {}).get("times", []) if now - t < cfg.same_fault_window] \
            if (same_memo or {}).get("key") == key else []
        times.append(now)
        self.budgets.set_memo("same_fault", {"key": key, "times": times})
        same = len(times)
        where = (f"node {node} chip {chip_of(root)} code {code}" if is_npu(root)
                 else f"node {node} device {chip_of(root)} fault {code}")
        if same >= cfg.same_fault_times:
            why = (f"D4 in-place degrade: {where} {same} times in a row within "
                   f"{cfg.same_fault_window / 3600:g} h (>= {cfg.same_fault_times})")
            if code in USER_INPUT_CODES:
                return Verdict(Action.RESTART_JOB, f"{why}, a user-input code → job reschedule, "
                                                   "no node isolated", "job")
            return self._isolate(root, failed, attempt, f"{why} → isolate")
        if root.action < Action.ISOLATE_NODE and heal_memo and heal_memo.get("attempt") == attempt - 1 and \
                heal_memo.get("node") == node and heal_memo.get("chip") == chip_of(root) and \
                code not in USER_INPUT_CODES:
            return self._isolate(root, failed, attempt, f"D4 in-place degrade: self-healing of {where} failed "
                                                        "(it faulted again right after the in-place recovery) "
                                                        "→ isolate")
        if root.action < Action.ISOLATE_NODE and not self_healing(root):
            return Verdict(Action.RESTART_JOB, f"D4 job reschedule: hardware fault {root.rule_id} on node {node} "
                                               "is not a self-healing chip fault (MindCluster L2-L5), so no free "
                                               "in-place recovery → rebuild the job", "job")
        if root.action < Action.ISOLATE_NODE:
            level = root.fields.get("level") or root.rule_id
            self.budgets.set_memo("in_place", {"attempt": attempt, "node": node, "chip": chip_of(root)})
            return Verdict(Action.RESTART_IN_PLACE, f"D4 in-place recovery: self-healable fault {root.rule_id} "
                                                    f"({level}) on node {node} → stop the processes, heal, rerun in "
                                                    "the same containers (costs no restart)", "free")
        return self._isolate(root, failed, attempt, f"D4: node fault {root.rule_id} on node {node} that cannot "
                                                    "self-heal")

    def _isolate(self, root: Finding, failed: frozenset[str], attempt: int, why: str) -> Verdict:
        b, ann, node = self.budgets, self.config.annotations, root.origin.node
        instance = root.origin.instance if root.origin.instance in failed else next(iter(sorted(failed)), None)
        if ann.pod_retry_num is not None:
            used = int(b.memo("pod_used") or 0)
            if used >= ann.pod_retry_num:
                why += f"; pod-retry-num exhausted ({used}/{ann.pod_retry_num})"
            elif instance is not None:
                b.set_memo("pod_used", used + 1)
                b.set_memo("pod_reschedule", {"attempt": attempt, "instance": instance})
                return Verdict(Action.ISOLATE_NODE, f"{why}; D4 pod reschedule: isolate node {node}, recreate only "
                                                    f"the failed pod {instance} ({used + 1}/{ann.pod_retry_num})",
                               "pod", node, instance)
        return Verdict(Action.ISOLATE_NODE, f"{why}; D4 isolating job reschedule: isolate node {node} first, then "
                                            "rebuild the job", "job", node)
