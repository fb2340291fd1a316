"""Tracebacks a run outlived (issue 12, no-action runs failed): a thread's uncaught exception
(``threading.excepthook``: the thread ends, the process goes on) and an exception the program
caught and logged before it, or (Sync) any rank, said training finished. All were user-code
failures before."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Action
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Policy
from ftwatch.rules.engine import Engine

JOB = "survived"
FLAGS = {"fault_tolerant_policy": "ExitCodeAndErrorMsg", "enable_job_restart": True, "max_num_of_job_restart": 3}
FINISHED = "[rank0]: Training completed. Do not forget to share your model on huggingface.co/models =)"


def _decide(tmp_path: Path, rules, lines: list[str], **flags):
    path = tmp_path / "train.log"
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    policy = Policy(Config().with_policy(**{**FLAGS, **flags}).policy, BudgetStore(tmp_path / "budgets.json", JOB),
                    JOB)
    return replay([path], Engine(rules), policy, JOB)


def _tb(final: str) -> list[str]:
    return ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "/srv/train.py", line 120, in push',
            "[rank0]:     api.upload_folder(folder_path=out)", f"[rank0]: {final}"]


def test_a_thread_that_died_of_an_exception_ended_no_program(rules, tmp_path):
    lines = (["[rank0]: Epoch 1/3", "[rank0]: Exception in thread Thread-3 (_log_worker):"]
             + _tb("KeyError: 'host'") + ["[rank0]: saving the model to /out/final", "[rank0]: done"])
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_the_same_traceback_without_the_thread_line_still_fails(rules, tmp_path):
    lines = ["[rank0]: Epoch 1/3"] + _tb("KeyError: 'host'")
    assert _decide(tmp_path, rules, lines).decision.action is Action.FAIL_JOB


def test_a_traceback_the_program_outlived_to_its_finish_line_is_a_notice(rules, tmp_path):
    """The program printed its own "Training completed" after the traceback: it caught the error."""
    lines = (["[rank0]: {'loss': 1.0, 'learning_rate': 1e-05, 'epoch': 2.9}"]
             + _tb("ValueError: Provided path: '/out/runs' is not a directory") + [FINISHED])
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def _rank1_error_then_rank0_finishes() -> list[str]:
    """Rank 1 logs a caught traceback; rank 0 (the only rank that logs) trains on and finishes."""
    return (["[rank0]: {'loss': 1.0, 'learning_rate': 1e-05, 'epoch': 2.8}"]
            + [line.replace("[rank0]", "[rank1]") for line in _tb("KeyError: 'metrics_url'")]
            + ["[rank0]: {'loss': 0.9, 'learning_rate': 1e-05, 'epoch': 2.9}", FINISHED])


def test_in_a_synchronous_job_any_ranks_finish_line_outlives_a_ranks_traceback(rules, tmp_path):
    """Sync (D1): each step all-reduces across every rank, so rank 0 finishing training after rank
    1's traceback means rank 1 took part to the end (before: fail_job on rank 1's KeyError)."""
    result = _decide(tmp_path, rules, _rank1_error_then_rank0_finishes())
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_in_an_asynchronous_job_another_ranks_finish_line_does_not(rules, tmp_path):
    result = _decide(tmp_path, rules, _rank1_error_then_rank0_finishes(), job_execution_mode="Async")
    assert result.decision.action is Action.FAIL_JOB


def test_a_frame_torch_compile_ran_eagerly_ended_no_program(rules, tmp_path):
    """torch._dynamo with suppress_errors logs "WON'T CONVERT ... due to:" and the traceback, then
    runs the frame eagerly (convert_frame.py); before: the catch-all, fail_job."""
    lines = (["[rank0]: step 1 loss 2.31",
              "[rank0]: [2024-05-01 10:00:00,000] torch._dynamo.convert_frame: [WARNING] WON'T CONVERT forward "
              "/app/model.py line 88 ", "[rank0]: due to: "]
             + _tb("torch._dynamo.exc.Unsupported: call_function BuiltinVariable(setattr) [TensorVariable(), "
                   "ConstantVariable(str)] {}"))
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_an_exit_handler_that_raised_before_python_3_10_ended_no_program(rules, tmp_path):
    """CPython < 3.10 prints "Error in atexit._run_exitfuncs:" and the handler's traceback, then
    clears it at finalisation (pylifecycle.c call_py_exitfuncs): the exit status stands. Before:
    the traceback's TimeoutError restarted a job whose work had ended."""
    lines = (["[rank0]: step 900 loss 0.41", "[rank0]: step 910 loss 0.40", "[rank0]: Error in atexit._run_exitfuncs:"]
             + _tb("TimeoutError: Timed out waiting for handles"))
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_the_resource_trackers_cleanup_warning_at_exit_is_no_missing_file(rules, tmp_path):
    """multiprocessing's resource tracker unlinks what the program left and warns for each unlink
    that failed (Lib/multiprocessing/resource_tracker.py); before: storage.no_such_file, fail_job."""
    lines = ["[rank0]: step 900 loss 0.41", "[rank0]: step 910 loss 0.40",
             "[rank0]: /usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: "
             "There appear to be 1 leaked shared_memory objects to clean up at shutdown",
             "[rank0]:   warnings.warn('resource_tracker: There appear to be %d '",
             "[rank0]: /usr/lib/python3.11/multiprocessing/resource_tracker.py:267: UserWarning: resource_tracker: "
             "'/psm_1a2b3c': [Errno 2] No such file or directory: '/psm_1a2b3c'",
             "[rank0]:   warnings.warn('resource_tracker: %r: %s' % (name, e))"]
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_nccls_cuda_failure_driver_shutting_down_at_exit_is_no_failure(rules, tmp_path):
    """cudaErrorCudartUnloading: a call made after the driver was unloaded at process exit (CUDA
    Runtime API docs); before: nccl.cuda_failure restarted the job (gpu.nvls_cuda_failure isolated
    the node for the NVLS transport's)."""
    for where in ("init.cc:1830", "transport/nvls.cc:223"):
        lines = ["[rank0]: step 900 loss 0.41", "[rank0]: step 910 loss 0.40",
                 f"[rank0]: gpu-node-3:2111:2111 [0] {where} NCCL WARN Cuda failure 4 'driver shutting down'"]
        result = _decide(tmp_path, rules, lines)
        assert result.decision is None or result.decision.action is Action.NONE, (where, result.decision)


