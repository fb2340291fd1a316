"""Root cause versus fallout (SPEC R7): explained exits, cascade errors, unranked log lines."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import CASCADE_RULES, analyse

JOB = "rc"
T0 = 1_795_219_200.0
RI, UC, HW, FALL = (FailureClass.RETRYABLE_INFRA, FailureClass.USER_CODE, FailureClass.HARDWARE_NODE,
                    FailureClass.FALLOUT)
SYSERR = "nccl.unhandled_system_error"
TABLE = ExitCodeTable.load()


def origin(rank: int | None, instance: str | None = None) -> Origin:
    return Origin(instance or f"worker-{rank}", rank, JOB, f"node-{rank}", "stderr", "process")


def log(rule: str, cls: FailureClass, rank: int | None, t: float, severity: Severity = Severity.ERROR,
        instance: str | None = None, action: Action = Action.RESTART_JOB) -> Finding:
    return Finding(rule, "keyword", cls, action, severity, origin(rank, instance), f"{rule} on {rank}", T0 + t,
                   seq=int(t * 100))


def died(rank: int, t: float, returncode: int | None = None, signal: int | None = None,
         launchers: frozenset[str] = frozenset()) -> Finding:
    f = exit_finding(ProcessExit(origin(rank), 100 + rank, returncode, signal, T0 + t), TABLE, seq=int(t * 100),
                     launchers=launchers)
    assert f is not None
    return f


def syserr(rank: int | None, t: float, instance: str | None = None) -> Finding:
    return log(SYSERR, RI, rank, t, instance=instance)


def test_the_rank_that_reports_a_system_error_and_exits_1_is_the_root_cause(tmp_path: Path):
    err, exit1 = syserr(1, 10.0), died(1, 11.0, returncode=1)
    an = analyse([exit1, err])
    assert an.root_cause == err and an.real == (err,) and not an.fallout_only
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", JOB), JOB)
    d = pol.decide(Incident(exit1, (err, exit1), 2, frozenset({"worker-1"}), 0), T0 + 12)
    assert d.action is Action.RESTART_JOB and d.root_cause == err
    assert d.policy_clause == "D2 ExitCodeAndErrorMsg: retryable_infra root cause → restart_job (Sync: whole job)"


def test_a_silent_exit_1_after_the_system_error_does_not_outrank_it():
    err, own, other = syserr(1, 10.0), died(1, 10.5, returncode=1), died(0, 11.0, returncode=1)
    an = analyse([other, own, err])
    assert an.root_cause == err and an.real == (err, other)


def test_a_silent_exit_1_before_the_system_error_is_the_first_failure():
    other, err = died(0, 9.0, returncode=1), syserr(1, 10.0)
    an = analyse([err, other, died(1, 11.0, returncode=1)])
    assert an.root_cause == other and an.real == (other,)      # the system error is its fallout


def test_a_peer_error_before_the_system_error_makes_it_fallout():
    key = log("python.key_error", UC, 0, 10.0, action=Action.FAIL_JOB)
    err = syserr(1, 10.5)
    an = analyse([err, died(1, 11.0, returncode=1), key, died(0, 10.2, returncode=1)])
    assert an.root_cause == key and an.real == (key,)


def test_a_system_error_after_its_own_peer_closed_line_is_a_later_peer_errors_fallout():
    """NCCL's 'Connection closed by remote peer' says the peer went first, whatever the lines' times."""
    closed = log("nccl.connection_closed_by_remote_peer", FailureClass.FALLOUT, 0, 10.0)
    err = syserr(0, 10.1)
    qp = log("nccl.ibv_call_failed", RI, 4, 12.0)
    an = analyse([closed, err, qp, syserr(4, 12.1)])
    assert an.root_cause == qp, an.root_cause
    alone = analyse([err, qp, syserr(4, 12.1)])        # without the line, the earlier one still leads
    assert alone.root_cause == err


def test_a_signal_death_outranks_the_survivors_system_errors_whatever_the_times():
    """A death is timestamped when it was seen (after the dead worker's pipes closed; in replay at the
    end of the log): the survivors' errors are often stamped before it."""
    errs = [syserr(0, 20.1), syserr(2, 20.2)]
    kill = died(1, 20.5, signal=9)
    an = analyse([*errs, kill, died(0, 21.0, returncode=1), died(2, 21.0, returncode=1)])
    assert an.root_cause == kill and an.real == (kill,)
    hw = died(1, 20.5, returncode=201, launchers=frozenset({"dlrover"}))   # a listed code (DLRover's) counts like a signal
    assert analyse([*errs, hw]).root_cause == hw


