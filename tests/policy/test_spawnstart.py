"""Rule 21 of rootcause: a spawned child cut off from its parent before it ran (ftwatch.policy.spawnstart)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.rootcause import analyse
from ftwatch.policy.spawnstart import CUT_RULE, parents_fallout, start_cut

T0 = 1_795_219_200.0
SPAWN_FRAMES = (
    "Traceback (most recent call last):",
    '  File "<string>", line 1, in <module>',
    '  File "/usr/lib/python3.10/multiprocessing/spawn.py", line 116, in spawn_main',
    "    exitcode = _main(fd, parent_sentinel)",
    '  File "/usr/lib/python3.10/multiprocessing/spawn.py", line 126, in _main',
    "    self = reduction.pickle.load(from_parent)",
)


def finding(rule: str, cls: FailureClass, line: str, evidence: tuple[str, ...], t: float = 0.0,
            action: Action = Action.FAIL_JOB) -> Finding:
    return Finding(rule, "keyword", cls, action, Severity.ERROR,
                   Origin("train", None, "job", "node-0", "stderr", "process"), line, T0 + t, seq=int(t * 10),
                   evidence=evidence)


def eof(t: float = 0.0) -> Finding:
    return finding("python.eof_input", FailureClass.USER_CODE, "EOFError: Ran out of input",
                   SPAWN_FRAMES + ("EOFError: Ran out of input",), t)


def truncated(t: float = 0.0) -> Finding:
    """The catch-all's finding: its line is the traceback's head, the exception is in the evidence."""
    return finding("python.uncaught_exception", FailureClass.USER_CODE, "Traceback (most recent call last):",
                   SPAWN_FRAMES + ("_pickle.UnpicklingError: pickle data was truncated",), t)


def test_a_cut_off_start_in_spawn_main_is_fallout():
    assert start_cut(eof()) and start_cut(truncated())
    for f in parents_fallout([eof(), truncated()]):
        assert f.rule_id == CUT_RULE
        assert f.failure_class is FailureClass.FALLOUT and f.action is Action.RESTART_JOB


def test_the_same_errors_in_the_programs_own_frames_keep_their_grade():
    """pickle.load of an empty cache file in the program: its own reading (python.eof_input stays)."""
    own = finding("python.eof_input", FailureClass.USER_CODE, "EOFError: Ran out of input",
                  ("Traceback (most recent call last):", '  File "train.py", line 40, in <module>',
                   "    cache = pickle.load(fh)", "EOFError: Ran out of input"))
    assert not start_cut(own)
    assert parents_fallout([own]) == [own]


def test_another_error_of_the_childs_start_keeps_its_grade():
    """A class the child cannot find is the program's (it fails in _main too, with another exception)."""
    missing = finding("python.exception.AttributeError", FailureClass.USER_CODE,
                      "AttributeError: Can't get attribute 'Net' on <module '__main__' (built-in)>",
                      SPAWN_FRAMES + ("AttributeError: Can't get attribute 'Net' on <module '__main__' (built-in)>",))
    assert not start_cut(missing)


def test_the_parents_own_failure_decides():
    """The children's cut-off starts after a parent that aborted on a lost socket: only fallout is left."""
    lost = finding("c10d.socket_not_connected", FailureClass.FALLOUT, "  what():  Transport endpoint is not connected",
                   ("  what():  Transport endpoint is not connected",), action=Action.RESTART_JOB)
    an = analyse([lost, truncated(1.0), eof(2.0)])
    assert an.fallout_only and an.root_cause.rule_id == "c10d.socket_not_connected"
    assert an.fallout_class is FailureClass.RETRYABLE_INFRA
    # a lone cut-off child is fallout as well: what its parent did decides, not the child
    assert analyse([eof()]).root_cause.rule_id == CUT_RULE
    parent = finding("python.exception.AttributeError", FailureClass.USER_CODE,
                     "AttributeError: Can't pickle local object 'main.<locals>.collate'",
                     ("Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
                      "AttributeError: Can't pickle local object 'main.<locals>.collate'"))
    assert analyse([parent, eof(1.0)]).root_cause.rule_id == "python.exception.AttributeError"
