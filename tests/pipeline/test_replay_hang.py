"""``ftwatch replay`` with job hang detection (R5 on recorded logs): a hang from the lines' timestamps.

The logs are shaped like a DDP job's under torchrun: one combined log with ``[defaultN]:``
prefixes, the trainer logging through Python's ``logging`` (ISO stamps) or glog, and
PyTorch's NCCL watchdog timing out after the job went quiet; or per-rank files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from ftwatch.events import Action, FailureClass

JOB = "replay-hang-test"
T0 = datetime(2026, 11, 21, 9, 0, 0, tzinfo=timezone.utc)
HANG_ON = {"enable_job_hang_detection": True, "job_hang_interval": 1800, "enable_job_restart": True}


def iso_line(rank: int, at: datetime, msg: str) -> str:
    return f"[default{rank}]:{at:%Y-%m-%d %H:%M:%S},{at.microsecond // 1000:03d} INFO train.py:88 {msg}"


def glog_line(rank: int, at: datetime, msg: str) -> str:
    return f"[default{rank}]:I{at:%m%d %H:%M:%S}.{at.microsecond:06d} {4120 + rank} train.py:88] {msg}"


def watchdog(rank: int, at: datetime) -> str:
    return (f"[default{rank}]:[rank{rank}]:[E{at:%m%d %H:%M:%S}.735118 {4120 + rank} "
            "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632] "
            f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48213, OpType=ALLREDUCE, "
            "NumelIn=25165824, NumelOut=25165824, Timeout(ms)=2400000) ran for 2400043 milliseconds before timing out.")


def training(stamp, upto: dict[int, datetime], every: timedelta = timedelta(seconds=10)) -> list[str]:
    """Interleaved step lines of ranks 0-2 from T0, each rank until its own last time."""
    out, at, step = [], T0, 1
    while at <= max(upto.values()):
        for rank in sorted(upto):
            if at <= upto[rank]:
                out.append(stamp(rank, at + timedelta(milliseconds=37 * rank), f"step {step} loss {4.6 / step:.4f}"))
        at += every
        step += 1
    return out


def quiet_then_watchdog(stamp) -> list[str]:
    """Rank 2 stops at 09:05:00, ranks 0 and 1 at 09:05:10; 40 min later the watchdog fires on 0 and 1."""
    last = {0: T0 + timedelta(minutes=5, seconds=10), 1: T0 + timedelta(minutes=5, seconds=10),
            2: T0 + timedelta(minutes=5)}
    woke = T0 + timedelta(minutes=45, seconds=10)
    return training(stamp, last) + [watchdog(0, woke), watchdog(1, woke)]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def utc(at: datetime) -> float:
    return at.timestamp()


@pytest.mark.parametrize("stamp", [iso_line, glog_line], ids=["iso", "glog"])
def test_all_ranks_quiet_for_40_min_is_a_hang_naming_the_rank_silent_first(run, tmp_path, stamp):
    result = run([write(tmp_path / "combined.log", quiet_then_watchdog(stamp))], **HANG_ON)

    d = result.decision
    assert d.action is Action.RESTART_JOB
    rc = d.root_cause
    assert (rc.rule_id, rc.kind, rc.failure_class, rc.action, rc.rank) == (
        "hang.job", "hang", FailureClass.HANG, Action.RESTART_JOB, 2)
    went_quiet = T0 + timedelta(minutes=5, seconds=10, milliseconds=37)    # rank 1's last line
    assert rc.time == pytest.approx(utc(went_quiet) + 1800)
    assert rc.line == ("no output from any of 3 instances for 1800 s; rank 2 went silent first "
                       f"(last output {(T0 + timedelta(minutes=5, milliseconds=74)).isoformat(timespec='milliseconds')})")
    assert "D2 ExitCodeAndErrorMsg: hang root cause" in d.policy_clause
    assert {f.rule_id for f in result.findings if f.failure_class is FailureClass.FALLOUT} == {
        "torch.nccl_watchdog_timeout"}
    assert result.notes == []


def test_without_hang_detection_the_watchdog_fallout_decides_as_before(run, tmp_path):
    result = run([write(tmp_path / "combined.log", quiet_then_watchdog(iso_line))], enable_job_restart=True)

    d = result.decision
    assert [f.rule_id for f in result.findings] == ["torch.nccl_watchdog_timeout"] * 2
    assert (d.action, d.root_cause.rule_id, d.root_cause.failure_class) == (
        Action.RESTART_JOB, "torch.nccl_watchdog_timeout", FailureClass.FALLOUT)
    assert "only fallout found" in d.policy_clause


def test_one_rank_stopping_early_while_the_others_print_is_no_hang(run, tmp_path):
    """Per-rank files: rank 1 stops at 09:30, ranks 0 and 2 print until 10:00; the end of input is no hang."""
    end, early = T0 + timedelta(hours=1), T0 + timedelta(minutes=30)
    lines = training(glog_line, {0: end, 1: early, 2: end}, every=timedelta(minutes=1))
    files = [write(tmp_path / f"rank{r}.log", [l.removeprefix(f"[default{r}]:") for l in lines
                                                if l.startswith(f"[default{r}]:")]) for r in range(3)]

    result = run(files, **HANG_ON)

    assert result.findings == []
    assert result.decision.action is Action.NONE
    assert result.notes == []


def test_per_rank_files_all_silent_is_a_hang_at_the_interval(run, tmp_path):
    stop = {0: T0 + timedelta(minutes=10), 1: T0 + timedelta(minutes=8), 2: T0 + timedelta(minutes=10)}
    lines = training(iso_line, stop, every=timedelta(minutes=1))
    lines += [iso_line(r, T0 + timedelta(hours=1), "still here") for r in (0, 2)]
    files = [write(tmp_path / f"rank{r}.log", [l.removeprefix(f"[default{r}]:") for l in lines
                                                if l.startswith(f"[default{r}]:")]) for r in range(3)]

    rc = run(files, **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.rank) == ("hang.job", 1)
    assert rc.time == pytest.approx(utc(T0 + timedelta(minutes=10, milliseconds=74)) + 1800)


def test_untimed_output_between_rare_stamps_is_no_hang(run, tmp_path):
    """Stamped start-up lines, two hours of print() output without stamps, stamped last lines: no
    silence is known, since the untimed lines may lie anywhere in between."""
    log = ([iso_line(r, T0, "initialized process group, world size 3") for r in range(3)]
           + [f"[default{r}]:step {s}/9000 loss 0.4{s % 10}" for s in range(1, 300) for r in range(3)]
           + [iso_line(r, T0 + timedelta(hours=2), "training finished") for r in range(3)])

    result = run([write(tmp_path / "combined.log", log)], **HANG_ON)

    assert result.findings == []
    assert result.decision.action is Action.NONE


def test_a_real_error_before_the_silence_stays_the_root_cause(run, tmp_path):
    log = training(iso_line, {r: T0 + timedelta(minutes=2) for r in range(3)})
    log += [iso_line(1, T0 + timedelta(minutes=2, seconds=5), "RuntimeError: CUDA error: an illegal memory access "
                                                                "was encountered")]
    log += [watchdog(0, T0 + timedelta(minutes=50))]

    result = run([write(tmp_path / "combined.log", log)], **HANG_ON)

    assert "hang.job" in {f.rule_id for f in result.findings}
    rc = result.decision.root_cause
    assert (rc.rule_id, rc.rank) == ("cuda.illegal_memory_access", 1)


def test_a_log_without_timestamps_finds_no_hang_and_says_why(run, tmp_path):
    log = [f"[default{r}]:step {s}/12 loss {4.6 / s:.4f}" for s in range(1, 13) for r in range(3)]

    result = run([write(tmp_path / "combined.log", log)], **HANG_ON)

    assert result.decision.action is Action.NONE
    assert result.notes == ["job hang detection needs timestamps: no line of "
                            f"{tmp_path / 'combined.log'} has one, so no job hang was looked for"]


# --- the command ---------------------------------------------------------------------------------

def ftwatch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


HANG_FLAGS = ("--enable-job-hang-detection=True", "--job-hang-interval=1800", "--enable-job-restart=True")


def test_replay_command_decides_restart_job_for_a_hang(tmp_path):
    path = write(tmp_path / "combined.log", quiet_then_watchdog(glog_line))

    proc = ftwatch("replay", "--json", *HANG_FLAGS, str(path), cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    decision = json.loads(proc.stdout)
    assert decision["action"] == "restart_job"
    assert decision["root_cause"]["rule_id"] == "hang.job"
    assert decision["root_cause"]["failure_class"] == "hang"
    assert decision["root_cause"]["rank"] == 2
    assert decision["root_cause"]["line"].startswith("no output from any of 3 instances for 1800 s; rank 2 went "
                                                     "silent first")


def test_replay_command_notes_on_stderr_that_hang_detection_needs_timestamps(tmp_path):
    path = write(tmp_path / "combined.log", [f"[default{r}]:step {s}/12" for s in range(1, 13) for r in range(3)])

    proc = ftwatch("replay", "--json", *HANG_FLAGS, str(path), cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["action"] == "none"
    assert "job hang detection needs timestamps" in proc.stderr


def agent_sigint(at: datetime) -> list[str]:
    """torchrun's agent (no rank prefix) stopping the workers on a SIGINT at ``at``."""
    return [f"W{at:%m%d %H:%M:%S}.000000 3001 torch/distributed/elastic/agent/server/api.py:704] "
            "Received Signals.SIGINT death signal, shutting down workers",
            f"W{at:%m%d %H:%M:%S}.100000 3001 torch/distributed/elastic/multiprocessing/api.py:897] "
            "Sending process 3100 closing signal SIGINT"]