def test_nccls_cuda_failure_with_an_error_text_still_acts(rules, tmp_path):
    lines = ["[rank0]: step 900 loss 0.41",
             "[rank0]: gpu-node-3:2111:2111 [0] init.cc:1830 NCCL WARN Cuda failure 'unspecified launch failure'"]
    assert _decide(tmp_path, rules, lines).decision.action is not Action.NONE


def test_the_heartbeat_monitors_store_warnings_when_the_store_host_finished_first_are_no_failure(rules, tmp_path):
    """c10d's WARNING-level store lines at the end of a run (pytorch/pytorch#123969: the store's host
    exited first, the heartbeat monitor's poll fails); before: c10d.store_peer_closed, restart."""
    lines = ["[rank1]: step 900 loss 0.41", "[rank1]: step 910 loss 0.40",
             "[rank1]:[W625 23:35:35.303797152 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=6, "
             "addr=[::ffff:127.0.0.1]:37468, remote=[::ffff:127.0.0.1]:6006): failed to recv, got 0 bytes",
             "[rank1]:[W625 23:35:35.311127584 ProcessGroupNCCL.cpp:1662] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
             'Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), '
             "with error: failed to recv, got 0 bytes"]
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_the_raised_store_error_still_acts(rules, tmp_path):
    lines = ["[rank1]: step 900 loss 0.41",
             "[rank1]: torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
             "closed. Did the remote server shutdown or crash?"]
    assert _decide(tmp_path, rules, lines).decision.action is not Action.NONE


def _uncaught(final: str) -> list[str]:
    """A traceback that unwound the main program (its first frame the script's ``<module>``)."""
    return ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "/srv/train.py", line 123, in <module>',
            "[rank0]:     sys.exit(main())", '[rank0]:   File "/srv/train.py", line 101, in main',
            "[rank0]:     batch = loader.next()", f"[rank0]: {final}"]


