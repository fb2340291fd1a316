"""An error printed after training finished (issue 12 item 3), graded by its class
(``ftwatch.policy.lifecycle.after_finish``): a transient fault of the run's tail keeps the ordinary
decision (a rerun redoes the upload), a node's hardware fault notifies, anything else (the
program's own error in its tail, a nonzero exit after the last step) needs no action and files no
failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.lifecycle import after_finish

JOB = "after-finish-test"
HF_END = ("{'train_runtime': 2651.4031, 'train_samples_per_second': 5.794, 'train_steps_per_second': 0.091, "
          "'train_loss': 1.2567, 'epoch': 3.0}")
STEPS = [f"{{'loss': {1.4 - i / 10:.3f}, 'grad_norm': 0.36, 'learning_rate': 1.5e-04, 'epoch': {i}.0}}"
         for i in range(3)]


def tb(final: str) -> list[str]:
    return ["Traceback (most recent call last):",
            '  File "/workspace/train.py", line 271, in train',
            "    publish(cfg.base_model)",
            final]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def assert_finished_then_notice(run, log: Path, finished_rule: str) -> None:
    """Replaying ``log`` decides no action, no failure, and names ``finished_rule`` as the finish."""
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.NONE and d.root_cause is None, d
    assert finished_rule in d.policy_clause, d


def test_the_programs_own_error_after_the_trainers_end_metrics_needs_no_action(run, tmp_path):
    log = write(tmp_path / "rank0.log", STEPS + [HF_END] + tb(
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '/data/models/base'. Use `repo_type` argument if needed."))
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.NONE and d.root_cause is None, d
    assert "lifecycle.finished.hf_trainer_metrics" in d.policy_clause


def test_a_nonzero_exit_after_megatrons_last_step_needs_no_action(run, tmp_path):
    log = write(tmp_path / "slurm.out", [
        "0: [2025-10-21 03:38:45] iteration     1000/    1000 | consumed samples:       512000",
        "0: [2025-10-21 03:39:41] [after training is done] datetime: 2025-10-21 03:39:41 ",
        "srun: error: h100-c07: task 3: Exited with exit code 1"])
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.NONE and d.root_cause is None, d


def test_the_programs_own_error_while_saving_its_result_after_the_end_fails_the_job(run, tmp_path):
    """It said it saves the model after the trainer's end, then died of its own error: nothing is
    written, and a rerun trains again only to fail at the same save."""
    saving = "[2024-01-13 05:44:29,006] [INFO] [axolotl.train.train:155] Training Completed!!! Saving pre-trained model to ./lora-out"
    log = write(tmp_path / "rank0.log", STEPS + [HF_END, saving] + tb(
        "AttributeError: 'Accelerator' object has no attribute 'deepspeed_config'"))
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.FAIL_JOB and d.root_cause.failure_class is FailureClass.USER_CODE, d
    assert "while saving its result" in d.policy_clause


@pytest.mark.parametrize("work", [
    "[INFO|trainer.py:4226] 2025-04-19 11:29:20,031 >> ***** Running Prediction *****",
    "Predicting DataLoader 0: 100%|##########| 1/1 [00:00<00:00,  3.01it/s]",
    "[INFO|trainer.py:2743] 2024-10-19 19:48:40,914 >> Loading best model from out/checkpoint-700 (score: 1.2861).",
])
def test_the_programs_own_error_while_predicting_after_the_end_fails_the_job(run, tmp_path, work):
    """It said it evaluates or predicts with the trained model after the trainer's end (the HF Trainer's
    evaluation loop, Lightning's predict bar), then died of its own error: the job's work is not done."""
    log = write(tmp_path / "rank0.log", STEPS + [HF_END, work] + tb(
        "TypeError: vstack(): argument 'tensors' (position 1) must be tuple of Tensors, not NoneType"))
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.FAIL_JOB and d.root_cause.failure_class is FailureClass.USER_CODE, d
    assert "predicting" in d.policy_clause


def test_the_programs_own_error_after_reloading_its_checkpoint_after_the_end_fails_the_job(run, tmp_path):
    """After its own "Training complete" MACE reloads its last checkpoint (``Loading checkpoint: <path>``)
    to evaluate and export the model; a traceback after that line ended the program before its result
    was written: the job failed."""
    log = write(tmp_path / "rank0.log", [
        "2026-01-02 07:52:09.047 INFO: Epoch 99: head: Default, loss=0.00150877",
        "2026-01-02 07:52:09.048 INFO: Training complete",
        "2026-01-02 07:52:09.052 INFO: Loading checkpoint: ./checkpoints/MACE_run-3_epoch-49.pt"] + tb(
        "RuntimeError: DDP expects same model across all ranks, but Rank 0 has 58 params, while rank 1 has "
        "inconsistent 61 params."))
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.FAIL_JOB and d.root_cause.failure_class is FailureClass.USER_CODE, d
    assert "while saving its result" in d.policy_clause


def test_a_rank_prefixed_error_after_the_combined_logs_own_tail_work_line_fails_the_job(run, tmp_path):
    """In a combined log the unprefixed lines are the stream's and a ``[rank0]:`` traceback is rank 0's
    (instance ``rank0`` under replay, ``<instance>/rank0`` under run): the tail-work line before it is
    still in the traceback's stream, so replay reads the log as run reads the stream it came from."""
    saving = "[INFO|trainer.py:3984] 2026-01-02 10:00:00,000 >> Saving model checkpoint to output/final"
    log = write(tmp_path / "train.log", STEPS + [HF_END, saving] + [f"[rank0]: {line}" for line in tb(
        "AttributeError: 'Accelerator' object has no attribute 'deepspeed_config'")])
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.FAIL_JOB and d.root_cause.failure_class is FailureClass.USER_CODE, d
    assert "while saving its result" in d.policy_clause


