"""Where a Python traceback was caught: the handler's frame, read from the traceback itself
(issue 12 item 3; ``ftwatch.policy.progress.Survival.repeat`` reads it).

A traceback lists the frames its exception unwound, from the frame that caught it down to the one
that raised it (the data model's traceback objects: "as the stack unwinds, each unwound level inserts a traceback
object in front of the current traceback", docs.python.org/3/reference/datamodel.html#traceback-objects;
``traceback.print_exc()`` and ``logging.exception`` print that list from inside the handler). An
exception that ends the program unwinds every frame, so its traceback starts at the program's
entry (the main module's ``<module>``, ``runpy``'s ``_run_module_as_main``). A traceback that
starts elsewhere and that its instance already outlived (a notice) was caught at its first frame
and the program went on; the same exception type with the same frames again is the same handler
catching the same failure again (a plotting or logging client posting to a server that is down,
every epoch): a notice at once, not a new wait. One whose first frame is the entry is never
read so: a handler at the top level may log and then re-raise there.
"""

from __future__ import annotations

from ftwatch.events import Finding
from ftwatch.parsers.multiline import FRAME as _FRAME, PY_START as _TRACEBACK

#: The first frame of a traceback whose exception unwound a whole program, process or thread: the
#: main module's code (``<module>``: a script, a console-script wrapper), ``runpy``'s (``python
#: -m``), ``multiprocessing.process.BaseProcess._bootstrap`` (a child process's) and
#: ``threading.Thread._bootstrap_inner`` (a thread's)
_ENTRY_FRAMES = frozenset({"<module>", "_run_module_as_main", "_run_code", "_bootstrap", "_bootstrap_inner"})


def catch_site(f: Finding) -> tuple[str, tuple[tuple[str, str, str], ...]] | None:
    """The identity of the handler that printed ``f``'s traceback: (rule id, its frames as (file,
    line, function), outermost first), or None when ``f`` holds no traceback, one without frames,
    or one whose first frame is the program's entry (:data:`_ENTRY_FRAMES`: it may have ended the
    program). Only the first traceback of the evidence is read (a chained one's context)."""
    if not f.evidence or _TRACEBACK not in f.evidence[0]:
        return None
    frames = []
    for line in f.evidence[1:]:
        m = _FRAME.match(line)
        if m is not None:
            frames.append(m.groups())
        elif frames and not line.startswith((" ", "\t")):
            break                                   # the exception's own line: the list ended
    if not frames or frames[0][2] in _ENTRY_FRAMES:
        return None
    return f.rule_id, tuple(frames)