def test_step_lines_after_a_traceback_that_ended_the_program_are_no_progress(rules, tmp_path):
    """Python prints an uncaught exception's traceback as the program ends: step lines after it
    (standard output flushed at exit, or read apart from standard error) were written before it,
    as recorded on a GPU (tests/golden/gpu_cuda_oom)."""
    lines = (["[rank0]: step 1/20 loss 0.60"] + _uncaught("KeyError: 'tokens'")
             + [f"[rank0]: step {n}/20 loss 0.5{n}" for n in range(2, 5)])
    result = _decide(tmp_path, rules, lines)
    assert result.decision.action is Action.FAIL_JOB
    assert result.decision.root_cause.rule_id == "python.key_error"


def test_step_lines_after_a_caught_and_logged_traceback_still_outlive_it(rules, tmp_path):
    """The same lines after a traceback caught inside the program (its first frame a function)."""
    lines = (["[rank0]: step 1/20 loss 0.60"] + _tb("KeyError: 'tokens'")
             + [f"[rank0]: step {n}/20 loss 0.5{n}" for n in range(2, 5)])
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_a_spawned_childs_traceback_leaves_the_program_running(rules, tmp_path):
    """A child multiprocessing started with spawn runs from its own ``<module>`` (``python -c ...
    spawn_main(...)``): its traceback ends the child, and the step lines after it are the parent's
    progress, which outlives it."""
    child = ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "<string>", line 1, in <module>',
             '[rank0]:   File "/usr/lib/python3.11/multiprocessing/spawn.py", line 122, in spawn_main',
             "[rank0]:     exitcode = _main(fd, parent_sentinel)",
             '[rank0]:   File "/srv/data.py", line 40, in load_shard', "[rank0]: KeyError: 'tokens'"]
    lines = ["[rank0]: step 1/20 loss 0.60"] + child + [f"[rank0]: step {n}/20 loss 0.5{n}" for n in range(2, 5)]
    result = _decide(tmp_path, rules, lines)
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def _thread_chain(header: bool) -> list[str]:
    """A thread's chained report: the cause's traceback, CPython's chain line, then the exception
    that left the thread's ``run()`` (its first frame ``threading.py`` ``_bootstrap_inner``), the
    program going on to its own end afterwards."""
    cause = ["Traceback (most recent call last):",
             '  File "/env/lib/python3.6/site-packages/tensorflow/python/client/session.py", line 1365, in _do_call',
             "    return fn(*args)",
             "tensorflow.python.framework.errors_impl.CancelledError: Enqueue operation was cancelled"]
    last = ["Traceback (most recent call last):",
            '  File "/env/lib/python3.6/threading.py", line 916, in _bootstrap_inner', "    self.run()",
            '  File "/env/lib/python3.6/threading.py", line 864, in run',
            "    self._target(*self._args, **self._kwargs)",
            '  File "/env/lib/python3.6/site-packages/trainer/train.py", line 84, in load_and_enqueue',
            "    sess.run(enqueue_op, feed_dict=food)",
            "tensorflow.python.framework.errors_impl.CancelledError: Enqueue operation was cancelled"]
    return (["iteration: 500 loss: 0.0074 lr: 0.005"] + (["Exception in thread Thread-1:"] if header else [])
            + cause + ["", "During handling of the above exception, another exception occurred:", ""] + last
            + ["evaluating the snapshot", "results stored"])


def test_every_link_of_a_threads_chained_report_ended_no_program(rules, tmp_path):
    """CPython prints "Exception in thread <name>:" once and then the whole chain; the engine reads
    each link as a record of its own, and the last one (the exception that left ``run()``, its first
    frame the thread's entry) is the same thread's end (before: restart_job on it, a run that
    finished; DeepLabCut's data-feeding thread cancelled at maxiters)."""
    result = _decide(tmp_path, rules, _thread_chain(header=True))
    assert result.decision is None or result.decision.action is Action.NONE, result.decision


def test_a_thread_entry_traceback_without_the_header_before_its_chain_still_counts(rules, tmp_path):
    """The thread's entry frame alone is not read as "ended no program": a program may run its
    training in a thread (a web UI's worker), and only Python's header says the report is a thread's."""
    result = _decide(tmp_path, rules, _thread_chain(header=False))
    assert result.decision is not None and result.decision.action is not Action.NONE
