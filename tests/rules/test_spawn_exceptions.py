"""torch.multiprocessing.spawn's parent-side exceptions (python_exceptions.tsv): the parent reports
a child's death or error; that report is fallout, the child's own output or signal decides."""

from __future__ import annotations

from ftwatch.events import FailureClass, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
PARENT = ["Traceback (most recent call last):", '  File "tests/test_internode.py", line 244, in <module>',
          "    torch.multiprocessing.spawn(test_loop, args=(num_processes, ), nprocs=num_processes)"]


def feed(lines: list[str]):
    return ENGINE.feed(Origin("launcher"), "".join(f"{x}\n" for x in lines).encode(), 1000.0, final=True)


def test_a_child_killed_by_a_signal_is_reported_as_fallout():
    found = feed(PARENT + ["torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGABRT"])
    assert [(f.rule_id, f.failure_class) for f in found] == [
        ("python.exception.torch.multiprocessing.spawn.ProcessExitedException", FailureClass.FALLOUT)]


def test_the_childs_own_traceback_decides_after_a_raised_exception():
    found = feed(PARENT + ["torch.multiprocessing.spawn.ProcessRaisedException: ", "",
                           "-- Process 1 terminated with the following error:",
                           "Traceback (most recent call last):", '  File "/srv/train.py", line 9, in run',
                           "KeyError: 'warmup_steps'"])
    assert [f.failure_class for f in found] == [FailureClass.FALLOUT, FailureClass.USER_CODE]
    assert analyse(found).root_cause.rule_id == "python.key_error"


def test_a_plain_exception_raised_by_join_before_torch_1_8_is_the_same_report():
    # PyTorch <= 1.7's ProcessContext.join raised Exception(msg) where 1.8 raises ProcessRaisedException
    # (python_exceptions.tsv, row kind ``site``): fallout, the child's CUDA error decides.
    join = ['  File "/env/lib/python3.8/site-packages/torch/multiprocessing/spawn.py", line 118, in join',
            "    raise Exception(msg)"]
    found = feed(PARENT + join + ["Exception: ", "", "-- Process 0 terminated with the following error:",
                                  "Traceback (most recent call last):", '  File "/srv/train.py", line 97, in run',
                                  "RuntimeError: CUDA error: unspecified launch failure"])
    assert [f.failure_class for f in found][0] is FailureClass.FALLOUT
    assert analyse(found).root_cause.rule_id == "cuda.unspecified_launch_failure"


def test_a_plain_exception_raised_elsewhere_keeps_its_grade():
    found = feed(PARENT + ['  File "/srv/train.py", line 118, in join', "    raise Exception(msg)", "Exception: bad config"])
    assert [f.failure_class for f in found] == [FailureClass.USER_CODE]
