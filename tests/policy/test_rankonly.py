"""A job hang that began in work the program ran on one rank alone (ftwatch.policy.rankonly, issue 12
item 3): where several ranks log their own training and only one says it evaluates, the silence
that begins there is the program's (user_code); a program that logs on one rank only, work every
rank reports, or a save keeps the hang reading."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.initphase import FirstProgress
from ftwatch.policy.rankonly import rank_only_before_hang
from ftwatch.policy.policy import Policy
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.testing import finding

T0 = 1_795_219_200.0
RULES = load_rules()
ENGINE = Engine(RULES)
JOB = "rankonly"
FLAGS = {"fault_tolerant_policy": "ExitCodeAndErrorMsg", "enable_job_restart": True, "max_num_of_job_restart": 3,
         "enable_job_hang_detection": True, "job_hang_interval": 1800}
EVAL = "[rank 0] evaluating on validation set ..."


def logged(rank: int, t: float, line: str) -> list[Finding]:
    o = Origin(f"rank{rank}", rank, JOB, "node-0", "stderr", "process")
    return ENGINE.feed(o, f"{line}\n".encode(), T0 + t, final=True)


def hang(last_output: float) -> Finding:
    return finding("hang.job", kind="hang", failure_class=FailureClass.HANG, action=Action.RESTART_JOB,
                   time=T0 + last_output + 1800.0, seq=10**9, fields={"silent_for": 1800.0})


ALL = frozenset({"rank0", "rank1", "rank2", "rank3"})


def test_an_evaluation_only_one_logging_rank_reports_before_the_silence_is_the_programs():
    work = logged(0, 600.0, EVAL)
    assert [f.rule_id for f in work] == ["lifecycle.own_work.evaluation"]
    h = hang(600.0)
    rc = rank_only_before_hang([*work, h], [h], ALL)
    assert rc is not None and rc.rule_id == "hang.rank_only_work"
    assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB
    assert rc.fields["rank_only"] == "rank0"


def test_a_program_that_logs_on_one_rank_only_says_nothing_of_who_evaluates():
    work, h = logged(7, 600.0, "evaluating on validation set (eval-iters 10) ..."), hang(600.0)
    assert rank_only_before_hang([*work, h], [h], frozenset({"rank7"})) is None
    assert rank_only_before_hang([*work, h], [h], frozenset()) is None


def test_work_every_rank_reports_is_no_ones_alone():
    work = logged(0, 600.0, EVAL) + logged(1, 600.0, "[rank 1] evaluating on validation set ...")
    h = hang(600.0)
    assert rank_only_before_hang([*work, h], [h], ALL) is None


def test_the_work_long_before_the_silence_or_an_error_after_it_keeps_the_hang():
    work = logged(0, 600.0, EVAL)
    late = hang(600.0 + 3600.0)
    assert rank_only_before_hang([*work, late], [late], ALL) is None
    crash = logged(1, 601.0, "RuntimeError: CUDA error: an illegal memory access was encountered")
    h = hang(601.0)
    assert rank_only_before_hang([*work, *crash, h], [h], ALL) is None


def test_a_save_by_one_rank_is_left_out():
    work, h = logged(0, 600.0, "Saving model checkpoint to /ckpt/step_500"), hang(600.0)
    assert rank_only_before_hang([*work, h], [h], ALL) is None


def test_first_progress_names_the_instances_that_logged_progress():
    p = FirstProgress()
    p.read(Origin("rank0", 0, JOB, "n", "stderr", "process"), b"2026-11-26 09:00:00 step 5 loss 2.1\n", T0, 0.0, 2026)
    p.read(Origin("rank1", 1, JOB, "n", "stderr", "process"), b"2026-11-26 09:00:00 loading data\n", T0, 0.0, 2026)
    assert p.progressed == {"rank0"}
    p.reset()
    assert p.progressed == frozenset()


def test_replay_of_per_rank_logs_decides_it(tmp_path: Path):
    paths = []
    for r in range(4):
        lines = [f"2026-03-15 09:{7 * e:02d}:00,000 [rank {r}] epoch {e} train loss 0.{9 - e}" for e in range(3)]
        if r == 0:
            lines.append("2026-03-15 09:15:00,000 [rank 0] evaluating on validation set ...")
        lines.append(f"2026-03-15 11:15:00,000 [rank {r}] terminated by the user (no progress)")
        path = tmp_path / f"rank{r}.log"
        path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
        paths.append(path)
    policy = Policy(Config().with_policy(**FLAGS).policy, BudgetStore(tmp_path / "b.json", JOB), JOB)
    d = replay(paths, Engine(RULES), policy, JOB).decision
    assert d.action is Action.FAIL_JOB and d.root_cause is not None, d.policy_clause
    assert d.root_cause.rule_id == "hang.rank_only_work"


def test_the_main_processs_own_preparation_is_left_out():
    work = logged(0, 600.0, "running tokenization on the main process (48213 examples)")
    assert [f.rule_id for f in work] == ["lifecycle.left_path.main_process_only"]
    h = hang(600.0)
    assert rank_only_before_hang([*work, h], [h], ALL) is None
