"""``ftwatch replay`` (T3): recorded logs through the engine and the policy, and its command.

The logs are shaped like the DDP jobs recorded in ``tests/golden`` (torchrun 3 workers, gloo):
per-rank files as ``torchrun --redirects`` writes them, or one combined file with torchrun's
``[defaultN]:`` prefixes, the agent's glog lines and its failure summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass
from ftwatch.pipeline.replay import CHUNK_BYTES, SIM_START, SIM_STEP, anchor, origin_for, replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.engine import Engine
from ftwatch.policy.policy import Policy

JOB = "replay-test"
BANNER = [
    "*****************************************",
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system "
    "being overloaded, please further tune the variable for optimal performance in your application as needed. ",
    "*****************************************",
]
KEYERROR_TB = [
    "Traceback (most recent call last):",
    '  File "/srv/train/examples/train_ddp.py", line 230, in <module>',
    "    _exit(main())",
    "          ^^^^^^",
    '  File "/srv/train/examples/train_ddp.py", line 182, in _inject',
    '    warmup = config["warmup_steps"]      # the bug: a key nobody set',
    "             ~~~~~~^^^^^^^^^^^^^^^^",
    "KeyError: 'warmup_steps'",
]


def gloo_tb(port: int, what: str = "Connection closed by peer [127.0.0.1]:{port}. This is typically caused by "
                                   "a remote worker crashing.") -> list[str]:
    return [
        "Traceback (most recent call last):",
        '  File "/srv/train/examples/train_ddp.py", line 106, in main',
        "    dist.all_reduce(p.grad)      # the collective every rank must reach",
        '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252, '
        "in all_reduce",
        "    work.wait()",
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        + what.format(port=port) + " Check the logs of the remote worker before reporting an error. GLHF! "
        "\U0001f3d6\ufe0f",
    ]


def steps(rank: int, upto: int = 7) -> list[str]:
    return [f"rank {rank}/3 starting: attempt 0, MA_PROC_START_CNT=1"] + [
        f"step {i}/12 loss {4.6369 / i:.4f}" for i in range(1, upto + 1)]


def tee(rank: int, lines: list[str], torch_rank: bool = False) -> list[str]:
    """torchrun --tee's prefix, plus PyTorch's own [rankN]: on uncaught exceptions."""
    inner = f"[rank{rank}]: " if torch_rank else ""
    return [f"[default{rank}]:{inner}{line}" for line in lines]


def agent_summary(root_rank: int, code: int, survivors: list[int]) -> list[str]:
    """The torchrun agent's last words: SIGTERM to the survivors, ChildFailedError and the summary."""
    out = [f"W1121 11:02:19.507000 18964 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
           f"{18988 + r} closing signal SIGTERM" for r in survivors]
    pid = 18988 + root_rank
    if code < 0:
        exitcode, traceback = f"{code} (pid: {pid})  (SIGKILL)", f"Signal 9 (SIGKILL) received by PID {pid}"
    else:
        exitcode = f"{code} (pid: {pid}) "
        traceback = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    out += [
        f"E1121 11:02:19.705000 18964 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: "
        f"{code}) local_rank: {root_rank} (pid: {18988 + root_rank}) of binary: /opt/venv/bin/python",
        "Traceback (most recent call last):",
        '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>',
        "    main()",
        '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in '
        "launch_agent",
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "=======================================================",
        "/srv/train/examples/train_ddp.py FAILED",
        "-------------------------------------------------------",
        "Failures:",
    ]
    for i, r in enumerate(survivors, start=1):
        out += [f"[{i}]:", "  time      : 2026-11-21_11:02:19", "  host      : node-a",
                f"  rank      : {r} (local_rank: {r})", f"  exitcode  : -15 (pid: {18988 + r})  (SIGTERM)",
                "  error_file: <N/A>", f"  traceback : Signal 15 (SIGTERM) received by PID {18988 + r}"]
    out += ["-------------------------------------------------------", "Root Cause (first observed failure):",
            "[0]:", "  time      : 2026-11-21_11:02:19", "  host      : node-a",
            f"  rank      : {root_rank} (local_rank: {root_rank})",
            f"  exitcode  : {exitcode}", "  error_file: <N/A>", f"  traceback : {traceback}",
            "======================================================="]
    return out


