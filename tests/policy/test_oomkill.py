"""Rule 14 of rootcause: a lone SIGKILL its parent lived to report is the OOM killer's (ftwatch.policy.oomkill)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ftwatch.cli.evaluate import DEFAULT_FLAGS
from ftwatch.config.model import Config, parse_aimaster_flags
from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.pipeline.build import build_engine, build_policy, build_rules
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.oomkill import KERNEL_DEATH, LOCAL_KILL_REPORTS, OOM_KILL, RAY_EOF, killed_when_reported
from ftwatch.policy.rootcause import SIGKILL_REPORTS, analyse
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding

JOB = "oomkill"
T0 = 1_795_219_200.0
TABLE = ExitCodeTable.load()
RI, UC, OOM = FailureClass.RETRYABLE_INFRA, FailureClass.USER_CODE, FailureClass.OOM
DS_KILLED = ("[2026-11-13 16:59:55,650] [ERROR] [launch.py:321:sigkill_handler] ['/opt/conda/bin/python', '-u', "
             "'train.py', '--local_rank=1'] exits with return code = -9")


def origin(rank: int | None, instance: str) -> Origin:
    return Origin(instance, rank, JOB, "node-0", "stderr", "process")


def log(rule: str, cls: FailureClass, t: float, instance: str = "launcher", kind: str = "keyword",
        action: Action = Action.RESTART_JOB, rank: int | None = None) -> Finding:
    return Finding(rule, kind, cls, action, Severity.ERROR, origin(rank, instance), f"{rule} line", T0 + t,
                   seq=int(t * 100))


def died(rank: int, t: float, signal: int) -> Finding:
    f = exit_finding(ProcessExit(origin(rank, f"rank{rank}"), 100 + rank, None, signal, T0 + t), TABLE,
                     seq=int(t * 100))
    assert f is not None
    return f


# --- examples: the lone kill reads as the OOM killer's -------------------------------------------

def test_a_launchers_lone_minus_9_is_the_oom_killers():
    killed = log("deepspeed_launcher.worker_sigkilled", RI, 5.0)
    rc = analyse([killed]).root_cause
    assert rc.rule_id == OOM_KILL and rc.failure_class is OOM and rc.action is Action.FAIL_JOB
    assert rc.fields["reported_by"] == "deepspeed_launcher.worker_sigkilled" and "OOM killer" in rc.line


def test_a_shells_lone_killed_line_is_the_oom_killers():
    rc = analyse([log("shell.job_killed", RI, 5.0, kind="exit_code")]).root_cause
    assert rc.rule_id == OOM_KILL and rc.failure_class is OOM


def test_an_exit_by_sigkill_keeps_the_exit_code_tables_reading():
    # SPEC R4: a rank's death by signal 9 (ftwatch run's supervisor, a replayed torchelastic summary)
    # is graded by exit_codes.tsv (137 retryable); the policy's tests fix it so
    rc = analyse([died(0, 5.0, 9)]).root_cause
    assert rc.rule_id == "exit.sigkill" and rc.failure_class is RI


def test_an_exit_by_sigkill_that_torchelastics_agent_reported_keeps_the_exit_reading():
    # torchelastic's summary restates the exit of a worker that ``ftwatch run``'s own supervisor
    # would see as an exit by signal 9: both drivers must decide alike (tests/test_golden.py, every
    # driver), and SPEC R4 keeps that exit retryable, so the agent's report keeps it too
    kill = died(0, 5.0, 9)
    agent = log("torch_elastic.exitcode_sigkill", FailureClass.FALLOUT, 5.0, instance="train")
    sigterm = log("torch_elastic.survivor_sigterm", FailureClass.FALLOUT, 4.9, instance="train")
    rc = analyse([sigterm, agent, kill, died(1, 5.0, 15)]).root_cause
    assert rc.rule_id == "exit.sigkill" and rc.failure_class is RI


FALL = FailureClass.FALLOUT


def test_a_ray_workers_death_without_a_word_and_nothing_else_is_the_oom_killers():
    # the raylet's line and the driver's RayActorError: only Ray's death reports in the incident
    raylet = log(RAY_EOF, FALL, 5.0, instance="driver")
    actor = log("python.exception.ray.exceptions.RayActorError", FALL, 6.0, instance="driver")
    rc = analyse([raylet, actor]).root_cause
    assert rc.rule_id == OOM_KILL and rc.failure_class is OOM and rc.fields["reported_by"] == RAY_EOF


def test_a_notebook_kernel_that_died_without_a_word_is_the_oom_killers():
    """The Jupyter server lived to report its kernel's death (KernelRestarter); nothing else says why."""
    restart = log(KERNEL_DEATH, FALL, 5.0, instance="notebook")
    again = log(KERNEL_DEATH, FALL, 5.1, instance="notebook")      # notebook's "kernel <id> restarted"
    rc = analyse([restart, again]).root_cause
    assert rc.rule_id == OOM_KILL and rc.failure_class is OOM and rc.fields["reported_by"] == KERNEL_DEATH


