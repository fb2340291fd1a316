"""Errors the job outlives (issue 12 item 3, part A): ``ftwatch.policy.progress`` and the desk's
held incidents (``ftwatch.pipeline.incidents.IncidentDesk``), driven by hand with a FakeClock."""

from __future__ import annotations

import io
from pathlib import Path

from ftwatch.bounded import EVICTIONS
from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Origin, ProcessExit, Severity
from ftwatch.pipeline.build import build_engine, build_policy, build_rules
from ftwatch.pipeline.incidents import IncidentDesk
from ftwatch.pipeline.recorder import Recorder
from ftwatch.policy import progress
from ftwatch.policy.catchsite import catch_site
from ftwatch.policy.triggers import fatal, may_survive, sticky_rules
from ftwatch.testing import T0, CaptureSink, FakeClock, finding

JOB = "progress-test"
REFUSED = (b"Traceback (most recent call last):\n"
           b"  File \"/opt/conda/lib/python3.10/site-packages/urllib3/connection.py\", line 174, in _new_conn\n"
           b"ConnectionRefusedError: [Errno 111] Connection refused\n")
#: a traceback printed by a handler inside the program (its first frame a function), which may go on
KEYERROR = b"Traceback (most recent call last):\n  File \"train.py\", line 3, in load_config\nKeyError: 'lr'\n"
#: the same exception unwinding the main program: printed as the program ends, never outlived
UNCAUGHT = b"Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nKeyError: 'lr'\n"
STICKY = b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
ALIVE = b"Could not connect to the plotting server, going on without it\n"


def worker(rank: int) -> Origin:
    return Origin(f"worker-{rank}", rank, JOB, "node-a", "stderr", "process")


def desk(tmp_path: Path, exits: bool, settle: float = 5.0, survive: float = progress.SURVIVE_SECONDS,
         limits: dict | None = None):
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}, "limits": limits or {}}
                                   ).with_policy(enable_job_restart=True)
    sink = CaptureSink()
    recorder = Recorder(sink, out=io.StringIO(), resolve_after=None)
    d = IncidentDesk(JOB, build_engine(config), build_policy(config, JOB), recorder, exits=exits, settle=settle,
                     summaries=None if exits else "live", survive=survive, limits=config.limits)
    d.new_attempt(T0, world_size=2 if exits else None)
    return d, sink


def step(n: int) -> bytes:
    return f"epoch 3 step {n} loss 0.{n:03d}\n".encode()


# -- the vocabulary and the reading ----------------------------------------------------------------

def test_progress_lines_are_dated_like_hit_lines_and_carry_their_counter():
    data = (b"[rank1]: 2026-11-21 10:00:00,000 step 5/12 loss 0.4\n"
            b"Epoch 0:  45%|####5     | 45/100 [00:10<00:12,  4.50it/s]\n"
            b"nothing here\n"
            b" iteration       10/     100 | elapsed time per iteration (ms): 1234.5\n"
            b"{'loss': 0.12, 'learning_rate': 1e-05, 'epoch': 0.5}\n"
            b"RuntimeError: failed at step 4\n")
    got = list(progress.marks(data, T0, 0.001, 2026))
    stamp = got[0][1]
    assert [(r, c) for r, _, c in got] == [
        (1, {"step_plain": 5}), (None, {"step_tqdm_its": 45, "epoch": 0}),
        (None, {"step_megatron": 10, "iteration": 10}), (None, {"epoch": 0})]
    assert [round(t - stamp, 3) for _, t, _ in got] == [0.0, 0.001, 0.003, 0.004]   # lines after the stamp


def test_two_progress_lines_after_an_error_outlive_it_within_the_window_only():
    err = finding("python.exception.ECONNREFUSED", time=T0 + 10, rank=1)
    s = progress.Survival(window=60, needed=2)
    s.wait(err)
    assert s.progress("worker-1", T0 + 5, {"step_plain": 7}) == []        # before it: the counter so far
    assert s.progress("worker-0", T0 + 11, {"step_plain": 8}) == []       # another rank's progress
    assert s.progress("worker-1", T0 + 11, {"step_plain": 8}) == []
    assert s.progress("worker-1", T0 + 12, {"step_plain": 9}) == [err] and not s
    late = finding("python.exception.ECONNREFUSED", time=T0 + 10, rank=1)
    s.wait(late)
    assert s.progress("worker-1", T0 + 71, {"step_plain": 9}) == [] and not s    # past the window: it stands


