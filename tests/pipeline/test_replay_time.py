"""The time of a replayed line without a timestamp (issue 11, item 2): the time of the last
timestamped line before it in the same file (plus ``SIM_STEP`` per line), not the file's anchor.

The case that made it matter: a worker log where the kernel's ``NVRM: Xid 79`` line (stamped) is
followed by the worker's ``terminate called ... what(): CUDA error: unspecified launch failure``
(untimed). Dated from the anchor, the ``what():`` lines came first and the job was failed as
user code; the GPU that fell off the bus is the root cause, and the node is isolated.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Action
from ftwatch.parsers.chunks import last_timestamp
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.replay import CHUNK_BYTES, SIM_STEP, replay
from ftwatch.policy.budgets import BudgetStore

JOB = "replay-time-test"
START = "2026-11-21 09:00:00,000 INFO train.py:88 rank 0 starting"
XID = "[Sat Nov 21 09:36:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=4121, GPU has fallen off the bus."
TERMINATE = ["terminate called after throwing an instance of 'c10::Error'",
             "  what():  CUDA error: unspecified launch failure",
             "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
             "below might be incorrect."]
XID_AT = datetime(2026, 11, 21, 9, 36, 3, tzinfo=timezone.utc).timestamp()


def steps(n: int) -> list[str]:
    return [f"step {i}/500 loss {4.6 / i:.4f}" for i in range(1, n + 1)]


def run(tmp_path: Path, files: list[Path]):
    config = Config().with_policy(enable_job_restart=True)
    policy = build_policy(config, JOB, BudgetStore(tmp_path / "budgets.json", JOB), state_dir=tmp_path,
                          in_memory=True)
    return replay(files, build_engine(config), policy, JOB)


def write(path: Path, data: list[str] | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else "".join(f"{line}\n" for line in data).encode())
    return path


def test_what_lines_after_an_xid_79_line_isolate_the_node(tmp_path):
    result = run(tmp_path, [write(tmp_path / "rank0.log", [START] + steps(399) + [XID] + TERMINATE)])

    by_rule = {f.rule_id: f for f in result.findings}
    cuda = by_rule["cuda.unspecified_launch_failure"]
    assert by_rule["xid.79"].time == pytest.approx(XID_AT)
    assert cuda.time == pytest.approx(XID_AT + 2 * SIM_STEP)      # the what() line, 2 lines after the Xid
    d = result.decision
    assert d.action is Action.ISOLATE_NODE, d.policy_clause
    assert d.root_cause.rule_id == "xid.79"


def test_the_last_stamp_is_carried_into_the_next_chunk(tmp_path):
    """The Xid line ends the first 1 MiB chunk; the what() lines open the second."""
    head = (START + "\n").encode()
    xid = (XID + "\n").encode()
    filler = b"step 7/500 loss 0.9119\n"
    room = CHUNK_BYTES - len(head) - len(xid)
    whole, rest = divmod(room, len(filler))
    data = head + filler * whole + (b"#" * (rest - 1) + b"\n" if rest else b"") + xid
    assert len(data) == CHUNK_BYTES
    data += "".join(f"{line}\n" for line in TERMINATE).encode()

    result = run(tmp_path, [write(tmp_path / "rank0.log", data)])

    cuda = next(f for f in result.findings if f.rule_id == "cuda.unspecified_launch_failure")
    assert cuda.time == pytest.approx(XID_AT + 2 * SIM_STEP)
    assert result.decision.action is Action.ISOLATE_NODE


def test_untimed_lines_before_the_first_stamp_keep_the_anchor(tmp_path):
    """Lines before any timestamp count back from the file's first stamp (its anchor), as before."""
    log = steps(3) + TERMINATE[:2] + [START]
    result = run(tmp_path, [write(tmp_path / "rank0.log", log)])
    cuda = next(f for f in result.findings if f.rule_id == "cuda.unspecified_launch_failure")
    start = datetime(2026, 11, 21, 9, tzinfo=timezone.utc).timestamp()
    assert cuda.time == pytest.approx(start - 1 * SIM_STEP)


def test_last_timestamp_parses_only_candidate_lines_and_skips_false_ones():
    data = (f"{START}\nstep 1\nelapsed 00:01:02 so far\n{XID}\nterminate\n  what(): x\n"
            "eta 01:02:03\n").encode()
    xid_at = data.index(b"[Sat")
    assert last_timestamp(data, 0, len(data), 2026) == (xid_at, pytest.approx(XID_AT))   # skips "eta 01:02:03"
    assert last_timestamp(data, 0, xid_at, 2026) == (0, pytest.approx(XID_AT - 36 * 60 - 3))
    assert last_timestamp(data, data.index(b"step 1"), xid_at, 2026) is None


def test_a_stamped_line_with_a_later_time_of_day_far_into_it_keeps_its_stamp():
    """The search finds the last time of day (here far into a long line); the line is read from
    its start, where its own stamp is."""
    data = (START + " " + "x" * 400 + " eta 01:02:03\nterminate\n").encode()
    assert last_timestamp(data, 0, len(data), 2026) == (0, pytest.approx(XID_AT - 36 * 60 - 3))


def test_tqdm_bars_with_a_long_eta_between_a_stamp_and_an_error_are_no_candidates():
    """A tqdm bar's ``[39:00<104:10:00, ...]`` holds ``04:10:00`` inside a longer count: no time of
    day, so it costs no try (of the 16). Before, more than 16 such bars between a stamped line and
    an untimed traceback made the search give up, and the traceback took the file's first time,
    minutes before the bars (read by the progress reader at the stamp's time), so the bars
    printed BEFORE it looked like progress after it and the error became a notice."""
    bars = [f"  1%|          | {300 + i}/46384 [39:{i:02d}<104:10:{i:02d},  8.10s/it]" for i in range(40)]
    data = ("\n".join([START, "[2026-11-21 09:20:00,000] [INFO] stage3 ready", *bars, "terminate", ""])).encode()
    stamped = data.index(b"[2026-11-21 09:20")
    assert last_timestamp(data, 0, data.index(b"terminate"), 2026) == (stamped, pytest.approx(XID_AT - 16 * 60 - 3))


def test_a_slurm_cancel_line_is_at_the_time_it_states_mid_line(tmp_path):
    """slurmstepd's ``*** JOB ... CANCELLED AT <time> ***`` carries its stamp mid-line: the line is at
    that time (as live, where it arrives when the scheduler signals the job), not at the last stamped
    line's, two hours earlier; the untimed lines after it follow it."""
    cancel = "slurmstepd: error: *** JOB 3318842 ON node07 CANCELLED AT 2026-11-21T11:00:00 DUE TO TIME LIMIT ***"
    log = [START] + steps(3) + [cancel, "mpirun noticed that process rank 0 with PID 0 on node node07 exited "
                                        "on signal 15 (Terminated)."]
    result = run(tmp_path, [write(tmp_path / "rank0.log", log)])

    by_rule = {f.rule_id: f for f in result.findings}
    at = datetime(2026, 11, 21, 11, tzinfo=timezone.utc).timestamp()
    assert by_rule["scheduler.time_limit"].time == pytest.approx(at)
    assert by_rule["mpi.process_exited_on_signal"].time == pytest.approx(at + SIM_STEP)
