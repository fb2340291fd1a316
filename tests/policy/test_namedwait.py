"""A job hang right after the framework named the program's wait (ftwatch.policy.namedwait, issue 12
item 3): JAX's "Did you run your code on all TPU hosts?" before the silence is the launch's
configuration (user_code); the same line long before the silence, or a hang with no such line,
keeps the hang reading."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.busy import waits
from ftwatch.policy.namedwait import (NAMED_WAIT_RULES, SLACK_SECONDS, WAIT_END_RULES, named_wait_before_hang,
                                      named_wait_rank)
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.testing import finding

T0 = 1_795_219_200.0
RULES = load_rules()
ENGINE = Engine(RULES)
JAX = ("/home/user/.local/lib/python3.8/site-packages/jax/_src/lib/xla_bridge.py:184: UserWarning: TPU backend "
       "initialization is taking more than 60.0 seconds. Did you run your code on all TPU hosts? See "
       "https://jax.readthedocs.io/en/latest/multi_process.html for more information.")


def logged(t: float, *lines: str) -> list[Finding]:
    o = Origin("train", None, "tpu", "host-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def hang(last_output: float, interval: float = 1800.0) -> Finding:
    return finding("hang.job", kind="hang", failure_class=FailureClass.HANG, action=Action.RESTART_JOB,
                   time=T0 + last_output + interval, seq=10**9, fields={"silent_for": interval})


def test_the_pack_and_the_policy_name_the_same_rules():
    assert {r.id for r in RULES if "names_wait" in r.tags} == NAMED_WAIT_RULES


def test_a_job_hang_right_after_jax_asks_for_all_tpu_hosts_is_the_launchs():
    found = logged(0.0, "I1231 09:02:11.230475 140208722954048 train.py:130] Using partitioner: PjitPartitioner", JAX)
    assert any(f.rule_id in NAMED_WAIT_RULES for f in found)
    rc = analyse([*found, hang(60.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.named_wait", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.fields["wait"] == "wait.jax_tpu_backend_not_on_all_hosts"


def test_the_warning_long_before_the_silence_says_nothing_of_the_hang():
    found = logged(0.0, JAX)          # the backend came up after all; the job trained for hours
    late = hang(last_output=4 * 3600.0)
    assert named_wait_before_hang([*found, late], [late]) is None
    rc = analyse([*found, late], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


def test_an_error_after_the_warning_keeps_its_own_reading():
    found = logged(0.0, JAX) + logged(1.0, "RuntimeError: CUDA error: an illegal memory access was encountered")
    h = hang(60.0)
    assert named_wait_before_hang(sorted([*found, h], key=lambda f: (f.time, f.seq)), [h]) is None


def test_a_hang_without_such_a_line_stays_a_hang():
    found = logged(0.0, "I1231 09:02:11.230475 140208722954048 train.py:130] Using partitioner: PjitPartitioner")
    rc = analyse([*found, hang(SLACK_SECONDS)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


USING = "Using ~/.cache/torch_extensions/py38_cpu as PyTorch extensions root..."


def ranked(t: float, rank: int, line: str) -> list[Finding]:
    o = Origin(f"rank{rank}", rank, "tpu", "host-0", "stderr", "process")
    return ENGINE.feed(o, f"{line}\n".encode(), T0 + t, final=True)


def test_the_pack_and_the_policy_name_the_same_wait_ends():
    assert {r.id for r in RULES if "ends_wait" in r.tags} == WAIT_END_RULES


def test_every_rank_silent_at_the_extensions_build_lock_is_a_stale_lock():
    # torch/utils/cpp_extension.py: every process but the builder waits in FileBaton.wait(), silent
    found = [f for r in range(4) for f in ranked(r * 0.001, r, USING)]
    rc = analyse([*found, hang(1.0)], world=4).root_cause
    assert rc is not None and rc.rule_id == "hang.named_wait", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.fields["wait"] == "wait.torch_extensions_build_lock"


def test_a_launcher_death_signal_after_the_silence_does_not_hide_the_wait():
    found = [f for r in range(2) for f in ranked(r * 0.001, r, USING)]
    h = hang(1.0)
    stop = finding("torch_elastic.agent_death_signal", time=h.time + 3600.0, seq=10**9 + 1)
    order = [*found, h, stop]
    assert named_wait_before_hang(order, [h, stop]) is not None


def test_a_hang_after_the_extension_loaded_is_no_lock_wait():
    found = ranked(0.0, 0, USING) + ranked(0.5, 0, "Loading extension module fused_adam...")
    rc = analyse([*found, hang(1.0)], world=1).root_cause
    assert rc is not None and rc.rule_id == "hang.job"


FUSED = "> compiling and loading fused kernels ..."
FUSED_DONE = ">>> done with compiling and loading fused kernels. Compilation time: 3.712 seconds"


def megatron_start(rank0_lines: list[tuple[float, str]]) -> list[Finding]:
    """Megatron's _compile_dependencies: rank 0 prints its lines, ranks 1-3 wait in the barrier (a
    one-element ALLREDUCE, SeqNum=1) until their watchdogs fire at 600 s."""
    found = [f for t, line in rank0_lines for f in ranked(t, 0, line)]
    for r in (1, 2, 3):
        found += ranked(600.0 + r / 10, r, f"[E ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
                        "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                        "Timeout(ms)=600000) ran for 600049 milliseconds before timing out.")
    return sorted(found, key=lambda f: (f.time, f.seq))


def test_peers_timing_out_on_a_rank_left_in_megatrons_kernel_build_is_the_named_wait():
    # megatron/training/initialize.py: rank 0 builds under a lock while the others sit in the barrier
    found = megatron_start([(0.0, FUSED)])
    assert named_wait_rank(found, waits(found, [f for f in found if f.rule_id != "wait.megatron_fused_kernels_build"])) is not None
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "hang.named_wait", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.rank == 0 and rc.fields["waiting"] == [1, 2, 3]


def test_a_build_that_said_it_was_done_keeps_the_silent_rank_reading():
    rc = analyse(megatron_start([(0.0, FUSED), (5.0, FUSED_DONE)]), world=4).root_cause
    assert rc is not None and rc.rule_id == "collective.silent_rank", rc


def test_a_build_line_older_than_the_wait_keeps_the_silent_rank_reading():
    rc = analyse(megatron_start([(-3600.0, FUSED)]), world=4).root_cause    # the barrier began at 0 s
    assert rc is not None and rc.rule_id == "collective.silent_rank", rc


def test_a_rank_with_an_error_after_the_build_line_failed_on_its_own():
    found = megatron_start([(0.0, FUSED), (30.0, "RuntimeError: CUDA error: an illegal memory access was encountered")])
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id != "hang.named_wait", rc


LIGHTNING_INIT = "Initializing distributed: GLOBAL_RANK: {}, MEMBER: {}/8"


def test_a_job_hang_right_after_lightning_enters_init_process_group_is_the_launchs():
    """Lightning's troubleshooting guides: stuck after "Initializing distributed" = no srun, counts
    that do not match, an interface or port range the nodes cannot reach each other on."""
    found = [f for r in range(4) for f in ranked(r / 10, r, LIGHTNING_INIT.format(r, r + 1))]
    rc = analyse([*found, hang(1.0)], world=4).root_cause
    assert rc is not None and rc.rule_id == "hang.named_wait", rc
    assert rc.failure_class is FailureClass.USER_CODE and rc.fields["wait"] == "wait.lightning_init_process_group"


def test_a_job_hang_after_every_lightning_process_registered_keeps_the_hang_reading():
    found = [*(f for r in range(2) for f in ranked(r / 10, r, LIGHTNING_INIT.format(r, r + 1))),
             *ranked(1.0, 0, "All distributed processes registered. Starting with 2 processes")]
    rc = analyse([*found, hang(2.0)], world=2).root_cause
    assert rc is not None and rc.rule_id == "hang.job", rc