def test_a_counter_that_went_back_is_a_restart_which_does_not_outlive_the_error():
    err = finding("python.key_error", time=T0 + 10, rank=1, failure_class=FailureClass.USER_CODE)
    s = progress.Survival(window=60, needed=2)
    s.wait(err)
    s.progress("worker-1", T0 + 9, {"step_plain": 5})
    assert s.progress("worker-1", T0 + 11, {"step_plain": 1}) == [] and not s


def test_fatal_findings_are_graded_by_the_catalogs():
    sticky = sticky_rules(build_rules(Config()))
    assert "cuda.illegal_memory_access" in sticky                  # cuda_errors.tsv: sticky = yes
    assert fatal(finding("xid.79", kind="fault_code", action=Action.ISOLATE_NODE,
                         failure_class=FailureClass.HARDWARE_NODE))
    assert fatal(finding("cuda.illegal_memory_access", failure_class=FailureClass.USER_CODE,
                         action=Action.FAIL_JOB), sticky)
    assert fatal(finding("exit.1", kind="exit_code")) and fatal(finding("torch_elastic.child_failed"))
    assert fatal(finding("x", severity=Severity.CRITICAL))
    keyerror = finding("python.key_error", failure_class=FailureClass.USER_CODE, action=Action.FAIL_JOB)
    assert not fatal(keyerror, sticky) and may_survive(keyerror, sticky)
    assert not may_survive(finding("gloo.connection_closed_by_peer", failure_class=FailureClass.FALLOUT))
    assert not may_survive(finding("x", severity=Severity.WARNING))


def test_notices_past_the_cap_are_forgotten_counted_and_never_evidence_again(tmp_path):
    """Issue 17: a job that outlives an error every few seconds for weeks kept every notice."""
    clock = FakeClock()
    d, sink = desk(tmp_path, exits=False, limits={"max_notices_per_job": 4})
    before = EVICTIONS.get("notice")
    n = 0
    for i in range(10):
        d.output(worker(1), REFUSED, clock.time(), clock.mono())
        for _ in range(2):
            clock.advance(1)
            n += 1
            d.output(worker(1), step(n), clock.time(), clock.mono())
        assert d.open is None
    assert len(d.notices) <= 4 and EVICTIONS.get("notice") - before == 10 - len(d.notices)
    assert d.evidence() == [f for f in d.findings if f.severity < Severity.ERROR]   # no error came back
    assert [e.kind for e in sink.events].count("notice") == 10                     # every one stored
    assert len(d.survival._ids) == len(d.notices)


# -- the desk -------------------------------------------------------------------------------------

def test_without_exits_an_error_the_rank_outlives_is_dropped_as_a_notice(tmp_path):
    clock = FakeClock()
    d, sink = desk(tmp_path, exits=False)
    d.output(worker(1), step(10), clock.time(), clock.mono())
    opener = d.output(worker(1), REFUSED, clock.time(), clock.mono())
    assert opener is not None and d.open is opener
    clock.advance(1)
    d.output(worker(1), ALIVE, clock.time(), clock.mono())             # it lives on: wait for its progress
    clock.advance(5)
    assert d.tick(clock.time(), clock.mono()) is None                   # held past settle
    d.output(worker(0), step(11) + step(12), clock.time(), clock.mono())     # another rank: no matter
    assert d.open is opener
    d.output(worker(1), step(11), clock.time(), clock.mono())
    clock.advance(10)
    d.output(worker(1), step(12), clock.time(), clock.mono())
    assert d.open is None and d.notices == [opener] and d.evidence() == []
    assert opener in d.findings                                         # still this attempt's record
    assert [e.kind for e in sink.events if e.kind == "notice"] == ["notice"]
    clock.advance(600)
    assert d.tick(clock.time(), clock.mono()) is None
    assert d.close(clock.time()) is None                                # the job ended by itself


