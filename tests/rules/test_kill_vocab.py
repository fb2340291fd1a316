"""Who killed a process (``kill_vocab.tsv``), and how a spawned child ended: SIGKILL reports are graded
as exit code 137 (retryable, tag ``sigkill``), the memory enforcers that kill are ``oom``; an OOM line
explains a SIGKILL report (``policy/rootcause.py`` rule 8)."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def findings(text: str, t: float = 1.0, instance: str = "job"):
    return ENGINE.feed(Origin(instance, None, "j", "node-1", "stdout", "file"), f"{text}\n".encode(), t,
                       final=True)


@pytest.mark.parametrize("line, rule", [
    ("/usr/local/bin/train.sh: line 18:    41 Killed                  python3 cnn.py --lr 0.001", "shell.job_killed"),
    ("Killed", "shell.killed_foreground"),
    ("[1]+  Killed                  python train.py --cfg a.yaml", "shell.killed_foreground"),
    ("Loading checkpoint shards:  38%|###   | 3/8 [00:02<00:03,  1.28it/s]Killed", "shell.killed_foreground"),
    ("subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGKILL: 9>.",
     "python.subprocess_died_sigkill"),
    # Darwin (macOS) strsignal(3) appends the signal number, and the bash macOS ships prints it
    ("./run.sh: line 142: 41872 Killed: 9               python -m train --config a.yaml", "shell.job_killed"),
    ("Killed: 9", "shell.killed_foreground"),
    ("[1]+  Killed: 9               python train.py --cfg a.yaml", "shell.killed_foreground"),
    (" 75%|#######5  | 15/20 [2:04:12<45:51, 550.22s/it]Killed: 9", "shell.killed_foreground"),
])
def test_a_sigkill_report_is_graded_as_exit_137(line: str, rule: str):
    [f] = findings(line)
    assert f.rule_id == rule
    assert f.failure_class is FailureClass.RETRYABLE_INFRA and f.action is Action.RESTART_JOB


def test_darwins_strsignal_wording_of_a_sigterm_is_the_same_report():
    """macOS's strsignal(3) appends the number ('Terminated: 15'), as bash there prints it."""
    [f] = findings("./entrypoint.sh: line 6:    57 Terminated: 15          python train.py")
    assert (f.rule_id, f.action) == ("shell.job_terminated", Action.RESTART_JOB)


@pytest.mark.parametrize("line", [
    "the object was [Killed]",
    "Killed 3 stale workers",
    "2026-05-14 10:12:55 INFO scheduler: Killed task 12 after timeout",
    # another number after Darwin's 'Killed:' is no SIGKILL's report
    "Killed: 15",
    "./run.sh: line 142: 41872 Killed: 90   python train.py",
    "Process gdb-inferior killed: 9",
])
def test_killed_as_a_word_is_not_a_sigkill_report(line: str):
    assert not [f for f in findings(line) if f.rule_id.startswith("shell.")]


@pytest.mark.parametrize("line, rule", [
    ("slurmstepd: error: StepId=318.0 exceeded memory limit (68719476736 > 64424509440), being killed",
     "slurm.step_memory_limit_kill"),
    ("Aug 27 16:10:19 n3 systemd-oomd[709]: Killed /system.slice/train.service due to memory pressure for "
     "/system.slice being 81.22% > 60.00% for > 20s with reclaim activity", "systemd.oomd_killed"),
    ("  Warning  SystemOOM  3m57s  kubelet  System OOM encountered, victim process: python3, pid: 3103923",
     "k8s.system_oom"),
    ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
     "ray.node_low_memory_kill"),
    ("[2481.702113] oom_reaper: reaped process 20417 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
     "os.oom_reaper"),
])
def test_a_memory_enforcers_kill_is_oom(line: str, rule: str):
    [f] = findings(line)
    assert f.rule_id == rule and f.failure_class is FailureClass.OOM and f.action is Action.FAIL_JOB