def test_an_exit_hang_outranks_the_survivors_system_errors():
    err = syserr(0, 30.0)
    hang = Finding("hang.exit", "exit_hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR, origin(1),
                   "rank 1 exited 0 early", T0 + 700.0, seq=1)
    assert analyse([err, hang]).root_cause == hang


def test_a_later_error_on_the_same_rank_does_not_outrank_its_system_error():
    err, later = syserr(1, 10.0), log("cuda.illegal_memory_access", UC, 1, 12.0, action=Action.FAIL_JOB)
    assert analyse([later, err]).root_cause == err
    first = log("cuda.ecc_uncorrectable", HW, 1, 9.0, action=Action.ISOLATE_NODE)
    assert analyse([err, first]).root_cause == first


def test_an_earlier_error_of_another_rank_counts_even_behind_one_of_its_own():
    own = log("cuda.ecc_uncorrectable", HW, 1, 9.0, action=Action.ISOLATE_NODE)
    other = log("python.key_error", UC, 0, 9.5, action=Action.FAIL_JOB)
    err = syserr(1, 10.0)
    assert analyse([err, other, own]).real == (own, other)
    assert analyse([err, own]).real == (own, err)


def test_two_system_errors_the_earliest_is_the_root_cause():
    a, b = syserr(2, 10.0), syserr(0, 10.3)
    assert analyse([b, a]).real == (a, b)


def test_warnings_neither_count_nor_explain_an_exit():
    """A warning-level finding beside the fallout used to turn the generic exit into user code."""
    warn = log("os.pcie_corrected", HW, 1, 5.0, severity=Severity.WARNING, action=Action.NOTIFY)
    remote = log("nccl.remote_error", FALL, 1, 6.0)
    exit1 = died(1, 7.0, returncode=1)
    an = analyse([warn, remote, exit1])
    assert an.fallout_only and an.root_cause == remote


def test_a_sigabrt_after_a_real_logged_error_is_explained_by_it():
    err, abort = syserr(1, 10.0), died(1, 11.0, signal=6)
    assert analyse([abort, err]).real == (err,)
    xid = log("xid.79", HW, 3, 10.0, action=Action.ISOLATE_NODE)
    assert analyse([died(3, 11.0, returncode=134), xid]).real == (xid,)


def test_log_lines_without_a_rank_explain_an_exit_of_a_rank_without_its_own():
    """A replayed log without rank prefixes and a torchelastic summary naming rank 1."""
    err = syserr(None, 10.0, instance="train")
    exit1 = died(1, 20.0, returncode=1)
    assert analyse([exit1, err]).real == (err,)
    fallout = log("nccl.remote_error", FALL, None, 10.0, instance="train")
    an = analyse([exit1, fallout])
    assert an.fallout_only and an.root_cause == fallout
    own = log("python.key_error", UC, 1, 12.0, action=Action.FAIL_JOB)     # its own lines come first
    assert analyse([exit1, err, own]).real == (err, own)


def test_a_rank_of_one_stream_is_explained_only_by_that_streams_unranked_lines():
    """`ftwatch watch`: pod-b's torchrun summary names rank 5 (instance pod-b/rank5); pod-a's
    unranked fallout says nothing about it."""
    exit5 = exit_finding(ProcessExit(origin(5, "pod-b/rank5"), 0, 1, None, T0 + 20.0), TABLE, seq=2000)
    assert exit5 is not None
    other = log("gloo.connection_closed_by_peer", FALL, None, 10.0, instance="pod-a")
    assert analyse([other, exit5]).real == (exit5,)
    own = log("nccl.remote_error", FALL, None, 10.0, instance="pod-b")
    an = analyse([other, own, exit5])
    assert an.fallout_only and an.real == ()


def test_a_bare_exit_1_is_still_a_root_cause():
    exit1 = died(0, 3.0, returncode=1)
    assert analyse([exit1]).real == (exit1,)


def test_cascade_rules_are_the_rules_tagged_cascade_in_the_packs():
    tagged = {r.id for r in load_rules([], builtin=True) if "cascade" in r.tags}
    assert tagged == CASCADE_RULES
    [rule] = [r for r in load_rules([], builtin=True) if r.id == SYSERR]
    assert rule.failure_class is RI and rule.action is Action.RESTART_JOB


# --- 6: a torch_npu return-code line is spelled out by the CANN error printed after it -----------

