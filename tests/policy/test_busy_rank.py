"""Ranks that timed out waiting for a rank busy with its own work (ftwatch.policy.busy, issue 12
item 3): the main process pre-processing data under main_process_first while its replicas' barrier
times out is the program's schedule (user_code), not a fault of the waiting ranks; without that
evidence the waits keep their own reading."""

from __future__ import annotations

from ftwatch.events import FailureClass, Finding, Origin, ProcessExit
from ftwatch.policy.busy import PHASE_RULES, busy_rank, waits
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
RULES = load_rules()
ENGINE = Engine(RULES)


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "busy", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def bar(pct: int, done: int, total: int = 2_000_000, clock: str = "29:57<18:11") -> str:
    return (f"Running tokenizer on dataset (num_proc=16):  {pct}%|██████    | {done}/{total} "
            f"[{clock}, 713.55 examples/s]")


def store_wait(rank: int) -> list[str]:
    """A replica's barrier inside main_process_first timing out on the store read."""
    return ["Traceback (most recent call last):",
            '  File "/work/train.py", line 40, in <module>',
            '    with training_args.main_process_first(desc="dataset map pre-processing"):',
            '  File "/opt/conda/lib/python3.10/site-packages/transformers/training_args.py", line 2368, in '
            "main_process_first",
            "    dist.barrier()",
            f"torch.distributed.DistBackendError: [{rank}] is setting up NCCL communicator and retrieving "
            "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: "
            "Socket Timeout"]


def unranked(t: float, line: str) -> list[Finding]:
    o = Origin("combined", None, "busy", "node-0", "stderr", "process")
    return ENGINE.feed(o, f"{line}\n".encode(), T0 + t, final=True)


def incident(phase: str | None, t_phase: float = 0.0) -> list[Finding]:
    found = logged(0, t_phase, phase) if phase else []
    for r in (1, 2, 3):
        found += logged(r, 1800.0 + r / 10, *store_wait(r))
    return found


