"""Finds where a multi-line block ends: a Python traceback or a C++ stack dump (SPEC P1).

The engine keeps the cleaned lines of each instance apart (rank prefix removed, so interleaved
ranks never mix), finds block starts with ``BLOCK_START_REGEXES`` in its Matcher (``ftwatch.rules``
wraps each into a regex ``Pattern``: parsers import nothing above them), confirms them
with ``is_block_start``, and asks ``block_end`` where the block stops; ``None`` means "not yet
known": wait for more lines, or flush what there is on a timeout or when the instance exits.
``BlockEnd`` gives the same answers for a block read one line at a time, reading each line once.

What is a block:
    Python traceback: ``Traceback (most recent call last):``, then the frames (every line
        indented by a space or a tab: ``  File "...", line N, in f``, code lines, ``^^^^`` markers,
        ``[Previous line repeated 996 more times]``), then the first non-indented line, the
        exception line (``KeyError: 'lr'``), which ends the block. Chained exceptions are one
        block: exception line, empty line, ``During handling of the above exception, another
        exception occurred:`` (or ``The above exception was the direct cause of the following
        exception:``), empty line, ``Traceback ...`` again; the block ends at the last exception
        line. An exception message continued on further *indented* lines is joined (CPython prints
        ``type: str(exc)`` and a multi-line ``str`` goes on as it is: grpcio's ``_InactiveRpcError``
        puts ``\tstatus = StatusCode.UNAVAILABLE`` there; nothing else of a traceback is indented
        after its exception line) when the lines are at hand (as for a chain, a chunk that ends
        right after the exception line ends the block: no wait); one continued on non-indented
        lines is not (those lines stay lines of their own: they cannot be told from the next log
        line). Exception groups (``  + Exception Group Traceback``) and
        torchelastic's ChildFailedError summary are not handled here.
    C++ stack dump (c10): a line holding ``Exception raised from `` or ending with ``(most recent
        call first):``, then ``frame #N: ...`` lines; the block ends at the last ``frame #`` line.
    IPython traceback (Jupyter, a notebook cell that launched or ran the job): IPython's own format
        (ipython/ipython IPython/core/ultratb.py, VerboseTB/ListTB: a header of the exception's
        class, padded, then ``Traceback (most recent call last)`` without CPython's colon; frames
        as ``Cell In[27], line 1`` / ``File /path.py:866, in f(...)`` / ``----> 866 raise ...``
        context lines, not indented; the same class name starts the final ``Class: message``
        line). The block ends at the first line that starts with the header's class;
        :func:`as_cpython` rewrites it into CPython's shape (header, indented frames, exception
        line), so everything that reads tracebacks reads it as one.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence

__all__ = ["BLOCK_START_REGEXES", "FRAME", "PY_START", "BlockEnd", "as_cpython", "block_end", "ipython_class",
           "is_block_start", "is_python_start"]

PY_START = "Traceback (most recent call last):"
#: One frame line of a Python traceback: (file, line number, function)
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_CPP_RAISED = "Exception raised from "
_CPP_FIRST = "(most recent call first):"
_CHAIN_MESSAGES = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)

#: IPython's traceback header: the exception's class, padding, ``Traceback (most recent call last)``
#: (no colon; ultratb.py), alone on its line
_IPY_START = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)\s+Traceback \(most recent call last\)\s*$")

BLOCK_START_REGEXES: tuple[str, ...] = (
    r"Traceback \(most recent call last\):",
    r"\w\s+Traceback \(most recent call last\)[ \t\r]*$",
    r"Exception raised from ",
    r"\(most recent call first\):[ \t\r]*$",
)
"""Regexes (the subset RE2 and Hyperscan share) that find candidate block-start lines in a raw chunk.