def test_a_held_error_nobody_outlives_is_due_when_its_window_ends(tmp_path):
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False, survive=60.0)
    opener = d.output(worker(1), KEYERROR, clock.time(), clock.mono())
    d.output(worker(1), ALIVE, clock.time(), clock.mono())
    clock.advance(59)
    assert d.tick(clock.time(), clock.mono()) is None
    clock.advance(1.1)
    assert d.tick(clock.time(), clock.mono()) is opener
    decision = d.decide(None, clock.time(), clock.mono())
    assert (decision.action, decision.root_cause.rule_id) == (Action.FAIL_JOB, "python.key_error")


def test_a_traceback_that_unwound_the_main_program_is_never_held(tmp_path):
    """Python prints it as the program ends: the desk does not wait for progress after it, it is
    due after settle like a fatal line (``catchsite.ended_program``)."""
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False, survive=60.0)
    opener = d.output(worker(1), UNCAUGHT, clock.time(), clock.mono())
    d.output(worker(1), step(41) + step(42), clock.time(), clock.mono())     # flushed at exit: no progress
    clock.advance(5.1)
    assert d.tick(clock.time(), clock.mono()) is opener
    assert d.notices == []


def test_a_fatal_line_is_never_held_and_decides_a_held_incident_after_settle(tmp_path):
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False)
    sticky = d.output(worker(0), STICKY, clock.time(), clock.mono())
    assert sticky.rule_id == "cuda.illegal_memory_access"
    clock.advance(5.1)
    assert d.tick(clock.time(), clock.mono()) is sticky                 # not held: due after settle

    d2, _ = desk(tmp_path / "2", exits=False)
    held = d2.output(worker(1), KEYERROR, clock.time(), clock.mono())
    d2.output(worker(1), ALIVE, clock.time(), clock.mono())
    clock.advance(30)
    assert d2.tick(clock.time(), clock.mono()) is None
    d2.output(worker(0), STICKY, clock.time(), clock.mono())            # joins: settle from now on
    clock.advance(4.9)
    assert d2.tick(clock.time(), clock.mono()) is None
    clock.advance(0.2)
    assert d2.tick(clock.time(), clock.mono()) is held


def test_under_run_an_outlived_traceback_is_not_the_root_cause_of_a_later_exit(tmp_path):
    """``run`` decides on exits; a KeyError the rank caught and trained on from is no root cause
    of its later SIGKILL (which is retryable, while the KeyError would fail the job)."""
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=True, settle=1.0)
    for rank in (0, 1):
        d.started(worker(rank), clock.time())
    d.output(worker(1), step(10), clock.time(), clock.mono())
    assert d.output(worker(1), KEYERROR, clock.time(), clock.mono()) is None
    for n in (11, 12):
        clock.advance(5)
        d.output(worker(1), step(n), clock.time(), clock.mono())
    assert [f.rule_id for f in d.notices] == ["python.key_error"]
    clock.advance(60)
    trigger = d.exited(ProcessExit(worker(1), 4121, None, 9, clock.time()), clock.mono())
    decision = d.decide(trigger, clock.time(), clock.mono())
    assert (decision.action, decision.root_cause.rule_id) == (Action.RESTART_JOB, "exit.sigkill")


def test_a_restarted_counter_does_not_outlive_the_error(tmp_path):
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False, settle=0.0)
    opener = d.output(worker(1), step(40) + KEYERROR, clock.time(), clock.mono())
    for n in (1, 2, 3):
        clock.advance(5)
        d.output(worker(1), step(n), clock.time(), clock.mono())
    assert d.notices == [] and d.open is opener


