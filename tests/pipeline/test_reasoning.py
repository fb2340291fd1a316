"""Reasoning across ranks and exit codes in context (issue 12 items 3 and 6), through the drivers:
``replay`` (recorded logs) and ``run`` (``FakeSupervisor`` workers on a FakeClock).

Each test fails without its change: the silent rank named from the watchdog's SeqNums, a peer's
later error as fallout, an error after "training finished" as a notice, a log that ends inside an
error block as a failed process, DLRover's exit 14 only under DLRover, and an exit 0 after an
uncaught traceback: flagged as hidden by a pipe under a shell, a notice where the program's own
status or its launcher's reading of it says 0.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass
from ftwatch.pipeline.build import build_run
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.replay import replay
from ftwatch.policy.lifecycle import reports_own_status
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Policy
from ftwatch.rules.engine import Engine
from ftwatch.testing import Exit, FakeClock, FakeControl, FakeSupervisor, Say, script_of

JOB = "reason"
FLAGS = {"fault_tolerant_policy": "ExitCodeAndErrorMsg", "enable_job_restart": True, "max_num_of_job_restart": 3}


def watchdog(rank: int, seq: int, second: int) -> str:
    return (f"[rank{rank}]:[E1121 09:{36 + second // 60:02d}:{second % 60:02d}.735118 2981 "
            f"torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=25165824, NumelOut=25165824, "
            f"Timeout(ms)=600000) ran for 600043 milliseconds before timing out.")


def step(rank: int, n: int, second: int) -> str:
    return f"[rank{rank}]:[I1121 09:{26 + second // 60:02d}:{second % 60:02d}.000000 2981 train.py:88] step {n}"


TRACEBACK = ["Traceback (most recent call last):",
             '  File "/srv/train.py", line 230, in <module>',
             "    main()",
             '  File "/srv/train.py", line 182, in main',
             '    warmup = config["warmup_steps"]',
             "KeyError: 'warmup_steps'"]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def replayed(tmp_path: Path, rules, files: list[Path], **flags):
    policy = Policy(Config().with_policy(**{**FLAGS, **flags}).policy,
                    BudgetStore(tmp_path / "budgets.json", JOB), JOB)
    return replay(files, Engine(rules), policy, JOB)


# ----------------------------------------------------------------------------------------- replay

def test_the_rank_that_never_reported_a_timeout_is_the_root_cause(rules, tmp_path):
    """Four ranks; ranks 0-2 time out at SeqNum 812, rank 3 printed steps and then nothing: rank 3
    is the suspect (a hang), not whichever timed-out rank printed first."""
    files = [write(tmp_path / f"rank{r}.log", [step(r, 811, 0), watchdog(r, 812, 600 + r)]) for r in range(3)]
    files.append(write(tmp_path / "rank3.log", [step(3, 811, 0)]))
    d = replayed(tmp_path, rules, files).decision
    assert d.root_cause.rule_id == "collective.silent_rank", d.policy_clause
    assert d.root_cause.rank == 3 and d.root_cause.failure_class is FailureClass.HANG
    assert d.root_cause.fields["seq"] == 812 and d.root_cause.fields["op"] == "ALLREDUCE"
    assert d.root_cause.fields["reporters"] == [0, 1, 2]
    assert d.action is Action.RESTART_JOB


def test_the_watchdog_line_carries_op_seq_and_timeout(rules, tmp_path):
    result = replayed(tmp_path, rules, [write(tmp_path / "rank0.log", [watchdog(0, 48213, 600)])])
    [f] = [f for f in result.findings if f.rule_id == "torch.nccl_watchdog_timeout"]
    assert (f.fields["seq"], f.fields["op"], f.fields["timeout_ms"], f.fields["ran_ms"]) == (
        48213, "ALLREDUCE", 600000, 600043)


def test_a_peer_error_printed_after_another_rank_failed_is_fallout(rules, tmp_path):
    """Rank 0 fails with a KeyError; ranks 1-3 print their own RuntimeErrors after it. With a
    tolerated failure rate of 0.5, four failed instances would fail the job by D3; only rank 0
    failed on its own, so the KeyError decides (user code: fail_job by D2, not by D3)."""
    files = [write(tmp_path / "rank0.log", [step(0, 5, 0)] + [f"[rank0]: {line}" for line in TRACEBACK])]
    for r in (1, 2, 3):
        files.append(write(tmp_path / f"rank{r}.log", [
            step(r, 5, 0), f"[rank{r}]:[E1121 09:27:0{r}.000000 2981 train.py:99] boom",
            f"[rank{r}]: Traceback (most recent call last):", f'[rank{r}]:   File "/srv/train.py", line 9, in f',
            f"[rank{r}]: ValueError: batch {r} is empty"]))
    # rank 0's KeyError carries no timestamp of its own: give it one before the peers'
    files[0] = write(tmp_path / "rank0.log", [step(0, 5, 0), "[rank0]:[E1121 09:27:00.000000 2981 train.py:99] x"]
                     + [f"[rank0]: {line}" for line in TRACEBACK])
    d = replayed(tmp_path, rules, files, max_tolerated_failure_rate=0.5).decision
    assert d.root_cause.rule_id == "python.key_error" and d.root_cause.rank == 0
    assert "max_tolerated_failure_rate" not in d.policy_clause, d.policy_clause
    assert d.policy_clause.startswith("D2 ExitCodeAndErrorMsg")


def test_an_error_after_training_finished_is_a_notice_not_a_restart(rules, tmp_path):
    """The HF Trainer said training completed; an NCCL error while tearing down is a notice."""
    lines = [step(0, 999, 0),
             "[rank0]:[INFO|trainer.py:2383] 2026-11-21 09:30:00,000 >> Training completed. Do not forget to share "
             "your model on huggingface.co/models =)",
             "[rank0]:[E1121 09:30:05.000000 2981 ProcessGroupNCCL.cpp:1] NCCL WARN Call to ibv_modify_qp failed "
             "with error Connection timed out",
             "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
             "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5"]
    d = replayed(tmp_path, rules, [write(tmp_path / "rank0.log", lines)]).decision
    # none, not notify (round 11): the training result is written, nothing is asked of anyone
    # (ftwatch.policy.lifecycle.after_finish; the tuning labels of such runs all say none)
    assert d.action is Action.NONE, d.policy_clause
    assert "lifecycle.finished.hf_trainer" in d.policy_clause and "notice" in d.policy_clause


def test_an_error_after_the_trainers_early_stop_ended_training_is_a_notice_not_a_failure(rules, tmp_path):
    """OpenNMT-tf leaves its step loop on early stopping ("Early stopping conditions are met.
    Exiting.", then the final save): a peer's later failed collective is the finished job's
    teardown (lifecycle.finished.early_stopping; before, the peer's error failed the job)."""
    lines = [step(0, 999, 0),
             "[rank0]:2026-11-21 09:30:00.000000: W training.py:190] Early stopping conditions are met. Exiting.",
             "[rank1]:Traceback (most recent call last):",
             '[rank1]:  File "/usr/local/bin/onmt-main", line 8, in <module>',
             "[rank1]:    sys.exit(main())",
             "[rank1]:tensorflow.python.framework.errors_impl.UnknownError: Graph execution error:"]
    d = replayed(tmp_path, rules, [write(tmp_path / "rank0.log", lines)]).decision
    assert d.action is Action.NONE, d.policy_clause      # none, not notify (round 11: after_finish)
    assert "lifecycle.finished.early_stopping" in d.policy_clause


def test_the_same_error_before_training_finished_restarts(rules, tmp_path):
    lines = [step(0, 999, 0),
             "[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
             "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5"]
    d = replayed(tmp_path, rules, [write(tmp_path / "rank0.log", lines)]).decision
    assert d.action is Action.RESTART_JOB, d.policy_clause


#: a C++ stack dump (c10::Error's "Exception raised from ...", then its frames)
STACK_DUMP = ["Exception raised from load_shard at /srv/ext/loader.cpp:88 (most recent call first):",
              "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3a in libc10.so)",
              "frame #1: load_shard + 0x1b2 (0x7f3b in libloader.so)"]


def test_a_log_that_ends_inside_an_error_block_is_a_failed_process(rules, tmp_path):
    """A C++ stack dump with no rule of its own ends the log: the process died of it, though no
    exit line says so (before: "the job ended by itself: job succeeded")."""
    result = replayed(tmp_path, rules, [write(tmp_path / "rank0.log", [step(0, 7, 0), *STACK_DUMP])])
    d = result.decision
    assert d.action is Action.FAIL_JOB, d.policy_clause
    assert d.root_cause.rule_id == "exit.ended_in_traceback" and d.root_cause.rank == 0


def test_a_log_that_ends_in_an_uncaught_cpp_exception_fails_on_its_what(rules, tmp_path):
    """The same dump after libstdc++'s terminate report: since round 23 its ``what()`` is read
    (``cpp.uncaught_exception_what``, the program's own statement of its error) and decides; the
    process is still a failed one."""
    lines = [step(0, 7, 0), "terminate called after throwing an instance of 'std::runtime_error'",
             "  what():  shard 17 has a bad header", *STACK_DUMP]
    d = replayed(tmp_path, rules, [write(tmp_path / "rank0.log", lines)]).decision
    assert d.action is Action.FAIL_JOB, d.policy_clause
    assert d.root_cause.rule_id == "cpp.uncaught_exception_what" and d.root_cause.rank == 0


def test_a_launcher_success_after_an_uncaught_traceback_is_a_notice(rules, tmp_path):
    """torchelastic says every worker exited 0, after rank 0's KeyError traceback. Changed on
    purpose (it was read as a status hidden by a pipe, seed 001): torchelastic is the workers'
    parent and reads their exit codes itself (torch/distributed/elastic/multiprocessing: the
    PContext's exit codes; "worker group successfully finished" only when all are 0), and Python
    exits 1 when an exception ends the main thread (docs: sys.excepthook, "the interpreter exits
    with status 1"), so no pipe stood between them and the KeyError ended no program: a notice.
    Still true: the KeyError is found and graded; nothing is flagged as hidden."""
    lines = ([step(0, 7, 0)] + [f"[rank0]: {line}" for line in TRACEBACK]
             + ["INFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully finished. "
                "Waiting 300 seconds for other agents to finish."])
    result = replayed(tmp_path, rules, [write(tmp_path / "combined.log", lines)])
    d = result.decision
    assert d.action is Action.NONE and d.root_cause is None, d.policy_clause
    assert "exit status hidden by a pipe" not in d.policy_clause
    assert any(f.rule_id == "python.key_error" for f in result.findings)
    assert not any(f.rule_id == "exit.hidden_by_pipe" for f in result.findings)


def test_deepspeeds_one_process_exit_0_makes_that_processs_traceback_a_notice(rules, tmp_path):
    """DeepSpeed's launcher.py logs "Process N exits successfully." when that worker's returncode
    is 0: the KeyError before it ended no program (before: exit.hidden_by_pipe, fail_job)."""
    lines = ([step(0, 7, 0)] + [f"[rank0]: {line}" for line in TRACEBACK]
             + ["[2026-11-21 09:36:03,735] [INFO] [launch.py:351:main] Process 48213 exits successfully."])
    result = replayed(tmp_path, rules, [write(tmp_path / "combined.log", lines)])
    assert result.decision.action is Action.NONE, result.decision.policy_clause
    assert not any(f.rule_id == "exit.hidden_by_pipe" for f in result.findings)


@pytest.mark.parametrize("command, own", [
    (("python", "train.py"), True), (("/usr/bin/python3.11", "-m", "train"), True),
    (("torchrun", "--nproc_per_node=8", "train.py"), True), (("deepspeed", "train.py"), True),
    (("bash", "-c", "python train.py | tee log"), False), (("./launch.sh",), False), (("sh", "run.sh"), False),
    ((), False)])
def test_which_commands_report_their_programs_own_exit_status(command, own):
    """Only a shell, a wrapper script or an unknown command can hide a failing status (seed 001)."""
    assert reports_own_status(command) is own


def test_the_same_traceback_without_the_launchers_success_fails_the_job(rules, tmp_path):
    """The control of the test above: no "exited 0" line, so the KeyError's class decides."""
    lines = [step(0, 7, 0)] + [f"[rank0]: {line}" for line in TRACEBACK] + ["[rank1]: step 8"]
    d = replayed(tmp_path, rules, [write(tmp_path / "combined.log", lines)]).decision
    assert d.root_cause.rule_id == "python.key_error" and d.action is Action.FAIL_JOB, d.policy_clause


# -------------------------------------------------------------------------------------------- run

def config(tmp_path, **policy):
    return Config.model_validate({
        "policy": {**FLAGS, **policy},
        "supervisor": {"nproc_per_node": "1:2", "restart_delay": 0, "devices": ["0", "1"]},
        "health": {"bootcheck": False, "troubleshooting": False},
        "storage": {"state_dir": str(tmp_path)},
    })


def run(tmp_path, script, command=("python", "train.py")):
    clock = FakeClock()
    sup = FakeSupervisor(clock, script, nproc=2, job=JOB)
    recorder = Recorder(SqliteStore(tmp_path / "ftwatch.db"), out=io.StringIO())
    status = build_run(config(tmp_path), list(command), JOB, recorder, out=io.StringIO(), clock=clock,
                       supervisor=sup, control=FakeControl()).run()
    return status, recorder.decisions


def test_exit_14_from_a_plain_script_is_not_a_gpu_fault(tmp_path):
    script = script_of({(1, 1): [Say(1, "step 1"), Exit(2, 14)]}, default=[Say(1, "step 1"), Exit(3)])
    status, decisions = run(tmp_path, script)
    first = decisions[0]
    assert first.root_cause.rule_id == "exit.14"
    assert first.root_cause.failure_class is FailureClass.USER_CODE and first.action is Action.FAIL_JOB
    assert first.root_cause.fields["private_to"] == "dlrover" and status == 1


def test_exit_14_under_dlrover_run_is_a_gpu_fault(tmp_path):
    script = script_of({(1, 1): [Say(1, "step 1"), Exit(2, 14)]}, default=[Say(1, "step 1"), Exit(3)])
    _, decisions = run(tmp_path, script, command=("dlrover-run", "--nproc_per_node=2", "train.py"))
    first = decisions[0]
    assert first.root_cause.rule_id == "exit.14"
    assert first.root_cause.failure_class is FailureClass.HARDWARE_NODE and first.action is Action.ISOLATE_NODE


def test_exit_14_after_dlrovers_own_lines_is_a_gpu_fault(tmp_path):
    """The launcher learnt from the output: DLRover's agent line in the worker's stream."""
    script = script_of({(1, 1): [Say(0.5, "[2026-11-21 09:26:03,735] [INFO] [elastic_run.py:455:run] DLRover agent "
                                          "started with: 0.4.0."), Exit(2, 14)]},
                       default=[Say(1, "step 1"), Exit(3)])
    _, decisions = run(tmp_path, script)
    assert decisions[0].root_cause.failure_class is FailureClass.HARDWARE_NODE


def test_exit_0_after_an_uncaught_traceback_is_flagged_and_decided_by_its_class(tmp_path):
    """Rank 1 printed an uncaught KeyError and exited 0 under a shell pipeline (`bash -c "python
    train.py | tee log"`): before, the job "succeeded"; now the hidden failure is an incident,
    decided as the KeyError's user code. Changed on purpose: the command is a shell now (it was
    `python train.py`, whose own exit 0 no pipe can hide, see the next test): only a pipe
    without pipefail or a wrapper script turns the failing status into 0 (seed 001)."""
    script = script_of({(1, 1): [Say(1, "step 1"), Say(1.5, "\n".join(TRACEBACK)), Exit(2, 0)]},
                       default=[Say(1, "step 1"), Exit(3)])
    status, decisions = run(tmp_path, script, command=("bash", "-c", "python train.py | tee train.log"))
    first = decisions[0]
    assert first.action is Action.FAIL_JOB and status == 1, first.policy_clause
    assert first.root_cause.rule_id == "python.key_error"
    assert "exit status hidden by a pipe" in first.policy_clause


def test_a_python_workers_own_exit_0_after_a_traceback_is_a_notice(tmp_path):
    """`python train.py` printed a KeyError traceback and exited 0: ftwatch saw the interpreter's
    own status, and Python exits 1 when an exception ends the main thread (docs: sys.excepthook),
    so the traceback was caught and printed (or came from a thread or a child): a notice, and the
    job succeeds (before: exit.hidden_by_pipe failed it)."""
    script = script_of({(1, 1): [Say(1, "step 1"), Say(1.5, "\n".join(TRACEBACK)), Exit(2, 0)]},
                       default=[Say(1, "step 1"), Exit(3)])
    status, decisions = run(tmp_path, script)
    assert status == 0 and [d.action for d in decisions] == [Action.NONE], [d.policy_clause for d in decisions]


def test_a_caught_traceback_before_training_finished_is_not_flagged(tmp_path):
    script = script_of({(1, 1): [Say(1, "\n".join(TRACEBACK)),
                                 Say(1.5, "Training completed. Do not forget to share your model on "
                                          "huggingface.co/models =)"), Exit(2, 0)]},
                       default=[Say(1, "step 1"), Exit(3)])
    status, decisions = run(tmp_path, script)
    assert status == 0 and [d.action for d in decisions] == [Action.NONE]


def test_a_rank_that_exits_0_while_the_other_loses_it_is_named(tmp_path):
    """Issue 17 item 5: rank 1 exits 0 early, rank 0 then fails on the lost peer (gloo). Before,
    the root cause was rank 0's fallout line; now it is rank 1's early exit (R5's exit hang: restart)."""
    closed = ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
              "peer [127.0.0.1]:5033. This is typically caused by a remote worker crashing.")
    script = script_of({(1, 1): [Say(1, "step 1"), Exit(2, 0)], (0, 1): [Say(1, "step 1"), Say(2.1, closed),
                                                                         Exit(2.5, 1)]},
                       default=[Say(1, "step 1"), Exit(3)])
    _, decisions = run(tmp_path, script)
    first = decisions[0]
    assert first.root_cause.rule_id == "exit.left_first", first.root_cause
    assert (first.root_cause.rank, first.root_cause.origin.instance) == (1, "worker-1")
    assert first.action is Action.RESTART_JOB, first.policy_clause


def test_a_worker_sigterm_from_outside_under_torchrun_is_the_root_cause(rules, tmp_path):
    """Issue 17 item 5, replayed: torchrun's summary says rank 1 got SIGTERM (a preemption-like
    signal from outside); rank 0's lost-peer error, the agent's SIGTERM of the survivor and the
    ChildFailedError are fallout of it, and the decision is a retryable restart."""
    lines = [step(0, 100, 0), step(1, 100, 0),
             "[default0]:[rank0]:[E1121 09:30:05.000000 2981 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID "
             "0(default_pg) Rank 0] Process group watchdog thread terminated with exception: NCCL error: remote "
             "process exited or there was a network error, NCCL version 2.21.5",
             "W1121 09:30:06.000000 2970 torch/distributed/elastic/multiprocessing/api.py:897] Sending process "
             "2981 closing signal SIGTERM",
             "Traceback (most recent call last):",
             '  File "/usr/local/bin/torchrun", line 8, in <module>',
             "    sys.exit(main())",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "============================================================",
             "train.py FAILED",
             "------------------------------------------------------------",
             "Failures:",
             "  <NO_OTHER_FAILURES>",
             "------------------------------------------------------------",
             "Root Cause (first observed failure):",
             "[0]:",
             "  time      : 2026-11-21_09:30:06",
             "  host      : node-3",
             "  rank      : 1 (local_rank: 1)",
             "  exitcode  : -15 (pid: 2982)",
             "  error_file: <N/A>",
             "  traceback : Signal 15 (SIGTERM) received by PID 2982",
             "============================================================"]
    d = replayed(tmp_path, rules, [write(tmp_path / "job.log", lines)]).decision
    assert (d.action, d.root_cause.rule_id, d.root_cause.rank) == (Action.RESTART_JOB, "exit.sigterm", 1), \
        d.policy_clause


SUMMARY = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
           "============================================================",
           "train.py FAILED",
           "------------------------------------------------------------",
           "Failures:",
           "[1]:",
           "  time      : 2026-11-26_04:01:07",
           "  host      : localhost",
           "  rank      : 0 (local_rank: 0)",
           "  exitcode  : -15 (pid: 1159)  (SIGTERM)",
           "  error_file: <N/A>",
           "  traceback : Signal 15 (SIGTERM) received by PID 1159",
           "------------------------------------------------------------",
           "Root Cause (first observed failure):",
           "[0]:",
           "  time      : 2026-11-26_04:01:07",
           "  host      : localhost",
           "  rank      : 1 (local_rank: 1)",
           "  exitcode  : -15 (pid: 1160)  (SIGTERM)",
           "  error_file: <N/A>",
           "  traceback : Signal 15 (SIGTERM) received by PID 1160",
           "============================================================"]


def test_a_launchers_summary_names_the_rank_a_signal_stopped_under_run(tmp_path):
    """Issue 17 item 5: `ftwatch run -- torchrun ...`: ftwatch's worker is the launcher, which exits
    1 after its summary; the summary's root cause (rank 1, SIGTERM from outside) is the root cause,
    not rank 0's lost-peer error nor the launcher's generic exit."""
    closed = ("[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
              "peer [127.0.0.1]:5033. This is typically caused by a remote worker crashing.")
    script = script_of({(0, 1): [Say(1, "step 1"), Say(2, closed), Say(2.2, "\n".join(SUMMARY)), Exit(2.5, 1)]},
                       default=[Say(1, "step 1"), Exit(10, 0)])
    _, decisions = run(tmp_path, script, command=("torchrun", "--nproc-per-node", "3", "train.py"))
    first = decisions[0]
    assert (first.root_cause.rule_id, first.root_cause.rank) == ("exit.sigterm", 1), first.root_cause
    assert first.action is Action.RESTART_JOB, first.policy_clause
