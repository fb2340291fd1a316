"""The rule engine: raw chunks in, one Finding per Record out (P1, P2, P3, R1, R2, R3, R7, Q1).

Every log line here is as PyTorch, torchrun, gloo, NCCL, the NVIDIA driver or the Ascend device
plugin print it (several are taken from the recorded DDP jobs in ``tests/golden``).
"""

from __future__ import annotations

import itertools
import random

import pytest
from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import MAX_CARRY_BYTES, Engine
from ftwatch.rules.judge import MAX_LINE_CHARS
from ftwatch.rules.loader import load_rules, rules_from_keywords
from ftwatch.rules.added_rules import LayeredMatcher
from ftwatch.rules.matcher import Matcher

from engine_samples import (C10_DUMP, GLOO_TB, KEYERROR_TB, NCCL_INFO, STEP, T0, WATCHDOG, XID79, needs_hs,
                            summary)

WORKER1 = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")
COMBINED = Origin("combined", None, "job-7", "node-a", "/logs/combined.log", "replay")


def lines(*parts: str | list[str], prefix: str = "") -> bytes:
    """The raw bytes of log lines, each with ``prefix`` and a newline."""
    flat: list[str] = []
    for part in parts:
        flat.extend([part] if isinstance(part, str) else part)
    return "".join(f"{prefix}{line}\n" for line in flat).encode()


@pytest.fixture(scope="module")
def rules():
    return load_rules()


@pytest.fixture
def engine(rules) -> Engine:
    return Engine(rules)


# --- P1: multi-line blocks ---------------------------------------------------------------------

def test_keyerror_traceback_is_one_user_code_finding_on_its_exception_line(engine):
    data = lines(STEP, KEYERROR_TB, "rank 1/3 exiting")

    [finding] = engine.feed(WORKER1, data, T0)

    assert finding.rule_id == "python.key_error"
    assert finding.failure_class is FailureClass.USER_CODE
    assert finding.action is Action.FAIL_JOB
    assert finding.line == "KeyError: 'warmup_steps'"
    assert finding.evidence == tuple(KEYERROR_TB)
    assert (finding.rank, finding.origin.instance) == (1, "worker-1")
    assert engine.stats.records == 1 and engine.stats.findings == 1


def test_traceback_behind_a_ray_prefix_is_one_record(rules):
    # Ray's driver reprints an actor's output as "(TaskRunner pid=N) <line>" (verl, OpenRLHF): the
    # prefix must not cut the traceback into a lone "Traceback" line (the catch-all) and frames
    [bare] = Engine(rules).feed(COMBINED, lines(STEP, KEYERROR_TB), T0)
    [finding] = Engine(rules).feed(COMBINED, lines(STEP, KEYERROR_TB, prefix="(TaskRunner pid=467613) "), T0)

    assert finding.rule_id != "python.uncaught_exception"     # the final exception decides
    assert finding.failure_class is bare.failure_class is FailureClass.USER_CODE
    assert finding.line.endswith(bare.line)
    assert finding.evidence == tuple(KEYERROR_TB)
    assert finding.rank is None


def test_traceback_behind_kubectl_timestamps_is_one_record(rules):
    # `kubectl logs --timestamps` / `docker logs --timestamps` put an RFC 3339 stamp before every
    # line: the frames' indentation comes after it, and the traceback must still join (else its
    # lone "Traceback" line is the catch-all and the final exception is a record of its own)
    [bare] = Engine(rules).feed(COMBINED, lines(STEP, KEYERROR_TB), T0)
    stamped = [f"2026-08-07T22:58:24.{i:03d}Z {line}" for i, line in enumerate([STEP] + KEYERROR_TB)]
    [finding] = Engine(rules).feed(COMBINED, lines(stamped), T0)

    assert finding.rule_id == bare.rule_id != "python.uncaught_exception"
    assert finding.line.endswith(bare.line)
    assert finding.time == pytest.approx(1786143504.001, abs=1e-3)     # the first line's own stamp


ECC_TB = ["Traceback (most recent call last):",
          '  File "/srv/ft/train.py", line 188, in <module>',
          "    main()",
          "RuntimeError: CUDA error: uncorrectable ECC error encountered",
          "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
          "below might be incorrect."]


@pytest.mark.parametrize("prefix", ["ERROR 06-03 09:46:31 multiproc_worker_utils.py:226] ",
                                    "(VllmWorkerProcess pid=58213) ERROR 06-03 09:46:31 worker_base.py:464] ",
                                    "ws-gpu-2: [rank13]: ", "ws-gpu-2: "],
                         ids=["vllm-logger", "vllm-worker-logger", "pdsh-rank", "pdsh"])
