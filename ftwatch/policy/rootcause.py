"""Root cause versus fallout (SPEC R7): which finding of an incident the decision is about.

The root cause is the earliest (time, seq) *real* error: severity >= ERROR and a class other than
``fallout`` / ``info``, after three readings that keep consequences from outranking causes:

1. A weak exit (a generic exit, code 1 or a code the exit-code table does not list, or a SIGABRT)
   of an instance that logged errors is explained by them: it is not a root cause of its own. If
   all those logged errors are fallout, the exit is fallout too (the rank died because another one
   failed; every watchdog-timeout case of the evaluation corpus ends in SIGABRT, which the
   exit-code table alone reads as user_code). A weak exit of a rank with no logged error of its
   own is explained by logged errors that carry no rank and may be that rank's: those of its
   stream (``pod`` for ``pod/rank3``, see ``Origin.with_rank``), or, where the instance names no
   stream (a replayed log without rank prefixes beside a torchelastic summary), all of them. A
   weak exit reported without a rank (a launcher's ``returned non-zero exit status 1``, srun's
   ``Exited with exit code 1`` over several tasks) is explained by the errors its stream's ranks
   logged: they are the processes it ran; one from a stream that logged none (a Kubernetes event
   ``Pod: ... exited with code 1``, ``kubectl describe``'s ``Exit Code: 1``: a report of pods whose
   own logs are other streams) by the errors the job's other streams logged. So a generic exit never outranks the error its rank
   logged before it. A SIGABRT that nothing logged explains is fallout as well: abort(3) is how a
   process ends itself on a reason it prints first (PyTorch's NCCL watchdog after a collective
   timed out or a peer failed, TORCH_NCCL_ASYNC_ERROR_HANDLING's default tear-down; glibc's heap
   checks; libstdc++'s terminate; assert(3)), so a bare one says that reason was not captured,
   and the exit-code sources disagree on it (exit_codes.tsv 134: DLRover fatal, training-operator
   retryable). With nothing else, D2 reads only-fallout as retryable (the restart budget and
   max_num_of_same_error bound a repeating abort); a real error of another instance decides.
   glibc's own abort report (``HEAP_ABORT_REPORTS``: "free(): invalid next size (fast)", "double free
   or corruption (!prev)", "*** stack smashing detected ***"; glibc malloc/malloc.c ``malloc_printerr``
   prints the check that failed and then calls abort()) is that reason printed, not a bare abort:
   when nothing its instance logged explains it, it is the process's own heap or stack corruption,
   a native crash of the program as a lone segmentation fault is (user_code); after fallout its
   instance logged it stays that fallout's tear-down, as above.
2. A *cascade* error (``CASCADE_RULES``, the rules tagged ``cascade`` in the packs: NCCL's
   "unhandled system error", a refused NCCL socket connect) is a real infra fault of the rank that reports it, unless another
   instance has a real error before it (at any time when the rank's own instance said first that its
   peer closed the connection, NCCL's ``Connection closed by remote peer``: the peer went first,
   whatever the times of lines of different hosts say), or died by a signal or a listed exit code, or
   exited early (an exit hang): then it is that failure's fallout. Deaths are compared whatever their time,
   because an exit is timestamped when ftwatch saw it (``ftwatch run``: after the dead worker's
   pipes closed; ``ftwatch replay``: at the end of the log), often after the survivors printed
   their errors.
3. Warnings and info findings never count, neither as errors nor as what explains an exit, except
   a traceback ended by an exception the catalog grades fallout (``KeyboardInterrupt``: the
   process was interrupted from outside; issue 17 item 5), which explains its instance's exit.
4. Anything a peer *prints* after the first real error of another instance is fallout of it
   (issue 12 item 3): a logged finding of another instance later by (time, seq). Exits are not
   printed lines (their time is when ftwatch saw them), so they keep their reading above.
5. The GPU driver's required reset (Xid 154, ``ftwatch.policy.gpureset``) of the root cause's
   node and GPU becomes the root cause: a restart on that GPU fails until it is reset.
6. An error printed after the job said training finished (``ftwatch.policy.lifecycle.finish``)
   is a notice (``Analysis.notices``), not a failure: it is no root cause while a real error
   came before the finish; the policy grades it by its class (``ftwatch.policy.lifecycle.after_finish``). When what follows the finish is only waiting (a job hang, collective
   timeouts and their fallout), the ranks' ends after the loop differ: ``collective.wait_after_finish``
   (user_code; ``ftwatch.policy.leftpath.waited_after_finish``).
7. A torch_npu return-code line (``HCCL function error: ..., error code is 7``; ``ftwatch.policy.cannrecord``)
   followed on its instance, within ``cannrecord.WRAPPED_WINDOW`` seconds, by a real error on a line with a
   CANN error code (0000-8999: an internal 9999 code such as ``EE9999: Inner Error!`` says no more),
   or by the AI Core's ``errorStr`` that spells out an ``EZ9999`` record (``cannrecord.SPELLED_OUT_RULES``), is explained by it: torch_npu prints the error CANN recorded (``EJ0001``, ``EI0004`` ...) as the
   rest of the same message, and that is the specific reading.
8. When every rank that reports an error only waited for its peers until a timeout (a barrier, a
   collective, the store read of a barrier) while another rank, with no error of its own, was
   still in unfinished work of its own (the main process pre-processing data under
   ``main_process_first``), that rank is the root cause, ``collective.busy_rank`` (user_code: the
   program held them longer than its timeout; ``ftwatch.policy.busy``), before the readings
   below and before the waits' own classes. So is a rank, with no error of its own, whose last
   word before their timeouts says it left their path (its data ran out, its epoch ended, it stops
   early, it works on the main process alone; ``collective.left_path``, user_code:
   ``ftwatch.policy.leftpath``); and a job hang right after a rank said it stops early or ran out
   of data, or ended its epoch alone, or its data loader or the ranks themselves said the data splits
   unevenly over them (``leftpath.left_before_hang``), or right after its framework
   named a wait only the program or its launch can end (``hang.named_wait``,
   ``ftwatch.policy.namedwait``: JAX's "Did you run your code on all TPU hosts?"), or a job hang over ranks
   whose own watchdogs timed out at one SeqNum on different operations or sizes (``collective.mismatch``,
   :func:`ftwatch.policy.collectives.mismatch_under_hang`), or a stop from outside
   (SIGTERM, SIGINT) right after Horovod's stall warning repeated (``leftpath.stalled_until_stopped``); and a rank that wrote lines of
   its own work (a file write, an evaluation) well inside their wait (``busy.working_rank``). When
   the waits' own bound (the watchdog's ``Timeout(ms)``) is below the tightest collective timeout a
   framework ships, the program's setting is the cause (``collective.timeout_below_default``,
   user_code; ``ftwatch.policy.timeoutbound``): after the readings that name a rank, before the
   silent-rank reading.
9. A report of a SIGKILL death (``SIGKILL_REPORTS``: a shell's ``Killed``, Python's ``died with
   <Signals.SIGKILL: 9>``, a launcher's ``return code = -9``; or an exit by signal 9 / code 137)
   is explained by an out-of-memory finding of the incident, whatever their order: the OOM killer
   ends its victim with SIGKILL (Linux mm/oom_kill.c ``__oom_kill_process``: ``do_send_sig_info(SIGKILL,
   ...)``), and the enforcer's own line often comes after the kill report (slurmstepd reads the
   cgroup's oom-kill events when the step has ended; a kernel log is collected apart). So the kill
   happened no later than its report: an OOM finding stamped after the earliest SIGKILL report it
   explains stands in that report's place (``killed_when_reported``), before the errors the
   victim's peers printed after it was gone (a parameter server killed for memory, its workers'
   ``UnavailableError: Socket closed``).
10. A fault of the device (``ftwatch.policy.devicefault``: a ``hardware_node`` finding of the
   root cause's node, an uncorrectable NPU memory event on its chip, or an application Xid that
   stays with one GPU across processes) becomes the root cause when
   the earliest real error is an error a GPU/NPU runtime returned to the program (a CUDA error
   graded the program's or ambiguous, NCCL's ``unhandled cuda error``, an application Xid, a
   torch_npu / ACL / CANN error), or a native crash beside a hardware Xid of its node, or a job hang
   beside a fault that took a device of its silent instance's node away: the program's error (or
   silence) is how the device's fault reached it. So does an NVLink Xid of the waiting ranks' node
   when every rank only timed out in a collective (``devicefault.interconnect_stall``).
11. A native crash (``NATIVE_CRASHES``: a segmentation fault, or an exit by SIGSEGV / 139) of an
   instance that had already logged fallout (its communicator failed because a peer or the
   network went away, a collective of it timed out) is the tear-down of that failure, fallout
   too: after an asynchronous error the only operation NCCL allows on the communicator is to
   destroy or abort it (NVIDIA/nccl#140; NCCL user guide, "Asynchronous errors and error
   handling"), and the abort of a communicator still in use is what crashes or hangs (openxla/xla#13109:
   aborting the faulty communicators "seems to be unreliable"; NVIDIA/JAX-Toolbox#194: "Only 2-3
   out of all the processes segfault with the above error, and the others abort"). A crash with
   no fallout before it on its instance stays the program's (user_code). So is the allocator's
   guard against a corrupt size (``CORRUPT_SIZE_RULES``: "Tried to allocate more than 1EB") after
   such fallout: the watchdog says then that "subsequent GPU operations might run on
   corrupted/incomplete data" (ProcessGroupNCCL.cpp), and a size received in the failed collective
   is such data (``broadcast_object_list`` broadcasts the objects' sizes, then allocates the
   largest; NVIDIA/nccl#1284: the maintainer read the 1 EB request after a broadcast timeout as a
   cascading error of the timeout).
12. An exit with status 124 is a timeout's stop (coreutils timeout(1), and the progress watchdogs
   that copy it; ``ftwatch.policy.timedout``): read as a hang (restart_job) before the readings
   above, no weak exit; an error logged before it still comes first.
13. An NCCL result code PyTorch raised (``internal error``, ``unhandled system error`` ... and its
   ``ncclInternalError: ...`` detail line) yields to the real error printed right after it on its
   instance: NCCL's ``Last error:`` text, the cause NCCL named for the generic code
   (``ftwatch.policy.lasterror``: torch's NCCLUtils ``getNcclErrorDetailStr``, NCCL's
   ``ncclGetLastError``). So does a traceback no rule grades (the catch-all), or one graded only
   by the fallback of a generic class whose message decides (torch_npu's ``RuntimeError: ACL
   stream synchronize failed.`` before the ``EL0004`` it carries), to the real error its
   exception's message carries on the lines after the record (same module). A kernel's failed
   device-side ``assert()`` print yields to the ``cudaErrorAssert`` its process then raised (same
   module, ``assert_reported``).
14. A lone SIGKILL death that its parent on the same node lived to report in the log (DeepSpeed's
   ``return code = -9``, a shell's ``Killed``, Python's ``died with <Signals.SIGKILL: 9>``),
   as the earliest real error, the incident's only SIGKILL report, with no other real error but
   exit reports (a scheduler's, the kubelet's, a peer's line keep it), is the kernel OOM killer's
   (``exit.sigkill_lone_oom``, oom: it kills one victim, Slurm, the kubelet and a node reclaim kill
   the launcher too; ``ftwatch.policy.oomkill``). So is a Ray worker's death without a word
   (``connection error code 2. End of file``) that its raylet reported when the incident holds
   nothing but Ray's death reports (``oomkill.lone_ray_kill``), and a notebook kernel's death the
   Jupyter server reported with nothing else (``oomkill.lone_kernel_death``).
15. A root cause that is a node's unranked device line (a kernel Xid, an ``mlx5_core`` health
   event) carries the rank of the one rank of that node that reported a device's error, the
   fault as its runtime returned it (``ftwatch.policy.devicefault.reporting_rank``).
16. Before that, a hardware Xid graded restart_in_place (Xid 94, contained ECC) yields to an Xid
   of the same GPU graded isolate_node (Xid 64, the row remapper failed): NVIDIA's catalog files
   the contained error as sympathetic, the memory's state is in the remap Xids
   (``ftwatch.policy.devicefault.worst_of_gpu``).
17. An IB/RoCE port error of a port that reported ``port active`` after it (the link came back),
   down fewer than 5 times, is a flap: a notice, not the node's fault (``ftwatch.policy.linkflap``);
   the job's own errors decide.

18. An out-of-memory error whose allocator figures show a full device that the one failing
   process held (almost) none of, or the CUDA runtime's ``out of memory`` raised while that
   process made its CUDA context (``torch.cuda.set_device``, the lazy init), is the node's state,
   a GPU held outside the job (``ftwatch.policy.heldmemory``: hardware_node, isolate_node), read
   where rule 5 is.
19. A runtime's "no device" error (``cudaErrorNoDevice``, ``No CUDA GPUs are available``) in an
   incident whose scheduler or launcher said the process was given no GPU (Ray trials holding
   CPUs and 0 GPUs, NNI's trial GPU number 0, ``CUDA_VISIBLE_DEVICES`` exported empty or -1) is
   the job's own allocation (``ftwatch.policy.noallocation``: user_code, fail_job), read where
   rule 5 is; without such a line it stays the node's.
20. A completion that ran out of transport retries (``status=12``) after an HCA of the job reported
   ``GID table change``, in a job whose NCCL said ``NCCL_IB_GID_INDEX`` was set by the environment, is
   the node whose GID table changed (``ftwatch.policy.gidchange``: hardware_node, isolate_node; NCCL
   binds a connection to the pinned index at connect time and does not reconnect, NVIDIA/nccl#1333),
   read where rule 5 is; without the pinned index it keeps its retryable grade.
21. A fault its rule grades a transient to retry (a device's POST_RESET failure, a PALS launch that
   could not reach a child node) that the log shows failing again on the same target in another
   try (a tool's own retry loop: another reset run, another launch id) is the target's fault
   (``ftwatch.policy.retried``: hardware_node, isolate_node; ``escalation.DEVICE_REPEAT``'s reading
   of a repeat, for tries the log itself holds), read where rule 5 is; one try keeps its grade.
22. A spawned child's failure to read its own start from its parent (``EOFError: Ran out of input``
   or ``UnpicklingError: pickle data was truncated`` raised in ``multiprocessing/spawn.py``'s
   ``_main``, before any program code ran in it) is fallout: the parent closed the pipe first, and
   its own output or exit decides (``ftwatch.policy.spawnstart``, CPython's spawn.py).
23. A store-based barrier's timeout (``init_process_group``) that counted more arrivals than the
   world has ranks (``world_size=4, worker_count=5``) is a member restarted alone into a group that
   had formed: the group cannot re-form and the others wait for it, a job hang that only a restart
   of every member ends (``ftwatch.policy.rejoined``: hang, restart_job; PyTorch's
   ``_store_based_barrier``). Fewer arrivals than ranks keep their grade.

When there is no real error, the root cause is the rank that left first (:func:`left_first`: an
instance that exited 0, a ``exit_ok`` finding of ``ftwatch run``, before any other instance's
failing exit, while the others then report only fallout: they lost their peer; SPEC R5 reads an
instance that exited 0 while the job goes on as an exit hang, that instance the culprit, restart),
else ranks that timed out in different collectives (operation, or size of a sized one) at one
sequence number, or a rank of a group that completed collectives another rank of it never entered
(user code, ``ftwatch.policy.collectives.mismatch``), else a flushed RDMA work
completion that nothing explains (the node's PCIe path, ``ftwatch.policy.verbs.flushed_alone``),
else the suspect rank of a
collective that timed out (``collectives.silent_rank``: the rank that never reported, or is
behind, while the others report timeouts), else Horovod's shut-down on several ranks with no exception
before it and no rank killed by a signal (a collective after one rank finished, by Horovod's own text:
``ftwatch.policy.hvdshutdown``, user_code), else the earliest notice (``after_finish``), else the
earliest fallout (``fallout_only``). Fallout that is only collective timeouts and their follow-on lines
(``collectives.timeouts_only``: every rank waited, none failed on its own) reads as a hang, other
fallout as retryable infrastructure (``Analysis.fallout_class``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from ftwatch.events import NOT_LOG_LINES, Action, FailureClass, Finding, Severity, is_error, precedes
from ftwatch.policy.busy import busy_rank, waits, working_rank
from ftwatch.policy.cannrecord import CannRecords
from ftwatch.policy.collectives import mismatch, mismatch_under_hang, silent_rank, timeouts_only
from ftwatch.policy.devicefault import device_fault, interconnect_stall, reporting_rank, worst_of_gpu
from ftwatch.policy.gidchange import pinned_gid_moved
from ftwatch.policy.retried import retried_on_target
from ftwatch.policy.gpureset import required_reset
from ftwatch.policy.heldmemory import held_elsewhere
from ftwatch.policy.lasterror import (Errors, assert_reported, assert_reports, last_error_starts,
                                      message_named_by_next, named_by_last_error)
from ftwatch.policy.leftpath import left_before_hang, left_rank, stalled_until_stopped, waited_after_finish
from ftwatch.policy.lifecycle import finish
from ftwatch.policy.trialloop import trial_finish
from ftwatch.policy.namedwait import named_wait_before_hang, named_wait_rank
from ftwatch.policy.noallocation import not_allocated
from ftwatch.policy.linkflap import recovered_flaps
from ftwatch.policy.hvdshutdown import finished_rank
from ftwatch.policy.oomkill import killed_when_reported, lone_kernel_death, lone_oom_kill, lone_ray_kill
from ftwatch.policy.rejoined import restarted_alone
from ftwatch.policy.spawnstart import parents_fallout
from ftwatch.policy.timedout import timed_out
from ftwatch.policy.timeoutbound import tight_bound
from ftwatch.policy.verbs import flushed_alone

#: Rules whose error is real on the rank that reports it but fallout beside another rank's failure
#: (tag ``cascade`` in ``ftwatch/rules/packs``; tests/rules/test_rootcause.py keeps the two in step).
#: nccl.unhandled_system_error: ncclSystemError, a failed socket/IB/shm call inside NCCL
#: (NVIDIA/nvidia-resiliency-ext@d8686d9c attribution/restart_agent/l0/registry.py files it as
#: ``nccl_cascade``); nccl.socket_connect_failed: a refused / timed-out connect to a peer, which a
#: dead peer causes as well as a broken network; nccl.code.system_error: the ``ncclSystemError``
#: detail line PyTorch prints under the same error (the NCCL catalog, nccl_vocab.tsv).
CASCADE_RULES = frozenset({"nccl.unhandled_system_error", "nccl.code.system_error", "nccl.socket_connect_failed"})
#: NCCL's word that the peer closed the connection (nccl.yaml; src/misc/socket.cc socketProgress: recv
#: returned 0, the remote end closed): the peer went first, whatever the lines' times across hosts say.
PEER_CLOSED = frozenset({"nccl.connection_closed_by_remote_peer"})
#: Rules that report a process killed by SIGKILL and nothing of why (tag ``sigkill`` in the packs;
#: tests/rules/test_rootcause.py keeps the two in step): rule 9 lets an OOM finding explain them.
SIGKILL_REPORTS = frozenset({"shell.job_killed", "shell.killed_foreground", "python.subprocess_died_sigkill",
                             "deepspeed_launcher.worker_sigkilled", "slurm.srun_task_killed",
                             "torch.mp_spawn_sigkill"})
#: Native crashes that rule 11 reads as the tear-down of fallout the same instance logged first.
NATIVE_CRASHES = frozenset({"os.segfault",
                            "windows.fatal_exception"})   # Windows' access violation, its SIGSEGV (platform_vocab.tsv)
#: glibc's own reports that it aborted the process on a corrupt heap or stack (kill_vocab.tsv): the
#: abort's reason printed with it, so a lone one is no bare SIGABRT (rule 1) but the process's own crash.
HEAP_ABORT_REPORTS = frozenset({"process.glibc_abort_report"})
#: Errors of a corrupt size that rule 11 reads, like a native crash, as fallout of the same instance's earlier fallout.
CORRUPT_SIZE_RULES = frozenset({"alloc.size_past_1eb"})
#: The rule id of the root cause :func:`left_first` names.
LEFT_FIRST = "exit.left_first"
_LEFT_SOURCE = ("SPEC R5 (AIMaster exit hang, seeds/000: an instance that exited 0 while the job has not "
                "finished is the culprit, restart) and R7 (a peer's lost connection is fallout)")


@dataclass(frozen=True)
class Analysis:
    """The R7 reading of a set of findings.

    Attributes:
        root_cause: the earliest real error; else the silent rank's finding; else the earliest
            notice; else the earliest fallout; else None.
        fallout_only: True when there is no real error, only fallout.
        real: every real error, earliest first.
        notices: errors printed after ``finished`` (none when there is no finish).
        finished: the "training finished" finding, if the job printed one.
        peer_fallout: the real errors (in ``real``) another instance printed after the root
            cause: fallout of it (rule 4); ``failed`` leaves their instances out.
        timeouts_only: with ``fallout_only``, the fallout is only collective timeouts and their
            follow-on lines (``ftwatch.policy.collectives.timeouts_only``).
    """

    root_cause: Finding | None
    fallout_only: bool
    real: tuple[Finding, ...]
    notices: tuple[Finding, ...] = ()
    finished: Finding | None = None
    peer_fallout: tuple[Finding, ...] = ()
    timeouts_only: bool = False

    @property
    def fallout_class(self) -> FailureClass:
        """How only-fallout reads (SPEC D2/R7, issue 12 item 3): ``hang`` when every rank reports
        only collective timeouts (someone never reached the collective), else
        ``retryable_infra``."""
        return FailureClass.HANG if self.timeouts_only else FailureClass.RETRYABLE_INFRA

    @property
    def failed(self) -> frozenset[str]:
        """The instances that failed on their own: those of ``real``, less a peer's later prints."""
        later = {id(f) for f in self.peer_fallout}
        return frozenset(f.origin.instance for f in self.real if id(f) not in later)

    @property
    def after_finish(self) -> bool:
        """No real error, but errors after training finished: a notice."""
        return not self.real and bool(self.notices)