def test_a_bash_killed_line_then_the_kernel_oom_line_decides_oom():
    killed = findings("train.sh: line 9:  4242 Killed                  python train.py", 1.0)
    oom = findings("[Sat Nov 21 09:36:03 2026] Out of memory: Killed process 4242 (python) total-vm:412345678kB, "
                   "anon-rss:260123456kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:512000kB oom_score_adj:0",
                   2.0, instance="host")
    an = analyse(killed + oom)
    assert an.root_cause is not None and an.root_cause.failure_class is FailureClass.OOM


@pytest.mark.parametrize("line, rule", [
    ("srun: error: gpu-node-3: tasks 0-3: Killed", "slurm.srun_task_killed"),
    ("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL",
     "torch.mp_spawn_sigkill"),
    ("      Exit Code:    137", "container.exit_code"),
    ("trainer-1  | trainer-1 exited with code 137", "container.exit_code"),
    ("Process finished with exit code 137 (interrupted by signal 9: SIGKILL)", "container.exit_code"),
])
def test_launchers_and_containers_report_a_sigkill(line: str, rule: str):
    [f] = findings(line)
    assert f.rule_id == rule and f.failure_class is FailureClass.RETRYABLE_INFRA


def test_kubernetes_oomkilled_reason_explains_exit_code_137():
    lines = findings("    State:          Terminated\n      Reason:       OOMKilled\n      Exit Code:    137")
    assert {f.rule_id for f in lines} == {"k8s.oom_killed", "container.exit_code"}
    assert analyse(lines).root_cause.rule_id == "k8s.oom_killed"


# --- exit reports (tag exit_report): the line is read as the exit it reports, graded by exit_codes.tsv ---

def test_an_exit_report_is_an_exit_finding_graded_by_the_exit_code_table():
    [f] = findings("mpirun noticed that process rank 3 with PID 48213 on node n3 exited on signal 6 (Aborted).")
    assert f.rule_id == "mpi.process_exited_on_signal" and f.kind == "exit_code"
    assert (f.fields["exitcode"], f.fields["signal"], f.rank) == (134, 6, 3)
    assert (f.failure_class, f.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)   # exit_codes.tsv 134


def test_srun_exit_code_1_is_a_generic_exit_explained_by_the_error_the_task_logged():
    error = findings("RuntimeError: CUDA error: an illegal memory access was encountered", 1.0)
    srun = findings("srun: error: gpu-node-3: task 0: Exited with exit code 1", 2.0)
    assert srun[0].kind == "exit_code" and srun[0].fields["generic"]
    assert analyse(error + srun).root_cause is error[0]


