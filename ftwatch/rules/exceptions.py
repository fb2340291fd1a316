"""Python's exception hierarchy as a catalog: a traceback's final exception class, graded.

The data is ``packs/python_exceptions.tsv`` (tab-separated, one header row, no quoting; every row
names its source): one row per exception class (the built-in hierarchy of
https://docs.python.org/3/library/exceptions.html#exception-hierarchy, and the few torch classes
whose name alone says what failed) and one per errno that an ``OSError`` message carries
(``[Errno 104] Connection reset by peer``). Columns:

    kind      ``class`` or ``errno``
    name      the class (qualified where it is not a built-in: ``torch.OutOfMemoryError``) or
              the errno symbol (``ECONNRESET``)
    parent    the base class (``class`` rows) or the errno number (``errno`` rows)
    class     the failure class; action: the recommended action
    decides   ``class``: the class itself decides; ``message``: a generic class (``RuntimeError``,
              ``OSError``, ``Exception``) whose message decides: the rules that hit the message
              (a CUDA, NCCL or HCCL error) win, and the row's grade is only the fallback
    source, meaning

How a traceback is read (``grade``): Python prints the exception line ``<qualified class>: <message>``
(or the bare class) after the frames, and the block ends there (``ftwatch.parsers.multiline``); the
last exception line of a block is the one that ended the program (a chain prints the causes first).
Its class is looked up by its full name, then by its last component; an ``OSError``-family message
with ``[Errno N]`` is graded by the errno row instead when there is one. So is a generic class
whose message decides (``RuntimeError``) or a class the catalog does not know, when its message
carries an ``[Errno N]`` of a row: the ``str()`` of an ``OSError`` wrapped in another exception
(``urllib.error.URLError: <urlopen error [Errno 111] Connection refused>``,
https://docs.python.org/3/library/urllib.error.html: ``reason`` is the wrapped exception); the
errno is what failed, the wrapper's class says only who called. A generic or unknown class whose
message is, or ends in, the C library's text for one of the errnos (``RuntimeError: Connection
reset by peer``: C++ code threw ``std::system_error(errno, std::system_category())``, whose
``what()`` is ``strerror(errno)``, and pybind11 turns it into a ``RuntimeError``, as c10d's
TCPStore did) is graded by that errno's row too (``_strerror_grade``). A class that decides by
itself (``ValueError``, ``KeyError``) keeps its grade whatever its message says.

A ``site`` row (``name`` = ``<file path suffix>:<function>``, ``parent`` = the class raised there)
grades a generic class by where it was raised (``grade_block``): older libraries raised a plain
``Exception`` where later versions raise a class of their own (torch.multiprocessing.spawn's join
before PyTorch 1.8: the parent's report of a failed child, today's ``ProcessRaisedException``), so
the last frame of the traceback says which exception it is.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import os
import re
from dataclasses import dataclass
from typing import Sequence

from ftwatch.events import Action, FailureClass
from ftwatch.parsers.multiline import FRAME

__all__ = ["ExceptionGrade", "ExceptionCatalog", "exception_line"]

_PACKAGE = "ftwatch.rules"
_FILE = "python_exceptions.tsv"
_COLUMNS = ["kind", "name", "parent", "class", "action", "decides", "source", "meaning"]
# ``pkg.mod.Class: message`` or a bare ``Class``; a class name starts with a capital letter
# (built-ins and torch's all do), which keeps log lines such as ``note: ...`` out.
_EXC_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::(?: (.*))?)?\s*$")
_ERRNO = re.compile(r"\[Errno (\d+)\]")


@dataclass(frozen=True)
class ExceptionGrade:
    """One catalog row as the engine uses it.

    Attributes:
        name: the class (or errno symbol) that matched.
        failure_class, action: the grade.
        decides_by_class: True when the class itself decides (``decides`` = ``class``).
        source: where the grade comes from.
    """

    name: str
    failure_class: FailureClass
    action: Action
    decides_by_class: bool
    source: str


def exception_line(lines: Sequence[str]) -> int | None:
    """The index of a Python traceback block's final exception line, or None.

    Args:
        lines: a block's cleaned lines (rank prefix removed), its first holding
            ``Traceback (most recent call last):``.

    Returns:
        The index of the first non-indented line after the frames (the lines after it, if any,
        continue its message: torch_npu appends the CANN error message), or None when there is
        no such line. The engine makes each exception of a chain a block of its own.
    """
    index = 1
    while index < len(lines) and lines[index][:1] in (" ", "\t"):
        index += 1
    if index >= len(lines) or not _EXC_LINE.match(lines[index].strip()):
        return None
    return index


class ExceptionCatalog:
    """The exception classes and errnos of ``python_exceptions.tsv``, by name and number."""

    def __init__(self, rows: Sequence[dict[str, str]]):
        self._classes: dict[str, ExceptionGrade] = {}
        self._short: dict[str, ExceptionGrade] = {}
        self._errno: dict[int, ExceptionGrade] = {}
        self._sites: dict[tuple[str, str], tuple[str, ExceptionGrade]] = {}   # (file, function) -> (class, grade)
        self._oserrors: set[str] = set()
        self._by_strerror: dict[str, tuple[int, ExceptionGrade]] | None = None   # ``_strerror_grade``'s index
        parents: dict[str, str] = {}
        for row in rows:
            grade = ExceptionGrade(row["name"], FailureClass(row["class"]), Action[row["action"].upper()],
                                   row["decides"] == "class", row["source"])
            if row["kind"] == "errno":
                self._errno[int(row["parent"])] = grade
                continue
            if row["kind"] == "site":
                path, _, function = row["name"].rpartition(":")      # named as a dotted id: the
                name = f"{path.removesuffix('.py').replace('/', '.')}.{function}.{row['parent']}"  # module, function, class
                self._sites[(path, function)] = (row["parent"], dataclasses.replace(grade, name=name))
                continue
            self._classes[row["name"]] = grade
            self._short.setdefault(row["name"].rsplit(".", 1)[-1], grade)
            parents[row["name"]] = row["parent"]
        for name in parents:
            up = name
            while up:
                if up == "OSError":
                    self._oserrors.add(name.rsplit(".", 1)[-1])
                    break
                up = parents.get(up, "")

    @classmethod
    @functools.lru_cache(maxsize=1)
    def load(cls) -> "ExceptionCatalog":
        """The built-in catalog (read once).

        Raises:
            ValueError: the file's header or a row is malformed.
        """
        text = importlib.resources.files(_PACKAGE).joinpath("packs").joinpath(_FILE).read_text(encoding="utf-8")
        lines = [ln for ln in text.split("\n") if ln.strip()]
        if lines[0].split("\t") != _COLUMNS:
            raise ValueError(f"{_FILE}:1: unexpected header")
        rows = []
        for number, line in enumerate(lines[1:], start=2):
            cols = line.split("\t")
            if len(cols) != len(_COLUMNS):
                raise ValueError(f"{_FILE}:{number}: expected {len(_COLUMNS)} columns, found {len(cols)}")
            rows.append(dict(zip(_COLUMNS, cols)))
        return cls(rows)

    def lookup(self, name: str) -> ExceptionGrade | None:
        """The row of a class by its printed name (qualified or not), or None."""
        return self._classes.get(name) or self._short.get(name.rsplit(".", 1)[-1])

    def grade(self, line: str) -> ExceptionGrade | None:
        """Grades one exception line (``ConnectionResetError: [Errno 104] ...``); None if unknown."""
        m = _EXC_LINE.match(line.strip())
        if m is None:
            return None
        name, message = m.group(1), m.group(2) or ""
        grade = self.lookup(name)
        errno = _ERRNO.search(message)
        if grade is None or not grade.decides_by_class:     # unknown or generic: the wrapped errno decides
            return (self._errno.get(int(errno.group(1))) if errno else None) or self._strerror_grade(message) or grade
        if errno and name.rsplit(".", 1)[-1] in self._oserrors:
            return self._errno.get(int(errno.group(1)), grade)
        return grade

    def grade_block(self, lines: Sequence[str], final: int) -> ExceptionGrade | None:
        """Grades a traceback's final exception line ``lines[final]``, by its raise site first.

        Args:
            lines: the traceback block's lines; final: the index of its exception line.

        Returns:
            The ``site`` row's grade when the last frame before ``final`` is a listed raise site and
            the line's class is the one raised there; else :meth:`grade` of the line.
        """
        if self._sites:
            frame = next(filter(None, map(FRAME.match, reversed(lines[:final]))), None)
            m = _EXC_LINE.match(lines[final].strip())
            if frame is not None and m is not None:
                path = frame.group(1).replace("\\", "/")
                for (suffix, function), (raised, grade) in self._sites.items():
                    if frame.group(3) == function and path.endswith(suffix) and m.group(1) == raised:
                        return grade
        return self.grade(lines[final])

    def _strerror_grade(self, message: str) -> ExceptionGrade | None:
        """The errno row whose ``strerror`` text is the whole message, or its last clause, or None.

        ``os.strerror`` is the C library's text (glibc on the Linux nodes whose logs ftwatch reads:
        104 -> ``Connection reset by peer``). The whole message, or the clause after the message's
        last ``": "`` or ``"] "`` when the text ends it: C++ code that reports a failed system call
        puts ``strerror(errno)`` last (c10d's ``... store->get('0') got error: Connection reset by
        peer``, ``[enforce fail at TCPStore.cpp:223] Connection reset by peer``), so the errno is
        what failed. A message that merely mentions the text (``... failed: Connection reset by
        peer, retrying``) keeps its class.
        """
        text = message.strip().rstrip(".")
        if not text:
            return None
        tail = max(text.rfind(": "), text.rfind("] "))
        last = text[tail + 2:] if tail >= 0 else None
        by_text = self._by_strerror
        if by_text is None:                      # the first errno (in table order) per text
            by_text = self._by_strerror = {}
            for rank, (number, grade) in enumerate(self._errno.items()):
                by_text.setdefault(os.strerror(number), (rank, grade))
        found = [hit for hit in (by_text.get(text), by_text.get(last) if last is not None else None) if hit]
        return min(found, key=lambda hit: hit[0])[1] if found else None