def generic_exit(f: Finding) -> bool:
    """An exit that says nothing about why: code 1 or an unlisted code (``fields["generic"]``,
    set by ``ftwatch.rules.exitcodes.exit_finding``)."""
    if f.kind != "exit_code":
        return False
    default = f.fields.get("signal") is None and f.fields.get("exitcode") == 1
    return bool(f.fields.get("generic", default))


def abort_exit(f: Finding) -> bool:
    """A SIGABRT death (-6 / 134): how PyTorch's NCCL watchdog ends a process after a collective
    failed ("To avoid data inconsistency, we are taking the entire process down" → std::abort)."""
    return f.kind == "exit_code" and (f.fields.get("signal") == 6 or f.fields.get("exitcode") == 134)


def left_first(order: Sequence[Finding]) -> Finding | None:
    """The rank that left first: the earliest ``exit_ok`` finding (an instance exited 0) that came
    before every failing exit of another instance, when another instance failed or reported
    fallout after it. None when no instance exited 0 first.

    Args:
        order: the findings, by (time, seq), none after training finished (a rank that exits 0
            then is done, not gone early).

    Returns:
        A Finding ``exit.left_first`` (kind ``exit_hang``, class hang, restart_job: an exit hang
        seen by its consequences, SPEC R5) on the instance that left, its line naming what the
        others reported; or None.
    """
    for ok in (f for f in order if f.kind == "exit_ok"):
        others = [f for f in order if f.origin.instance != ok.origin.instance and is_error(f)]
        if not others or any(f.kind == "exit_code" and precedes(f, ok) for f in others):
            continue
        lost = next((f for f in others if f.kind != "exit_code"), others[0])
        who = f"rank {lost.rank}" if lost.rank is not None else lost.origin.instance
        line = (f"{ok.line} while the others were still running; then {who} reported {lost.rule_id} "
                "(a lost peer): the instance that left first is the culprit")
        return Finding(LEFT_FIRST, "exit_hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR, ok.origin,
                       line, ok.time, ok.seq, (ok.line,), {"exitcode": 0, "after": lost.rule_id}, _LEFT_SOURCE)
    return None