def test_traceback_behind_a_prefix_repeated_on_every_line_is_decided_by_its_message(rules, prefix):
    # vLLM's NewLineFormatter repeats the record's "LEVEL date file:line] " head on every line of a
    # logged traceback, pdsh its "host: " label: the frames are indented only after it, and the
    # message's vocabulary (an uncorrectable ECC: the device) must decide, not the catch-all
    [bare] = [f for f in Engine(rules).feed(COMBINED, lines(ECC_TB), T0) if f.failure_class is not FailureClass.INFO]
    found = [f for f in Engine(rules).feed(COMBINED, lines(ECC_TB, prefix=prefix), T0)
             if f.failure_class is not FailureClass.INFO]

    assert bare.rule_id == "cuda.uncorrectable_ecc"
    assert [f.rule_id for f in found] == [bare.rule_id]
    assert found[0].failure_class is FailureClass.HARDWARE_NODE


def test_a_traceback_prefix_is_stripped_only_where_repeated_exactly(rules):
    # the next line of another record (another time) is not the traceback's: the block ends at the
    # last frame, as before (a cut traceback), and that line is judged on its own
    head = "ERROR 06-03 09:46:31 worker_base.py:464] "
    data = lines(head + ECC_TB[0], head + ECC_TB[1], head + ECC_TB[2],
                 "ERROR 06-03 09:46:32 worker_base.py:464] KeyError: 'warmup_steps'")
    found = Engine(rules).feed(COMBINED, data, T0)

    assert [f.rule_id for f in found] == ["python.uncaught_exception"]
    assert found[0].line == head + ECC_TB[0]


def test_a_traceback_glued_to_a_progress_bar_is_its_ranks(rules):
    # tqdm redraws its bar with \r and writes no newline until it closes: the crashing rank's first
    # traceback line lands on the bar's line, its other lines start with the rank's own prefix
    bar = "Epoch 0:  16%|#5        | 7212/44871 [13:02:19<68:05:41,  6.51s/it, train_loss: 0.087]"
    tb = [f"[rank3]: {line}" for line in KEYERROR_TB]
    [finding] = Engine(rules).feed(COMBINED, lines(bar + tb[0], tb[1:]), T0)

    assert finding.rule_id == "python.key_error"
    assert finding.rank == 3
    # a bracket that is no rank prefix changes nothing: the lone line is the catch-all, as before
    found = Engine(rules).feed(COMBINED, lines(bar + "[note]: " + KEYERROR_TB[0], tb[1:]), T0, final=True)
    assert [(f.rule_id, f.rank) for f in found][0] == ("python.uncaught_exception", None)


def test_a_python_logging_stamp_is_not_stripped():
    from ftwatch.parsers.fields import strip_stamp_prefix
    assert strip_stamp_prefix("2026-08-07 22:58:24,992 - root - INFO - Opening data") == \
        "2026-08-07 22:58:24,992 - root - INFO - Opening data"
    assert strip_stamp_prefix("2026-08-07T22:58:24.992123456+08:00     main()") == "    main()"


@pytest.mark.parametrize("prefix", ["[rank{r}]: ", "[default{r}]:[rank{r}]: "], ids=["torch", "torchrun-tee"])
def test_interleaved_tracebacks_of_two_ranks_never_mix(engine, prefix):
    rank0 = [prefix.format(r=0) + line for line in GLOO_TB]
    rank1 = [prefix.format(r=1) + line for line in KEYERROR_TB]
    merged = [line for pair in itertools.zip_longest(rank0, rank1) for line in pair if line is not None]

    findings = engine.feed(COMBINED, lines(merged), T0)

    by_rank = {f.rank: f for f in findings}
    assert sorted(by_rank) == [0, 1] and len(findings) == 2
    assert by_rank[1].rule_id == "python.key_error"
    assert by_rank[1].evidence == tuple(KEYERROR_TB)
    assert by_rank[1].origin.instance == "rank1"
    assert by_rank[0].rule_id == "gloo.connection_closed_by_peer"
    assert by_rank[0].evidence == tuple(GLOO_TB)
    assert by_rank[0].origin.instance == "rank0"