Unanchored at the start, since raw lines carry rank prefixes and timestamps before the text. A
hit is a candidate only: confirm it with ``is_block_start`` on the cleaned line.
"""


def is_block_start(line: str) -> bool:
    """Says whether a cleaned line starts a Python traceback (CPython's or IPython's) or a C++ stack dump."""
    return (PY_START in line or _CPP_RAISED in line or line.rstrip().endswith(_CPP_FIRST)
            or ipython_class(line) is not None)


def ipython_class(line: str) -> str | None:
    """The exception class an IPython traceback header names (``RuntimeError      Traceback (most
    recent call last)``), or None for any other line."""
    found = _IPY_START.match(line.strip())
    return found.group(1) if found else None


def _ipython_final(line: str, cls: str) -> bool:
    """Says whether ``line`` is the final ``Class: message`` (or bare ``Class``) line of an IPython
    traceback whose header named ``cls``."""
    return line.rstrip() == cls or line.startswith(cls + ":")


def as_cpython(texts: list[str]) -> list[str]:
    """An IPython traceback block in CPython's shape: ``Traceback (most recent call last):``, its
    frame lines indented by two spaces, its final exception line as it is. Any other block is
    returned unchanged (the same list).

    Args:
        texts: a block's cleaned lines, as :func:`block_end` delimits them.
    """
    cls = ipython_class(texts[0]) if texts else None
    if cls is None or not _ipython_final(texts[-1], cls):
        return texts
    return [PY_START] + ["  " + t for t in texts[1:-1]] + [texts[-1]]


def is_python_start(line: str) -> bool:
    """Says whether a cleaned line starts a Python traceback (not a C++ stack dump)."""
    return PY_START in line


# Ray's RayTaskError prints the remote task's traceback in its message, its header in place of the
# remote "Traceback (most recent call last):" (ray-project/ray python/ray/exceptions.py,
# RayTaskError.__str__: "<proctitle>() (pid=N, ip=A)" after the class, then the frames and the
# remote exception line)
_REMOTE_TRACEBACK_HEADER = re.compile(r"RayTaskError(\(\w+\))?: ray::\S+ \(pid=\d+")


def _indented(line: str) -> bool:
    """Says whether a line belongs to a traceback's frames (starts with a space or a tab)."""
    return line[:1] in (" ", "\t")


def _is_frame(line: str) -> bool:
    """Says whether a line is a c10 stack frame (``frame #3: ...``)."""
    return line.lstrip().startswith("frame #")


def _python_scan(lines: Sequence[str], start: int) -> Generator[None, None, int]:
    """Scans a Python traceback from ``lines[start]``; returns the index of its last line.

    Yields (None) where the lines run out before the block is known to be complete, and goes on
    from there, with what it has read, when resumed after ``lines`` grew: each line is read once
    however often it is resumed, and resumed with more lines it answers as a scan from ``start``
    over all of them would (every test it passed compared an index with the old length and is
    true with the new one). Returns on the same choices as :func:`block_end`.

    Choices where the lines run out: right after an exception line, the block is complete
    (a chain printed later becomes a block of its own); after an exception line and an empty
    line, or in the middle of a chain's separator, it is not (yield).
    """
    i = start + 1
    while True:
        while True:
            while i < len(lines) and _indented(lines[i]):
                i += 1
            if i < len(lines):
                break
            yield  # still in the frames
        if not lines[i]:
            return i - 1  # a traceback cut off before its exception line
        exc = i
        if lines[exc].rstrip().endswith(":") and not is_block_start(lines[exc]):
            # a message that announces more goes on, indented (grpcio: "... terminated with:" then
            # tab-indented "status = StatusCode.X" lines); where the lines run out inside it, the
            # block is not complete yet, so where a chunk ends changes nothing
            while True:
                while (exc + 1 < len(lines) and lines[exc + 1] and _indented(lines[exc + 1])
                       and not is_block_start(lines[exc + 1])):
                    exc += 1
                if exc + 1 < len(lines):
                    break
                yield
        if _REMOTE_TRACEBACK_HEADER.search(lines[exc]):
            # a wrapper whose message carries the remote traceback: its frames and the remote
            # exception line follow (CPython itself never prints frames right after an exception
            # line), so the traceback goes on, and the exception line after them is its final one
            i = exc + 1
            continue
        if exc + 1 >= len(lines):
            return exc
        if lines[exc + 1].strip():
            return exc
        while exc + 2 >= len(lines):
            yield  # exception line, empty line: a chain may follow
        if lines[exc + 2].strip() not in _CHAIN_MESSAGES:
            return exc
        while exc + 4 >= len(lines):
            yield
        if lines[exc + 3].strip() or PY_START not in lines[exc + 4]:
            return exc
        i = exc + 5