def _interrupted(f: Finding) -> bool:
    """A traceback whose final exception the catalog grades fallout whatever its severity
    (``KeyboardInterrupt``: SIGINT reached the process, python_exceptions.tsv): the process was
    stopped from outside, so it explains that instance's exit (issue 17 item 5)."""
    return f.failure_class is FailureClass.FALLOUT and "exception" in f.fields


def sigkill_report(f: Finding) -> bool:
    """Says whether ``f`` reports a death by SIGKILL and nothing of why (rule 9)."""
    return f.rule_id in SIGKILL_REPORTS or (f.kind == "exit_code" and f.fields.get("signal") == 9)


def native_crash(f: Finding) -> bool:
    """Says whether ``f`` reports a native crash of its process (rule 11): a segmentation-fault
    line, or an exit by SIGSEGV (signal 11, code 139)."""
    if f.kind == "exit_code":
        return f.fields.get("signal") == 11 or f.fields.get("exitcode") == 139
    return f.rule_id in NATIVE_CRASHES


def analyse(findings: Sequence[Finding], world: int | None = None) -> Analysis:
    """Find the root cause (R7), as the module docstring says.

    Args:
        findings: one incident's findings, any order, all instances (or one, in Async).
        world: the number of ranks, for the silent-rank reading (None: unknown, or Async).

    Returns:
        The analysis; ``real`` leaves out explained exits, cascades and a peer's later prints
        filed as fallout, and errors after training finished (``notices``).
    """
    done = finish(findings)
    if done is not None and trial_finish(done, findings) is not None:
        done = None                     # 6: it ended one trial of a search; the search itself then failed
    order = sorted((timed_out(f) for f in findings), key=lambda f: (f.time, f.seq))   # 12: exit 124
    order = recovered_flaps(order)      # 17: a port that came back flapped: a notice
    order = parents_fallout(order)      # 22: a spawned child cut off from its parent before it ran
    order = restarted_alone(order)      # 23: a barrier that counted a rank twice: a member restarted alone
    notices: list[Finding] = []
    if done is not None:
        notices = [f for f in order if is_error(f) and precedes(done, f)]
        order = [f for f in order if not precedes(done, f)]
    logged: dict[str, list[Finding]] = {}
    unranked: list[Finding] = []
    for f in order:
        if f.kind not in NOT_LOG_LINES and (is_error(f) or _interrupted(f)):
            logged.setdefault(f.origin.instance, []).append(f)
            if f.origin.rank is None:
                unranked.append(f)

    def explainers(f: Finding) -> list[Finding]:
        """The logged errors that explain a weak exit ([] when it is not one, or nothing does)."""
        if not (generic_exit(f) or abort_exit(f)):
            return []
        own = logged.get(f.origin.instance)
        if own:
            return own
        if f.origin.rank is None:           # a report with no rank (a launcher's "exit status 1"):
            where = (f.origin.job, f.origin.node, f.origin.stream)      # its stream's ranks are its workers
            same = [e for es in logged.values() for e in es if (e.origin.job, e.origin.node, e.origin.stream) == where]
            # a report stream that logged nothing of its own (Kubernetes events, kubectl describe):
            # the workers whose generic exit it reports logged elsewhere, and their errors say why
            return same or [e for es in logged.values() for e in es if e.origin.job == f.origin.job]
        stream = f.origin.instance.rpartition("/")[0]       # "pod/rank3": a rank of stream "pod"
        if stream:
            return [e for e in logged.get(stream, ()) if e.origin.rank is None]
        return unranked

    def torn_down(f: Finding) -> bool:
        """Rule 11: a native crash (or a corrupt size) after fallout its own instance logged."""
        return (native_crash(f) or f.rule_id in CORRUPT_SIZE_RULES) and any(e.failure_class is FailureClass.FALLOUT and precedes(e, f)
                                       for e in logged.get(f.origin.instance, ()))

    fallout: list[Finding] = []
    candidates: list[Finding] = []
    for f in order:
        why = explainers(f)
        if f.failure_class is FailureClass.FALLOUT or torn_down(f) or (why and all(
                e.failure_class is FailureClass.FALLOUT for e in why)) or (
                abort_exit(f) and not why and f.rule_id not in HEAP_ABORT_REPORTS):
            fallout.append(f)
        elif is_error(f) and not why:
            candidates.append(f)

    # 7, 13 read only the candidate's own instance's findings after it: each gets its instance's,
    # in the same order (a whole-incident list per candidate made this rule O(candidates x findings)),
    # and its place there, so that it reads only the findings after it (a
    # list that does not sort by (time, seq), a NaN time, is read from its start)
    mine: dict[str, list[Finding]] = {}
    place: dict[int, int] = {}
    for f in order:
        own = mine.setdefault(f.origin.instance, [])
        place[id(f)] = len(own) + 1
        own.append(f)
    unsorted = {instance for instance, own in mine.items()
                if any(not (a.time, a.seq) <= (b.time, b.seq) for a, b in zip(own, own[1:]))}
    after = {id(c): 0 if c.origin.instance in unsorted else place[id(c)] for c in candidates}
    # 7: a run of result codes is passed over once per instance, not once per code in it
    named_at = {instance: last_error_starts(own) for instance, own in mine.items() if instance not in unsorted}
    reports = assert_reports(candidates)      # 13: each instance's latest cudaErrorAssert, read once
    records = CannRecords(candidates)        # 7: the errors CANN recorded, read once per instance
    errors = Errors(candidates)              # 7, 13 ask of each candidate whether a finding is one
    candidates = [c for c in candidates if not records.spelled_out(c)
                  and not named_by_last_error(c, mine[c.origin.instance], errors,   # 7, 13
                                              named_at[c.origin.instance][after[id(c)]] if after[id(c)] else 0)
                  and not assert_reported(c, reports)         # 13: the kernel assert its process raised
                  and not message_named_by_next(c, mine[c.origin.instance], errors, after[id(c)])]
    if any(c.failure_class is FailureClass.OOM for c in candidates):     # 9: the OOM killer's SIGKILL
        candidates = killed_when_reported(candidates, [c for c in candidates if sigkill_report(c)])
    strong = [r for r in candidates if r.rule_id not in CASCADE_RULES]
    deaths = {r.origin.instance for r in strong
              if r.kind == "exit_hang" or (r.kind == "exit_code" and not generic_exit(r))}
    firsts: list[Finding] = []          # the earliest strong error of the first two instances
    for r in strong:
        if not firsts or (len(firsts) == 1 and r.origin.instance != firsts[0].origin.instance):
            firsts.append(r)

    def outranked(c: Finding) -> bool:
        """Another instance died, or had a (non-cascade) real error before ``c``, or any time when
        ``c``'s own instance said first that its peer closed the connection (rule 2)."""
        if deaths - {c.origin.instance}:
            return True
        other = next((r for r in firsts if r.origin.instance != c.origin.instance), None)
        return other is not None and (precedes(other, c) or any(
            e.rule_id in PEER_CLOSED and precedes(e, c) for e in logged.get(c.origin.instance, ())))

    cascades = {id(c) for c in candidates if c.rule_id in CASCADE_RULES and outranked(c)}
    real = tuple(f for f in candidates if id(f) not in cascades)
    waited = waits(order, real or fallout)     # 8: the ranks only waited (read once, for the four that ask),
    busy = (busy_rank(order, waited) or left_rank(order, waited)   # for a busy rank or one that left their path,
            or named_wait_rank(order, waited)   # for a rank in a wait its framework named,
            or working_rank(order, waited)   # or one that wrote its own work's lines inside the wait
            or left_before_hang(order, real)    # for a rank busy with its own work or one that left their path
            or stalled_until_stopped(order, real)   # or a stop while Horovod reported the ranks stalled
            or named_wait_before_hang(order, real)     # or a job hang its framework named the program's wait
            or mismatch_under_hang(order, real, world)     # or a job hang whose ranks' watchdogs named different collectives
            or (tight_bound(order, real) if real else None))    # or a job hang under a timeout set too tight
    if busy is not None:
        return Analysis(busy, False, (busy,), tuple(notices), done)
    if real:                            # 4: a peer's later prints are fallout of the first failure
        head = real[0]
        peer = tuple(f for f in real if f.origin.instance != head.origin.instance
                     and f.kind not in NOT_LOG_LINES and precedes(head, f))
        reset = (required_reset(head, real) or held_elsewhere(head, order)   # 5: the driver's verdict; 18: a GPU held outside
                 or not_allocated(head, order)      # 19: no GPU because the job's allocation gave it none
                 or pinned_gid_moved(head, order)   # 20: a pinned RoCE GID entry moved on a node
                 or retried_on_target(head, order))     # 21: a retried fault failed again on its target
        if reset is not None:
            return _with_rank(Analysis(reset, False, (reset, *(f for f in real if f is not reset)), tuple(notices),
                                       done, tuple(f for f in peer if f is not reset)))
        fault = device_fault(head, real, order, native_crash(head))   # 10: the device's fault explains the program's device error
        if fault is not None:
            return _with_rank(Analysis(fault, False, (fault, *(f for f in real if f is not fault)), tuple(notices),
                                       done, tuple(f for f in peer if f is not fault)))
        oom = lone_oom_kill(head, real, [f for f in order if sigkill_report(f)])   # 14: the OOM killer's lone kill
        if oom is not None:
            return Analysis(oom, False, (oom, *real[1:]), tuple(notices), done, peer)
        return _with_rank(Analysis(head, False, real, tuple(notices), done, peer))   # 15: the rank a node's fault hit
    stall = interconnect_stall(fallout, order) if fallout and timeouts_only(fallout) else None
    if stall is not None:               # 10: an NVLink Xid of the waiting ranks' node explains their stall
        return Analysis(stall, False, (stall,), tuple(notices), done)
    suspect = (left_first(order) or mismatch(order, world) or flushed_alone(fallout) or tight_bound(order, fallout)
               or silent_rank(order, world) or lone_ray_kill(fallout)   # 14: Ray's lone kill
               or lone_kernel_death(fallout)                            # 14: a notebook kernel's
               or finished_rank(order, fallout)) if fallout else None   # Horovod's shut-down, no exception, no kill
    if suspect is not None:
        return Analysis(suspect, False, (suspect,), tuple(notices), done)
    if notices:
        waited = waited_after_finish(notices, done)     # 6: only waiting after the finish: the ends differ
        if waited is not None:
            return Analysis(waited, False, (waited,), tuple(notices), done)
        return Analysis(notices[0], False, (), tuple(notices), done)
    return Analysis(fallout[0] if fallout else None, bool(fallout), (), (), done,
                    timeouts_only=timeouts_only(fallout))


def _with_rank(an: Analysis) -> Analysis:
    """Rules 15-16: ``an`` with its root cause read on its device: a contained Xid yields to its GPU's
    isolating one (``devicefault.worst_of_gpu``); an unranked line of a node's device carries the one
    rank of that node that reported a device's error (``devicefault.reporting_rank``)."""
    rc = an.root_cause
    if rc is None:
        return an
    worst = worst_of_gpu(rc, an.real)
    ranked = reporting_rank(worst, an.real)
    if ranked is rc:
        return an
    rest = tuple(f for f in an.real if f is not rc and f is not worst)
    return dataclasses.replace(an, root_cause=ranked, real=(ranked, *rest) if worst is not rc
                               else tuple(ranked if f is rc else f for f in an.real))