SIGKILL_COMBINED = (BANNER + tee(0, steps(0)) + tee(1, steps(1, 5)) + tee(2, steps(2, 5))
                    + tee(1, ["injecting fault sigkill at step 8"])
                    + tee(2, gloo_tb(55958, "Read error [127.0.0.1]:{port}: Connection reset by peer."), True)
                    + tee(0, gloo_tb(7317, "Read error [127.0.0.1]:{port}: Connection reset by peer."), True)
                    + agent_summary(1, -9, [0, 2]))
KEYERROR_COMBINED = (BANNER + tee(0, steps(0)) + tee(1, steps(1, 5)) + tee(2, steps(2, 5))
                     + tee(1, KEYERROR_TB, True) + tee(2, gloo_tb(20909), True) + tee(0, gloo_tb(20909), True)
                     + agent_summary(1, 1, [0, 2]))
CLEAN_COMBINED = BANNER + [line for r in range(3) for line in tee(r, steps(r, 12) + ["training finished at step 12"])]


def pad(size: int, line: bytes = b"[default0]:step 7/12 loss 0.9119\n") -> bytes:
    """Worker lines of exactly ``size`` bytes (the last one shorter), so a test can place a chunk boundary."""
    whole, rest = divmod(size, len(line))
    return line * whole + (b"#" * (rest - 1) + b"\n" if rest else b"")


def write(path: Path, lines: list[str] | bytes) -> Path:
    path.write_bytes(lines if isinstance(lines, bytes) else "".join(f"{l}\n" for l in lines).encode())
    return path


def test_file_names_give_ranks_and_a_combined_log_has_none(tmp_path):
    assert origin_for(tmp_path / "rank3.log", JOB).rank == 3
    assert origin_for(tmp_path / "worker-12.err", JOB).rank == 12
    assert origin_for(tmp_path / "combined.log", JOB).rank is None
    assert origin_for(tmp_path / "workerlog.3", JOB).rank == 3          # Paddle's launcher's per-worker file
    assert origin_for(tmp_path / "workerlog.1.log", JOB).rank == 1


def test_per_rank_files_keyerror_fails_the_job_naming_rank_1(run, tmp_path):
    files = [write(tmp_path / "rank0.log", steps(0) + ["[rank0]: " + l for l in gloo_tb(42725)]),
             write(tmp_path / "rank1.log", steps(1, 5) + ["[rank1]: " + l for l in KEYERROR_TB]),
             write(tmp_path / "rank2.log", steps(2, 6) + ["[rank2]: " + l for l in gloo_tb(46808)])]

    result = run(files, enable_job_restart=True)

    d = result.decision
    assert d.action is Action.FAIL_JOB
    assert (d.root_cause.rule_id, d.root_cause.rank, d.root_cause.line) == (
        "python.key_error", 1, "KeyError: 'warmup_steps'")
    assert sorted((f.rank, f.failure_class) for f in result.findings) == [
        (0, FailureClass.FALLOUT), (1, FailureClass.USER_CODE), (2, FailureClass.FALLOUT)]
    assert result.lines == sum(len(p.read_bytes().splitlines()) for p in files)
    assert result.bytes == sum(p.stat().st_size for p in files)


def test_combined_keyerror_log_fails_the_job_naming_rank_1_not_its_exit(run, tmp_path):
    result = run([write(tmp_path / "combined.log", KEYERROR_COMBINED)], enable_job_restart=True)
    d = result.decision
    assert d.action is Action.FAIL_JOB
    assert (d.root_cause.rule_id, d.root_cause.rank) == ("python.key_error", 1)
    assert "user_code" in d.policy_clause


