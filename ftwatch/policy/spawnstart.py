"""A spawned child that could not read its own start from its parent: the parent's failure, not the child's.

CPython's ``multiprocessing`` starts a child under the ``spawn`` (and ``forkserver``) start method
by running ``spawn_main`` in a fresh interpreter, whose ``_main`` reads two pickles from the pipe
the parent writes: the preparation data, then the process object itself
(python/cpython ``Lib/multiprocessing/spawn.py``, ``_main``: ``reduction.pickle.load(from_parent)``
twice, before ``prepare`` and ``_bootstrap``). Nothing of the program has run in the child at that
point. When that read ends early, the pickle module says so: ``EOFError: Ran out of input`` (no
byte came; CPython ``Modules/_pickle.c`` ``_Unpickler_ReadImpl``) or ``_pickle.UnpicklingError:
pickle data was truncated`` (the pickle stopped half way, same file). Both mean the parent closed
its end before it had written the child's start: it died (a signal, an abort, a crash of the main
process that was spawning DataLoader workers or ``torch.multiprocessing.spawn`` ranks), or its own
pickling failed and it raised in its own traceback. Either way the child's error is a consequence
(SPEC R7 fallout): the parent's own output or exit says why, and decides.

Only that exact place: the traceback's innermost frame is ``spawn.py``'s ``_main`` and its
exception is one of those two end-of-data errors. A child whose start ran into the program's code
(``prepare`` re-running the main module, a class the child cannot find: ``AttributeError: Can't
get attribute``) fails in the program's frames or with another exception, and keeps its grade.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding
from ftwatch.policy.catchsite import traceback_of

#: The rule id of the regraded finding.
CUT_RULE = "python.spawn_start_cut"
_SOURCE = ("python/cpython Lib/multiprocessing/spawn.py (_main: the child reads its preparation data and its process "
           "object with reduction.pickle.load(from_parent) before any program code runs) and Modules/_pickle.c "
           "('Ran out of input', 'pickle data was truncated': the stream ended before the pickle did)")
#: The end-of-data errors of the pickle reader (the exception line, rank prefixes and module path allowed before it).
_CUT = re.compile(r"(?:^|[\s:\]])(?:_pickle\.|pickle\.)?(?:EOFError: Ran out of input|UnpicklingError: pickle data was truncated)\s*$")


#: Words every :data:`_CUT` match holds: a finding whose line and evidence lack both is no cut start,
#: known without reading its traceback (root cause asks this of every finding of an incident)
_CUT_WORDS = ("Ran out of input", "pickle data was truncated")


def start_cut(f: Finding) -> bool:
    """True when ``f`` is a spawned child's failure to read its start from its parent."""
    text = "\n".join((f.line, *f.evidence)) if f.evidence else f.line    # (no word holds a newline)
    if not any(w in text for w in _CUT_WORDS):
        return False
    frames, exception = traceback_of(f)
    if not frames or not (_CUT.search(exception or f.line) or _CUT.search(f.line)):
        return False
    file, _, function = frames[-1]                  # the innermost frame
    return function == "_main" and file.replace("\\", "/").endswith("multiprocessing/spawn.py")


def parents_fallout(order: Sequence[Finding]) -> list[Finding]:
    """``order`` with each spawned child's cut-off start (:func:`start_cut`) regraded as fallout."""
    return [dataclasses.replace(f, rule_id=CUT_RULE, failure_class=FailureClass.FALLOUT,
                                action=Action.RESTART_JOB, source=_SOURCE) if start_cut(f) else f
            for f in order]