def test_the_cann_error_printed_after_a_return_code_line_is_the_root_cause():
    # torch_npu: "HCCL function error: ..., error code is 7", "[ERROR] ... ERR02200 ...", then
    # "EJ0001: Failed to initialize the HCCP process ..." (NPUException.h: one message)
    code = log("hccl.result_7_unavail", RI, 2, 10.0)
    wrapper = log("torch_npu.err_api_call_failed", FALL, 2, 10.01)
    ej = replace(log("hccp.ej0001_init_failed", RI, 2, 10.9, action=Action.RESTART_IN_PLACE),
                 line="EJ0001: [PID: 468348] 2026-04-24-16:14:56.975.866 Failed to initialize the HCCP process.")
    an = analyse([ej, wrapper, code])
    assert an.root_cause == ej and an.real == (ej,)
    # a later error without a CANN code (another traceback of the instance) spells nothing out
    other = log("python.uncaught_exception", UC, 2, 10.5, action=Action.FAIL_JOB)
    assert analyse([other, code]).root_cause == code


def test_a_return_code_line_stays_the_root_cause_when_nothing_spells_it_out():
    code = log("hccl.result_7_unavail", RI, 2, 10.0)
    other_rank = replace(log("hccp.ej0001_init_failed", RI, 3, 10.5),   # another instance's error
                         line="EJ0001: Failed to initialize the HCCP process.")
    much_later = replace(log("cann.ee1002_stream_sync_timeout", FailureClass.HANG, 2, 10.0 + 60),
                         line="EE1002: Stream synchronize timeout.")
    only_fallout = log("torch_npu.err_api_call_failed", FALL, 2, 10.01)
    for rest in ([other_rank], [much_later], [only_fallout]):
        assert analyse([code, *rest]).root_cause == code


def test_a_cann_internal_error_code_does_not_spell_a_return_code_out():
    """CANN's 9000-9999 codes are its internal errors ("EE9999: Inner Error!", EH9999, EZ9999), to be
    read with the messages around them: no more specific than the aclError code before them."""
    code = replace(log("acl.rt_timeout", RI, 2, 10.0),
                   line="RuntimeError: synchronize:NPUEvent.cpp:212 NPU function error: aclrtSynchronizeEvent(event_), "
                        "error code is 107020")
    for inner in ("EE9999: Inner Error!", "EH9999[PID: 285] 2025-12-12-12:10:10.639.672 (EH9999):  query failed",
                  "EZ9999: Inner Error!"):
        generic = replace(log("cann.ee9999_runtime_internal_error", RI, 2, 10.3, action=Action.RESTART_IN_PLACE),
                          line=inner)
        assert analyse([generic, code]).root_cause == code, inner
    specific = replace(log("cann.ee1002_stream_sync_timeout", FailureClass.HANG, 2, 10.3),
                       line="EE1002: Stream synchronize timeout.")
    assert analyse([specific, code]).root_cause == specific


def test_the_ai_core_errorstr_after_the_internal_record_spells_a_return_code_out():
    """The AI Core's errorStr ("The DDR address of the MTE instruction is out of range") ends the
    EZ9999 record torch_npu prints after the return code: the specific reading, however late the
    clock puts it (the return-code line carries an earlier line's timestamp)."""
    code = log("torch_npu.synchronize_failed", RI, 0, 10.0)
    wrapper = log("torch_npu.err_api_call_failed", FALL, 0, 17.0)
    inner = [replace(log("cann.ez9999_kernel_error", UC, 0, t, action=Action.RESTART_IN_PLACE), line=text)
             for t, text in ((17.1, "EZ9999: Inner Error!"),
                             (17.3, "EZ9999: [PID: 6] ... there is an exception of fftsplus aivector error"))]
    why = replace(log("cann.aicore_errorstr_out_of_bounds", UC, 0, 17.4, action=Action.FAIL_JOB),
                  line="The extend info: errcode:(0x800000, 0, 0) errorStr: The DDR address of the MTE "
                       "instruction is out of range.")
    assert analyse([code, wrapper, *inner, why]).root_cause == why
    # another real error of the instance between them: the errorStr is no longer the same message
    between = log("python.key_error", UC, 0, 17.2, action=Action.FAIL_JOB)
    assert analyse([code, wrapper, inner[0], between, why]).root_cause == code
    # another instance's errorStr spells nothing out for this one
    elsewhere = replace(why, origin=origin(1))
    assert analyse([code, wrapper, *inner, elsewhere]).root_cause == code


def test_only_return_code_rules_yield_to_what_follows():
    keyerror = log("python.key_error", UC, 1, 10.0, action=Action.FAIL_JOB)
    later = replace(log("hccp.ej0001_init_failed", RI, 1, 10.5), line="EJ0001: Failed to initialize the HCCP process.")
    assert analyse([keyerror, later]).root_cause == keyerror


