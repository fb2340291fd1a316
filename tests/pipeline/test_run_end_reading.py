"""How a replayed run's end is read (knowledge round 18, issue 12 item 3): the scheduler's verdict
that no process outlives, a node that rebooted under the job, a GPU driver found hung, and a log
that ends in glog's stack dump. Each through ``ftwatch.pipeline.replay`` (the code ``evaluate``
runs), with the engine and policy ``ftwatch replay`` builds."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass
from ftwatch.pipeline.build import build_engine, build_policy, build_rules
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.triggers import fatal, fatal_rules, may_survive, outside_rules
from ftwatch.testing import finding

JOB = "run-end-test"


def _replay(tmp_path: Path, files: dict[str, list[str]], **flags):
    config = Config().with_policy(enable_job_restart=True, max_num_of_job_restart=3, **flags)
    paths = []
    for name, lines in files.items():
        path = tmp_path / name
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        paths.append(path)
    policy = build_policy(config, JOB, BudgetStore(tmp_path / "b.json", JOB), state_dir=tmp_path, in_memory=True)
    return replay(paths, build_engine(config), policy, JOB).decision


def _epoch(n: int, step: int) -> str:
    return f"Epoch {n}:  93%|#########3| {step}/20000 [28:54<02:08, 10.74it/s, v_num=3kqa, train_loss=3.41]"


# -- the scheduler's verdict ----------------------------------------------------------------------

def test_the_schedulers_verdicts_are_fatal_whatever_the_program_prints_after_them():
    rules = build_rules(Config())
    outside = outside_rules(rules)
    assert {"scheduler.time_limit", "slurm.cancelled", "k8s.oom_killed", "k8s.preempted"} <= outside
    assert "python.key_error" not in outside and "os.hung_task" not in outside
    assert outside <= fatal_rules(rules) and "cuda.illegal_memory_access" in fatal_rules(rules)
    limit = finding("scheduler.time_limit", failure_class=FailureClass.USER_CODE, action=Action.FAIL_JOB)
    assert fatal(limit, fatal_rules(rules)) and not may_survive(limit, fatal_rules(rules))
    assert not fatal(limit) and may_survive(limit)        # without the rules' tags it was survivable


def test_a_time_limit_whose_sigterm_the_program_bypassed_still_ended_the_job(tmp_path):
    """Lightning-AI/pytorch-lightning#20542's shape: slurmstepd cancels the step at its time limit,
    Lightning bypasses the SIGTERM and prints more steps until KillWait's SIGKILL. Before: the
    steps outlived the cancel line (a notice) and the run read as succeeded."""
    lines = ([_epoch(10, s) for s in (18624, 18625)]
             + ["slurmstepd: error: *** STEP 8830214.0 ON gpu-node-0412 CANCELLED AT 2025-01-10T15:27:25 DUE TO "
                "TIME LIMIT ***",
                "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
                "[rank: 0] Received SIGTERM: 15", "Bypassing SIGTERM: 15"]
             + [_epoch(10, s) for s in range(18626, 18640)])
    d = _replay(tmp_path, {"slurm-8830214.out": lines})
    assert d.action is Action.FAIL_JOB, d.policy_clause
    assert d.root_cause.rule_id == "scheduler.time_limit"


def test_a_requeued_job_that_finished_in_the_same_output_needs_nothing(tmp_path):
    """Lightning's auto-requeue (its SLURM guide): the allocation is cancelled DUE TO JOB REQUEUE,
    the next one appends to the same file, resumes and finishes. The verdict is fatal to the
    process, but the finish after it says the job ran again and completed: a notice."""
    lines = ([_epoch(13, 903), "Handling auto-requeue signal: 10", "Requeued SLURM job: 5531907",
              "slurmstepd: error: *** JOB 5531907 ON gn-a07 CANCELLED AT 2026-11-25T23:58:31 DUE TO JOB REQUEUE ***",
              "Restored all states from the checkpoint at /scratch/seg/lightning_logs/hpc_ckpt_1.ckpt"]
             + [_epoch(15, s) for s in (19000, 19500)] + ["`Trainer.fit` stopped: `max_epochs=16` reached."])
    d = _replay(tmp_path, {"slurm-5531907.out": lines})
    assert d.action is Action.NONE and d.root_cause is None, d.policy_clause


# -- the node under the job -----------------------------------------------------------------------

TRAIN = [f"Epoch: [0][{i}/5005]\tTime 0.512 (2.409)\tLoss 6.96 (6.99)" for i in range(0, 90, 10)]


def test_a_boot_banner_in_the_nodes_kernel_log_is_the_node_resetting_under_the_job(tmp_path):
    """The job's log just stops; the node's kernel log, read from its end, holds the next boot:
    the machine reset under the job (Slurm downs such a node: 'Node unexpectedly rebooted')."""
    kern = ["Oct  9 23:18:40 dl-box kernel: [    0.000000] Linux version 4.10.0-35-generic (buildd@lcy01-33) "
            "(gcc version 5.4.0 20160609 (Ubuntu 5.4.0-6ubuntu1~16.04.4) ) #39~16.04.1-Ubuntu SMP Wed Sep 13 "
            "09:02:42 UTC 2017 (Ubuntu 4.10.0-35.39~16.04.1-generic 4.10.17)",
            "Oct  9 23:18:40 dl-box kernel: [    0.000000] Command line: BOOT_IMAGE=/vmlinuz-4.10.0-35-generic ro"]
    d = _replay(tmp_path, {"train.log": TRAIN, "kern.log": kern})
    assert (d.action, d.root_cause.rule_id) == (Action.ISOLATE_NODE, "os.kernel_boot"), d.policy_clause
    (tmp_path / "q").mkdir()
    proc_version = "Linux version 5.15.0-91-generic (buildd@lcy02-amd64-045) (gcc 11.4.0) #101-Ubuntu SMP"
    quiet = _replay(tmp_path / "q", {"train.log": [proc_version] + TRAIN})
    assert quiet.action is Action.NONE          # /proc/version printed by the job: no boot
    (tmp_path / "d").mkdir()
    dump = ["[    0.000000] Linux version 5.15.0-91-generic (buildd@lcy02-amd64-045) (gcc 11.4.0) #101-Ubuntu SMP",
            "[    0.000000] Command line: BOOT_IMAGE=/boot/vmlinuz-5.15.0-91-generic ro"]
    assert _replay(tmp_path / "d", {"train.log": TRAIN, "dmesg.txt": dump}).action is Action.NONE   # a dmesg dump


def test_nvidia_smi_hung_in_the_driver_makes_the_trainings_hung_task_the_nodes_fault(tmp_path):
    """sist-hpc's shape: the training process, then nvidia-smi, blocked in D state: the GPU driver
    is hung (NVIDIA/gpu-monitoring-tools#46), not the job (os.hung_task alone restarts)."""
    stamp = "Jul 26 09:{m}:12 node26 kernel: [81273{m}.401122] INFO: task {t} blocked for more than 120 seconds."
    train = ["2019-07-26 09:15:03 | INFO | Epoch: [0][0/3697]\tTime 9.412 (9.412)\tLoss 4.6031 (4.6031)"]
    only_python = [stamp.format(m=24, t="python:30417")]
    d = _replay(tmp_path, {"train.log": train, "kern.log": only_python})
    assert (d.action, d.root_cause.rule_id) == (Action.RESTART_JOB, "os.hung_task"), d.policy_clause
    (tmp_path / "2").mkdir()
    kern = only_python + [stamp.format(m=31, t="nvidia-smi:31822")]
    d = _replay(tmp_path / "2", {"train.log": train, "kern.log": kern})
    assert (d.action, d.root_cause.rule_id) == (Action.ISOLATE_NODE, "gpu.driver_hung_task"), d.policy_clause
    assert d.root_cause.failure_class is FailureClass.HARDWARE_NODE


# -- a log that ends in a stack dump --------------------------------------------------------------

def test_a_log_that_ends_in_glogs_stack_dump_is_a_process_that_died(tmp_path):
    """glog prints '*** Check failure stack trace: ***' and '    @ 0x... symbol' frames after a FATAL
    record, then aborts: the stream ends in an error block even when no rule read the record."""
    lines = ["2020-09-17 06:43:56,102-INFO: iter: 41380, lr: 0.000625, 'loss': '12.129196', time: 4.889",
             "F0917 06:44:27.830562 22903 all_reduce_op_handle.cc:192] some native failure nobody catalogued",
             "*** Check failure stack trace: ***",
             "    @     0x7f6d1d4aa35c  paddle::framework::details::AllReduceOpHandle::SyncNCCLAllReduce()",
             "    @     0x7f6d99bac88f  clone"]
    d = _replay(tmp_path, {"worker-0.log": lines})
    assert d.action is Action.FAIL_JOB and d.root_cause.rule_id == "exit.ended_in_traceback", d.policy_clause
    (tmp_path / "2").mkdir()
    assert _replay(tmp_path / "2", {"worker-0.log": lines[:1]}).action is Action.NONE


def test_a_boot_the_jobs_own_output_went_on_after_is_no_reset_under_it(tmp_path):
    """A kern.log shipped whole holds the boot before the job: the job's stamped lines an hour
    later say it ran after that boot, so the banner is no reset under it (a notice)."""
    kern = ["Oct  9 08:00:00 dl-box kernel: [    0.000000] Linux version 4.10.0-35-generic (buildd@lcy01-33) "
            "(gcc version 5.4.0) #39~16.04.1-Ubuntu SMP Wed Sep 13 09:02:42 UTC 2017"]
    train = [f"2017-10-09 09:{m:02d}:00 | INFO | Epoch: [0][{m}/5005]\tLoss 6.96 (6.99)" for m in range(0, 50, 10)]
    d = _replay(tmp_path, {"train.log": train, "kern.log": kern})
    assert d.action is Action.NONE and d.root_cause is None, d.policy_clause
    (tmp_path / "2").mkdir()
    late = ["Oct  9 09:41:00 dl-box kernel: [    0.000000] Linux version 4.10.0-35-generic (buildd@lcy01-33) "
            "(gcc version 5.4.0) #39~16.04.1-Ubuntu SMP Wed Sep 13 09:02:42 UTC 2017"]
    d = _replay(tmp_path / "2", {"train.log": train, "kern.log": late})
    assert (d.action, d.root_cause.rule_id) == (Action.ISOLATE_NODE, "os.kernel_boot"), d.policy_clause
