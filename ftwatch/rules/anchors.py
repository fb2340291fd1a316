"""Line-start anchors read as the newline before them, for the scan's database.

In multi-line mode Hyperscan finds ``^`` (a line's start) by tracking every position, and does
not use the newline before a line as a literal: ``^\\| +\\d+ +.*\\| +...`` (an nvidia-smi table row)
cost its scan of ``make bench``'s corpus 33 M instructions per 4 MB (cachegrind), as much as
three plain literals, while the same regex led by ``\\n`` instead cost 9 M, as one literal does.
Of the built-in rules' 1,348 expressions 59 hold a ``^``, all rewritten; at 1,000 and at 10,000
rules the scan's database cost 17 M instructions per 4 MB less with them led by the newline
(86 M against 69 M, 98 M against 81 M).

So the matcher scans each chunk with one newline before it (a copy of the chunk: a memcpy,
~0.04 ms a MiB, against ~5 ms a MiB of scan), every line then following a newline, and compiles
its scan's database from each expression as :func:`newline_led` rewrites it: each ``^`` read as
the newline it follows. A match then begins one byte earlier, on that newline, and ends where it
did, so the line its end falls on is the same. (A pattern that can match a newline, ``\\s``, can
also match the one before the chunk: its hits are re-checked on their line with RE2, as every
such pattern's are, ``ftwatch.rules.matcher``.) The rewrite is exact only where every ``^`` is
where a match begins (``^a|^b``, ``(^|: )F``, ``(?:^x)y``); where one may follow something the
match holds (``x^``, ``\\s^``, ``^^``) or is repeated or looked around (``(^a)+``; Hyperscan
refuses most of these itself: "Embedded start anchors not supported"), the expression is left
as written, as it is where Python's parser could read it otherwise than
Hyperscan (``ftwatch.rules.gates.parse``) or inline flags other than ``(?i)`` are set.
"""

from __future__ import annotations

import re

from ftwatch.rules import gates

_C = gates._C
#: group syntax the rewrite takes: plain and caseless groups, ``(?i)``; anything else (inline
#: ``m``, ``s``, ``x`` flags, lookarounds, named groups) leaves the expression as written
_OTHER_GROUP = re.compile(rb"\(\?(?!:|i\)|i:)")


def newline_led(expression: bytes) -> bytes | None:
    """``expression`` with each line-start anchor ``^`` written ``\\n``, for a scan of a buffer in
    which a newline comes before every line (module doc); None when it holds no ``^`` or the
    rewrite could change what it finds.

    Args:
        expression: a Hyperscan expression (``ftwatch.rules.patterns``' translation of a rule's
            pattern), compiled with ``HS_FLAG_MULTILINE``.

    Returns:
        The rewritten expression's bytes, or None.
    """
    if b"^" not in expression or _OTHER_GROUP.search(expression):
        return None
    tree = gates.parse(expression)
    if tree is None:
        return None
    walked = _walk(list(tree), True)
    if walked is None or walked[0] == 0:
        return None
    where = _anchors(expression)
    # the offsets are the tree's anchors: written as two newlines (two, so that Python's parser
    # makes no class of a branch of one newline and others of one byte), the text reads as the
    # tree with two newlines for each anchor
    again = gates.parse(_written(expression, where, b"\\n\\n"))
    if again is None or _shape(again, False) != _shape(tree, True):
        return None
    return _written(expression, where, b"\\n")


def _written(expression: bytes, where: list[int], anchor: bytes) -> bytes:
    """``expression`` with ``anchor`` for the byte at each offset of ``where``."""
    out, last = [], 0
    for at in where:
        out += [expression[last:at], anchor]
        last = at + 1
    out.append(expression[last:])
    return b"".join(out)


def _walk(items: list, start: bool) -> tuple[int, bool] | None:
    """Walks a sequence of parse-tree nodes from a point where no byte of the match was taken
    (``start``) or some may have been: (the ``^`` met, whether still none was taken), or None
    when a ``^`` is where a byte may have been taken, or repeated, or inside a lookaround."""
    count = 0
    for op, value in items:
        if op is _C.AT and value is _C.AT_BEGINNING:
            if not start:
                return None
            count, start = count + 1, False    # the newline it becomes is taken
        elif op is _C.SUBPATTERN:
            walked = _walk(list(value[-1]), start)
            if walked is None:
                return None
            count, start = count + walked[0], walked[1]
        elif op is _C.BRANCH:
            branches = [_walk(list(branch), start) for branch in value[1]]
            if None in branches:
                return None
            count += sum(b[0] for b in branches)   # type: ignore[index]
            start = False
        elif op in _NESTED:
            if _holds_anchor([(op, value)]):
                return None
            start = False
        else:                                  # a byte, a class, another zero-width assertion
            start = False
    return count, start


def _holds_anchor(items) -> bool:
    """Whether parse-tree nodes hold a ``^`` anywhere, at any depth."""
    for op, value in items:
        if op is _C.AT:
            if value is _C.AT_BEGINNING:
                return True
            continue
        for part in value if isinstance(value, (tuple, list)) else (value,):
            subs = part if isinstance(part, list) else (part,)
            if any(isinstance(sub, gates._P.SubPattern) and _holds_anchor(sub) for sub in subs):
                return True
    return False


def _shape(items, newline: bool):
    """Parse-tree nodes as nested tuples, each ``^`` as two newline literals when ``newline``."""
    out = []
    for item in items:
        if newline and item == (_C.AT, _C.AT_BEGINNING):
            out += [(_C.LITERAL, 0x0A)] * 2
        else:
            out.append(_plain(item, newline))
    return tuple(out)


def _plain(value, newline: bool):
    if isinstance(value, gates._P.SubPattern):
        return _shape(value, newline)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v, newline) for v in value)
    return value


_NESTED = tuple(op for op in (*gates._REPEATS, getattr(_C, "ASSERT", None), getattr(_C, "ASSERT_NOT", None),
                              getattr(_C, "ATOMIC_GROUP", None)) if op is not None)


def _anchors(expression: bytes) -> list[int]:
    """Offsets of the ``^`` in ``expression`` that are anchors: not escaped, not in a class."""
    out, i, n = [], 0, len(expression)
    while i < n:
        c = expression[i]
        if c == 0x5C:                          # \x: an escape, the next byte is not syntax
            i += 2
            continue
        if c == 0x5B:                          # [ ... ]: a class; a ] first in it is a member
            j = i + 1
            if j < n and expression[j] == 0x5E:
                j += 1
            if j < n and expression[j] == 0x5D:
                j += 1
            while j < n and expression[j] != 0x5D:
                j += 2 if expression[j] == 0x5C else 1
            i = j + 1
            continue
        if c == 0x5E:
            out.append(i)
        i += 1
    return out