def test_a_kernel_death_after_the_error_that_ended_it_keeps_that_error():
    error = log("cuda.device_side_assert", UC, 4.0, instance="notebook", action=Action.FAIL_JOB)
    restart = log(KERNEL_DEATH, FALL, 5.0, instance="notebook")
    assert analyse([error, restart]).root_cause is error
    watchdog = log("torch.nccl_watchdog_timeout", FALL, 4.0, instance="notebook")   # other fallout: no reading
    assert analyse([watchdog, restart]).root_cause.rule_id != OOM_KILL


def test_a_ray_death_beside_other_fallout_or_a_lost_node_keeps_its_reading():
    raylet = log(RAY_EOF, FALL, 5.0, instance="driver")
    watchdog = log("torch.nccl_watchdog_timeout", FALL, 4.0, instance="worker")     # the abort explains the death
    assert analyse([watchdog, raylet]).root_cause.rule_id != OOM_KILL
    node = log("ray.actor_node_died", RI, 6.0, instance="driver")                   # its node died: retryable
    assert analyse([raylet, node]).root_cause is node
    actor = log("ray.actor_died_unexpectedly", FALL, 5.0, instance="driver")       # no exit detail: no reading
    assert analyse([actor]).root_cause.rule_id != OOM_KILL


def test_the_other_nodes_exit_reports_after_it_keep_the_reading():
    # DeepSpeed's multi-node runner: the other node's launcher tears down (return code -15) and
    # pdsh reports both remote exits; exit reports say nothing of who killed the first worker
    killed = log("deepspeed_launcher.worker_sigkilled", RI, 5.0, instance="node-a")
    torn = log("deepspeed_launcher.worker_exit", RI, 9.0, instance="node-b", kind="exit_code")
    pdsh = log("pdsh.remote_exit", UC, 10.0, instance="head", kind="exit_code", action=Action.FAIL_JOB)
    assert analyse([killed, torn, pdsh]).root_cause.rule_id == OOM_KILL


# --- counterexamples: other evidence keeps its reading --------------------------------------------

def test_preemption_beside_the_kill_stays_a_restart():
    killed = log("shell.job_killed", RI, 5.0, kind="exit_code")
    for t in (4.0, 6.0):                # the event before or after the kill report
        preempted = log("k8s.preempted", RI, t, instance="events")
        rc = analyse([killed, preempted]).root_cause
        assert rc.rule_id != OOM_KILL and rc.failure_class is RI


def test_a_schedulers_cancel_after_the_kill_report_stays():
    killed = log("shell.killed_foreground", RI, 5.0, kind="exit_code")
    cancel = log("slurm.cancelled_preemption_or_node_failure", RI, 7.0, instance="slurmstepd")
    assert analyse([killed, cancel]).root_cause is killed


def test_an_oom_killer_line_still_explains_the_kill():
    killed = log("deepspeed_launcher.worker_sigkilled", RI, 5.0)
    oom = log("os.oom_killer", OOM, 6.0, instance="host", action=Action.FAIL_JOB)
    assert analyse([killed, oom]).root_cause is oom


def test_an_oom_line_stamped_after_the_peers_errors_takes_the_place_of_the_kill_it_explains():
    """Rule 9: the kill happened no later than its report; a kernel log collected apart stamps the
    OOM kill after the errors the victim's peers printed once it was gone: the OOM decides."""
    killed = log("shell.job_killed", RI, 1.0, instance="ps", kind="exit_code")
    peer = log("python.exception.tensorflow.python.framework.errors_impl.UnavailableError", RI, 5.0,
               instance="rank0", rank=0)
    oom = log("os.oom_killer", OOM, 9.0, instance="host", action=Action.FAIL_JOB)
    assert analyse([killed, peer, oom]).root_cause is oom
    assert killed_when_reported([killed, peer, oom], [killed]) == [oom, peer]


def test_a_peers_error_before_the_kill_report_stays_first_beside_an_oom_line():
    peer = log("python.key_error", UC, 0.5, instance="rank0", rank=0)
    killed = log("shell.job_killed", RI, 1.0, instance="ps", kind="exit_code")
    oom = log("os.oom_killer", OOM, 9.0, instance="host", action=Action.FAIL_JOB)
    assert killed_when_reported([peer, killed, oom], [killed]) == [peer, oom]
    assert analyse([peer, killed, oom]).root_cause is peer


def test_a_peers_error_first_makes_the_kill_its_fallout():
    # an sglang server kills its own process tree (SIGKILL, the shell prints "Killed") after a child failed
    error = log("cuda.uncorrectable_ecc", FailureClass.HARDWARE_NODE, 4.0, instance="server",
                action=Action.ISOLATE_NODE)
    killed = log("shell.killed_foreground", RI, 5.0, instance="server", kind="exit_code")
    assert analyse([error, killed]).root_cause is error