def test_a_traceback_glued_behind_a_progress_bar_is_its_ranks_one_record(engine):
    """A tqdm bar writes no newline until it closes: the rank's first traceback line lands on the
    bar's line, its other lines under ``[rank3]:`` must still join it (one record, rank 3)."""
    tb = ["  File \"/workspace/trainer.py\", line 167, in perform_sampling",
          "    os.makedirs(save_dir, exist_ok=True)",
          "OSError: [Errno 5] Input/output error: '/data/run7/samples'"]
    data = lines("Epoch 0:  16%|#5        | 7212/44871 [13:02:19<68:05:41,  6.51s/it, loss: 0.087]"
                 "[rank3]: Traceback (most recent call last):", [f"[rank3]: {t}" for t in tb])

    [finding] = engine.feed(COMBINED, data, T0)

    assert finding.rank == 3 and finding.origin.instance == "rank3"
    assert finding.failure_class is FailureClass.RETRYABLE_INFRA
    assert finding.evidence == ("Traceback (most recent call last):", *tb)


@pytest.mark.parametrize("header", ["ERROR 08-13 15:31:21 [multiproc_executor.py:945] ",
                                    "ERROR 06-09 06:57:48 worker_base.py:581] "], ids=["vllm", "vllm-before-0.6"])
def test_a_traceback_logged_under_vllms_header_is_one_record(engine, header):
    """vLLM's formatter writes its header before every line of a logged traceback; read with it,
    the frames lose their indentation and the exception line is cut from its traceback."""
    tb = ["Traceback (most recent call last):",
          '  File "/vllm-workspace/vllm/worker/worker_base.py", line 573, in execute_method',
          "    return run_method(target, method, args, kwargs)",
          "RuntimeError: NPU out of memory. Tried to allocate 30.00 MiB (NPU 3; 60.96 GiB total capacity)"]
    data = lines([f"(RayWorkerWrapper pid=9120) {header}{t}" for t in tb])

    [finding] = engine.feed(COMBINED, data, T0)

    assert finding.failure_class is FailureClass.OOM
    assert finding.evidence[1:] == tuple(tb[1:])


def test_a_launcher_host_label_before_the_rank_is_no_glued_bar(engine):
    """pdsh's ``host: `` label ends in a space: that line's rank prefix is not a bar's glued tail."""
    data = lines(["ws-gpu-2: [rank13]: Traceback (most recent call last):",
                  "ws-gpu-2: [rank13]:   File \"train.py\", line 3, in <module>",
                  "ws-gpu-2: [rank13]: KeyError: 'labels'"])
    findings = engine.feed(COMBINED, data, T0)
    assert all(f.rank is None for f in findings)


def test_traceback_ending_in_gloo_peer_closed_is_fallout_not_user_code(engine, rules):
    """The generic traceback rule hits the same record; the gloo rule's priority wins (R7)."""
    generic = next(r for r in rules if r.id == "python.uncaught_exception")
    gloo = next(r for r in rules if r.id == "gloo.connection_closed_by_peer")
    assert generic.priority < gloo.priority

    [finding] = engine.feed(WORKER1, lines(GLOO_TB), T0)
    assert (finding.rule_id, finding.failure_class) == ("gloo.connection_closed_by_peer", FailureClass.FALLOUT)
    assert finding.line == GLOO_TB[-1]

    # Without its last line the same traceback is only the generic rule's.
    engine.feed(WORKER1, lines(GLOO_TB[:-1]), T0)
    [cut] = engine.flush(WORKER1, T0)
    assert (cut.rule_id, cut.failure_class) == ("python.uncaught_exception", FailureClass.USER_CODE)


def test_c10_stack_dump_is_one_record(engine):
    """A rule hitting a frame makes one finding for the whole dump; the frames make no others."""
    engine.add_rules(rules_from_keywords(["WorkNCCL::checkTimeout"], id_prefix="test.frame"))
    dump = ["[rank1]: " + line for line in C10_DUMP]

    watchdog, frames = engine.feed(COMBINED, lines(dump, "[rank1]: " + STEP), T0)

    assert (watchdog.rule_id, watchdog.rank) == ("torch.nccl_watchdog_timeout", 1)
    assert watchdog.line == C10_DUMP[1]
    assert (frames.rule_id, frames.rank) == ("test.frame.worknccl_checktimeout", 1)
    assert frames.evidence == tuple(C10_DUMP[2:])
    assert frames.line == C10_DUMP[-1]


