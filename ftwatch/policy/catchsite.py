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

Some libraries' handlers are known from their code to catch every exception, log its traceback
and return (:data:`GOING_ON`, :func:`going_on`): a traceback whose first frame, its catching frame,
is one of them ended nothing, and is a notice at once (``ftwatch.policy.progress.ignored``), as
Python's own "Exception ignored in" is.
"""

from __future__ import annotations

import functools

from ftwatch.events import Finding
from ftwatch.parsers.multiline import FRAME as _FRAME, PY_START as _TRACEBACK

#: The first frame of a traceback whose exception unwound a whole program, process or thread: the
#: main module's code (``<module>``: a script, a console-script wrapper), ``runpy``'s (``python
#: -m``), ``multiprocessing.process.BaseProcess._bootstrap`` (a child process's) and
#: ``threading.Thread._bootstrap_inner`` (a thread's)
_ENTRY_FRAMES = frozenset({"<module>", "_run_module_as_main", "_run_code", "_bootstrap", "_bootstrap_inner"})
#: Those of :data:`_ENTRY_FRAMES` that start the main program (a thread's or a child process's
#: end leaves the program running): :func:`ended_program`
_PROGRAM_ENTRY = frozenset({"<module>", "_run_module_as_main", "_run_code"})
#: the files of a multiprocessing child's own entry (:func:`ended_program`: no end of the program)
_CHILD_ENTRY_FILES = ("multiprocessing/spawn.py", "multiprocessing/forkserver.py")


#: Library functions whose code catches every exception in its body, logs the traceback and returns
#: (function name -> the file its frame line names must end with, "" for any, and the source):
#: a logged traceback that starts at one of them was caught there and the program went on.
GOING_ON: dict[str, tuple[str, str]] = {
    # AllenNLP's optional GPU-memory probe (and the copies of it in other projects' utils):
    # ``except FileNotFoundError: return {}`` then a bare ``except`` whose comment says it catches
    # everything because "this memory check is a nice-to-have" no training run should fail of, and
    # ``logger.exception("unable to check gpu_memory_mb(), continuing"); return {}``
    # (allenai/allennlp allennlp/common/util.py gpu_memory_mb, 0.x to 2.x)
    "gpu_memory_mb": ("", "allenai/allennlp allennlp/common/util.py gpu_memory_mb"),
    # AutoGluon's trainer fitting one model: ``except Exception as err:`` logs "Warning: Exception
    # caused <model> to fail during training... Skipping this model." and ``logger.exception(
    # "Detailed Traceback:")`` (verbosity > 0), and the fit goes on with the next model
    # (autogluon/autogluon core/src/autogluon/core/trainer/abstract_trainer.py _train_and_save)
    "_train_and_save": ("trainer/abstract_trainer.py",
                        "autogluon/autogluon core/src/autogluon/core/trainer/abstract_trainer.py _train_and_save"),
}


def traceback_of(f: Finding, last: bool = False) -> tuple[list[tuple[str, str, str]], str | None]:
    """The frames (file, line, function) of ``f``'s first traceback (``last``: of its last one, the
    exception a chain ended in), outermost first, and the exception line that ends them (None when
    the evidence stops before it); ([], None) when ``f`` holds no traceback."""
    if not f.evidence or _TRACEBACK not in f.evidence[0]:
        return [], None
    frames, exception = _read_traceback(tuple(f.evidence), last)   # (a tuple already: itself)
    return list(frames), exception


@functools.lru_cache(maxsize=256)
def _read_traceback(evidence: tuple[str, ...], last: bool) -> tuple[tuple[tuple[str, str, str], ...], str | None]:
    """:func:`traceback_of` of a finding with ``evidence``, cached: an incident asks it of each
    finding several times (whether it was ignored, may be outlived, caught where one was before,
    cut off at a spawned start: ~1.3k reads of 16 distinct evidence lists a bench replay, issue 16).
    256 lists at most: evidence holds up to 16 lines of up to 4,096 characters
    (``ftwatch.rules.judge``), so the cache stays under ~16 MiB whatever a job prints."""
    frames: list[tuple[str, str, str]] = []
    start = 1
    if last:
        start = 1 + max(i for i, line in enumerate(evidence) if _TRACEBACK in line)
    for line in evidence[start:]:
        m = _FRAME.match(line)
        if m is not None:
            frames.append(m.groups())
        elif frames and not line.startswith((" ", "\t")):
            return tuple(frames), line              # the exception's own line: the list ended
    return tuple(frames), None


def _frames(f: Finding, last: bool = False) -> list[tuple[str, str, str]]:
    """The frames of :func:`traceback_of`."""
    return traceback_of(f, last)[0]


def ended_program(f: Finding) -> bool:
    """``f``'s traceback (the last of a chain) unwound the main program: its first frame is the
    main module's code or ``runpy``'s (:data:`_PROGRAM_ENTRY`). Python prints such a traceback
    through ``sys.excepthook`` as the program ends ("When an exception is raised and uncaught, the
    interpreter calls sys.excepthook ... just before control is returned to the prompt",
    docs.python.org/3/library/sys.html#sys.excepthook), so nothing its process writes later can
    follow it: lines of the same instance after it in a log were written before it. A process's
    standard output, block-buffered when it is a pipe or a file ("When interactive, stdout is
    line-buffered. Otherwise, it is block-buffered like regular text files",
    docs.python.org/3/library/sys.html#sys.stdout), is flushed at exit, after the traceback went to
    unbuffered standard error; and where the two streams are read apart (two pipes, or the two
    files torchrun's ``--tee`` tails), their lines interleave in the order they were read, not
    written. Recorded on a GPU with torch 2.11 (``tools/gpu_capture.sh``, ``tests/golden/gpu_cuda_oom``):
    a CUDA OOM's traceback came before the step lines printed ahead of it, under both ``torchrun
    --tee 3`` and ``ftwatch run``. Such an error is never outlived by progress lines
    (``ftwatch.policy.triggers.may_survive``); an exit 0 after it still says it ended nothing
    (``Survival.exited_ok``: a handler at the top level that logged it and went on). The one
    reading this misses: a main thread's uncaught exception leaves the program's non-daemon threads
    running (the interpreter joins them before it exits), and their lines do follow it."""
    frames = _frames(f, last=True)
    if not frames or frames[0][2] not in _PROGRAM_ENTRY:
        return False
    # a child that multiprocessing started with spawn or forkserver runs ``spawn_main`` from its own
    # ``<module>`` (``python -c 'from multiprocessing.spawn import spawn_main; spawn_main(...)'``,
    # Lib/multiprocessing/spawn.py get_command_line): its end leaves the parent, the program, running
    return not any(file.replace("\\", "/").endswith(_CHILD_ENTRY_FILES) for file, _, _ in frames[:3])


#: A thread's own entry frame (file, function): ``Thread._bootstrap_inner`` runs ``self.run()`` in a
#: bare ``try`` whose ``except`` hands the exception to ``threading.excepthook`` (3.8+; before, it
#: printed "Exception in thread <name>:" and the traceback itself) and then lets the thread end
#: (CPython Lib/threading.py, read in 3.11; Python 2.7's name-mangled ``__bootstrap_inner`` prints the
#: same). Its frame is the first of the traceback of the exception that ended the thread.
_THREAD_ENTRY = ("threading.py", frozenset({"_bootstrap_inner", "__bootstrap_inner"}))


def ended_thread(f: Finding) -> bool:
    """``f``'s (first) traceback starts at a thread's entry frame (:data:`_THREAD_ENTRY`): the
    exception escaped that thread's ``run()``, and Python's thread machinery printed it as the
    thread ended. ``progress.Survival.ignored`` reads it as the last link of the chained report
    that an "Exception in thread <name>:" header began (CPython prints a chain's causes first,
    each after "During handling of the above exception, another exception occurred:", and the
    exception that escaped last; the engine reads each link as a record of its own)."""
    frames = _frames(f)
    if not frames:
        return False
    file, _, function = frames[0]
    return function in _THREAD_ENTRY[1] and file.replace("\\", "/").endswith(_THREAD_ENTRY[0])


def going_on(f: Finding) -> str | None:
    """The handler of :data:`GOING_ON` that caught ``f``'s traceback (its first frame), or None."""
    frames = _frames(f)
    if not frames:
        return None
    file, _, function = frames[0]
    known = GOING_ON.get(function)
    if known is None or not file.replace("\\", "/").endswith(known[0]):
        return None
    return function


def catch_site(f: Finding) -> tuple[str, tuple[tuple[str, str, str], ...]] | None:
    """The identity of the handler that printed ``f``'s traceback: (rule id, its frames as (file,
    line, function), outermost first), or None when ``f`` holds no traceback, one without frames,
    or one whose first frame is the program's entry (:data:`_ENTRY_FRAMES`: it may have ended the
    program). Only the first traceback of the evidence is read (a chained one's context)."""
    frames = _frames(f)
    if not frames or frames[0][2] in _ENTRY_FRAMES:
        return None
    return f.rule_id, tuple(frames)
