"""glibc's own abort report on a corrupt heap (``process.glibc_abort_report``, rootcause rule 1):
its line is the abort's reason, so with nothing its instance logged before it, it is the process's
own crash (user_code), not a bare SIGABRT read as fallout; its pre-2.26 form is matched too."""

from __future__ import annotations

from ftwatch.events import FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
T0 = 1_795_219_200.0
OLD_FORM = ("*** Error in `/home/u/torch/install/bin/luajit': free(): invalid next size (fast): "
            "0x0000000001c93e40 ***")


def logged(rank: int, t: float, *lines: str) -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "heap", "node-0", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def test_the_pre_2_26_form_is_matched():
    assert [f for f in logged(0, 0.0, OLD_FORM) if f.rule_id == "process.glibc_abort_report"]


def test_a_lone_heap_abort_is_the_programs_crash_not_fallout():
    an = analyse(logged(0, 0.0, "free(): corrupted unsorted chunks", "Aborted (core dumped)"), world=1)
    assert not an.fallout_only
    assert an.root_cause.rule_id == "process.glibc_abort_report"
    assert an.root_cause.failure_class is FailureClass.USER_CODE


def test_a_bare_abort_stays_fallout():
    an = analyse(logged(0, 0.0, "Aborted (core dumped)"), world=1)
    assert an.fallout_only


def test_a_heap_abort_after_its_instances_fallout_is_that_fallouts_tear_down():
    found = logged(0, 0.0, "[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: "
                           "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                           "600070 milliseconds before timing out.")
    found += logged(0, 1.0, "double free or corruption (!prev)")
    an = analyse(found, world=2)
    assert an.root_cause is not None and an.root_cause.rule_id != "process.glibc_abort_report"