def _cpp_scan(lines: Sequence[str], start: int) -> Generator[None, None, int]:
    """Scans a c10 stack dump from ``lines[start]``; returns the index of its last frame (``start``
    if none). Yields where the lines run out (the next line decides whether more frames follow),
    and goes on from there when resumed, as :func:`_python_scan`."""
    i = start + 1
    while True:
        while i < len(lines) and _is_frame(lines[i]):
            i += 1
        if i < len(lines):
            return i - 1
        yield


def _ipython_scan(lines: Sequence[str], start: int, cls: str) -> Generator[None, None, int]:
    """Scans an IPython traceback from ``lines[start]`` (its header naming ``cls``); returns the
    index of its final exception line. Yields where the lines run out before it."""
    i = start + 1
    while True:
        while i < len(lines) and not _ipython_final(lines[i], cls):
            if is_block_start(lines[i]):
                return i - 1            # another traceback starts: this one was cut off
            i += 1
        if i < len(lines):
            return i
        yield


def _scan(lines: Sequence[str], start: int) -> Generator[None, None, int]:
    """The scan of the block that starts at ``lines[start]`` (a line of its own if none starts there)."""
    line = lines[start]
    if PY_START in line:
        return (yield from _python_scan(lines, start))
    cls = ipython_class(line)
    if cls is not None:
        return (yield from _ipython_scan(lines, start, cls))
    if is_block_start(line):
        return (yield from _cpp_scan(lines, start))
    return start


class BlockEnd:
    """:func:`block_end` for a block whose lines come one at a time, each line read once.

    ``BlockEnd(lines, start)`` keeps ``lines`` (the caller's list); after the caller appends to
    it, :meth:`end` answers ``block_end(lines, start)`` for the lines as they stand, going on from
    where the last call stopped, so a block of n lines costs O(n), not O(n^2) as asking
    ``block_end`` after every line does. Once it has answered an index, the block is closed: it
    keeps that answer, whatever is appended after (a caller stops there, as ``block_end``'s
    answer may change for more lines: a chain printed after an exception line).

    Raises:
        IndexError: ``start`` is not an index into ``lines``.
    """

    __slots__ = ("_end", "_scan")

    def __init__(self, lines: Sequence[str], start: int = 0) -> None:
        if not 0 <= start < len(lines):
            raise IndexError(f"start {start} outside lines[0:{len(lines)}]")
        self._scan = _scan(lines, start)
        self._end: int | None = None

    def end(self) -> int | None:
        """The index of the block's last line, or None while ``lines`` ends before it is known
        (as :func:`block_end`); lines may only be appended between calls."""
        if self._end is None:
            try:
                next(self._scan)
            except StopIteration as stop:
                self._end = stop.value
        return self._end


def block_end(lines: Sequence[str], start: int) -> int | None:
    """Finds the last line of the block that starts at ``lines[start]``.

    Args:
        lines: cleaned lines of one instance, rank prefix removed.
        start: index of a block start (``is_block_start``); any other line is a block of its own.

    Returns:
        The index (``>= start``) of the block's last line, or None when ``lines`` ends before the
        block is known to be complete (wait for more lines, or flush on timeout or exit).

    Raises:
        IndexError: ``start`` is not an index into ``lines``.
    """
    return BlockEnd(lines, start).end()
