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