def test_an_engine_like_another_shares_its_database_and_none_of_its_state(engine, rules):
    """``like`` (evaluate: one compile for every case) reuses the compiled matcher and tables of an
    engine with the same rules; a half-fed block, counters and sequence numbers stay behind; other
    rules compile their own database."""
    engine.feed(WORKER1, lines(KEYERROR_TB[:2]), T0)               # an open block, carried
    twin = Engine(rules, like=engine)
    assert twin.matcher is engine.matcher and twin.tables is engine.tables
    assert engine.pending_origins() == [WORKER1] and twin.pending_origins() == []
    [finding] = twin.feed(WORKER1, lines(STEP, KEYERROR_TB), T0, final=True)
    assert finding.rule_id == "python.key_error" and finding.evidence == tuple(KEYERROR_TB)
    assert twin.stats.findings == 1 and engine.stats.findings == 0
    other = Engine(rules[:-1], like=engine)
    assert other.matcher is not engine.matcher and len(other.rules) == len(rules) - 1
    twin.add_rules(rules_from_keywords(["flaky fabric"]))          # recompiles its own, never the shared one
    assert twin.matcher is not engine.matcher and len(engine.rules) == len(rules)


def test_traceback_split_across_two_feeds_is_joined(engine):
    assert engine.feed(WORKER1, lines(STEP, KEYERROR_TB[:5]), T0) == []
    assert engine.pending_origins() == [WORKER1]

    [finding] = engine.feed(WORKER1, lines(KEYERROR_TB[5:], STEP), T0 + 1)

    assert finding.rule_id == "python.key_error"
    assert finding.evidence == tuple(KEYERROR_TB)
    assert finding.time == T0  # when the traceback began, not when it was complete
    assert engine.pending_origins() == []


def test_carried_block_joins_a_feed_whose_last_line_lacked_its_newline(engine):
    first = lines(KEYERROR_TB[:-1]).rstrip(b"\n")  # "complete lines; the last may lack its newline"
    assert engine.feed(WORKER1, first, T0) == []
    [finding] = engine.feed(WORKER1, lines(KEYERROR_TB[-1:], STEP), T0 + 1)
    assert finding.line == "KeyError: 'warmup_steps'"
    assert finding.evidence == tuple(KEYERROR_TB)


def test_closed_block_lines_carried_with_an_open_one_are_not_judged_twice(engine):
    """Rank 0's traceback ends in the first feed, rank 1's does not: rank 0's lines travel along."""
    rank0 = ["[rank0]: " + line for line in KEYERROR_TB]
    rank1 = ["[rank1]: " + line for line in GLOO_TB]
    first = [rank0[0], rank1[0], *rank0[1:], *rank1[1:-1]]

    found = engine.feed(COMBINED, lines(first), T0) + engine.feed(COMBINED, lines(rank1[-1:]), T0 + 1)

    assert [(f.rank, f.rule_id) for f in found] == [(0, "python.key_error"), (1, "gloo.connection_closed_by_peer")]
    assert engine.stats.lines == len(first) + 1


def test_flush_closes_an_unfinished_traceback_and_only_that_origin(engine):
    other = Origin("worker-2", 2, "job-7", "node-a", "stderr", "process")
    engine.feed(WORKER1, lines(KEYERROR_TB[:7]), T0)
    engine.feed(other, lines(GLOO_TB[:3]), T0)

    [finding] = engine.flush(WORKER1, T0 + 30)

    assert finding.rule_id == "python.uncaught_exception"
    assert finding.evidence == tuple(KEYERROR_TB[:7])
    assert finding.time == T0
    assert engine.pending_origins() == [other]
    assert engine.flush(WORKER1, T0 + 31) == []


def test_flush_stale_closes_only_after_the_timeout_since_the_last_line(engine):
    engine.feed(WORKER1, lines(KEYERROR_TB[:3]), T0)
    assert engine.flush_stale(T0 + 1.999, timeout=2.0) == []
    engine.feed(WORKER1, lines(KEYERROR_TB[3:6]), T0 + 1.5)      # more frames: not stale yet
    assert engine.flush_stale(T0 + 3.0, timeout=2.0) == []
    assert engine.pending_origins() == [WORKER1]

    [finding] = engine.flush_stale(T0 + 3.5, timeout=2.0)

    assert finding.evidence == tuple(KEYERROR_TB[:6])
    assert finding.time == T0
    assert engine.pending_origins() == []


# --- P3 / R3: fault codes ----------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    XID79,
    "Nov 21 09:36:03 gpu-node-3 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.",
], ids=["dmesg", "journal"])
def test_xid_79_line_is_a_fault_code_finding_that_isolates_the_node(engine, line):
    [finding] = engine.feed(WORKER1, lines(line), T0)
    assert (finding.kind, finding.rule_id) == ("fault_code", "xid.79")
    assert finding.action is Action.ISOLATE_NODE
    assert finding.failure_class is FailureClass.HARDWARE_NODE
    assert finding.fields["xid"] == 79
    assert finding.fields["pci"] == "0000:3b:00"