def test_a_signal_long_after_every_rank_went_silent_is_the_reaction_to_a_hang(run, tmp_path):
    """The ranks stop at 09:05; the launcher's SIGINT lines come 4 hours later. A live monitor
    reported the hang at 09:35; the person's Ctrl-C afterwards is no root cause (issue 12)."""
    lines = training(iso_line, {r: T0 + timedelta(minutes=5) for r in RANKS3}) + agent_sigint(T0 + timedelta(hours=4))

    rc = run([write(tmp_path / "combined.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class, rc.rank) == ("hang.job", FailureClass.HANG, 0)
    assert rc.time == pytest.approx(utc(T0 + timedelta(minutes=5, milliseconds=74)) + 1800)


def test_a_signal_during_active_progress_stays_the_root_cause(run, tmp_path):
    """10 minutes of silence (under the 30-minute interval): the SIGINT is the cause (issue 17 item 5)."""
    lines = training(iso_line, {r: T0 + timedelta(minutes=5) for r in RANKS3}) + agent_sigint(T0 + timedelta(minutes=15))

    d = run([write(tmp_path / "combined.log", lines)], **HANG_ON).decision

    assert d.root_cause.rule_id == "torch_elastic.agent_death_signal"
    assert d.root_cause.failure_class is FailureClass.RETRYABLE_INFRA


RANKS3 = (0, 1, 2)


def vllm_line(at: datetime, msg: str) -> str:
    """vLLM's own logger form (vllm/logger.py: level, then %m-%d %H:%M:%S), behind v1's process prefix."""
    return f"(APIServer pid=611) INFO {at:%m-%d %H:%M:%S} [loggers.py:118] {msg}"


def serving(until: datetime) -> list[str]:
    """A vLLM server's stats line every 10 s from T0 to ``until``; the access lines are untimed."""
    out, at = ["INFO:     Application startup complete."], T0
    while at <= until:
        out += [vllm_line(at, "Engine 000: Avg generation throughput: 1305.4 tokens/s, Running: 45 reqs"),
                'INFO:     10.40.2.17:40551 - "POST /v1/chat/completions HTTP/1.1" 200 OK']
        at += timedelta(seconds=10)
    return out


def test_a_vllm_server_silent_for_hours_before_its_shutdown_is_a_hang(run, tmp_path):
    """The stats lines stop at 09:05 (the last one followed by nothing) and the shutdown comes the next
    day: vLLM's own stamps date that silence (they were untimed before, so no hang was looked for)."""
    stop = T0 + timedelta(minutes=5)
    lines = serving(stop)[:-1] + [vllm_line(T0 + timedelta(hours=23), "Shutting down FastAPI HTTP server.")]

    result = run([write(tmp_path / "server.log", lines)], **HANG_ON)

    rc = result.decision.root_cause
    assert (rc.rule_id, rc.failure_class, result.decision.action) == ("hang.job", FailureClass.HANG, Action.RESTART_JOB)
    assert rc.time == pytest.approx(utc(stop) + 1800)
    assert result.notes == []


def test_a_vllm_server_idle_under_the_interval_is_no_hang(run, tmp_path):
    """Counterexample: 20 minutes without a stats line (no requests) under the 30-minute interval."""
    lines = serving(T0 + timedelta(minutes=5))[:-1] + [vllm_line(T0 + timedelta(minutes=25), "Shutting down FastAPI HTTP server.")]

    result = run([write(tmp_path / "server.log", lines)], **HANG_ON)

    assert result.findings == []
    assert result.decision.action is Action.NONE


def nvidia_smi(at: datetime) -> list[str]:
    """nvidia-smi's table, headed by C's ctime() date as the tool prints it."""
    return [f"{at:%a %b %d %H:%M:%S %Y}       ",
            "+-----------------------------------------------------------------------------+",
            "|   0  Tesla V100-SXM2...  On   | 00000000:1A:00.0 Off |                    0 |",
            "| N/A   44C    P0    72W / 300W |  21840MiB / 32510MiB |    100%      Default |"]


def test_a_ctime_dated_snapshot_hours_after_the_last_step_dates_the_silence(run, tmp_path):
    """Training lines stop at 09:05; an nvidia-smi snapshot five hours later opens with its ctime date
    (a bare weekday, once not read as a stamp, so the untimed table bridged the silence to the end)."""
    stop = T0 + timedelta(minutes=5)
    lines = [l.removeprefix("[default0]:") for l in training(iso_line, {0: stop})] + nvidia_smi(T0 + timedelta(hours=5))

    rc = run([write(tmp_path / "train.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class) == ("hang.job", FailureClass.HANG)
    assert rc.time == pytest.approx(utc(stop) + 1800)


def test_a_ctime_snapshot_during_training_is_no_hang(run, tmp_path):
    """Counterexample: the same snapshot taken while the steps still come, at the end of the input."""
    stop = T0 + timedelta(minutes=5)
    lines = [l.removeprefix("[default0]:") for l in training(iso_line, {0: stop})] + nvidia_smi(stop)

    result = run([write(tmp_path / "train.log", lines)], **HANG_ON)

    assert result.findings == []
    assert result.decision.action is Action.NONE


def test_a_few_untimed_lines_cannot_fill_hours_of_silence(run, tmp_path):
    """The last stats line at 09:05 is followed by one untimed access line, then the SIGTERM line two
    hours later: one line cuts 2 h into two gaps, one of them at least an hour, so a 30-minute
    silence happened wherever the line lies (it was bridged to the SIGTERM before)."""
    stop = T0 + timedelta(minutes=5)
    lines = serving(stop) + [vllm_line(T0 + timedelta(hours=2, minutes=5), "Received SIGTERM, shutting down")]

    rc = run([write(tmp_path / "decode.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class) == ("hang.job", FailureClass.HANG)
    assert rc.time == pytest.approx(utc(stop) + 1800)


def test_untimed_lines_enough_to_fill_the_span_are_still_bridged(run, tmp_path):
    """Counterexample: four untimed lines in 2 h leave gaps that may all be under 30 minutes."""
    stop = T0 + timedelta(minutes=5)
    lines = (serving(stop) + ['INFO:     10.40.2.17:40552 - "GET /health HTTP/1.1" 200 OK'] * 3
             + [vllm_line(T0 + timedelta(hours=2), "Shutting down FastAPI HTTP server.")])

    result = run([write(tmp_path / "decode.log", lines)], **HANG_ON)

    assert result.findings == []
    assert result.decision.action is Action.NONE


def untimed_progress(ranks=RANKS3) -> list[str]:
    """Eight bare print() lines per rank, no stamps (Keras, tqdm): enough to bridge a 2-hour span."""
    return [f"[default{r}]:Epoch 2/3 step {s}/500" for s in range(1, 9) for r in ranks]


def test_a_watchers_silence_report_places_the_untimed_lines_before_the_silence(run, tmp_path):
    """Stamped start-up, a few untimed progress lines, then a job watcher's stamped line saying the job
    wrote nothing for 2 h: the untimed lines lie before that silence, so it is a hang from the
    moment the watcher says the silence began (parsers.silence)."""
    report_at = T0 + timedelta(hours=2, minutes=10)
    lines = ([iso_line(r, T0, "initialized process group, world size 3") for r in RANKS3] + untimed_progress()
             + [f"{report_at:%Y-%m-%d %H:%M:%S} job-watch: demo produced no output on any worker for 2h05m; "
                "terminating"])

    rc = run([write(tmp_path / "combined.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class) == ("hang.job", FailureClass.HANG)
    assert rc.time == pytest.approx(utc(report_at - timedelta(hours=2, minutes=5)) + 1800)


def test_a_watchers_report_of_a_silence_under_the_interval_is_no_hang(run, tmp_path):
    """Counterexample: the same log with a 10-minute silence reported: the untimed lines may still
    fill the rest of the span, so no silence of the 30-minute interval is known."""
    report_at = T0 + timedelta(hours=2, minutes=10)
    lines = ([iso_line(r, T0, "initialized process group, world size 3") for r in RANKS3] + untimed_progress()
             + [f"{report_at:%Y-%m-%d %H:%M:%S} job-watch: demo produced no output for 10m0s"])

    result = run([write(tmp_path / "combined.log", lines)], **HANG_ON)

    assert result.findings == []
    assert result.decision.action is Action.NONE


def slurm_cancel(at: datetime, why: str = "") -> list[str]:
    """srun's and slurmstepd's lines when a step is cancelled (Slurm slurmstepd/req.c)."""
    return ["srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
            f"slurmstepd: error: *** STEP 4242.0 ON node07 CANCELLED AT {at:%Y-%m-%dT%H:%M:%S}{why} ***"]


def test_a_slurm_cancel_hours_after_every_rank_went_silent_dates_the_silence(run, tmp_path):
    """The ranks stop at 09:05; slurmstepd's cancel line, stamped mid-line, comes 40 minutes later:
    a live monitor reported the hang at 09:35, before the scancel."""
    lines = training(iso_line, {r: T0 + timedelta(minutes=5) for r in RANKS3}) + slurm_cancel(T0 + timedelta(minutes=45))

    rc = run([write(tmp_path / "combined.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class) == ("hang.job", FailureClass.HANG)
    assert rc.time == pytest.approx(utc(T0 + timedelta(minutes=5, milliseconds=74)) + 1800)


def test_a_slurm_cancel_soon_after_the_last_step_is_no_hang(run, tmp_path):
    """Counterexample: cancelled 10 minutes after the last step (under the interval): no hang."""
    lines = training(iso_line, {r: T0 + timedelta(minutes=5) for r in RANKS3}) + slurm_cancel(T0 + timedelta(minutes=15))

    result = run([write(tmp_path / "combined.log", lines)], **HANG_ON)

    assert all(f.rule_id != "hang.job" for f in result.findings)


def pdsh_line(host: str, at: datetime, msg: str) -> str:
    """DeepSpeed's multi-node runner under pdsh: pdsh labels each line of a host's output ``host: ``."""
    return f"{host}: [{at:%Y-%m-%d %H:%M:%S},{at.microsecond // 1000:03d}] [INFO] [logging.py:69:log_dist] {msg}"


def pdsh_run(stop: datetime, killed: datetime) -> list[str]:
    lines = [pdsh_line(f"worker-{h}", T0 + timedelta(minutes=m), f"[Rank 0] step={m * 10}")
             for m in range(int((stop - T0).total_seconds() // 60) + 1) for h in range(2)]
    return lines + [pdsh_line(f"worker-{h}", killed, "Killing subprocess 30110") for h in range(2)]


def test_pdsh_labelled_lines_are_stamped_so_hours_of_silence_are_a_hang(run, tmp_path):
    """Every line carries pdsh's ``worker-N: `` label before its stamp: read, the 3-hour silence
    before the launcher's kill is a hang (untimed before, so the kill's lines bridged it)."""
    stop = T0 + timedelta(minutes=5)
    lines = pdsh_run(stop, T0 + timedelta(hours=3))

    rc = run([write(tmp_path / "train.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class) == ("hang.job", FailureClass.HANG)
    assert rc.time == pytest.approx(utc(stop) + 1800)


def test_pdsh_labelled_lines_killed_under_the_interval_are_no_hang(run, tmp_path):
    """Counterexample: the kill 10 minutes after the last step."""
    lines = pdsh_run(T0 + timedelta(minutes=5), T0 + timedelta(minutes=15))

    result = run([write(tmp_path / "train.log", lines)], **HANG_ON)

    assert all(f.rule_id != "hang.job" for f in result.findings)


def test_paddle_launcher_and_slash_dated_lines_date_the_silence(run, tmp_path):
    """Paddle's launcher writes ``LAUNCH INFO <iso>`` (name before level), PaddleOCR ``[Y/m/d H:M:S]``:
    both are stamps, so the two hours between the last worker line and the launcher's SIGTERM are a hang."""
    stop = T0 + timedelta(minutes=5)
    lines = ([f"LAUNCH INFO {T0:%Y-%m-%d %H:%M:%S},221 Job: default, mode collective"]
             + [f"[{T0 + timedelta(minutes=m):%Y/%m/%d %H:%M:%S}] ppocr INFO: epoch: [1/1200], iter: {m}"
                for m in range(6)]
             + [f"LAUNCH INFO {T0 + timedelta(hours=2):%Y-%m-%d %H:%M:%S},778 Terminating with signal 15"])

    rc = run([write(tmp_path / "worker-0.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class) == ("hang.job", FailureClass.HANG)
    assert rc.time == pytest.approx(utc(stop) + 1800)


def nccl_init(host: str = "p4d-c41a8") -> list[str]:
    """NCCL's init lines (untimed: NCCL_DEBUG=INFO writes ``host:pid:tid [dev] NCCL INFO ...``)."""
    return ([f"{host}:6883:8229 [0] NCCL INFO Channel {c:02d}/24 :    0   1   2   3" for c in range(6)]
            + [f"{host}:6883:8229 [0] NCCL INFO Connected all rings",
               f"{host}:6883:8229 [0] NCCL INFO comm 0x5581c9e0 rank 0 nranks 4 cudaDev 0 busId 101c0 - Init COMPLETE"])


def ds_line(at: datetime, msg: str) -> str:
    return f"[{at:%Y-%m-%d %H:%M:%S},000] [INFO] [launch.py:318:main] {msg}"


def test_untimed_init_lines_after_a_stamp_were_printed_with_it(run, tmp_path):
    """NCCL's eight untimed init lines right after the stamped ``Initializing TorchBackend`` line, then
    nothing until the launcher kills the job 90 minutes later: live watch saw the lines at init and
    the silence after them (they were once read as possibly spread over the 90 minutes, which eight
    lines can fill, so no hang was found)."""
    lines = ([ds_line(T0, "Initializing TorchBackend in DeepSpeed with backend nccl")] + nccl_init()
             + [ds_line(T0 + timedelta(minutes=90), "Killing subprocess 6883")])

    rc = run([write(tmp_path / "rank0.log", lines)], **HANG_ON).decision.root_cause

    assert (rc.rule_id, rc.failure_class) == ("hang.job", FailureClass.HANG)
    assert rc.time == pytest.approx(utc(T0) + 1800)


def test_untimed_step_prints_between_two_stamps_still_bridge_the_span(run, tmp_path):
    """Counterexample: eight untimed step prints (progress lines) in the same 90 minutes were written
    as the work went on: they may fill the span, so no hang."""
    lines = ([ds_line(T0, "Initializing TorchBackend in DeepSpeed with backend nccl")]
             + [f"rank=0: step {s} loss {4.6 / s:.4f}" for s in range(1, 9)]
             + [ds_line(T0 + timedelta(minutes=90), "Killing subprocess 6883")])

    result = run([write(tmp_path / "rank0.log", lines)], **HANG_ON)

    assert [f for f in result.findings if f.rule_id == "hang.job"] == []


def test_a_traceback_after_a_files_last_stamp_was_printed_with_it(run, tmp_path):
    """Rank 1's untimed traceback follows its last stamp at 09:05; rank 0 goes on stamping until 09:40
    and then goes quiet until its shutdown line at 11:00. Rank 1's lines are its output at 09:05, not
    output to the end of the input, so the job fell silent at 09:40."""
    rank1 = training(iso_line, {1: T0 + timedelta(minutes=5)}) + [
        "[default1]:Traceback (most recent call last):", '[default1]:  File "train.py", line 9, in <module>',
        "[default1]:KeyboardInterrupt"]
    rank0 = training(iso_line, {0: T0 + timedelta(minutes=40)}) + [iso_line(0, T0 + timedelta(hours=2), "exiting")]

    scan = run([write(tmp_path / "rank1.log", rank1), write(tmp_path / "rank0.log", rank0)], **HANG_ON)

    hang = [f for f in scan.findings if f.rule_id == "hang.job"]
    assert [f.time for f in hang] == [pytest.approx(utc(T0 + timedelta(minutes=40)) + 1800)]


def _one_rank_then_quiet(tmp_path: Path) -> Path:
    """rank0.log: a step a minute from 09:00 to 09:10, then nothing."""
    lines = training(iso_line, {0: T0 + timedelta(minutes=10)}, every=timedelta(minutes=1))
    return write(tmp_path / "rank0.log", [l.removeprefix("[default0]:") for l in lines])


@pytest.mark.parametrize("name", ["events.log", "modelarts-events.log", "k8s-events.txt"])
def test_a_platforms_periodic_event_lines_do_not_keep_a_silent_job_active(run, tmp_path, name):
    """Round 26: an event stream (the control plane's records about the job) polls every ten minutes
    while the ranks have been silent since 09:10; its lines are no instance's output, so the job hangs
    at 09:40, and its last stamp (10:20) shows the input went on past that."""
    polls = [f"{T0 + timedelta(minutes=m):%Y-%m-%d %H:%M:%S} [platform] job={JOB} util=100% io_changed=false"
             for m in range(0, 81, 10)]
    result = run([write(tmp_path / name, polls), _one_rank_then_quiet(tmp_path)], **HANG_ON)

    rc = result.decision.root_cause
    assert (result.decision.action, rc.rule_id, rc.rank) == (Action.RESTART_JOB, "hang.job", 0)
    assert rc.time == pytest.approx(utc(T0 + timedelta(minutes=10)) + 1800)


def test_a_kernel_logs_periodic_lines_do_not_keep_a_silent_job_active(run, tmp_path):
    """The node's kernel log is host evidence, never an instance: a corrected PCIe error logged every
    minute until 10:20 does not hide the ranks' silence since 09:10."""
    kern = [f"{T0 + timedelta(minutes=m):%b %d %H:%M:%S} n1 kernel: pcieport 0000:00:03.0: AER: Corrected error "
            "received: 0000:00:03.0" for m in range(0, 81)]
    result = run([write(tmp_path / "kern.log", kern), _one_rank_then_quiet(tmp_path)], **HANG_ON)

    rc = result.decision.root_cause
    assert (rc.rule_id, rc.rank) == ("hang.job", 0)
    assert rc.time == pytest.approx(utc(T0 + timedelta(minutes=10)) + 1800)


def test_event_lines_that_end_soon_after_the_last_step_are_no_hang(run, tmp_path):
    polls = [f"{T0 + timedelta(minutes=m):%Y-%m-%d %H:%M:%S} [platform] job={JOB} util=100%" for m in (0, 10, 20)]
    result = run([write(tmp_path / "events.log", polls), _one_rank_then_quiet(tmp_path)], **HANG_ON)

    assert result.decision.action is Action.NONE