def test_sigkill_restarts_the_job_naming_rank_1_not_a_survivor(run, tmp_path):
    result = run([write(tmp_path / "combined.log", SIGKILL_COMBINED)], enable_job_restart=True)

    d = result.decision
    assert d.action is Action.RESTART_JOB
    assert (d.root_cause.rule_id, d.root_cause.rank) == ("exit.sigkill", 1)
    assert d.root_cause.failure_class is FailureClass.RETRYABLE_INFRA
    assert (d.restarts_used, d.restarts_left) == (1, 2)
    assert not [f for f in result.findings if f.rule_id == "exit.sigterm"]   # the agent stopped them
    fallout = {f.rank for f in result.findings if f.rule_id == "gloo.pair_io_error"}
    assert fallout == {0, 2}


def test_sigkill_without_restarts_enabled_fails_the_job(run, tmp_path):
    d = run([write(tmp_path / "combined.log", SIGKILL_COMBINED)]).decision
    assert d.action is Action.FAIL_JOB
    assert (d.root_cause.rule_id, d.root_cause.rank) == ("exit.sigkill", 1)
    assert "enable_job_restart=False" in d.policy_clause


@pytest.mark.parametrize("cut_before", [
    "Failures:",
    "  exitcode  : -15 (pid: 18990)  (SIGTERM)",
    "Root Cause (first observed failure):",
    "  exitcode  : -9 (pid: 18989)  (SIGKILL)",
    "  traceback : Signal 9 (SIGKILL) received by PID 18989",
])
def test_summary_cut_by_a_chunk_boundary_is_read_whole(run, tmp_path, cut_before):
    """A long log puts its summary anywhere relative to the 1 MiB chunks."""
    log = "".join(f"{l}\n" for l in SIGKILL_COMBINED).encode()
    data = pad(CHUNK_BYTES - log.index(cut_before.encode())) + log
    assert data[CHUNK_BYTES:].startswith(cut_before.encode())   # the second chunk starts with it

    d = run([write(tmp_path / "combined.log", data)], enable_job_restart=True).decision

    assert (d.action, d.root_cause.rule_id, d.root_cause.rank) == (Action.RESTART_JOB, "exit.sigkill", 1)


def test_clean_log_decides_nothing(run, tmp_path):
    result = run([write(tmp_path / "combined.log", CLEAN_COMBINED)], enable_job_restart=True)
    assert result.decision.action is Action.NONE
    assert result.decision.root_cause is None
    assert result.findings == []
    assert result.lines == len(CLEAN_COMBINED)


def test_traceback_straddling_a_chunk_boundary_is_one_finding_at_its_own_time(run, tmp_path):
    tb = [f"[rank1]: {l}\n".encode() for l in KEYERROR_TB]
    head = pad(CHUNK_BYTES - len(b"".join(tb[:3])), b"step 5/12 loss 0.4920\n")  # 3 lines in the first chunk
    path = write(tmp_path / "rank1.log", head + b"".join(tb) + b"step 8/12 loss 0.7960\n" * 10)

    result = run([path])

    [finding] = result.findings
    assert finding.rule_id == "python.key_error"
    assert finding.evidence == tuple(KEYERROR_TB)
    assert finding.time == pytest.approx(SIM_START + head.count(b"\n") * SIM_STEP, abs=SIM_STEP / 2)
    assert result.lines == head.count(b"\n") + len(KEYERROR_TB) + 10


def test_earliest_error_wins_when_a_later_one_straddles_a_chunk_boundary(run, tmp_path):
    """R7 across files: line times must not jump back when a traceback is carried to the next chunk."""
    head = pad(CHUNK_BYTES - 60, b"[rank0]: step 5/12 loss 0.4920\n")
    late = "".join(f"[rank0]: {l}\n" for l in ["Traceback (most recent call last):",
                                                 '  File "/srv/train/train.py", line 40, in <module>',
                                                 "    a, b = batch",
                                                 "ValueError: too many values to unpack (expected 2)"])
    early = steps(1, 100) + ["[rank1]: " + l for l in KEYERROR_TB]
    files = [write(tmp_path / "rank0.log", head + late.encode()), write(tmp_path / "rank1.log", early)]

    result = run(files)

    assert {f.rule_id: f.rank for f in result.findings} == {"python.value_error": 0, "python.key_error": 1}
    assert (result.decision.root_cause.rule_id, result.decision.root_cause.rank) == ("python.key_error", 1)