def test_xid_13_is_an_application_error_and_does_not_isolate(engine):
    line = ("Nov 21 09:36:03 gpu-node-3 kernel: NVRM: Xid (PCI:0000:b1:00): 13, pid=48213, name=python, "
            "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address")
    [finding] = engine.feed(WORKER1, lines(line), T0)
    assert finding.rule_id == "xid.13"
    assert finding.failure_class is FailureClass.USER_CODE
    assert finding.action < Action.ISOLATE_NODE


@pytest.mark.parametrize("code", ["0x80C98002", "0x80CB8002", "80c98002"])
def test_user_input_npu_fault_code_never_isolates(engine, code):
    [finding] = engine.feed(WORKER1, lines(f"[ERROR] device-plugin: npu 3 has fault code {code}"), T0)
    assert finding.kind == "fault_code"
    assert finding.fields["fault_code"] == code.upper().removeprefix("0X")
    assert finding.failure_class is FailureClass.USER_CODE
    assert finding.action < Action.ISOLATE_NODE


def test_hardware_npu_fault_code_in_the_same_words_does_isolate(engine):
    [finding] = engine.feed(WORKER1, lines("[ERROR] device-plugin: npu 3 has fault code 0x80E18402"), T0)
    assert (finding.rule_id, finding.action) == ("npu.80E18402", Action.ISOLATE_NODE)


# --- P2: fields ----------------------------------------------------------------------------------

@pytest.mark.parametrize("line, fraction", [
    ("E1121 09:36:03.735000 4100 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
     "local_rank: 1 (pid: 4120) of binary: /usr/bin/python3", 0.735),
    ("[rank1]:" + WATCHDOG, 0.735),
    ("2026-11-21T17:36:03.735+08:00 torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", 0.735),
    ("2026-11-21T09:36:03.735118000Z stderr F KeyError: 'input_ids'", 0.735118),
    ("2026-11-21 09:36:03,250 ERROR RuntimeError: CUDA error: an illegal memory access was encountered", 0.25),
], ids=["glog", "glog-bracketed-after-rank", "iso-offset", "cri-nanoseconds", "python-logging"])
def test_timestamp_in_the_line_sets_finding_time(engine, line, fraction):
    [finding] = engine.feed(WORKER1, lines(line), T0 + 5000)
    assert finding.time == pytest.approx(T0 + fraction, abs=1e-6)


def test_line_without_timestamp_gets_the_feed_time(engine):
    [finding] = engine.feed(WORKER1, lines("[rank1]: KeyError: 'lr'"), T0 + 5000)
    assert finding.time == T0 + 5000


def test_colour_codes_never_hide_a_hit_nor_reach_the_finding(engine):
    """Python 3.13 colours tracebacks on a terminal; loguru colours every field."""
    coloured_tb = [
        "Traceback (most recent call last):",
        '  File \x1b[35m"/srv/train/examples/train_ddp.py"\x1b[0m, line \x1b[35m182\x1b[0m, in \x1b[35m_inject\x1b[0m',
        '    warmup = config["warmup_steps"]',
        "             \x1b[31m~~~~~~\x1b[0m\x1b[1;31m^^^^^^^^^^^^^^^^\x1b[0m",
        "\x1b[1;35mKeyError\x1b[0m: \x1b[35m'warmup_steps'\x1b[0m",
    ]
    loguru = ("\x1b[32m2026-11-21 09:36:03.735\x1b[0m | \x1b[31m\x1b[1mERROR   \x1b[0m | \x1b[36mtrain\x1b[0m:"
              "\x1b[36mstep\x1b[0m:\x1b[36m182\x1b[0m - \x1b[31m\x1b[1mRuntimeError: CUDA error: an illegal memory "
              "access was encountered\x1b[0m")

    tb, log = engine.feed(WORKER1, lines(coloured_tb, STEP, loguru), T0 + 5000)

    assert (tb.rule_id, tb.line) == ("python.key_error", "KeyError: 'warmup_steps'")
    assert tb.evidence[1] == '  File "/srv/train/examples/train_ddp.py", line 182, in _inject'
    assert log.rule_id == "cuda.illegal_memory_access"
    assert "\x1b" not in log.line and log.line.endswith("an illegal memory access was encountered")
    assert log.time == pytest.approx(T0 + 0.735, abs=1e-6)