def test_the_traceback_of_an_exception_python_ignored_is_a_notice(tmp_path):
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False)
    data = (b"Exception ignored in: <bound method BaseSession.__del__ of <Session object at 0x7f3e11c8a8d0>>\n"
            b"Traceback (most recent call last):\n"
            b"  File \"/usr/lib/python3/dist-packages/tensorflow/python/client/session.py\", line 738, in __del__\n"
            b"TypeError: 'NoneType' object is not callable\n")
    assert d.output(worker(0), data, clock.time(), clock.mono(), final=True) is None
    assert d.open is None and [f.rule_id for f in d.notices] == ["python.type_error"]
    assert d.close(clock.time()) is None


def test_an_error_its_instance_prints_nothing_after_is_due_after_settle(tmp_path):
    """A dying process prints nothing after its traceback: the held incident is due as any other."""
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False)
    opener = d.output(worker(1), KEYERROR, clock.time(), clock.mono())
    d.output(worker(0), ALIVE, clock.time(), clock.mono())              # another rank's output: no matter
    clock.advance(5.1)
    assert d.tick(clock.time(), clock.mono()) is opener


def _replay(tmp_path: Path, lines: list[bytes]):
    from ftwatch.pipeline.replay import replay
    from ftwatch.policy.budgets import BudgetStore
    config = Config.model_validate({"storage": {"state_dir": str(tmp_path)}}).with_policy(enable_job_restart=True)
    path = tmp_path / "train.log"
    path.write_bytes(b"".join(lines))
    policy = build_policy(config, JOB, BudgetStore(tmp_path / "b.json", JOB), state_dir=tmp_path, in_memory=True)
    return replay([path], build_engine(config), policy, JOB)


def test_replay_a_traceback_printed_every_epoch_while_epochs_go_on_is_left_alone(tmp_path):
    """A plotting client's caught connection error each epoch (the same code replay and evaluate
    run): the epochs after each traceback outlive it, the run needs no action."""
    epoch = [REFUSED] + [f"(epoch: {{e}}, iters: {i}, time: 0.25) loss: 0.3\n".encode() for i in (400, 800, 1200)]
    lines = [line.replace(b"{e}", str(e).encode()) for e in (1, 2, 3) for line in epoch]
    result = _replay(tmp_path, lines)
    assert result.decision.action is Action.NONE and result.decision.root_cause is None
    assert [f.rule_id for f in result.findings].count("python.exception.ECONNREFUSED") == 3


def test_replay_the_same_traceback_as_the_logs_last_words_still_decides(tmp_path):
    lines = [f"(epoch: 1, iters: {i}, time: 0.25) loss: 0.3\n".encode() for i in (400, 800)] + [REFUSED]
    result = _replay(tmp_path, lines)
    assert result.decision.action is Action.RESTART_JOB
    assert result.decision.root_cause.rule_id == "python.exception.ECONNREFUSED"


def test_a_per_epoch_count_restarting_with_the_next_epoch_is_no_restart():
    assert not progress.went_back({"epoch": 2, "iteration": 1200}, {"epoch": 3, "iteration": 400})
    assert progress.went_back({"epoch": 2, "iteration": 1200}, {"epoch": 1, "iteration": 1300})
    assert progress.went_back({"epoch": 2, "iteration": 1200}, {"epoch": 2, "iteration": 400})
    assert progress.went_back({"step_plain": 40}, {"step_plain": 1, "epoch": 3})


# -- the same traceback, caught at the same frame, again (Survival.repeat) -------------------------

def test_a_tracebacks_catch_site_is_its_frames_unless_it_starts_at_the_programs_entry():
    refused = finding("python.exception.ECONNREFUSED", evidence=tuple(REFUSED.decode().splitlines()))
    assert catch_site(refused) == ("python.exception.ECONNREFUSED", (
        ("/opt/conda/lib/python3.10/site-packages/urllib3/connection.py", "174", "_new_conn"),))
    for entry in ("<module>", "_run_module_as_main", "_bootstrap_inner"):     # it may have ended the program
        lines = ("Traceback (most recent call last):", f'  File "train.py", line 3, in {entry}', "KeyError: 'lr'")
        assert catch_site(finding("python.key_error", evidence=lines)) is None
    assert catch_site(finding("python.exception.ECONNREFUSED", evidence=("ConnectionRefusedError",))) is None