def test_a_transient_fault_uploading_the_results_after_the_end_still_restarts(run, tmp_path):
    log = write(tmp_path / "rank0.log", STEPS + [HF_END] + tb(
        "ConnectionResetError: [Errno 104] Connection reset by peer"))
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.RESTART_JOB, d
    assert d.root_cause is not None and d.root_cause.failure_class is FailureClass.RETRYABLE_INFRA


def finding(cls: FailureClass, kind: str = "keyword", raised: bool = True) -> Finding:
    o = Origin("worker-0", 0, JOB, "node-0", "stderr", "process")
    evidence = ("Traceback (most recent call last):", "ConnectionResetError: [Errno 104]") if raised else ()
    return Finding("x.y", kind, cls, Action.RESTART_JOB, Severity.ERROR, o, "line", 0.0, evidence=evidence)


@pytest.mark.parametrize("notice, cascade, action", [
    (finding(FailureClass.RETRYABLE_INFRA), False, None),                  # the ordinary decision stands
    (finding(FailureClass.RETRYABLE_INFRA), True, Action.NONE),            # a peer's exit, seen by NCCL
    (finding(FailureClass.RETRYABLE_INFRA, kind="exit_code"), False, Action.NONE),   # an exit names no fault
    (finding(FailureClass.RETRYABLE_INFRA, raised=False), False, Action.NONE),  # the library's teardown line
    (finding(FailureClass.HARDWARE_NODE), False, Action.NOTIFY),
    (finding(FailureClass.USER_CODE), False, Action.NONE),
    (finding(FailureClass.OOM), False, Action.NONE),
    (finding(FailureClass.FALLOUT), False, Action.NONE),
])
def test_after_finish_grades_the_notice_by_its_class(notice, cascade, action):
    assert after_finish(notice, cascade)[0] is action


def test_a_shells_segfault_report_after_the_programs_own_training_finished_line_needs_no_action(run, tmp_path):
    """The program's whole message that training finished (``lifecycle.finished.program_says``)
    ends training as a framework's own line does: a crash at exit after it is a notice."""
    log = write(tmp_path / "train.log", [
        "| Epoch:   2 | Iter:   1200 | loss: 2.0893 | lr: 1.0000e-04 |",
        "saving checkpoint to ./results/run/epoch2.pt",
        "2026-11-26 10:00:00 | INFO | Training completed.",
        "Segmentation fault (core dumped)"])
    assert_finished_then_notice(run, log, "lifecycle.finished.program_says")