# --- 8: an OOM finding explains a report of a SIGKILL death, whatever the order --------------------

def test_an_oom_line_after_a_shell_killed_line_is_the_root_cause():
    # a batch script prints "line 31: 20417 Killed  python3 main.py", then slurmstepd reports the
    # cgroup's oom-kill event once the step has ended (the OOM killer's SIGKILL: mm/oom_kill.c)
    killed = log("shell.job_killed", RI, None, 5.0, instance="batch")
    oom = log("slurm.cgroup_oom_kill", FailureClass.OOM, None, 6.0, instance="batch", action=Action.FAIL_JOB)
    an = analyse([killed, oom])
    assert an.root_cause == oom and an.real == (oom,)


def test_an_oom_line_explains_an_exit_by_sigkill():
    oom = log("os.oom_killer", FailureClass.OOM, None, 2.0, instance="host", action=Action.FAIL_JOB)
    exit9 = died(0, 1.0, signal=9)
    assert analyse([exit9, oom]).root_cause == oom


def test_without_oom_evidence_a_sigkill_report_stays_the_root_cause():
    killed = log("shell.job_killed", RI, None, 5.0, instance="batch")
    other = log("python.key_error", UC, None, 6.0, instance="batch", action=Action.FAIL_JOB)
    assert analyse([killed, other]).root_cause == killed


def test_sigkill_reports_are_the_rules_tagged_sigkill_in_the_packs():
    from ftwatch.policy.rootcause import SIGKILL_REPORTS
    assert {r.id for r in load_rules([], builtin=True) if "sigkill" in r.tags} == SIGKILL_REPORTS


def test_an_unranked_weak_exit_is_explained_by_the_errors_of_its_streams_ranks():
    # a launcher's "returned non-zero exit status 1" (no rank) after rank 2 logged a real error
    rank2 = log("cuda.illegal_memory_access", UC, 2, 1.0, instance="pod/rank2", action=Action.FAIL_JOB)
    launcher = replace(died(0, 2.0, returncode=1), origin=Origin("pod", None, JOB, "node-0", "stderr", "process"))
    rank2 = replace(rank2, origin=Origin("pod/rank2", 2, JOB, "node-0", "stderr", "process"))
    an = analyse([rank2, launcher])
    assert an.root_cause is rank2 and an.real == (rank2,)


# --- rule 11: a native crash after the instance's own fallout is the tear-down --------------------

def test_a_segfault_after_its_ranks_async_nccl_error_is_fallout():
    lost = log("nccl.remote_error", FALL, 37, 10.0)
    crash = log("os.segfault", UC, 37, 10.001, action=Action.FAIL_JOB)
    other = syserr(0, 11.0)
    an = analyse([crash, lost, other])
    assert an.root_cause == other and crash not in an.real


def test_an_exit_by_sigsegv_after_fallout_is_fallout_too():
    lost = log("nccl.remote_error", FALL, 3, 10.0)
    an = analyse([died(3, 12.0, signal=11), lost])
    assert an.fallout_only and an.root_cause == lost


def test_a_segfault_before_any_fallout_stays_the_programs():
    crash = log("os.segfault", UC, 2, 10.0, action=Action.FAIL_JOB)
    lost = log("nccl.remote_error", FALL, 2, 11.0)
    peer = log("nccl.remote_error", FALL, 0, 11.0)
    an = analyse([peer, lost, crash])
    assert an.root_cause == crash and an.real == (crash,)


def test_a_segfault_after_another_ranks_fallout_stays_the_programs():
    peer = log("nccl.remote_error", FALL, 0, 9.0)
    crash = log("os.segfault", UC, 2, 10.0, action=Action.FAIL_JOB)
    assert analyse([peer, crash]).root_cause == crash


def test_a_corrupt_size_after_its_ranks_collective_timeout_is_fallout():
    # ProcessGroupNCCL: after a timeout "subsequent GPU operations might run on corrupted/incomplete data";
    # broadcast_object_list then allocates the size it received: more than 1 EB
    timeout = log("torch.nccl_watchdog_timeout", FALL, 3, 10.0)
    guard = log("alloc.size_past_1eb", UC, 3, 11.0, action=Action.FAIL_JOB)
    an = analyse([timeout, guard])
    assert an.fallout_only and guard not in an.real


def test_a_corrupt_size_with_no_fallout_before_it_stays_the_programs():
    guard = log("alloc.size_past_1eb", UC, 3, 10.0, action=Action.FAIL_JOB)
    timeout = log("torch.nccl_watchdog_timeout", FALL, 0, 11.0)
    assert analyse([guard, timeout]).root_cause == guard
