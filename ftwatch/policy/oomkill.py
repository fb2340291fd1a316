"""A lone SIGKILL that its own parent lived to report is the kernel OOM killer's (rule 14 of rootcause).

A SIGKILL report says how a process died, not who killed it; the exit-code table grades a bare
SIGKILL (137) retryable (kubedl, kubeflow training-operator, DLRover). But the killers differ in
*what* they kill:

- the kernel's OOM killer selects ONE victim (Linux mm/oom_kill.c ``select_bad_process``: "We
  choose the process with the highest number of 'points'" (``oom_badness``, in practice the largest
  memory user: a worker rather than its small parent) and sends it SIGKILL (``__oom_kill_process``);
  a whole cgroup dies only with cgroup v2 ``memory.oom.group`` set (torvalds/linux 3d8b38eb81ca
  "mm, oom: introduce memory.oom.group": its tasks "are killed together or not at all"; default
  0). The kubelet sets it on container cgroups since 1.28 (kubernetes/kubernetes#117793;
  ``singleProcessOOMKill`` opts out, #126096): there a container's OOM takes the launcher with its
  workers, which the container's own exit 137 / OOMKilled shows, and a launcher that survived
  still saw a single victim;
- Slurm signals every task of the step or job on scancel, a time limit or preemption (SIGTERM, then
  SIGKILL after slurm.conf KillWait) and says so (``*** STEP ... CANCELLED AT ...``, scheduler.yaml);
- the kubelet stops the whole container (eviction, preemption, deletion: SIGTERM to PID 1, then
  SIGKILL to every process after the grace period; kubernetes.io "Pod Lifecycle", "Termination of
  Pods") and records an event (Evicted, Preempted, OOMKilled);
- a spot or node reclaim takes the whole node.

So a launcher on the worker's node, in its container, that survives to report that ONE child died
by SIGKILL (DeepSpeed's ``launch.py`` ``exits with return code = -9``, a shell's ``Killed``,
Python's ``died with <Signals.SIGKILL: 9>``, ``torch.multiprocessing.spawn``'s ``terminated with
signal SIGKILL``) saw a kill that targeted that one process, which is what the OOM killer does. The packs already
read a DataLoader worker's SIGKILL, which its parent reports (torch/csrc/DataLoader.cpp), the same
way (python.yaml ``torch.dataloader_worker_killed``: oom). Every tuning thread where such a report
is the only evidence concluded host memory (issue 12, round 7).

The reading holds only when nothing else in the incident says who killed it: the report is the
earliest real error, the only SIGKILL report of the incident (several processes killed at once is a
node-wide or step-wide kill), and every other real error is an exit report (the launchers' and
pdsh's exits after it). Any other real error, whatever its time, keeps the report's own reading:
a scheduler's or the kubelet's line (preemption, eviction, cancel, node failure, a time limit),
often printed after the kill report, says who killed it; an agent's received SIGTERM says the
stop came from outside; a peer's error first is the root cause and the kill its tear-down (an
sglang server kills its own process tree after a child failed); an OOM line explains it (rule
9). A later real error of a peer also keeps it, which errs towards a restart, not a failed job.
Reports by a launcher on another node (srun's ``tasks 4-7: Killed``, mpirun's ``exited on signal
9``: a node's loss or a node-wide kill leaves them alive) and a container's own exit 137 (``Exit
Code: 137``, a task runner's ``exit code: 137``: the whole container died, which the kubelet, a
cgroup OOM or the node may do) are not such reports and keep exit_codes.tsv's reading.

Inside a Slurm batch job (the kill report names Slurm's spooled batch script,
``<SlurmdSpoolDir>/job<id>/slurm_script``, Slurm src/slurmd/slurmd/req.c) an OOM kill does not go
unannounced: with task/cgroup, slurmstepd reads the step cgroup's oom_kill counter at the step's end
and prints ``Detected N oom_kill event(s) in StepId=... Some of the step tasks have been OOM
Killed`` (task_cgroup_memory_check_oom; scheduler.yaml reads it as oom), and that counter counts a
task killed "by any kind of OOM killer" (Linux cgroup-v2.rst memory.events; v1 memory.oom_control
since torvalds/linux 8e675f7af507 "count global and memory cgroup oom kills"). A lone kill in a
Slurm batch job without that line therefore names no OOM kill, and keeps the exit-code reading (a
site's cleanup or a person's ``kill -9`` do this: retryable).
"""

from __future__ import annotations

import re

from dataclasses import replace
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, precedes