def test_live_the_same_traceback_again_after_its_instance_outlived_it_is_a_notice_at_once(tmp_path):
    clock = FakeClock()
    d, sink = desk(tmp_path, exits=False)
    first = d.output(worker(1), REFUSED, clock.time(), clock.mono())
    clock.advance(1)
    d.output(worker(1), step(11) + step(12), clock.time(), clock.mono())
    assert d.open is None and d.notices == [first]
    clock.advance(60)
    assert d.output(worker(1), REFUSED, clock.time(), clock.mono()) is None     # no new wait, no incident
    assert d.open is None and len(d.notices) == 2
    assert d.output(worker(0), REFUSED, clock.time(), clock.mono()) is not None   # another rank never outlived it


def test_replay_the_same_traceback_after_one_it_outlived_is_a_notice_even_as_the_last_words(tmp_path):
    """A plotting client's traceback each epoch, the last one followed by a single line: before,
    the last waited for two progress lines and decided a restart; the handler that printed it had
    caught the same exception at the same frame before, and the program went on then."""
    epoch = [b"(epoch: {e}, iters: 400, time: 0.25) loss: 0.3\n", b"(epoch: {e}, iters: 800, time: 0.25) loss: 0.3\n",
             REFUSED]
    lines = [line.replace(b"{e}", str(e).encode()) for e in (1, 2) for line in epoch]
    result = _replay(tmp_path, lines + [b"saving the model, epoch 2 done\n"])
    assert result.decision.action is Action.NONE and result.decision.root_cause is None
    other = REFUSED.replace(b"line 174, in _new_conn", b"line 98, in create_connection")    # another handler
    result = _replay(tmp_path, lines + [other, b"saving the model, epoch 2 done\n"])
    assert result.decision.action is Action.RESTART_JOB


# -- a traceback caught by a library handler that goes on (catchsite.GOING_ON) ---------------------

PROBE = (b"Traceback (most recent call last):\n"
         b"  File \"/usr/lib/python3/dist-packages/allennlp/common/util.py\", line 378, in gpu_memory_mb\n"
         b"    encoding='utf-8')\n"
         b"  File \"/usr/lib/python3.8/subprocess.py\", line 415, in check_output\n"
         b"    **kwargs).stdout\n"
         b"subprocess.CalledProcessError: Command '['nvidia-smi', '--query-gpu=memory.used', "
         b"'--format=csv,nounits,noheader']' returned non-zero exit status 9.\n")


def test_a_traceback_caught_at_a_handler_that_goes_on_is_known_by_its_first_frame():
    from ftwatch.policy.catchsite import going_on
    probe = finding("python.subprocess_exit_status", evidence=tuple(PROBE.decode().splitlines()))
    assert going_on(probe) == "gpu_memory_mb"
    windows = ("Traceback (most recent call last):",
               r'  File "D:\env\lib\site-packages\autogluon\core\trainer\abstract_trainer.py", line 1422, in _train_and_save',
               "AttributeError: 'NoneType' object has no attribute '_user_params_aux'")
    assert going_on(finding("python.attribute_error", evidence=windows)) == "_train_and_save"
    # the same function name in another file is not the handler the table names; nor a frame below the first
    other = (windows[0], '  File "mytrainer.py", line 9, in _train_and_save', windows[2])
    assert going_on(finding("python.attribute_error", evidence=other)) is None
    deeper = (PROBE.decode().splitlines()[0], '  File "train.py", line 3, in main') + tuple(PROBE.decode().splitlines()[1:])
    assert going_on(finding("python.subprocess_exit_status", evidence=deeper)) is None


