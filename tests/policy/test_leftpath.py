"""Ranks that timed out waiting for a rank that left their path (ftwatch.policy.leftpath, issue 12
item 3): its data ran out, its epoch ended, it stopped early or it works on the main process alone
while they wait in a collective is the program's control flow (user_code, PyTorch's uneven-inputs
tutorial, accelerate's troubleshooting guide); a rank that says nothing of the kind keeps the hang
reading."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.busy import waits
from ftwatch.policy.leftpath import LEFT_PATH_RULES, UNEVEN_SPLIT_RULES, left_rank
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
RULES = load_rules()
ENGINE = Engine(RULES)


def logged(rank: int | None, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}" if rank is not None else "combined", rank, "left", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def watchdog(rank: int, seq: int = 19) -> str:
    return (f"[E ProcessGroupNCCL.cpp:563] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=1800000) ran for 1800083 milliseconds before timing out.")


def incident(rank0_last: str | None, t: float = 0.0, waiting_too: str | None = None) -> list[Finding]:
    """Ranks 1-3 time out at 1800 s in an all-reduce; rank 0 printed ``rank0_last`` at ``t``."""
    found = logged(0, t, rank0_last) if rank0_last else []
    for r in (1, 2, 3):
        if waiting_too:
            found += logged(r, t, waiting_too)
        found += logged(r, 1800.0 + r / 10, watchdog(r))
    return found


@pytest.mark.parametrize("line", [
    "epoch 0 finished after 18 steps, starting validation",
    "rank 0: dataloader exhausted after 812 batches",
    "Early stopping: no improvement in 5 validations; stopping at step 14000",
    "running evaluation on the main process (12000 samples)",
    "INFO trainer: running validation (12 datasets) on rank 0",     # rank 0 is the main process
    "computing BLEU on the validation set (rank 0 only)",
])
def test_a_rank_that_last_said_it_left_the_path_made_the_hang(line):
    rc = analyse(incident(line), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 0
    assert rc.fields["waiting"] == [1, 2, 3]


@pytest.mark.parametrize("line", ["loaded 12000 validation samples on rank 0",
                                  "initialized seed on rank 0, numpy: 42"])
def test_a_label_of_what_rank_0_did_is_no_rank_only_work(line):
    """Every rank may print what it did with its own number: no word of who else does it."""
    rc = analyse(incident(line), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.silent_rank", rc


def test_a_program_that_labels_every_ranks_work_with_its_number_names_no_one():
    """Every rank says it runs validation on itself: the waiting ranks said the same, no one left."""
    found = [f for f in incident("INFO trainer: running validation (12 datasets) on rank 0")
             if f.rank == 0 or "running validation" not in f.line]
    for r in (1, 2, 3):
        found += logged(r, 0.5, f"INFO trainer: running validation (12 datasets) on rank {r}")
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.silent_rank", rc


def test_without_such_a_line_the_silent_rank_stays_a_hang():
    rc = analyse(incident(None), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.silent_rank"
    assert rc.failure_class is FailureClass.HANG


def test_a_rank_whose_last_line_is_other_work_is_not_read_as_gone():
    """grpo-style: rank 0 starts a server of its own; nothing says it left the collectives' path."""
    rc = analyse(incident("starting vLLM generation server on device cuda:7 for rank 0"), world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.left_path"


def test_waiting_ranks_that_said_the_same_did_not_part_there():
    """Every rank ended its epoch: the end of the epoch is where all of them were, not a split."""
    found = incident("epoch 3 done", waiting_too="epoch 3 done")
    order = sorted(found, key=lambda f: (f.time, f.seq))
    w = waits(order, [f for f in found if "Watchdog caught" in f.line])    # ranks 1-3 only waited
    assert w is not None and w.waiting == [1, 2, 3] and left_rank(order, w) is None
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.left_path", rc


def test_a_line_older_than_the_wait_is_not_where_the_rank_is():
    rc = analyse(incident("epoch 0 finished after 18 steps", t=-3600.0), world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.left_path"


def test_a_rank_with_an_error_of_its_own_failed_rather_than_left():
    found = incident("epoch 0 finished after 18 steps") + logged(
        0, 600.0, "RuntimeError: CUDA error: an illegal memory access was encountered")
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.left_path"


def test_an_unprefixed_line_beside_named_waiting_ranks_is_the_left_one():
    """accelerate launch: one terminal, no prefixes; the watchdog lines name their ranks."""
    found = logged(None, 0.0, "running evaluation on the main process (12000 samples)")
    found += [f for r in (1, 2, 3) for f in logged(None, 1800.0, watchdog(r).replace("SeqNum=19, ", ""))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.fields["waiting"] == [1, 2, 3]


def test_left_path_rules_are_the_packs_left_path_rules():
    assert {r.id for r in RULES if "left_path" in r.tags} == LEFT_PATH_RULES


def test_uneven_split_rules_are_the_packs_uneven_split_rules():
    assert {r.id for r in RULES if "uneven_split" in r.tags} == UNEVEN_SPLIT_RULES


FIT_DONE = "`Trainer.fit` stopped: `max_epochs=50` reached."


def test_only_waiting_after_training_finished_is_the_programs_end_not_a_notice():
    """Lightning's save_checkpoint called on rank 0 alone: its barrier has no partner after fit."""
    found = logged(0, 0.0, FIT_DONE, "saving final checkpoint to outputs/final.ckpt")
    found += logged(0, 1800.0, watchdog(0, seq=11874))
    an = analyse(found, world=4)
    assert an.root_cause is not None and an.root_cause.rule_id == "collective.wait_after_finish", an.root_cause
    assert an.root_cause.failure_class is FailureClass.USER_CODE and not an.after_finish


def test_an_error_of_its_own_after_training_finished_stays_a_notice():
    found = logged(0, 0.0, FIT_DONE)
    found += logged(0, 60.0, "RuntimeError: CUDA error: an illegal memory access was encountered")
    an = analyse(found, world=4)
    assert an.after_finish and an.root_cause is not None and an.root_cause.rule_id != "collective.wait_after_finish"


def test_a_wait_beside_an_error_of_its_own_after_the_finish_stays_a_notice():
    found = logged(0, 0.0, FIT_DONE) + logged(0, 1800.0, watchdog(0, seq=11874))
    found += logged(1, 1700.0, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    an = analyse(found, world=4)
    assert an.after_finish


def job_hang(t: float, silent: float = 1800.0) -> Finding:
    o = Origin("combined", None, "left", "node-0", "stderr", "process")
    return Finding("hang.job", "hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR, o,
                   f"no output from any of 1 instance for {silent:.0f} s", T0 + t, 10_000,
                   fields={"silent_for": silent, "instances": 1})


SWIFT_DONE = "[INFO:swift] End time of running main: 2026-11-21 00:00:00.000000"
CANCELLED = "slurmstepd: error: *** JOB 5512093 ON gpu-c07 CANCELLED AT 2026-11-21T02:23:00 ***"


def test_a_job_hang_after_swifts_main_returned_is_the_programs_end():
    """ms-swift logs "End time of running main" only when its pipeline's run() returned (a finish)."""
    found = logged(None, 0.0, SWIFT_DONE)
    rc = analyse(found + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.wait_after_finish", rc
    assert rc.fields["finished"] == "lifecycle.finished.swift_main"


def test_the_cancel_that_ended_a_job_silent_after_its_finish_is_not_read():
    """The scheduler's cancel hours after the job went silent is how it was ended, not why it hung."""
    found = logged(None, 0.0, SWIFT_DONE) + logged(None, 8580.0, CANCELLED)
    assert [f.rule_id for f in found if f.severity >= Severity.ERROR], "the cancel must be an error for this test"
    rc = analyse(found + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.wait_after_finish", rc


def test_a_cancel_after_the_finish_with_no_job_hang_stays_a_notice():
    found = logged(None, 0.0, SWIFT_DONE) + logged(None, 600.0, CANCELLED.replace("02:23:00", "00:10:00"))
    an = analyse(found, world=1)
    assert an.after_finish and an.root_cause is not None and an.root_cause.rule_id != "collective.wait_after_finish"


def test_a_ctrl_c_beside_the_hang_after_the_finish_is_no_death_of_its_own():
    """mpirun's report of a rank ended by SIGINT (a person's Ctrl-C, forwarded) says nothing of its own."""
    found = logged(None, 0.0, FIT_DONE)
    found += logged(None, 60.0, "mpirun noticed that process rank 0 with PID 0 on node hls2 exited on signal 2 (Interrupt).")
    rc = analyse(found + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.wait_after_finish", rc


def test_a_rank_killed_beside_the_hang_after_the_finish_stays_a_notice():
    found = logged(None, 0.0, FIT_DONE)
    found += logged(None, 60.0, "mpirun noticed that process rank 0 with PID 0 on node hls2 exited on signal 9 (Killed).")
    an = analyse(found + [job_hang(1800.0)], world=1)
    assert an.after_finish and an.root_cause is not None and an.root_cause.rule_id != "collective.wait_after_finish"


STALL = ("[1,0]<stderr>:WARNING: One or more tensors were submitted to be reduced, gathered or broadcasted by subset "
         "of ranks and are waiting for remainder of ranks for more than 60 seconds. This may indicate that different "
         "ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, which will "
         "cause deadlock.")


def mpirun_stop(t: float, signal: str = "15 (Terminated)") -> list[Finding]:
    return logged(None, t, f"mpirun noticed that process rank 0 with PID 48812 on node gpu-3 exited on signal {signal}.")


def test_a_job_stopped_while_horovod_kept_reporting_a_stall_is_the_ranks_diverging():
    found = logged(0, 60.0, STALL) + logged(0, 120.0, STALL) + logged(0, 180.0, STALL) + mpirun_stop(200.0)
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.fields["phase"] == "lifecycle.stall.horovod"


def test_one_stall_warning_before_a_stop_keeps_the_stops_reading():
    """A single warning is a rank that was slow for one check (horovod#403: it can be ignored)."""
    rc = analyse(logged(0, 60.0, STALL) + mpirun_stop(200.0), world=4).root_cause
    assert rc is not None and rc.rule_id == "mpi.process_exited_on_signal", rc


def test_a_rank_killed_while_horovod_reported_a_stall_died_of_its_own():
    found = logged(0, 60.0, STALL) + logged(0, 120.0, STALL) + mpirun_stop(200.0, "9 (Killed)")
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "mpi.process_exited_on_signal", rc


def test_a_job_hang_right_after_an_early_stop_is_the_stop_on_some_ranks_only():
    found = logged(None, 0.0, "Early stopping: no improvement in 5 validations; stopping at step 14000")
    rc = analyse(found + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.fields["hang"] == "hang.job"


def test_the_cancel_that_ended_a_job_silent_right_after_an_early_stop_is_not_read():
    """What came after the whole hang interval (the scheduler's cancel) is how the silent job ended."""
    found = logged(None, 0.0, "Early stopping: no improvement in 5 validations; stopping at step 14000")
    rc = analyse(found + [job_hang(1800.0)] + logged(None, 5000.0, CANCELLED), world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc


def test_a_job_hang_long_after_the_stop_line_keeps_the_hang_reading():
    found = logged(None, 0.0, "Early stopping: no improvement in 5 validations; stopping at step 14000")
    rc = analyse(found + [job_hang(7200.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def test_a_job_hang_after_an_epoch_end_keeps_the_hang_reading():
    """Every rank ends its epochs: an epoch's end is no sign that some ranks left."""
    rc = analyse(logged(None, 0.0, "epoch 3 done") + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


HOROVOD_STALL = ("[1,0]<stderr>:W horovod/common/stall_inspector.cc:107] One or more "
                 "tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting "
                 "for remainder of ranks for more than 60 seconds. This may indicate that different ranks are trying "
                 "to submit different tensors or that only subset of ranks is submitting tensors, which will cause deadlock.")


def test_a_job_hang_right_after_horovods_stall_warning_is_the_ranks_diverging():
    """stall_inspector.cc: different ranks submit different tensors, "which will cause deadlock"."""
    found = logged(None, 0.0, HOROVOD_STALL, "Missing ranks:", "2: [HorovodAllreduce_grad_0]")
    rc = analyse(found + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.fields["phase"] == "lifecycle.stall.horovod"


def test_horovods_stall_warning_long_before_a_job_hang_keeps_the_hang_reading():
    """Counterexample: training went on after the warning (a slow rank, horovod#403); the hang came later."""
    found = logged(None, 0.0, HOROVOD_STALL)
    rc = analyse(found + [job_hang(7200.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


NCCL_SUSPECTED = ("gpu-ws-03:31502:31620 [0] init.cc:1256 NCCL WARN Your program may be hanging, this may be caused "
                  "by a collective mismatch around rank 1. Please check your collective calls at and around this rank.")


def test_a_job_hang_right_after_nccls_suspected_mismatch_is_the_ranks_diverging():
    """NCCL src/init.cc ncclDevSuspectedMismatch: a peer went on to later collectives while this rank waited."""
    rc = analyse(logged(None, 0.0, NCCL_SUSPECTED) + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.fields["phase"] == "nccl.collective_mismatch_suspected"


def test_nccls_suspected_mismatch_long_before_a_job_hang_keeps_the_hang_reading():
    rc = analyse(logged(None, 0.0, NCCL_SUSPECTED) + [job_hang(7200.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def ranked_hang(t: float, culprit: int, culprit_last: float, silent: float = 1800.0) -> Finding:
    """A job hang at ``t`` of two per-rank instances; ``culprit`` went silent first, at ``culprit_last``."""
    o = Origin(f"worker-{culprit}", culprit, "left", "node-0", "stderr", "process")
    return Finding("hang.job", "hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR, o,
                   f"no output from any of 2 instances for {silent:.0f} s", T0 + t, 10_000,
                   fields={"silent_for": silent, "instances": 2, "culprit_silent_for": t - culprit_last,
                           "last_output": "2026-11-21T09:00:00+00:00"})


EPOCH_DONE = "INFO [train.py:350] epoch 0 done on rank {}, saving epoch-0.pt"


def test_a_job_hang_after_one_rank_alone_ended_its_epoch_is_its_peers_uneven_inputs():
    """Rank 1 ends its epoch; rank 0 wrote its own lines until 40 s before and never ends it: rank 1's
    collectives all completed with rank 0, so rank 0 went on into collectives rank 1 never issues."""
    found = logged(1, 40.0, EPOCH_DONE.format(1))
    rc = analyse(found + [ranked_hang(40.0 + 1800.0, culprit=0, culprit_last=0.0)], world=2).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.fields["phase"] == "lifecycle.left_path.epoch_end"


def test_a_job_hang_after_every_rank_ended_its_epoch_keeps_the_hang_reading():
    """Counterexample: rank 0 printed its epoch end too: they parted nowhere."""
    found = logged(1, 40.0, EPOCH_DONE.format(1)) + logged(0, 41.0, EPOCH_DONE.format(0))
    rc = analyse(found + [ranked_hang(41.0 + 1800.0, culprit=1, culprit_last=40.0)], world=2).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def test_a_job_hang_after_an_epoch_end_beside_a_rank_silent_long_before_keeps_the_hang_reading():
    """Counterexample: the culprit wrote nothing for an hour before the epoch end (a rank that logs
    nothing of its own, or one silent long before): its missing epoch-end line says nothing."""
    found = logged(1, 3600.0, EPOCH_DONE.format(1))
    rc = analyse(found + [ranked_hang(3600.0 + 1800.0, culprit=0, culprit_last=0.0)], world=2).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def test_a_job_hang_whose_culprit_printed_the_epoch_end_keeps_the_hang_reading():
    """Counterexample: the rank that ended its epoch is the one that went silent first."""
    found = logged(1, 40.0, EPOCH_DONE.format(1))
    rc = analyse(found + [ranked_hang(40.0 + 1800.0, culprit=1, culprit_last=40.0)], world=2).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


WDS_SPLIT = ("[rank0]: /opt/venv/lib/python3.8/site-packages/webdataset/shardlists.py:98: "
             "UserWarning: world_size 4 > num_shards 1")
NEMO_SPLIT = ("[NeMo W 2026-11-21 00:00:00 audio_to_text:201] Number of shards in tarred dataset (10) is not "
              "divisible by number of distributed workers (8).")


@pytest.mark.parametrize("line", [WDS_SPLIT, NEMO_SPLIT])
def test_a_job_hang_right_after_the_loader_said_the_shards_split_unevenly_is_the_programs(line):
    """webdataset split_by_node: ranks past the last shard get none; NeMo: "may hang if the shards are uneven"."""
    rc = analyse(logged(None, 0.0, line) + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "collective.left_path", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.fields["phase"] in UNEVEN_SPLIT_RULES and rc.fields["left"] is None


def test_training_that_went_on_long_after_the_split_warning_keeps_the_hang_reading():
    """Counterexample: resampled shards or with_epoch fed every rank, and the job hung much later."""
    rc = analyse(logged(None, 0.0, WDS_SPLIT) + [job_hang(7200.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def test_the_per_worker_shard_warning_is_no_uneven_split_of_ranks():
    """num_workers > num_shards leaves some loader workers of one rank idle, not a rank without data."""
    line = "/opt/venv/lib/python3.8/site-packages/webdataset/dataset.py:85: UserWarning: num_workers 4 > num_shards 1"
    rc = analyse(logged(None, 0.0, line) + [job_hang(1800.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"