#: Log lines by a parent on the worker's node, in its container, that ONE child died by SIGKILL
#: (all within ``rootcause.SIGKILL_REPORTS``; tests/policy/test_oomkill.py keeps them so). Not the
#: exit findings by signal 9 (``exit.sigkill``: ``ftwatch run``'s supervisor, a replayed torchelastic
#: summary): SPEC R4 and the policy's tests fix a rank's death by SIGKILL among its survivors'
#: fallout as a retryable root cause (tests/rules/test_policy.py, test_rootcause_table.py), a
#: decision of the spec this reading leaves to it. The two must move together: torchelastic's
#: summary restates the exit that ``run``'s supervisor sees, and every driver decides a recorded
#: run alike (tests/test_golden.py; its torchrun_sigkill run is a deliberate self-SIGKILL, which a
#: torchelastic-only reading would have failed as OOM while ``run`` restarts it).
LOCAL_KILL_REPORTS = frozenset({"deepspeed_launcher.worker_sigkilled", "shell.job_killed",
                                "shell.killed_foreground", "python.subprocess_died_sigkill",
                                "torch.mp_spawn_sigkill"})
#: Slurm's spooled batch script in a shell's kill report: the job runs under slurmstepd's task/cgroup.
_SLURM_BATCH = re.compile(r"/job\d+/slurm_script\b")
#: The rule id of the reading's root cause.
OOM_KILL = "exit.sigkill_lone_oom"
_SOURCE = ("Linux mm/oom_kill.c (select_bad_process/oom_badness pick one victim; __oom_kill_process sends it "
           "SIGKILL); torvalds/linux 3d8b38eb81ca memory.oom.group (default 0: one task, not the group; the "
           "kubelet sets it since kubernetes/kubernetes#117793, killing the launcher too); scancel(1), "
           "slurm.conf KillWait (Slurm signals the whole step); kubernetes.io Pod Lifecycle, termination "
           "(the kubelet kills every process of the container); ftwatch.policy.oomkill")


def lone_oom_kill(head: Finding, real: Sequence[Finding], kills: Sequence[Finding]) -> Finding | None:
    """The OOM killer's reading of a lone SIGKILL its parent reported, when nothing else explains it.

    Args:
        head: the incident's earliest real error (R7).
        real: all its real errors, earliest first (``head`` first).
        kills: every SIGKILL report of the incident (``rootcause.sigkill_report``), fallout included.

    Returns:
        ``head`` re-read as ``exit.sigkill_lone_oom`` (class oom, fail_job: the same program on the
        same memory is killed again), its line saying why; or None when ``head`` is not a local
        parent's report of one SIGKILL death, when the incident holds several SIGKILL reports, or
        when it holds another real error that is no exit report, whatever its time, or when the
        report is a Slurm batch script's (Slurm announces an OOM kill itself).
    """
    if head.rule_id not in LOCAL_KILL_REPORTS or len(kills) != 1 or kills[0] is not head:
        return None
    if any(f is not head and f.kind != "exit_code" for f in real):
        return None
    if _SLURM_BATCH.search(head.line or ""):
        return None                 # Slurm would have announced an OOM kill (module docstring)
    line = (f"{head.line} -- one process killed by SIGKILL while its parent lived to report it, and nothing "
            "else says who killed it: the kernel OOM killer's kill (host memory)")
    return replace(head, rule_id=OOM_KILL, failure_class=FailureClass.OOM, action=Action.FAIL_JOB, line=line,
                   fields={**head.fields, "reported_by": head.rule_id}, source=_SOURCE)


#: Ray's death reports (stacks_vocab.tsv): the raylet's and the driver's restatements of one
#: worker's death, and the exit detail of a worker that died without a word to its raylet.
RAY_DEATH_REPORTS = frozenset({"ray.actor_died_unexpectedly", "python.exception.ray.exceptions.RayActorError",
                               "python.exception.ray.exceptions.ActorDiedError"})
RAY_EOF = "ray.worker_exit_eof"
_RAY_SOURCE = ("ray-project/ray src/ray/raylet/node_manager.cc (a worker's connection closed without an exit message: "
               "'(1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is "
               "called. (3) The worker is crashed unexpectedly due to SIGSEGV ...'); Linux mm/oom_kill.c (one "
               "victim); ftwatch.policy.oomkill")


def lone_ray_kill(fallout: Sequence[Finding]) -> Finding | None:
    """The OOM killer's reading of a Ray worker that died without a word, when nothing else explains it.

    Ray's raylet, the worker's parent on its node, lived to report that the worker's connection
    closed with no exit message (``Worker unexpectedly exits with a connection error code 2. End of
    file``). Of the causes Ray's own text lists, ``ray stop --force`` takes the raylet too (it
    could not report), a crash prints its signal's stack first (a finding of its own), and Ray's
    memory monitor names its kills: a lone kill the raylet reported, with nothing else in the
    incident, is the kernel OOM killer's, as for the launchers' reports above (the module
    docstring).

    Args:
        fallout: the incident's findings, all fallout (``rootcause.analyse``'s only-fallout case).

    Returns:
        The first Ray exit-detail finding re-read as ``exit.sigkill_lone_oom`` (oom, fail_job); None
        when there is none or any finding of ``fallout`` is not one of Ray's death reports (a
        watchdog's, a peer's, NCCL's: they explain the death otherwise).
    """
    return _lone_silent_death(fallout, RAY_EOF, RAY_DEATH_REPORTS, "one Ray worker died without a word while its "
                              "raylet lived to report it", _RAY_SOURCE)