def test_a_workers_abort_after_maskrcnn_benchmarks_total_training_time_needs_no_action(run, tmp_path):
    """maskrcnn-benchmark's do_train prints its total training time after the loop (and saved
    model_final in the loop's last iteration): an abort of a worker after it ended no training."""
    log = write(tmp_path / "train.log", [
        "2024-03-07 09:43:34,918 maskrcnn_benchmark.trainer INFO: eta: 0:00:00  iter: 30000  loss: 0.1298 (0.1401)",
        "2024-03-07 09:43:35,002 maskrcnn_benchmark.utils.checkpoint INFO: Saving checkpoint to ./ckpt/model_final.pth",
        "2024-03-07 09:43:39,611 maskrcnn_benchmark.trainer INFO: Total training time: 7:32:41.208911 (0.9051 s / it)",
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 2960900 closing signal SIGTERM",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 1 (pid: 2960901) of "
        "binary: /usr/bin/python"])
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.NONE and d.root_cause is None, d


def test_a_loss_that_is_not_finite_when_training_ends_keeps_the_ordinary_decision():
    """NaN propagates into every weight an update reads: the result written at the end is no result."""
    o = Origin("worker-0", 0, JOB, "node-0", "stderr", "process")
    nan = Finding("python.loss_not_finite", "keyword", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR, o,
                  "step: 100  loss:    nan", 0.0)
    assert after_finish(nan, False)[0] is None
    assert after_finish(finding(FailureClass.USER_CODE), False)[0] is Action.NONE


#: a runtime's abort while the interpreter exits (cudaErrorCudartUnloading: a call made during
#: process shutdown) and the launcher's report of it
EXIT_ABORT = ["terminate called after throwing an instance of 'c10::CUDAError'",
              "  what():  CUDA error: driver shutting down",
              "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 2 (pid: 20973) "
              "of binary: /usr/bin/python"]


def test_an_abort_after_wandb_reports_the_runs_exit_code_0_needs_no_action(run, tmp_path):
    """W&B prints "(success)" only for exit code 0 (no uncaught exception ended the main thread):
    the run finished, and a runtime's abort while the process exits is a notice."""
    log = write(tmp_path / "train.log", STEPS + ["wandb: Waiting for W&B process to finish... (success)."] + EXIT_ABORT)
    assert_finished_then_notice(run, log, "lifecycle.finished.wandb_exit_ok")


def test_wandbs_failed_exit_status_is_no_finish(run, tmp_path):
    """"(failed 1)": an exception ended the program: no finish, the ordinary decision stands."""
    log = write(tmp_path / "train.log", STEPS + [
        "wandb: Waiting for W&B process to finish... (failed 1). Press Control-C to abort syncing."] + EXIT_ABORT)
    d = run([log], enable_job_restart=True, max_num_of_job_restart=3).decision
    assert d.action is Action.RESTART_JOB and "lifecycle.finished" not in d.policy_clause, d


def test_a_segfault_in_mpi_finalize_after_training_finished_and_was_saved_needs_no_action(run, tmp_path):
    """The program said training finished and its checkpoint was written (past tense): the crash
    while the processes leave is a notice."""
    log = write(tmp_path / "mpirun.log", [
        "[1,0]<stdout>:235/235 - 31s - loss: 0.1367 - accuracy: 0.9700",
        "[1,0]<stdout>:training finished, checkpoint written to ./checkpoints/checkpoint-3.h5",
        "[1,0]<stderr>:[c8-node:04187] *** Process received signal ***",
        "[1,0]<stderr>:[c8-node:04187] Signal: Segmentation fault (11)",
        "[1,0]<stderr>:[c8-node:04187] *** End of error message ***",
        "mpirun noticed that process rank 0 with PID 4187 on node c8-node exited on signal 11 (Segmentation fault)."])
    assert_finished_then_notice(run, log, "lifecycle.finished.program_says_saved")