def test_srun_exit_code_1_alone_fails_the_job_as_user_code():
    [f] = findings("srun: error: gpu-node-3: task 0: Exited with exit code 1")
    assert analyse([f]).root_cause is f and (f.failure_class, f.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_a_report_of_exit_0_makes_nothing():
    assert not findings("srun: error: gpu-node-3: task 0: Exited with exit code 0")


@pytest.mark.parametrize("text, expected", [
    ("train.sh: line 9:  4242 Killed                  python train.py", (None, 9, None)),
    ("srun: error: n3: task 2: Segmentation fault (core dumped)", (None, 11, 2)),
    ("      Exit Code:    137", (137, None, None)),
    ("died with <Signals.SIGKILL: 9>.", (None, 9, None)),
    ("Process 2 exit with status code 143.", (143, None, 2)),      # Horovod's gloo runner: rank 2
])
def test_reported_exit_reads_signal_names_strsignal_texts_and_codes(text, expected):
    from ftwatch.rules.exitcodes import reported_exit
    assert reported_exit(text) == expected


def test_a_launchers_exit_1_after_only_fallout_is_fallout():
    # accelerate's CalledProcessError for a worker that the NCCL watchdog ended: nothing but fallout
    # was logged, so the generic exit is fallout too (SPEC R7), not the user_code catch-all
    timeout = findings("[rank1]:[E1121 10:50:03.384 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                       "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                       "Timeout(ms)=600000) ran for 600042 milliseconds before timing out.", 1.0)
    cpe = findings("subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' returned non-zero exit "
                   "status 1.", 2.0)
    assert cpe[0].rule_id == "python.subprocess_exit_status" and cpe[0].fields["generic"]
    an = analyse(timeout + cpe)
    assert an.fallout_only and not an.real


@pytest.mark.parametrize("code, signal, exitcode", [("1", None, 1), ("-6", 6, 134)])
def test_the_deepspeed_launchers_return_code_is_read(code, signal, exitcode):
    [f] = findings("[2026-11-13 16:59:55,650] [ERROR] [launch.py:321:sigkill_handler] ['/opt/conda/bin/python', "
                   f"'-u', 'train.py', '--local_rank=1'] exits with return code = {code}")
    assert f.rule_id == "deepspeed_launcher.worker_exit" and (f.fields["signal"], f.fields["exitcode"]) == (signal,
                                                                                                          exitcode)


@pytest.mark.parametrize("codes, exitcode, generic", [("[139] (likely due to Segmentation Fault)", 139, False),
                                                     ("[0, 1]", 1, True)])
def test_skypilots_return_code_list_is_an_exit_report_of_its_first_nonzero_code(codes, exitcode, generic):
    [f] = findings(f"ERROR: Job 1 failed with return code list: {codes}")
    assert f.rule_id == "skypilot.job_return_codes" and f.kind == "exit_code"
    assert (f.fields["exitcode"], bool(f.fields.get("generic"))) == (exitcode, generic)


@pytest.mark.parametrize("code, generic, failure_class", [
    ("1", True, FailureClass.USER_CODE), ("137", False, FailureClass.RETRYABLE_INFRA)])
def test_pdshs_remote_exit_is_an_exit_report_graded_per_code(code, generic, failure_class):
    # DeepSpeed's multi-node runner (pdsh): ssh passes on the remote command's status (ssh(1))
    [f] = findings(f"pdsh@worker-0: worker-1: ssh exited with exit code {code}")
    assert f.rule_id == "pdsh.remote_exit" and f.kind == "exit_code"
    assert (f.fields["exitcode"], bool(f.fields.get("generic")), f.failure_class) == (int(code), generic,
                                                                                       failure_class)


def test_pdshs_remote_exit_1_after_a_workers_error_is_not_the_root_cause():
    error = findings("RuntimeError: CUDA error: an illegal memory access was encountered", 1.0)
    pdsh = findings("pdsh@worker-0: worker-1: ssh exited with exit code 1", 2.0)
    assert analyse(error + pdsh).root_cause is error[0]


@pytest.mark.parametrize("line, signal, exitcode, failure_class", [
    ("srun: error: gpu-n03: task 24: Aborted (core dumped)", 6, 134, FailureClass.USER_CODE),
    ("srun: error: gpu-n03: tasks 0-3: Hangup", 1, 129, FailureClass.RETRYABLE_INFRA),
    ("srun: error: gpu-n03: task 5: Bus error (core dumped)", 7, 135, FailureClass.USER_CODE),
])
def test_srun_reports_a_tasks_death_by_any_signal_as_that_exit(line, signal, exitcode, failure_class):
    # srun prints strsignal(sig) for every signal, not only SIGKILL (Killed) and SIGSEGV
    [f] = findings(line)
    assert f.rule_id == "slurm.srun_task_signal" and f.kind == "exit_code"
    assert (f.fields["signal"], f.fields["exitcode"], f.failure_class) == (signal, exitcode, failure_class)


def test_srun_aborted_after_only_a_watchdog_timeout_is_not_a_program_bug():
    timeout = findings("[rank1]:[E1121 10:50:03.384 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
                       "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                       "Timeout(ms)=600000) ran for 600042 milliseconds before timing out.", 1.0)
    aborted = findings("srun: error: gpu-n03: task 1: Aborted (core dumped)", 2.0)
    # the watchdog ends the process with SIGABRT: nothing real was logged, so the abort is fallout (SPEC R7)
    an = analyse(timeout + aborted)
    assert an.fallout_only and not an.real


def test_lightnings_sigterm_handler_line_is_a_stop_from_outside():
    """signal_connector.py logs rank_prefixed_message(f"Received SIGTERM: {signum}", local_rank)."""
    [f] = findings("[rank: 0] Received SIGTERM: 15")
    assert f.rule_id == "lightning.received_sigterm"
    assert f.failure_class is FailureClass.RETRYABLE_INFRA and f.action is Action.RESTART_JOB


def test_the_sigterm_exception_lightnings_loops_raise_is_the_signals_fallout():
    """utilities/exceptions.py: SIGTERMException(SystemExit) is raised by the loops after a SIGTERM; with the
    handler's line before it the signal is the root cause: restart, not the catch-all's fail_job."""
    text = "\n".join(["[rank: 0] Received SIGTERM: 15", "Traceback (most recent call last):",
                      '  File "/app/train.py", line 140, in <module>', "    trainer.fit(model)",
                      '  File "/usr/lib/python3.11/site-packages/lightning/pytorch/loops/fit_loop.py", line 476, '
                      "in on_advance_end", "    raise SIGTERMException",
                      "lightning.pytorch.utilities.exceptions.SIGTERMException"])
    found = findings(text)
    exc = [f for f in found if "SIGTERMException" in f.line and f.rule_id != "lightning.received_sigterm"]
    assert exc and all(f.failure_class is FailureClass.FALLOUT for f in exc), [(f.rule_id, f.failure_class) for f in found]
    rc = analyse(found, world=1).root_cause
    assert rc is not None and rc.rule_id == "lightning.received_sigterm", rc
    assert rc.action is Action.RESTART_JOB


def test_a_spawned_childs_own_nonzero_exit_is_the_programs_decision():
    """torch.multiprocessing.spawn's _wrap turns an uncaught exception into ProcessRaisedException: an
    'exit code N' report is the child's own sys.exit(N), which a restart repeats."""
    [f] = findings("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 1")
    assert f.rule_id == "torch.mp_spawn_child_exit"
    assert f.failure_class is FailureClass.USER_CODE and f.action is Action.FAIL_JOB
    rc = analyse([f]).root_cause
    assert rc is not None and rc.action is Action.FAIL_JOB


@pytest.mark.parametrize("line", [
    "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL",
    "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 0",
])
def test_a_spawned_childs_signal_or_clean_exit_is_no_own_nonzero_exit(line: str):
    assert not [f for f in findings(line) if f.rule_id == "torch.mp_spawn_child_exit"]


def test_horovods_runner_report_of_a_sigterm_exit_is_a_retryable_exit_of_that_rank():
    """horovod/runner/gloo_run.py prints ``Process {rank} exit with status code {ec}.`` per worker
    that exited nonzero: 143 is SIGTERM (exit_codes.tsv), the stop came from outside."""
    [f] = findings("Process 2 exit with status code 143.")
    assert f.kind == "exit_code" and f.rank == 2
    assert (f.failure_class, f.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


@pytest.mark.parametrize("line", [
    "  traceback : Signal 7 (SIGBUS) received by PID 4121",
    "[2024-03-26 02:13:01,120] [ERROR] [training.py:1013:_invoke_run] The worker fails with {0: ProcessFailure("
    "local_rank=0, pid=54, exitcode=-7, error_file='<N/A>', error_file_data={'message': '<NONE>'}, "
    "message='Signal 7 (SIGBUS) received by PID 54', timestamp=1711419181)}",
])
def test_torchelastics_own_message_for_a_worker_a_bus_error_ended_is_that_death(line: str):
    """torchelastic's ProcessFailure says ``Signal {-exitcode} ({name}) received by PID {pid}`` for a
    worker a signal ended: its summary's traceback field and DLRover's repr of the failure print it."""
    found = [f for f in findings(line) if f.rule_id == "process.fatal_signal_report"]
    assert found and found[0].failure_class is FailureClass.USER_CODE


def test_torchelastics_message_for_a_sigterm_is_no_fatal_signal_report():
    assert not [f for f in findings("  traceback : Signal 15 (SIGTERM) received by PID 4121")
                if f.rule_id == "process.fatal_signal_report"]


@pytest.mark.parametrize("line, rule, exitcode", [
    ("F1224 22:32:45.210337   31904 real_program_continuator.cc:1331] Halt is unexpected",
     "process.glog_fatal_report", 134),
    ("2024-01-01 10:00:00.123456: F tensorflow/core/kernels/x.cc:12] Unexpected state", "process.glog_fatal_report",
     134),
    ("*** Check failure stack trace: ***", "process.glog_fatal_report", 134),
    ("panic: runtime error: invalid memory address or nil pointer dereference", "process.go_panic_report", 2),
    ("fatal error: all goroutines are asleep - deadlock!", "process.go_panic_report", 2),
    ("thread 'main' panicked at src/bin/worker.rs:88:14:", "process.rust_main_panic_report", 101),
])
def test_a_runtimes_own_crash_report_is_the_exit_it_ends_the_process_with(line, rule, exitcode):
    """glog's LOG(FATAL) aborts (134), Go's runtime exits 2 after a
    panic or a fatal error, Rust's std exits 101 when the main thread panics."""
    [f] = findings(line)
    assert f.rule_id == rule and f.kind == "exit_code" and f.fields["exitcode"] == exitcode
    assert f.failure_class is FailureClass.USER_CODE


@pytest.mark.parametrize("line", [
    "thread '<unnamed>' panicked at src/lib.rs:3:9:",       # another thread's panic ends only that thread
    "E1224 22:32:45.210337   31904 real_program_continuator.cc:1331] Halt is unexpected",
    "INFO don't panic: the job resumes from its last checkpoint",
    "fatal error: cuda_runtime.h: No such file or directory",   # a compiler's, not Go's runtime
])
def test_lines_that_only_look_like_a_crash_report_are_none(line):
    assert not [f for f in findings(line) if f.rule_id.startswith("process.") and f.rule_id.endswith("_report")]


def test_a_crash_reports_message_decides_over_the_report_itself():
    """The crash-report rules carry priority -1: a rule on the same line's message wins (a CUDA error
    on a glog fatal line is that CUDA error)."""
    [f] = findings("F0312 10:01:55.123456 12345 syncedmem.cpp:71] Check failed: error == cudaSuccess (2 vs. 0)  "
                   "out of memory")
    assert f.failure_class is FailureClass.OOM


def test_a_log_that_ends_in_a_go_panic_is_a_failed_process():
    fs = findings("step 10 loss 2.31\npanic: runtime error: index out of range [17] with length 16\n\n"
                  "goroutine 1 [running]:\nmain.main()\n")
    rc = analyse(fs).root_cause
    assert rc is not None and rc.action is Action.FAIL_JOB


@pytest.mark.parametrize("line", [
    "run.pl: job failed, log is in exp/nnet3/lstm_sp/log/train.216.2.log",
    "queue.pl: 3 / 16 failed, log is in exp/make_mfcc/train/make_mfcc_train.*.log",
])
def test_a_kaldi_launchers_failure_report_is_its_exit_1(line):
    """Kaldi's run.pl / queue.pl / slurm.pl print '<launcher>: job failed, log is in <log>' and exit 1."""
    [f] = findings(line)
    assert f.rule_id == "kaldi.launcher_job_failed" and f.kind == "exit_code" and f.fields["exitcode"] == 1


def test_kaldis_retry_of_a_failed_job_is_no_failure_report():
    assert not findings("retry.pl: job failed; renaming log file to exp/log/train.0.1.log.bak and rerunning")


def test_an_r_script_halted_on_an_error_is_its_exit_1_and_fails_the_job():
    """R run non-interactively prints 'Execution halted' after an uncaught error and quits with
    status 1 (R src/main/main.c check_session_exit): a generic exit, so the job failed."""
    [f] = findings("Execution halted")
    assert f.rule_id == "r.execution_halted" and f.kind == "exit_code" and f.fields["exitcode"] == 1
    fs = findings("fitting on rows 1..2561\nError in resolve_data(x, y) : \n"
                  "  Error: found missing values in the predictor data frame\nExecution halted\n")
    rc = analyse(fs).root_cause
    assert rc is not None and rc.action is Action.FAIL_JOB


def test_a_line_that_only_mentions_a_halt_is_no_exit_report():
    assert not findings("Execution halted at step 3; resuming from checkpoint")


@pytest.mark.parametrize(("line", "code"), [
    ("Trial 83 (Experiment 89) was terminated: allocation failed: resources failed with non-zero exit code: "
     "container failed with non-zero exit code: 1 (exit code 1)", 1),
    ("ERROR: crashed: resources failed with non-zero exit code: container failed with non-zero exit code: 137 "
     "(exit code 137)", 137),
])
def test_determineds_container_failure_is_the_trials_exit(line, code):
    """Determined's master formats a container failure as '<type>: <message> (exit code N)'
    (master/pkg/aproto/exit.go ContainerFailureError.Error)."""
    [f] = findings(line)
    assert f.rule_id == "determined.container_exit" and f.kind == "exit_code" and f.fields["exitcode"] == code


def test_a_retried_container_failure_line_is_no_determined_exit_report():
    assert not [f for f in findings("container failed with non-zero exit code: 1 (exit code 1) on attempt 1 "
                                    "of 3, retrying") if f.rule_id == "determined.container_exit"]


@pytest.mark.parametrize("line", [
    "free(): invalid pointer",
    "double free or corruption (!prev)",
    "*** Error in `python3': double free or corruption (out): 0x00007f2c9c0a1e40 ***",
    "malloc(): corrupted top size",
    "[rank3]:corrupted size vs. prev_size",
    "*** stack smashing detected ***: terminated",
])
def test_glibcs_heap_and_stack_checks_abort_the_process(line):
    """glibc's malloc_printerr and __fortify_fail print their check's text, then abort(): exit 134."""
    [f] = findings(line)
    assert f.rule_id == "process.glibc_abort_report" and f.kind == "exit_code" and f.fields["signal"] == 6


@pytest.mark.parametrize("line", [
    "# run under MALLOC_CHECK_=3 to catch a double free or corruption early",
    "warning: the free(): call site was inlined",
])
def test_words_about_heap_checks_are_no_abort(line):
    assert not [f for f in findings(line) if f.rule_id == "process.glibc_abort_report"]


def test_cpythons_own_fatal_error_is_an_abort():
    """Py_FatalError prints 'Fatal Python error: ...' and calls abort() (C API docs, Process Control)."""
    [f] = findings("Fatal Python error: PyThreadState_Get: the function must be called with the GIL held")
    assert f.rule_id == "process.python_fatal_error_report" and f.kind == "exit_code" and f.fields["signal"] == 6


@pytest.mark.parametrize("line, rule, signal", [
    ("Fatal Python error: Bus error", "process.fatal_signal_report", 7),
    ("Fatal Python error: Aborted", "process.abort_report", 6),
])
def test_faulthandlers_signal_reports_keep_their_signal(line, rule, signal):
    [f] = findings(line)
    assert f.rule_id == rule and f.fields["signal"] == signal


@pytest.mark.parametrize("line, rule, failure_class", [
    ("21/06/14 10:22:41 ERROR ApplicationMaster: User class threw exception: java.lang.IllegalArgumentException: "
     "requirement failed", "spark.user_class_exception", FailureClass.USER_CODE),
    ("ERROR ApplicationMaster: User class threw exception: java.lang.OutOfMemoryError: Java heap space",
     "jvm.out_of_memory", FailureClass.OOM),
])
def test_sparks_application_master_reports_the_user_mains_exception(line, rule, failure_class):
    """In YARN cluster mode Spark's ApplicationMaster logs 'User class threw exception: <cause>' when the
    program's main throws; a rule on the exception itself decides."""
    [f] = findings(line)
    assert f.rule_id == rule and f.failure_class is failure_class


@pytest.mark.parametrize("line", [
    "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD",
    "[1,3]<stderr>:MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD with errorcode 1.",
    "Abort(1) on node 0 (rank 0 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1) - process 0",
])
def test_a_programs_mpi_abort_is_a_failed_job(line):
    """Open MPI's and MPICH's reports that the program called MPI_Abort: the launcher kills every rank
    and exits with the errorcode; read as the generic exit 1, a weak exit."""
    [f] = findings(line)
    assert f.rule_id == "mpi.abort_invoked" and f.kind == "exit_code" and f.fields["exitcode"] == 1


@pytest.mark.parametrize("line", [
    "Abort(0) on node 0 (rank 0 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 0) - process 0",
    "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD with errorcode 0.",
])
def test_an_mpi_abort_with_errorcode_zero_is_no_failure(line):
    """MPI 4.1 section 11.2.2: the errorcode of MPI_Abort becomes the launcher's exit status, so a
    program that aborts with errorcode 0 asks for a successful exit (a deliberate stop): no crash
    report. The nonzero forms above stay failures."""
    assert [f for f in findings(line) if f.rule_id == "mpi.abort_invoked"] == []


def test_a_real_error_before_mpi_abort_explains_it():
    fs = findings("[1,0]<stderr>:RuntimeError: CUDA error: out of memory\n"
                  "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD")
    assert analyse(fs).root_cause.failure_class is FailureClass.OOM


@pytest.mark.parametrize("line, signal", [
    ("Trace/breakpoint trap (core dumped)", 5),
    ("./run.sh: line 5:  1234 Bad system call         (core dumped) python train.py", 31),
    ("File size limit exceeded (core dumped)", 25),
])
def test_a_shells_report_of_sigtrap_sigsys_or_sigxfsz_is_that_death(line, signal):
    """bash prints strsignal(3)'s text for any fatal signal: SIGTRAP, SIGSYS (a seccomp refusal) and
    SIGXFSZ (the file-size ulimit) end the process as the other fatal signals do."""
    [f] = findings(line)
    assert f.rule_id == "process.fatal_signal_report" and f.fields["signal"] == signal
    assert f.failure_class is FailureClass.USER_CODE


@pytest.mark.parametrize("sig", ["SIGBUS", "SIGILL", "SIGFPE"])
def test_a_spawned_childs_death_by_its_own_fatal_signal_is_graded_as_the_exit_it_makes(sig: str):
    """spawn.py's ProcessExitedException names the signal: graded as the shell's 128+N exit (the
    exit-code table), as bash's, srun's and faulthandler's reports of the same death are."""
    [f] = findings(f"torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal {sig}")
    assert f.rule_id == "torch.mp_spawn_fatal_signal"
    assert f.kind == "exit_code" and f.failure_class is FailureClass.USER_CODE and f.action is Action.FAIL_JOB


def test_a_spawned_childs_bus_error_alone_fails_the_job_and_a_sigkill_stays_retryable():
    rc = analyse(findings("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal "
                          "SIGBUS")).root_cause
    assert rc is not None and rc.action is Action.FAIL_JOB
    [k] = findings("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL")
    assert k.rule_id == "torch.mp_spawn_sigkill" and k.action is Action.RESTART_JOB