#: The Jupyter server's reports that its kernel process died (platform_vocab.tsv).
KERNEL_DEATH = "jupyter.kernel_died"
_KERNEL_SOURCE = ("jupyter/jupyter_client jupyter_client/restarter.py (KernelRestarter.poll: the kernel process is no "
                  "longer alive); jupyter/notebook notebook/services/kernels (kernel died / restarted); ipython/ipykernel "
                  "(a cell's exception never ends the kernel; faulthandler is not enabled); Linux mm/oom_kill.c (one "
                  "victim, by SIGKILL); ftwatch.policy.oomkill")


def lone_kernel_death(fallout: Sequence[Finding]) -> Finding | None:
    """The OOM killer's reading of a notebook kernel that died without a word, when nothing else explains it.

    The Jupyter server is the kernel's parent: jupyter_client's ``KernelRestarter`` polls the kernel
    process and, once it is gone, logs ``KernelRestarter: restarting kernel (n/5)`` and starts a new
    one (notebook's ``kernel <id> restarted``, the frontend's "The kernel appears to have died").
    The program cannot end its kernel with an error: IPython catches a cell's exception, SystemExit
    included, and shows it in the cell; a native abort prints its message first (a finding of its
    own). So a kernel death the server reported, with nothing else in the incident, is a signal no
    one announced: the kernel OOM killer's SIGKILL of the largest process of the runtime's VM, which
    the notebook platforms say is what ends a session that used all of its RAM (platform_vocab.tsv
    ``colab.session_crashed_out_of_ram``). A silent SIGSEGV (ipykernel leaves faulthandler off)
    would read the same; Ray's raylet has the same limit (:func:`lone_ray_kill`).

    Args:
        fallout: the incident's findings, all fallout (``rootcause.analyse``'s only-fallout case).

    Returns:
        The first kernel-death report re-read as ``exit.sigkill_lone_oom`` (oom, fail_job); None when
        there is none or any finding of ``fallout`` is no such report.
    """
    return _lone_silent_death(fallout, KERNEL_DEATH, frozenset(), "a notebook's kernel died without a word while the "
                              "Jupyter server lived to report it", _KERNEL_SOURCE)


def _lone_silent_death(fallout: Sequence[Finding], report: str, companions: frozenset[str], what: str,
                       source: str) -> Finding | None:
    """The first ``report`` finding of ``fallout`` re-read as the OOM killer's kill, when every finding
    of ``fallout`` is ``report`` or one of ``companions`` (restatements of the same death); else None."""
    first = next((f for f in fallout if f.rule_id == report), None)
    if first is None or any(f.rule_id != report and f.rule_id not in companions for f in fallout):
        return None
    line = f"{first.line} -- {what}, and nothing else says who killed it: the kernel OOM killer's kill (host memory)"
    return replace(first, rule_id=OOM_KILL, failure_class=FailureClass.OOM, action=Action.FAIL_JOB, line=line,
                   fields={**first.fields, "reported_by": report}, source=source)


def killed_when_reported(candidates: Sequence[Finding], reports: Sequence[Finding]) -> list[Finding]:
    """Rule 9 of rootcause: an OOM finding explains the SIGKILL reports, and the kill happened no
    later than its earliest report (the kernel's line is collected apart, slurmstepd reads the
    cgroup's oom-kill events after the step ended): the reports leave the candidates, and the first
    OOM finding, when stamped later than the earliest report, takes that report's place, before the
    errors the victim's peers printed once it was gone.

    Args:
        candidates: real errors in (time, seq) order, an OOM finding among them.
        reports: those of them that report a death by SIGKILL and nothing of why.

    Returns:
        The candidates in their new order; the OOM finding keeps its own line and time.
    """
    gone = {id(r) for r in reports}
    rest = [c for c in candidates if id(c) not in gone]
    oom = next(c for c in rest if c.failure_class is FailureClass.OOM)
    if not reports or not precedes(reports[0], oom):
        return rest
    rest.remove(oom)
    at = next((i for i, c in enumerate(rest) if precedes(reports[0], c)), len(rest))
    return [*rest[:at], oom, *rest[at:]]