def test_replicas_timing_out_while_the_main_process_maps_the_dataset_is_a_program_schedule():
    rc = analyse(incident(bar(61, 1_221_000), t_phase=1500.0), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.rank == 0
    assert rc.fields["waiting"] == [1, 2, 3] and rc.fields["percent"] == 61


def test_the_waits_are_read_once_for_the_four_readings_that_start_from_them(monkeypatch):
    """The waits (every waiting rank's findings read with regexes: a quarter of the decision where
    4,096 ranks each printed a traceback) are read once per analysis, not once by each of busy,
    left, named-wait and working rank; a phase line none of them names leaves all four asked."""
    from ftwatch.policy import busy
    read = []
    real = busy._waiting
    monkeypatch.setattr(busy, "_waiting", lambda mine: read.append(1) or real(mine))
    an = analyse(incident("a line of no phase", t_phase=1500.0), world=4)
    assert an.root_cause is not None and an.root_cause.rule_id != "collective.busy_rank"
    assert len(read) == 3                                  # ranks 1-3, once each (was 12)


def test_without_the_busy_ranks_phase_line_the_waits_keep_their_reading():
    an = analyse(incident(None), world=4)
    assert an.root_cause is not None and an.root_cause.rule_id != "collective.busy_rank"


def test_a_finished_map_says_the_rank_was_no_longer_busy():
    rc = analyse(incident(bar(100, 2_000_000), t_phase=1500.0), world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.busy_rank"


def test_a_phase_line_older_than_the_wait_is_not_what_they_waited_for():
    rc = analyse(incident(bar(61, 1_221_000), t_phase=-3600.0), world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.busy_rank"


def test_a_waiting_rank_with_a_fault_of_its_own_is_not_only_waiting():
    found = incident(bar(61, 1_221_000), t_phase=1500.0)
    found += logged(2, 1790.0, "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    order = sorted(found, key=lambda f: (f.time, f.seq))
    assert busy_rank(order, waits(order, found)) is None


def test_a_rank_killed_meanwhile_is_not_explained_by_the_wait():
    """A SIGKILL (the OOM killer, a preemption) says rank 3 died: no barrier explains that."""
    found = incident(bar(61, 1_221_000), t_phase=1500.0)
    o = Origin("worker-3", 3, "busy", "node-0", "stderr", "process")
    death = exit_finding(ProcessExit(o, 4242, None, 9, T0 + 1790.0), ExitCodeTable.load())
    assert death is not None and death.fields.get("signal") == 9
    order = sorted(found, key=lambda f: (f.time, f.seq))
    assert busy_rank(order, waits(order, [*found, death])) is None


def test_a_busy_rank_that_failed_itself_is_no_busy_rank():
    found = incident(bar(61, 1_221_000), t_phase=1500.0)
    found += logged(0, 1600.0, "RuntimeError: CUDA error: an illegal memory access was encountered")
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.busy_rank"


def test_work_that_its_bar_says_ends_within_the_timeout_does_not_explain_the_wait():
    """05:00 elapsed + 02:00 remaining: the main process's map alone could not hold them 30 min."""
    rc = analyse(incident(bar(61, 1_221_000, clock="05:00<02:00"), t_phase=1500.0), world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.busy_rank"


def test_a_bar_without_a_rank_prefix_beside_named_waiting_ranks_is_the_busy_one():
    """torchrun prefixes the workers' tracebacks ([rank1]:) but not rank 0's progress bar."""
    found = unranked(1500.0, bar(92, 1_840_000)) + incident(None)
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.rank is None and rc.fields["waiting"] == [1, 2, 3]


def watchdog(rank: int) -> str:
    """torch 2.1's watchdog line, the rank named only inside it (no launcher prefix)."""
    return (f"[E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800328 "
            "milliseconds before timing out.")


def test_a_bar_that_a_waiting_ranks_timeout_line_runs_on_from_is_the_busy_process():
    """accelerate launch: one terminal, no prefixes; tqdm's carriage return leaves rank 0's bar
    at the head of the line rank 2's watchdog message then continues."""
    head = ("Running tokenizer on dataset:   9%|███▊      | 280000/2969526 [29:55<4:48:08, 155.57 examples/s]"
            + watchdog(2))
    found = [f for line in (head, watchdog(1), watchdog(3)) for f in unranked(1800.0, line)]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.fields["waiting"] == [1, 2, 3] and rc.fields["percent"] == 9


def test_without_a_bar_unprefixed_watchdog_timeouts_stay_a_hang():
    found = [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
    an = analyse(found, world=4)
    assert an.fallout_only and an.fallout_class is FailureClass.HANG


def test_phase_rules_are_the_packs_rank_phase_rules():
    tagged = {r.id for r in RULES if "rank_phase" in r.tags}
    assert tagged == PHASE_RULES


def test_a_rank_reading_a_file_longer_than_the_timeout_is_busy_too():
    """A bar counting bytes (tqdm unit="B"): the main process scans a file of its own for 88 min
    while the replicas' all-reduce times out after 30."""
    scan = " 34%|###       | 70956855155/208140108456 [30:00<58:00, 39115047.81B/s]"
    found = unranked(1750.0, scan) + [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.fields["phase"] == "lifecycle.rank_phase.bytes_transfer" and rc.fields["percent"] == 34


def test_a_file_transfer_its_bar_says_ends_within_the_timeout_does_not_explain_the_wait():
    scan = " 80%|########  | 4.00G/5.00G [06:00<01:30, 11.4MB/s]"
    found = unranked(1750.0, scan) + [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id != "collective.busy_rank"


def test_ranks_timing_out_while_the_local_master_scans_yolo_labels_is_a_program_schedule():
    """YOLOv5 builds its dataset inside torch_distributed_zero_first: the local master scans the
    labels while the others wait in a barrier; a scan past the 30-minute timeout is the job's."""
    scan = ("train: Scanning /data/Objects365/labels/train... 1130415 found, 0 missing, 195 empty, 0 corrupt:"
            "  65%|######4   | 1132365/1742289 [31:10<16:47, 605.4it/s]")
    found = unranked(1790.0, scan) + [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.fields["phase"] == "lifecycle.rank_phase.label_scan"


def test_the_ultralytics_scan_wording_is_the_same_local_master_scan():
    """Later YOLOv5 and YOLOv8 on write the scan bar as "N images, M backgrounds, K corrupt"; the
    dataset is still built under torch_distributed_zero_first while the other ranks wait."""
    scan = ("train: Scanning /mnt/bulk/aerial/labels/train... 412093 images, 2210 backgrounds, 0 corrupt:"
            "  17%|█▋        | 414303/2431877 [29:41<2:24:10, 233.21it/s]")
    found = unranked(1790.0, scan) + [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.fields["phase"] == "lifecycle.rank_phase.label_scan"


def test_ranks_timing_out_while_one_process_tokenizes_the_dataset_is_a_program_schedule():
    """The process that builds the dataset tokenizes it whole before training; a tokenization its
    own bar says outlasts the others' 30-minute wait held them there."""
    tok = ("Tokenizing inputs... This may take some time...: 58%|█▌        | 296960/512000 "
           "[29:41<21:40, 197.3it/s]")
    found = unranked(1790.0, tok) + [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.fields["phase"] == "lifecycle.rank_phase.tokenizing"


def test_a_tokenization_its_bar_says_ends_within_the_timeout_does_not_explain_the_wait():
    tok = "Tokenizing inputs... This may take some time...: 58%|█▌        | 296960/512000 [06:41<04:40, 197.3it/s]"
    found = unranked(1790.0, tok) + [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
    rc = analyse(found, world=4).root_cause
    assert rc is None or rc.rule_id != "collective.busy_rank", rc


def test_a_bar_that_cannot_tell_what_remains_is_busy_only_when_its_elapsed_covers_the_wait():
    """tqdm prints ``?`` for the remaining time it cannot tell: the elapsed time alone is the work."""
    long = " 34%|###       | 70956855155/208140108456 [31:00<?, 39115047.81B/s]"
    short = " 34%|###       | 70956855155/208140108456 [12:00<?, 39115047.81B/s]"
    for scan, busy in ((long, True), (short, False)):
        found = unranked(1790.0, scan) + [f for r in (1, 2, 3) for f in unranked(1800.0, watchdog(r))]
        rc = analyse(found, world=4).root_cause
        assert rc is not None and (rc.rule_id == "collective.busy_rank") is busy, (scan, rc)


WATCHDOG = ("[E ProcessGroupNCCL.cpp:828] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
            "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800946 milliseconds before timing out.")


def caching_bar(done: int, clock: str) -> str:
    """A plain tqdm bar (s/it: no datasets or bytes unit) on a terminal the ranks share."""
    return f" {done * 100 // 1818}%|████████▍ | {done}/1818 [{clock},  1.14s/it]"


def shared_terminal(*later: str) -> list[Finding]:
    """Rank 1's watchdog line running on from the main process's bar, then what the terminal shows next."""
    found = unranked(1800.0, caching_bar(1581, "30:01<04:30") + WATCHDOG)
    for i, line in enumerate(later):
        found += unranked(1801.0 + i, line)
    return sorted(found, key=lambda f: (f.time, f.seq))


def test_a_bar_of_any_unit_that_advanced_after_the_peers_timeout_was_a_busy_process():
    found = shared_terminal(caching_bar(1582, "30:02<04:29") + "[2023-11-26 14:52:18,904] torch.distributed.elastic."
                            "multiprocessing.api: [WARNING] Sending process 612 closing signal SIGTERM")
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.fields["phase"] == "progress_bar.advanced_past_timeout" and rc.fields["waiting"] == [1]


def test_a_bar_that_stopped_with_the_timeout_keeps_the_hang_reading():
    found = shared_terminal("[2023-11-26 14:52:18,904] torch.distributed.elastic.multiprocessing.api: [WARNING] "
                            "Sending process 612 closing signal SIGTERM")
    rc = analyse(found, world=2).root_cause
    assert rc is None or rc.rule_id != "collective.busy_rank", rc


def test_a_unique_id_read_on_a_stream_with_no_rank_prefix_is_the_rank_it_names():
    # ProcessGroupNCCL's broadcastUniqueNCCLID names its group rank: "[1] is setting up NCCL
    # communicator ...". On one unprefixed stream (torch.distributed.launch, accelerate) the
    # waiting ranks are those it names, and rank 0's unprefixed map bar is the busy one.
    found = unranked(1500.0, bar(61, 1_221_000))
    for r in (1, 2, 3):
        found += unranked(1800.0 + r / 10, store_wait(r)[-1])
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank", rc
    assert rc.fields["waiting"] == [1, 2, 3]


def test_the_unique_id_reads_rank_is_read_only_in_the_default_group():
    from ftwatch.policy.collectives import rank_of
    line = store_wait(2)[-1]
    assert rank_of(unranked(0.0, line)[-1]) == 2
    other = line.replace("Socket Timeout", "wait timeout after 600000ms, keys: /default_pg/3//cuda//0")
    assert rank_of(unranked(0.0, other)[-1]) is None
    default = line.replace("Socket Timeout", "wait timeout after 600000ms, keys: /default_pg/0//cuda//0")
    assert rank_of(unranked(0.0, default)[-1]) == 2
    without_it = unranked(0.0, "RuntimeError: [2] something else failed")
    assert all(rank_of(f) is None for f in without_it)


def rendezvous_connect(rank: int) -> list[str]:
    """A rank's env:// rendezvous giving up on rank 0's store, which rank 0 starts only once it
    reaches init_process_group itself (torch/distributed/rendezvous.py _create_c10d_store)."""
    return ["[E socket.cpp:860] [c10d] The client socket has timed out after 1800s while trying to connect to "
            "(10.0.0.1, 29500).",
            "Traceback (most recent call last):",
            '  File "/work/train.py", line 307, in <module>',
            '  File "/env/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 1141, in '
            "init_process_group",
            "    store, rank, world_size = next(rendezvous_iterator)",
            '  File "/env/lib/python3.10/site-packages/torch/distributed/rendezvous.py", line 172, in '
            "_create_c10d_store",
            "    return TCPStore(",
            "torch.distributed.DistNetworkError: The client socket has timed out after 1800s while trying to "
            "connect to (10.0.0.1, 29500)."]


def test_ranks_whose_rendezvous_connect_timed_out_while_rank_0_mapped_the_dataset_waited_for_it():
    """Rank 0 maps the dataset before it calls init_process_group (XTuner under DeepSpeed): the others'
    connects to its store time out after the process group's 30 minutes while its bar says hours
    remain. The program's schedule against its own timeout (before: the store client's timeout, a
    restart that meets the same 30 minutes)."""
    found = logged(0, 1790.0, "Map (num_proc=32):  12%|█▏        | 79551/665298 [29:57<3:40:22, 44.29 examples/s]")
    found += logged(1, 1800.0, *rendezvous_connect(1))
    rc = analyse(found, world=2).root_cause
    assert rc is not None and rc.rule_id == "collective.busy_rank" and rc.rank == 0, rc
    # without rank 0's bar the connect keeps its own reading
    rc = analyse(logged(1, 1800.0, *rendezvous_connect(1)), world=2).root_cause
    assert rc is not None and rc.rule_id != "collective.busy_rank"


def test_which_bars_advanced_after_their_timeout_is_the_answer_of_reading_every_later_line():
    """``_advanced_bars`` (one sweep from the end, each total's later updates kept) names the same
    timeouts as reading every later finding's bar for each timeout: the same total, more elapsed
    and more done (either count not a plain number counts as more)."""
    import random

    from ftwatch.policy.busy import _BAR, _advanced_bars, _clock, _unfinished
    from ftwatch.testing import finding
    rng = random.Random(3)

    def reference(f, order):
        m = _BAR.match(f.line)
        if m is None or _unfinished(f) is None:
            return False
        done, total, elapsed = m.group(2), m.group(3), _clock(m.group(4))
        for g in order:
            n = _BAR.match(g.line)
            if (g.time, g.seq) <= (f.time, f.seq) or n is None or n.group(3) != total or _clock(n.group(4)) <= elapsed:
                continue
            if not (done.isdigit() and n.group(2).isdigit()) or int(n.group(2)) > int(done):
                return True
        return False

    for _ in range(300):
        order = []
        for seq in range(rng.randint(1, 25)):
            total = rng.choice(["500", "2000"])
            done = rng.choice([str(rng.randint(0, 40)), "1.2k"])
            clock = f"{rng.randint(0, 2):02d}:{rng.randint(0, 59):02d}<00:10"
            line = (f"Map:  {rng.randint(0, 99)}%|##  | {done}/{total} [{clock}, 3.1 examples/s]"
                    f"[E ProcessGroupNCCL.cpp:475] [Rank {seq}] Watchdog caught collective operation timeout")
            if rng.random() < 0.2:
                line = "no bar on this line"
            order.append(finding("nccl.watchdog_timeout", line=line, time=T0 + rng.choice([0.0, 1.0, 2.0]), seq=seq))
        order.sort(key=lambda f: (f.time, f.seq))
        timeouts = [f for f in order if rng.random() < 0.6]
        assert _advanced_bars(timeouts, order) == {id(f) for f in timeouts if reference(f, order)}