def test_invalid_utf8_in_a_hit_line_is_replaced(engine):
    [finding] = engine.feed(COMBINED, b"[rank1]: KeyError: '\xe4\xb8\xad\xff\xfe'\n", T0)
    assert finding.rule_id == "python.key_error"
    assert finding.line == "KeyError: '\u4e2d\ufffd\ufffd'"
    assert finding.rank == 1


# --- Q1: bad input -------------------------------------------------------------------------------

def test_binary_garbage_is_counted_and_the_lines_after_it_still_hit(engine):
    garbage = random.Random(79).randbytes(1 << 20)
    data = garbage + b"\n" + lines("[rank1]: KeyError: 'lr'")

    [finding] = engine.feed(COMBINED, data, T0)

    assert (finding.rule_id, finding.rank) == ("python.key_error", 1)
    assert engine.stats.lines == garbage.count(b"\n") + 2
    assert engine.stats.bytes == len(data)


def test_a_callers_line_count_is_taken_only_for_the_chunk_as_given(rules):
    """Issue 16: ``feed(counted=...)`` takes the caller's count instead of counting again (a count
    that is not the chunk's own shows it was taken), but not where the chunk changed: escapes
    removed, or a block carried in or left open."""
    plain = lines(STEP, "[rank1]: KeyError: 'lr'")
    counted = Engine(rules)
    counted.feed(COMBINED, plain, T0, counted=99)
    assert counted.stats.lines == 99
    mine = Engine(rules)
    mine.feed(COMBINED, plain, T0, counted=plain.count(b"\n"))
    assert mine.stats.lines == 2

    escaped = Engine(rules)
    escaped.feed(COMBINED, b"\x1b[31m" + plain, T0, counted=99)
    assert escaped.stats.lines == 2

    carried = Engine(rules)
    opened = lines(STEP, "Traceback (most recent call last):", '  File "t.py", line 1, in <module>')
    carried.feed(WORKER1, opened, T0, counted=99)         # the traceback stays open: its lines not yet
    assert carried.stats.lines == 1
    carried.feed(WORKER1, lines("KeyError: 'lr'", STEP), T0, counted=99)
    assert carried.stats.lines == 5


def test_ten_megabyte_lines_are_counted_never_fatal_and_never_carried_unbounded(engine):
    huge = b"x" * (10 << 20)
    data = huge + b"\n" + b"[rank1]: " + huge + b" " + lines(WATCHDOG, STEP)

    found = engine.feed(COMBINED, data, T0)
    assert [f.rule_id for f in found] == ["torch.nccl_watchdog_timeout"]
    assert engine.stats.lines == 3

    # A traceback whose frame line is 10 MB is closed at once, not held in memory.
    [block] = engine.feed(WORKER1, lines("Traceback (most recent call last):") + b"  " + huge + b"\n", T0)
    assert block.rule_id == "python.uncaught_exception"
    assert len(huge) > MAX_CARRY_BYTES and engine.pending_origins() == []