def test_replay_a_traceback_a_library_handler_caught_and_went_on_from_is_no_failure(tmp_path):
    """AllenNLP's GPU-memory probe logs nvidia-smi's failure and returns: the subprocess's exit
    status in the traceback is no exit of the job (before: fail_job on python.subprocess_exit_status)."""
    lines = [b"2021-08-18 09:42:40,512 - INFO - allennlp.training.trainer - Epoch 0/39\n", PROBE,
             b"2021-08-18 09:42:41,987 - INFO - allennlp.training.trainer - Training\n"]
    result = _replay(tmp_path, lines)
    assert result.decision.action is Action.NONE and result.decision.root_cause is None
    # the same exception raised through the program's entry still decides
    entry = PROBE.replace(b"Traceback (most recent call last):\n",
                          b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n")
    result = _replay(tmp_path, lines[:1] + [entry])
    assert result.decision.action is not Action.NONE


def test_snake_case_loss_lines_are_progress():
    """``total_loss: 5.81`` (a snake_case metric name) is a loss figure as ``loss: 5.81`` is."""
    for line in (b"training_step: 2, total_loss: 5.7934\n", b"Epoch 1/10 - 3s - val_loss: 0.5210\n",
                 b"loss: 0.31\n"):
        assert progress.PROGRESS.search(line), line
    for line in (b"lossy compression 0.5\n", b"loss_scale: 1024.0\n", b"total_loss: inf\n"):
        assert not progress.PROGRESS.search(line), line


def test_replay_a_traceback_followed_by_snake_case_loss_lines_is_outlived(tmp_path):
    """A traceback the program caught (its first frame a function) and then ``total_loss`` lines
    (before: fail_job on python.type_error, the lines were no progress). One that unwound the main
    program is never outlived (``catchsite.ended_program``), even where its threads train on."""
    tb = (b"Traceback (most recent call last):\n  File \"learner.py\", line 392, in start_actors\n"
          b"    coord.join(thread_data)\nTypeError: 'Thread' object is not iterable\n")
    lines = [tb] + [f"training_step: {n}, total_loss: 5.8{n}\n".encode() for n in (1, 2, 3)]
    result = _replay(tmp_path, lines)
    assert result.decision.action is Action.NONE and result.decision.root_cause is None
    assert _replay(tmp_path, [tb]).decision.action is not Action.NONE


# -- Open MPI's MPI_ABORT report with its errorcode 0 wrapped onto the next line -------------------

ABORT = (b"--------------------------------------------------------------------------\n"
         b"MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n"
         b"with errorcode {code}.\n\n"
         b"NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n"
         b"You may or may not see output from other processes, depending on\n"
         b"exactly when Open MPI kills them.\n"
         b"--------------------------------------------------------------------------\n")


def test_replay_an_mpi_abort_with_errorcode_zero_is_the_programs_own_stop(tmp_path):
    """FedML's server ends its MPI job with MPI_Abort(0) after the last round (before: fail_job on
    mpi.abort_invoked, whose one-line pattern cannot see the wrapped errorcode)."""
    lines = [b"INFO:root:{'test_acc': 0.8929, 'test_loss': 0.4412}\n", b"INFO:root:__finish server\n"]
    result = _replay(tmp_path, lines + [ABORT.replace(b"{code}", b"0")])
    assert result.decision.action is Action.NONE and result.decision.root_cause is None
    failed = _replay(tmp_path, lines + [ABORT.replace(b"{code}", b"1")])
    assert failed.decision.action is not Action.NONE
    assert failed.decision.root_cause.rule_id == "mpi.abort_invoked"


def test_only_the_errorcode_line_right_after_the_abort_report_reads_it():
    report = finding("mpi.abort_invoked")
    zero = finding("mpi.abort_errorcode_zero")
    assert progress.abort_zero(report, zero)
    assert not progress.abort_zero(None, zero) and not progress.abort_zero(finding("python.key_error"), zero)
    assert not progress.abort_zero(report, finding("python.key_error"))


#: recorded on an H200 (tests/golden/gpu_nccl_init_oom, ``ftwatch run``): NCCL could not allocate a
#: new communicator's buffers with the GPU's memory full; torch raised on standard error at once,
#: while the step lines printed before, and NCCL's own WARN naming the CUDA error (stamped before
#: the traceback), came on standard output only as the process exited
NCCL_OOM_TRACEBACK = (
    b"[rank0]: Traceback (most recent call last):\n"
    b'[rank0]:   File "/work/main/examples/train_gpu.py", line 211, in <module>\n'
    b"[rank0]:     sys.exit(main())\n"
    b'[rank0]:   File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", '
    b"line 2253, in _new_process_group_helper\n"
    b"[rank0]:     eager_backend.eager_connect_single_device(device_id)\n"
    b"[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
    b"NCCLUtils.cpp:253, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9\n"
    b"[rank0]: ncclUnhandledCudaError: Call to CUDA function failed.\n"
    b"[rank0]: Last error:\n"
    b"[rank0]: Failed to CUDA calloc async 4 bytes\n")
NCCL_OOM_STDOUT = (
    b"step 2/20 loss 0.6072\nstep 3/20 loss 0.5620\nstep 4/20 loss 0.5939\n\n"
    b"[2026-11-20 23:59:59] vm:1003:1003 [0] include/alloc.h:228 NCCL WARN Cuda failure 2 'out of memory'\n\n"
    b"[2026-11-20 23:59:59] vm:1003:1003 [0] include/alloc.h:346 NCCL WARN Failed to CUDA calloc async 4 bytes\n")


def test_lines_read_after_the_traceback_that_ended_the_program_outlive_none_of_its_errors(tmp_path):
    """The step lines on standard output, read after the traceback that unwound the main program
    on standard error, were written before it: they outlive neither the error line inside that
    traceback nor NCCL's out-of-memory WARN stamped before it (``Survival.program_ended``).
    Live, they did, and the job was restarted on ``unhandled cuda error`` (retryable) twice."""
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=True, settle=1.0)
    stdout = Origin("worker-0", 0, JOB, "node-a", "stdout", "process")
    d.started(worker(0), clock.time())
    d.output(stdout, b"step 1/20 loss 0.6009\n", clock.time(), clock.mono())
    clock.advance(1.0)
    d.output(worker(0), NCCL_OOM_TRACEBACK, clock.time(), clock.mono())
    clock.advance(1.5)
    d.output(stdout, NCCL_OOM_STDOUT, clock.time(), clock.mono())
    assert d.notices == []
    trigger = d.exited(ProcessExit(worker(0), 4121, 1, None, clock.time()), clock.mono())
    decision = d.decide(trigger, clock.time(), clock.mono())
    assert (decision.action, decision.root_cause.rule_id, decision.root_cause.failure_class) == (
        Action.FAIL_JOB, "cuda.rt.memory_allocation", FailureClass.OOM)