def test_several_sigkill_deaths_are_no_lone_kill():
    # a node-wide or step-wide kill takes several processes; the OOM killer picks one victim
    first = log("deepspeed_launcher.worker_sigkilled", RI, 5.0, instance="node-a")
    second = log("deepspeed_launcher.worker_sigkilled", RI, 5.1, instance="node-b")
    assert analyse([first, second]).root_cause is first
    assert analyse([first, died(1, 6.0, 9)]).root_cause is first


def test_a_remote_launchers_report_and_a_containers_exit_137_keep_their_reading():
    for rule in ("slurm.srun_task_killed", "mpi.process_exited_on_signal", "container.exit_code"):
        killed = log(rule, RI, 5.0, kind="exit_code")
        assert analyse([killed]).root_cause is killed


def test_an_agents_received_sigterm_keeps_the_kill_external():
    killed = log("python.subprocess_died_sigkill", RI, 5.0)
    agent = log("torch_elastic.agent_death_signal", RI, 4.0, instance="agent")
    assert analyse([agent, killed]).root_cause is agent


def test_local_kill_reports_are_sigkill_reports():
    assert LOCAL_KILL_REPORTS <= SIGKILL_REPORTS


# --- end to end: the packs' lines through replay and the policy -----------------------------------

def _decide(tmp_path: Path, text: str):
    log_file = tmp_path / "launcher.log"
    log_file.write_text(text)
    flags, _ = parse_aimaster_flags(list(DEFAULT_FLAGS))      # restarts on, as ``evaluate`` runs a case
    config = Config().with_policy(**flags)
    engine = build_engine(config, build_rules(config))
    policy = build_policy(config, JOB, BudgetStore(tmp_path / "budgets.json", JOB), state_dir=tmp_path,
                          in_memory=True)
    return replay([log_file], engine, policy, JOB).decision


def test_a_replayed_lone_deepspeed_minus_9_fails_the_job_as_oom(tmp_path: Path):
    d = _decide(tmp_path, "[2026-11-13 16:59:50,000] [INFO] loading checkpoint shards\n" + DS_KILLED + "\n")
    assert d.root_cause.rule_id == OOM_KILL and d.action is Action.FAIL_JOB


def test_a_replayed_minus_9_beside_a_preemption_restarts(tmp_path: Path):
    preempted = ("52s         Normal    Preempted   pod/pytorchjob-bert-worker-0    Preempted by pod "
                 "8d1f2c44-71e0-4a0b-9c55-2f3a1b2c3d4e on node gpu-node-3\n")
    d = _decide(tmp_path, preempted + DS_KILLED + "\n")
    assert d.root_cause.rule_id != OOM_KILL and d.action is Action.RESTART_JOB


def test_a_kill_after_sglangs_scheduler_watchdog_is_its_tear_down_of_a_hang(tmp_path: Path):
    """SGLang's watchdog SIGQUITs its parent, which SIGKILLs the process tree (sglang utils/watchdog.py,
    kill_process_tree): the shell's ``Killed`` after it names its killer, a stuck engine, not the OOM killer."""
    text = ("[2025-12-16 06:24:30 DP1 TP0] Decode batch. #running-req: 32, #token: 23279, token usage: 0.40\n"
            "[2025-12-16 06:29:30 DP3 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)\n"
            "[2025-12-16 06:29:30] Received sigquit from a child process. It usually means the child failed.\n"
            "Killed\n")
    d = _decide(tmp_path, text)
    assert d.root_cause.rule_id == "sglang.scheduler_watchdog_timeout"
    assert (d.root_cause.failure_class, d.action) == (FailureClass.HANG, Action.RESTART_JOB)


def test_a_slurm_batch_scripts_unannounced_kill_keeps_the_exit_code_reading():
    """Slurm's task/cgroup announces every OOM kill of the step (``Detected N oom_kill event(s)``):
    a batch script's lone ``Killed`` without it names no OOM kill (a site's cleanup, a ``kill -9``)."""
    slurm = replace(log("shell.job_killed", RI, 5.0, kind="exit_code"),
                    line="/var/spool/slurmd/job127431/slurm_script: line 17: 40712 Killed    python train.py")
    rc = analyse([slurm]).root_cause
    assert rc.rule_id == "shell.job_killed" and rc.failure_class is RI


def test_a_plain_shell_scripts_lone_kill_still_reads_as_the_oom_killers():
    """Counterexample: the same report from a script outside Slurm keeps the OOM reading."""
    plain = replace(log("shell.job_killed", RI, 5.0, kind="exit_code"),
                    line="./train.sh: line 17: 40712 Killed    python train.py")
    assert analyse([plain]).root_cause.rule_id == OOM_KILL


def test_a_macos_shells_lone_killed_9_reads_as_the_oom_killers(tmp_path: Path):
    """Darwin's strsignal wording ('Killed: 9') is the same lone report, decided alike by replay."""
    d = _decide(tmp_path, " 75%|#######5  | 15/20 [2:04:12<45:51, 550.22s/it]./run.sh: line 142: 41872 Killed: 9"
                          "               python -m train --config a.yaml\n")
    assert d.root_cause.rule_id == OOM_KILL and d.action is Action.FAIL_JOB