def test_a_ten_megabyte_hit_line_is_capped_in_its_finding_and_the_next_chunk_still_hits(engine):
    """A tensor printed whole after a CUDA error: the finding keeps the message, not 10 MB."""
    tensor = "tensor([" + "0.1234, " * (10_000_000 // 8) + "0.5678], device='cuda:1')"
    line = "[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered; last batch " + tensor

    [finding] = engine.feed(COMBINED, lines(line), T0)

    assert (finding.rule_id, finding.rank) == ("cuda.illegal_memory_access", 1)
    assert len(finding.line) <= MAX_LINE_CHARS
    assert finding.line.startswith("RuntimeError: CUDA error: an illegal memory access was encountered; last")
    assert " …[truncated 10.0 MB]… " in finding.line
    assert finding.line.endswith("0.1234, 0.5678], device='cuda:1')")
    assert finding.evidence == (finding.line,)
    assert len(finding.to_dict()["line"]) <= MAX_LINE_CHARS

    [after] = engine.feed(COMBINED, lines("[rank1]: " + STEP, "[rank1]: KeyError: 'lr'"), T0 + 1)
    assert (after.rule_id, after.line, after.evidence) == ("python.key_error", "KeyError: 'lr'", ("KeyError: 'lr'",))
    assert engine.stats.lines == 3


def test_a_ten_megabyte_line_in_a_traceback_is_capped_in_its_evidence(engine):
    frame = '    batch = {"input_ids": ' + "1, " * (10 << 20) + "}"
    tb = KEYERROR_TB[:3] + [frame] + KEYERROR_TB[3:]

    [finding] = engine.feed(WORKER1, lines(tb, STEP), T0, final=True)

    assert (finding.rule_id, finding.line) == ("python.key_error", "KeyError: 'warmup_steps'")
    assert [e for e in finding.evidence if len(e) > MAX_LINE_CHARS] == []
    capped = finding.evidence[3]
    assert capped.startswith('    batch = {"input_ids": 1, 1, ') and capped.endswith("1, }")
    assert "…[truncated 31.5 MB]…" in capped
    assert finding.evidence[:3] + finding.evidence[4:] == tuple(KEYERROR_TB)


def test_a_line_of_exactly_max_line_chars_is_kept_whole(engine):
    line = "KeyError: '" + "k" * (MAX_LINE_CHARS - 12) + "'"
    assert len(line) == MAX_LINE_CHARS
    [finding] = engine.feed(WORKER1, lines(line), T0)
    assert finding.line == line


def test_stats_count_every_line_once(engine):
    engine.feed(WORKER1, lines(STEP, NCCL_INFO, STEP), T0)
    engine.feed(WORKER1, lines(STEP, KEYERROR_TB[:4]), T0)        # an open block: carried
    engine.feed(WORKER1, lines(KEYERROR_TB[4:]) + b"last line without newline", T0)
    assert engine.stats.lines == 3 + 1 + len(KEYERROR_TB) + 1


# --- R2: rules added at run time ---------------------------------------------------------------

def test_runtime_retryable_keyword_takes_effect_at_once(engine):
    line = "[rank0]: dataloader worker 3: connect timeout to oss-cn-hangzhou-internal.aliyuncs.com:80"
    assert engine.feed(COMBINED, lines(line), T0) == []

    engine.add_rules(rules_from_keywords(["connect timeout"]))   # AIMaster's own example (seeds/000)

    [finding] = engine.feed(COMBINED, lines(line), T0)
    assert finding.rule_id == "custom.retryable.connect_timeout"
    assert (finding.failure_class, finding.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
    assert finding.rank == 0


def test_runtime_rules_are_removed_by_the_ids_add_rules_returned(engine):
    """``add_rules`` returns only the ids it added (a rule the engine had stays someone else's);
    ``remove_rules`` recompiles without them, and the line hits nothing again while the rules
    that came after them (and the fault codes and block starts) still match."""
    line = "[rank0]: dataloader worker 3: connect timeout to oss-cn-hangzhou-internal.aliyuncs.com:80"
    before = len(engine.rules)
    added = engine.add_rules(rules_from_keywords(["connect timeout", "flaky fabric"]))
    assert added == ["custom.retryable.connect_timeout", "custom.retryable.flaky_fabric"]
    assert engine.add_rules(rules_from_keywords(["connect timeout"])) == []
    assert engine.remove_rules(added[:1]) == 1 and len(engine.rules) == before + 1
    assert engine.feed(COMBINED, lines(line), T0) == []
    [finding] = engine.feed(COMBINED, lines("[rank0]: flaky fabric on port 3"), T0)
    assert finding.rule_id == "custom.retryable.flaky_fabric"
    assert [f.rule_id for f in engine.feed(WORKER1, lines(XID79), T0)] == ["xid.79"]
    assert engine.remove_rules(["no.such.rule"]) == 0


def test_runtime_rules_compile_beside_the_database_and_never_it():
    """``add_rules`` compiles only the rules it adds, beside the compiled database (the same
    object stays: ~2 s per call at 1,000 rules before, in the loop that reads every job's
    output); removing them leaves that database alone, removing a compiled rule compiles the
    set again."""
    engine = Engine(rules_from_keywords(["alpha fault", "beta fault"], id_prefix="test.base"))
    compiled = engine.matcher
    added = engine.add_rules(rules_from_keywords(["connect timeout"]))
    more = engine.add_rules(rules_from_keywords(["flaky fabric"]))
    assert isinstance(engine.matcher, LayeredMatcher) and engine.matcher.base is compiled
    assert engine.remove_rules(added) == 1 and engine.matcher.base is compiled
    [finding] = engine.feed(COMBINED, lines("[rank0]: flaky fabric on port 3"), T0)
    assert finding.rule_id == more[0]
    assert engine.remove_rules(more) == 1 and engine.matcher is compiled
    assert engine.remove_rules([engine.rules[0].id]) == 1
    assert type(engine.matcher) is Matcher and engine.matcher is not compiled
    assert [f.rule_id for f in engine.feed(WORKER1, lines(XID79), T0)] == ["xid.79"]


def test_runtime_rule_applies_to_a_block_already_carried(engine):
    tb = KEYERROR_TB[:-1] + ["ConnectionError: connect timeout while loading shard-00017"]
    engine.feed(WORKER1, lines(tb[:4]), T0)
    engine.add_rules(rules_from_keywords(["connect timeout"]))
    [finding] = engine.feed(WORKER1, lines(tb[4:], STEP), T0)
    assert finding.rule_id == "custom.retryable.connect_timeout"
    assert finding.evidence == tuple(tb)


# --- one backend or the other: the same findings -------------------------------------------------

MIXED = b"".join([
    lines(STEP, NCCL_INFO, prefix="[default0]:"),
    lines([f"[rank0]: {a}\n[rank1]: {b}" for a, b in zip(GLOO_TB, KEYERROR_TB)]),
    lines(GLOO_TB[len(KEYERROR_TB):], prefix="[rank0]: "),
    lines("[rank1]:" + WATCHDOG, XID79, "[ERROR] device-plugin: npu 3 has fault code 0x80C98002"),
    lines(C10_DUMP, prefix="[rank2]: "),
    b"\x1b[1;35mKeyError\x1b[0m: \x1b[35m'lr'\x1b[0m\n\xff\xfe\x00garbage\n",
    lines("2026-11-21T09:36:03.735118000Z stderr F KeyError: 'input_ids'", STEP),
])


@needs_hs
def test_re2_backend_gives_the_same_findings_as_hyperscan(rules, monkeypatch):
    hs = Engine(rules)
    monkeypatch.setenv("FTWATCH_MATCHER", "re2")
    re2 = Engine(rules)
    assert (hs.matcher.backend, re2.matcher.backend) == ("hyperscan", "re2")

    expected = hs.feed(COMBINED, MIXED, T0, final=True)

    assert [f.rule_id for f in expected] == [
        "gloo.connection_closed_by_peer", "python.key_error", "torch.nccl_watchdog_timeout", "xid.79",
        "npu.80C98002", "torch.nccl_watchdog_timeout", "python.key_error", "python.key_error"]
    assert summary(re2.feed(COMBINED, MIXED, T0, final=True)) == summary(expected)


# --- issue 16: a text judged once -----------------------------------------------------------

def test_the_same_traceback_from_two_ranks_makes_two_findings_each_with_its_own_origin_and_time(engine):
    first = engine.feed(COMBINED, lines(KEYERROR_TB, prefix="[rank0]: "), T0, sim_step=0.001)
    again = engine.feed(COMBINED, lines(KEYERROR_TB, prefix="[rank3]: "), T0 + 5, sim_step=0.001)

    [a], [b] = first, again
    assert (a.rank, b.rank) == (0, 3) and a.origin != b.origin
    assert b.time > a.time and b.seq > a.seq
    assert (a.rule_id, a.line, a.evidence, a.fields) == (b.rule_id, b.line, b.evidence, b.fields)
    assert a.fields is not b.fields                 # each finding's own mapping


def test_a_rule_whose_condition_reads_the_origin_is_judged_for_each_record(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n"
                    "  - id: test.on_rank_two\n"
                    "    keywords: ['fell over']\n"
                    "    when: 'rank == 2'\n"
                    "    class: user_code\n"
                    "    action: fail_job\n")
    engine = Engine(load_rules([path], builtin=False))

    made = [engine.feed(Origin(f"w{rank}", rank, "job-7", "node-a", "stderr", "process"), b"it fell over\n", T0)
            for rank in (1, 2, 1, 2)]

    assert [len(found) for found in made] == [0, 1, 0, 1]


def test_a_rule_whose_condition_reads_only_text_is_judged_by_the_raw_lines_it_reads(tmp_path):
    """A ``when:`` of regex terms alone (the CUDA catalog's) reads the raw line, rank prefix and
    all: the same record text behind two prefixes is remembered apart (one judged text, one finding
    per prefix that passes)."""
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n"
                    "  - id: test.rank_two_prefix\n"
                    "    keywords: ['fell over']\n"
                    "    when: 'regex \"^\\[rank2\\]: \"'\n"
                    "    class: user_code\n"
                    "    action: fail_job\n")
    [rule] = load_rules([path], builtin=False)
    assert rule.predicate.texts_only
    engine = Engine([rule])

    made = [engine.feed(COMBINED, f"[rank{rank}]: it fell over\n".encode(), T0) for rank in (1, 2, 1, 2)]

    assert [[f.rank for f in found] for found in made] == [[], [2], [], [2]]