def test_line_longer_than_a_chunk_is_read_whole(run, tmp_path):
    long_line = b"[rank1]: " + b"0123456789abcdef" * (3 * CHUNK_BYTES // 16) + b"\n"
    path = write(tmp_path / "rank1.log", long_line + "".join(f"{l}\n" for l in KEYERROR_TB).encode())

    result = run([path])

    assert [f.rule_id for f in result.findings] == ["python.key_error"]
    assert result.lines == 1 + len(KEYERROR_TB)
    assert result.bytes == path.stat().st_size


def test_progress_is_told_every_byte(rules, tmp_path):
    data = "".join(f"{l}\n" for l in CLEAN_COMBINED * 2000).encode()
    path = write(tmp_path / "rank0.log", data + b"a last line without its newline")
    told: list[int] = []
    policy = Policy(Config().policy, BudgetStore(tmp_path / "b.json", JOB), JOB)
    replay([path], Engine(rules), policy, JOB, progress=told.append)
    assert len(told) > 1 and sum(told) == path.stat().st_size


# --- the simulated clock's anchor -----------------------------------------------------------------

def utc(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


LAUNCH_2024 = "2024-03-05 10:00:00,000 - torch.distributed.run - INFO - Using nproc_per_node=3."
CUDA_GLOG_2024 = ("E0305 10:00:05.000000 4120 train.py:182] RuntimeError: CUDA error: an illegal memory access was "
                  "encountered")
CUDA_ISO_2024 = ("2024-03-05 10:00:03,250 ERROR RuntimeError: CUDA error: an illegal memory access was "
                 "encountered")


def test_untimed_error_before_a_glog_error_of_a_2024_log_is_the_root_cause(run, tmp_path):
    """The untimed KeyError comes first in the file; the glog line (no year) is 5 s after launch."""
    log = [LAUNCH_2024] + steps(1, 5) + ["[rank1]: " + l for l in KEYERROR_TB] + steps(1, 12) + [CUDA_GLOG_2024]
    result = run([write(tmp_path / "rank1.log", log)])

    by_rule = {f.rule_id: f for f in result.findings}
    key, cuda = by_rule["python.key_error"], by_rule["cuda.illegal_memory_access"]
    assert key.time == pytest.approx(utc(2024, 3, 5, 10) + log.index("[rank1]: Traceback (most recent call last):")
                                     * SIM_STEP, abs=SIM_STEP / 2)
    assert cuda.time == pytest.approx(utc(2024, 3, 5, 10, 0, 5), abs=1e-6)     # glog read in the log's year
    assert key.time < cuda.time
    d = result.decision
    assert (d.action, d.root_cause.rule_id, d.root_cause.rank) == (Action.FAIL_JOB, "python.key_error", 1)
    assert datetime.fromtimestamp(d.time, tz=timezone.utc).year == 2024


def test_iso_error_before_an_untimed_error_of_a_2024_log_is_the_root_cause(run, tmp_path):
    log = steps(1, 3) + [CUDA_ISO_2024] + steps(1, 5) + ["[rank1]: " + l for l in KEYERROR_TB]
    result = run([write(tmp_path / "rank1.log", log)])

    by_rule = {f.rule_id: f for f in result.findings}
    assert by_rule["cuda.illegal_memory_access"].time < by_rule["python.key_error"].time
    assert by_rule["python.key_error"].time < utc(2024, 3, 5, 10, 0, 4)
    assert result.decision.root_cause.rule_id == "cuda.illegal_memory_access"


def test_a_file_without_timestamps_starts_at_the_other_files_anchor(run, tmp_path):
    """rank0's log has dates, rank1's none: rank1's KeyError is not put in 2026, after rank0's fallout."""
    rank0 = [LAUNCH_2024] + steps(0, 40) + ["2024-03-05 10:00:09,000 - ERROR - gloo peer gone"] + [
        "[rank0]: " + l for l in gloo_tb(42725)]
    rank1 = steps(1, 5) + ["[rank1]: " + l for l in KEYERROR_TB]
    result = run([write(tmp_path / "rank0.log", rank0), write(tmp_path / "rank1.log", rank1)])

    key = next(f for f in result.findings if f.rule_id == "python.key_error")
    assert utc(2024, 3, 5, 10) <= key.time < utc(2024, 3, 5, 10, 0, 1)
    assert (result.decision.root_cause.rule_id, result.decision.root_cause.rank) == ("python.key_error", 1)


def test_anchor_puts_the_first_timestamped_line_at_its_own_time_in_the_logs_year(tmp_path):
    glog = "I0305 10:00:00.500000 4100 torch/distributed/run.py:1] launching"
    path = write(tmp_path / "rank0.log", ["banner", "", glog, "step 1", LAUNCH_2024])
    assert anchor(path, 2026) == (pytest.approx(utc(2024, 3, 5, 10, 0, 0, 500000) - 2 * SIM_STEP), 2024)

    glog_only = write(tmp_path / "rank1.log", ["banner", glog])
    assert anchor(glog_only, 2026) == (pytest.approx(utc(2026, 3, 5, 10, 0, 0, 500000) - SIM_STEP), 2026)

    late = write(tmp_path / "rank2.log", ["step 7/12 loss 0.9119"] * 250 + [LAUNCH_2024])   # past the lines looked at
    assert anchor(late, 2026) is None
    assert anchor(write(tmp_path / "empty.log", b""), 2026) is None



def test_a_kernel_logs_yearless_stamps_are_read_in_the_year_the_other_files_carry(run, tmp_path):
    """syslog's "Mmm dd hh:mm:ss" has no year (RFC 3164): beside dated logs of 2024 a kern.log's OOM
    kill is read in 2024, minutes after rank0's last line, not in the simulated clock's 2026."""
    rank0 = [LAUNCH_2024] + steps(0, 5)
    kern = ["Mar  5 10:03:00 node-0 kernel: [2271904.551204] Out of memory: Killed process 41877 (python) "
            "total-vm:131742080kB, anon-rss:127018832kB, file-rss:40712kB, shmem-rss:0kB"]
    result = run([write(tmp_path / "rank0.log", rank0), write(tmp_path / "kern.log", kern)])

    oom = next(f for f in result.findings if f.rule_id == "os.oom_killer")
    assert oom.time == pytest.approx(utc(2024, 3, 5, 10, 3, 0))

# --- the command ---------------------------------------------------------------------------------

def ftwatch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftwatch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("flags, action, left", [
    (["--enable-job-restart=True"], "restart_job", 2),
    ([], "fail_job", 3),
])
def test_replay_command_prints_one_decision_in_the_contract_shape(tmp_path, flags, action, left):
    path = write(tmp_path / "combined.log", SIGKILL_COMBINED)

    proc = ftwatch("replay", "--json", *flags, str(path), cwd=tmp_path)

    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    decision = json.loads(line)
    assert set(decision) == {"time", "action", "target", "root_cause", "policy_clause", "restarts_used",
                             "restarts_left"}
    assert set(decision["target"]) == {"job", "instance", "rank", "node"}
    assert set(decision["root_cause"]) == {"rule_id", "failure_class", "rank", "line"}
    assert decision["action"] == action
    assert decision["root_cause"] == {"rule_id": "exit.sigkill", "failure_class": "retryable_infra", "rank": 1,
                                      "line": "rank1 (rank 1) was killed by signal 9 (SIGKILL)"}
    assert decision["restarts_left"] == left
    assert datetime.fromisoformat(decision["time"]).tzinfo is not None
    assert isinstance(decision["policy_clause"], str) and decision["policy_clause"]


def test_replay_command_on_a_clean_log_says_none(tmp_path):
    proc = ftwatch("replay", "--json", "--enable-job-restart=True", str(write(tmp_path / "c.log", CLEAN_COMBINED)),
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    decision = json.loads(proc.stdout)
    assert (decision["action"], decision["root_cause"]) == ("none", None)


def test_replay_command_reports_a_straggler_rank_like_watch(tmp_path):
    """A 4-rank Megatron log whose rank 3 prints 2.5x the others' step time (H3 in replay too)."""
    line = ("[rank{r}]: [2026-11-21 09:00:{n:02d}] iteration {n:>8}/     100 | consumed samples: {s} | "
            "elapsed time per iteration (ms): {ms} | learning rate: 1.000E-04 | lm loss: 7.1E+00 |\n")
    log = tmp_path / "megatron.log"
    log.write_text("".join(line.format(r=r, n=n, s=64 * n, ms=ms) for n in range(1, 16)
                           for r, ms in ((0, 1001.2), (1, 998.7), (2, 1003.0), (3, 2502.5))))
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "replay", str(log)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    stragglers = [ln for ln in proc.stdout.splitlines() if ln.startswith("straggler: ")]
    assert len(stragglers) == 1 and "rank 3 is a straggler" in stragglers[0] and "2.5x" in stragglers[0]


def test_a_c4d_warn_in_a_clean_log_is_a_notify_decision(run, tmp_path):
    """R8: a C4D Warn asks a person even when the job ends well (it used to be ``none``)."""
    log = write(tmp_path / "combined.log", BANNER + tee(0, steps(0, 3))
                + ["[C4D] Warn RankCommHang rank=1 node=gpu-node-7 duration=12s times=1"]
                + tee(0, ["training finished at step 3"]))
    result = run([log])
    assert result.decision.action is Action.NOTIFY, result.decision.policy_clause
    assert "R8 C4D Warning RankCommHang on node gpu-node-7 rank 1" in result.decision.policy_clause


def test_a_c4d_error_with_c4d_detection_isolates_the_node_it_names(run, tmp_path):
    log = write(tmp_path / "combined.log", BANNER + tee(0, steps(0, 3))
                + ["[C4D] Error RankCommHang rank=1 node=gpu-node-7 times=18"])
    result = run([log], enable_job_hang_detection=True, enable_c4d_hang_detection=True, enable_job_restart=True)
    assert result.decision.action is Action.ISOLATE_NODE, result.decision.policy_clause
    assert result.decision.target.node == "gpu-node-7"


def test_a_line_past_max_line_and_a_bars_redraws_are_handed_over_in_bounded_pieces(run, tmp_path, monkeypatch):
    """A file with no newline for megabytes (one huge line; a progress bar's ``\\r`` redraws written to a
    file until the bar closes) reaches the desk in pieces of at most ``MAX_LINE`` plus a chunk, as
    ``run``'s readers hand them over: nothing is read whole into memory, every byte is counted, and
    the error after them is found."""
    from ftwatch.pipeline import incidents, replay as replay_module
    monkeypatch.setattr(replay_module, "MAX_LINE", 2 * CHUNK_BYTES)
    seen: list[int] = []
    output = incidents.IncidentDesk.output
    monkeypatch.setattr(incidents.IncidentDesk, "output",
                        lambda self, origin, data, *a, **k: (seen.append(len(data)), output(self, origin, data, *a, **k))[1])
    blob = b"[rank1]: " + b"0123456789abcdef" * (5 * CHUNK_BYTES // 16)                 # 5 chunks, no line end
    bars = b"".join(b"\rEpoch 0:  %d%%|%s| %d/500" % (k % 100, b"#" * 60, k) for k in range(60_000))   # ~5 MiB
    path = write(tmp_path / "rank1.log", blob + b"\n" + bars + b"\n" + "".join(f"{l}\n" for l in KEYERROR_TB).encode())

    result = run([path])

    assert [f.rule_id for f in result.findings] == ["python.key_error"]
    assert result.bytes == path.stat().st_size
    assert max(seen) <= 2 * CHUNK_BYTES + CHUNK_BYTES + 1
    assert len([n for n in seen if n > 0]) > 5
