"""Errors a program logs without an exit line (issue 12: a log that ends inside an error block is a
failed process even when no exit follows), in the words two stacks use that no rule read before:

* HugeCTR's Norm data reader logs ``DataHeaderError <file>:<line>`` when an input file's header does
  not match the job's declared check type or slot count (``HugeCTR/include/data_readers/
  data_reader_worker.hpp``), in its older ``[HCDEBUG][ERROR]`` form and its logger's
  ``[HUGECTR][<time>][ERROR][RANK<r>]:`` form: the job's data or configuration, fail.
* Isaac Gym's plugin logs a failed CUDA call as ``[Error] [carb.gym.plugin] Gym cuda error: <text>:
  <file>: <line>``: the runtime's text, graded by its enum (``cuda_errors.tsv``) as every other print.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
GYM = "[Error] [carb.gym.plugin] Gym cuda error: {}: ../../../source/plugins/carb/gym/impl/Gym/GymPhysX.cpp: 1459"


def findings(*lines: str):
    text = "".join(f"{line}\n" for line in lines)
    return ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), text.encode(), 1.0, final=True)


@pytest.mark.parametrize("line", [
    "[HCDEBUG][ERROR] DataHeaderError /hugectr/HugeCTR/include/data_readers/data_reader_worker.hpp:58",
    "[HUGECTR][06:18:47][ERROR][RANK0]: DataHeaderError /hugectr/HugeCTR/include/common.hpp:259",
])
def test_hugectr_header_mismatch_is_the_jobs_data(line):
    [f] = findings(line)
    assert (f.rule_id, f.failure_class, f.action) == ("hugectr.data_header_error", FailureClass.USER_CODE,
                                                      Action.FAIL_JOB)


def test_another_librarys_data_header_error_class_is_not_hugectrs():
    assert not [f for f in findings("simba.utils.errors.DataHeaderError: the file has no header row")
                if f.rule_id == "hugectr.data_header_error"]


@pytest.mark.parametrize("text, rule, cls, action", [
    ("an illegal memory access was encountered", "cuda.rt.illegal_address", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("out of memory", "cuda.rt.memory_allocation", FailureClass.OOM, Action.FAIL_JOB),
    ("invalid resource handle", "cuda.rt.invalid_resource_handle", FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_isaac_gym_prints_the_cuda_runtime_text_graded_by_its_enum(text, rule, cls, action):
    fs = [f for f in findings(GYM.format(text)) if f.rule_id.startswith("cuda.")]
    assert [(f.rule_id, f.failure_class, f.action) for f in fs] == [(rule, cls, action)]


def test_gyms_other_plugin_errors_are_not_cuda_errors():
    assert not [f for f in findings("[Error] [carb.gym.plugin] Failed to fill rigid body state tensor")
                if f.rule_id.startswith("cuda.")]


def test_a_log_that_ends_at_the_error_line_is_a_failed_run(tmp_path: Path):
    """No exit line follows: the error the log ends in decides (issue 12)."""
    from ftwatch.cli.common import load_config_from_args, split_flags
    from ftwatch.pipeline.build import build_engine, build_policy
    from ftwatch.pipeline.replay import replay
    from ftwatch.policy.budgets import BudgetStore
    import argparse
    log = tmp_path / "train.log"
    log.write_text("[03d14h21m07s][HUGECTR][INFO]: Initial seed is 1187622049\n"
                   "[03d14h21m10s][HUGECTR][INFO]: num_internal_buffers 1\n"
                   + "[HCDEBUG][ERROR] DataHeaderError /hugectr/HugeCTR/include/data_readers/data_reader_worker.hpp:58\n" * 3)
    flags, _, _ = split_flags(["--enable-job-restart=True", "--max-num-of-job-restart=3"])
    config = load_config_from_args(argparse.Namespace(config=None, aimaster_args=None), flags)
    policy = build_policy(config, "j", BudgetStore(tmp_path / "b.json", "j"), state_dir=tmp_path, in_memory=True)
    decision = replay([log], build_engine(config), policy, "j").decision
    assert decision.action == Action.FAIL_JOB
    assert decision.root_cause.rule_id == "hugectr.data_header_error"


@pytest.mark.parametrize("line", [
    "Exception initializing accelerator: Accelerator.__init__() got an unexpected keyword argument 'project_dir'",
    "ERROR: building the model failed: Net.__init__() got an unexpected keyword argument 'use_dropout'. "
    "Did you mean 'dropout'?",
])
def test_a_caught_typeerrors_bare_message_is_the_programs_call(line):
    """CPython's message for a keyword the callee does not take, printed without its class by a program
    that caught it: the code and the installed library disagree, a rerun repeats it."""
    fs = findings(line)
    assert [(f.rule_id, f.failure_class, f.action) for f in fs] == [
        ("python.unexpected_keyword_argument", FailureClass.USER_CODE, Action.FAIL_JOB)]


@pytest.mark.parametrize("line", [
    "TypeError: forward() got an unexpected keyword argument 'labels'",
    "UserWarning: generate() got an unexpected keyword argument 'foo', it is ignored",
])
def test_the_class_line_and_warnings_are_left_to_their_rules(line):
    assert not [f for f in findings(line) if f.rule_id == "python.unexpected_keyword_argument"]


@pytest.mark.parametrize("line", [
    "E1224 22:32:45.210337   31904 real_program_continuator.cc:1331] 0x0x0_TC0: *** Halt is unexpected, all pending "
    "programs will fail. This is likely an XLA compiler bug, please file a bug to xla-tpu@ and CC tfrt-devs@.",
    "6x2x0_SC1: *** A program or fatal error occurred, all pending programs will fail, and results may be corrupted. "
    "This is likely an XLA compiler bug or your job hit a bad TPU hardware.",
])
def test_a_halted_tpu_program_is_ambiguous_relaunch_once(line):
    """The TPU runtime names a compiler bug or a bad TPU; Google's MaxText guide says retry to confirm:
    the ambiguous grade (relaunch once where the policy relaunches user code, a repeat decides)."""
    fs = findings(line)
    assert [(f.rule_id, f.failure_class, f.action) for f in fs] == [
        ("tpu.program_halted_unexpectedly", FailureClass.USER_CODE, Action.RESTART_IN_PLACE)]


def test_mace_distributed_setup_missing_a_launch_variable_is_the_launch():
    """MACE's Slurm-only distributed set-up logs the KeyError of a missing variable and returns (exit 0):
    the launch lacks the environment it reads, fail."""
    [f] = findings("ERROR:root:Failed to initialize distributed environment: 'SLURM_JOB_NODELIST'")
    assert (f.rule_id, f.failure_class, f.action) == ("mace.distributed_env_missing", FailureClass.USER_CODE,
                                                      Action.FAIL_JOB)
    assert not [f for f in findings("ERROR:root:Failed to initialize distributed environment: [Errno 111] "
                                    "Connection refused") if f.rule_id == "mace.distributed_env_missing"]