def test_an_error_after_the_traceback_that_ended_the_program_still_waits(tmp_path):
    """Only the errors up to that traceback stop waiting: a later one (a process started again
    under the same instance) is outlived by the progress after it, as before."""
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False, survive=60.0)
    d.output(worker(1), UNCAUGHT, clock.time(), clock.mono())
    clock.advance(30)
    d.output(worker(1), KEYERROR, clock.time(), clock.mono())
    assert d.survival                                   # it waits
    for n in (1, 2):
        clock.advance(1)
        d.output(worker(1), step(n), clock.time(), clock.mono())
    assert [(f.rule_id, f.line) for f in d.notices] == [("python.key_error", "KeyError: 'lr'")]
    assert d.notices[0] is d.findings[1]                # the later one, not the one that ended the program


def test_progress_before_the_traceback_that_ended_the_program_still_outlives_an_earlier_error(tmp_path):
    """The steps between a caught error and the traceback that later ended the program are dated
    before that traceback, and outlive the error; the end takes nothing back."""
    clock = FakeClock()
    d, _ = desk(tmp_path, exits=False, survive=60.0)
    d.output(worker(1), KEYERROR, clock.time(), clock.mono())
    for chunk in (step(1), step(2), UNCAUGHT.replace(b"KeyError: 'lr'", b"ValueError: nan loss")):
        clock.advance(1)
        d.output(worker(1), chunk, clock.time(), clock.mono())
    assert [(f.rule_id, f.line) for f in d.notices] == [("python.key_error", "KeyError: 'lr'")]
