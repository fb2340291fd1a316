"""Multiline blocks in the engine: where one closes in a chunk, and the open ones carried over.

``collect_block`` reads the lines of the block that starts at an offset of a chunk (same rank
only, P1), or says it is still open; ``OpenBlocks`` is the table of open blocks carried to the
next feed of their origin (``Engine.feed`` takes one back, ``flush``/``flush_stale`` close
them), with what ``watch`` stores of them across restarts (issue 17: which changed since the
last batch, and a stored one opened again). Split out of ``ftwatch.rules.engine``, which scans
and dates the lines and uses both.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from dataclasses import dataclass

from ftwatch.events import Origin
from ftwatch.parsers import chunks, fields, multiline
from ftwatch.rules.judge import line_at

MAX_BLOCK_LINES = 400          # a block longer than this is closed where it is
MAX_CARRY_BYTES = 1 << 20      # never carry more than 1 MiB into the next feed


@dataclass(slots=True)
class OpenBlock:
    """An open block carried to the next feed of its origin.

    Attributes:
        data: the bytes from the block's first line on (ANSI removed, newline-terminated).
        since: the time of the last feed that carried it (``flush_stale`` measures from it).
        base: the time of ``data``'s first line, for its lines without a timestamp.
        skip: offsets in ``data`` of lines that closed blocks already took.
    """

    data: bytes
    since: float
    base: float
    skip: frozenset[int] = frozenset()


def starts_block(data: bytes, start: int) -> bool:
    """Whether the line at offset ``start`` of ``data`` starts a block (its rank prefix aside)."""
    return multiline.is_block_start(fields.split_rank_prefix(fields.clean(line_at(data, start)))[1])


def _traceback_lead(text: str) -> str:
    """What a Python traceback's first line carries before ``Traceback (most recent call last):``
    ('' for any other block): a prefix its writer repeats, the same, on every line of the record,
    so the block's other lines are read without it (their frames are indented only after it).

    Writers that do so: a logging formatter that aligns a multi-line message, as vLLM's
    ``NewLineFormatter`` (vllm-project/vllm vllm/logging_utils/formatter.py: ``msg.replace("\\n",
    "\\r\\n" + parts[0])``, every line behind ``ERROR 06-03 09:46:31 worker_base.py:464] ``); pdsh,
    which labels each line of a host's output with ``host: `` (pdsh(1): "output ... is prefixed
    by the hostname"). A line without that exact prefix keeps its text (another writer's line).
    A C++ stack dump's prefix is its message (``RuntimeError: ... Exception raised from``): none.
    """
    at = text.find(multiline.PY_START)
    return text[:at] if at > 0 and multiline.is_python_start(text) else ""


def _glued_rank(lead: str) -> int | None:
    """The rank of a bracketed rank prefix (``[rank3]: ``, ``[default3]:``) that ends a traceback's
    ``lead``, or None: another writer's unfinished line in front of it. A progress bar (tqdm) redraws
    its line with ``\\r`` and writes no newline until it closes, so the first line a crashing rank
    prints lands on the bar's line (``Epoch 0:  16%|...| 7212/44871 [...][rank3]: Traceback ...``)
    while the traceback's other lines start with the rank's own prefix."""
    at = lead.rfind("[")
    while at >= 0:
        rank, rest = fields.split_rank_prefix(lead[at:])
        if rank is not None and not rest.strip():
            # glued: right behind the other writer's last character, not a launcher's label
            # ("ws-gpu-2: [rank13]: ", pdsh), whose lines all carry it (a repeated lead)
            return rank if at > 0 and not lead[at - 1].isspace() else None
        at = lead.rfind("[", 0, at)
    return None


_FRAME_LINE = rb"[ \t][^\n\x1b]*\n"     # escapes: the line is read one at a time (``fields.clean``)
_DIGIT_RUN = re.compile(rb"(\d+)")


@functools.lru_cache(maxsize=256)
def _run_of(shape: bytes) -> "re.Pattern[bytes]":
    """The frame-run pattern of the prefixes of one ``shape`` (a prefix escaped, its digit runs
    ``\\d+``): the first line's prefix as group 1, each further line's the same text."""
    return re.compile(b"(" + shape + b")" + _FRAME_LINE + b"(?:\\1" + _FRAME_LINE + b")*")


@functools.lru_cache(maxsize=1024)
def _run_for(prefix: bytes) -> "re.Pattern[bytes]":
    """:func:`_run_of` the shape of ``prefix`` (a block's first line's prefix), the shape made once
    per prefix: escaping it cost ~6 us a block (a bench replay's ~850 blocks share a few dozen)."""
    parts = _DIGIT_RUN.split(prefix)
    return _run_of(b"".join(rb"\d+" if i % 2 else re.escape(part) for i, part in enumerate(parts)))


def _frame_run(data: bytes, start: int, first_text: str) -> "tuple[re.Pattern[bytes], bytes] | None":
    """A pattern (and the prefix) for a run of whole lines, each the block's first line's prefix
    (the rank prefixes before its text; none for a bare line) then a space or a tab: lines
    ``collect_block`` would read one at a time as the block's own and indented (frames, code lines,
    an indented message), with the same rank, the prefix removed (each prefix ends with a space, so
    the prefix rule reads exactly it and stops at the indentation: no prefix starts with one).
    ``BlockEnd`` answers the same for them taken together as one at a time: an indented line
    never ends a scan that waits, and where one ends it, the index does not depend on the lines
    after. None when the prefix ends without a space (``[rank3]:`` glued to its text: the next
    line's optional space would go with the prefix) or holds escapes the raw line had.

    A match is the block's run only where its group 1 is the prefix (another rank's lines of the
    same shape match too). The pattern is one per shape of prefix, not per prefix: compiled per
    rank's prefix (``[rank3]: ``), each of thousands of ranks' tracebacks compiled its own (~130 us,
    past ``re``'s cache of 512), a tenth of a 4,096-rank replay where each rank printed one.

    Issue 16: a block's lines cost ~2 us each read one at a time; ~10,000 in a bench replay.
    """
    raw = line_at(data, start)
    cleaned = fields.clean(raw)
    prefix = cleaned[:len(cleaned) - len(first_text)]
    if (prefix and not prefix.endswith(" ")) or not prefix.isascii():
        return None
    head = prefix.encode()
    return (_run_for(head), head) if raw.startswith(head) else None


class RankLines:
    """One chunk's lines by rank, for the blocks read in it (:func:`collect_block`): built only once
    the blocks' reads have passed over as many other ranks' lines as the chunk holds, then each
    block reads its own rank's lines alone.

    In a combined log each rank that fails prints its traceback and stops; a block whose rank
    prints nothing after it is read to the chunk's end, over every other rank's lines (each one
    cleaned and its prefix read), so a chunk's blocks cost O(ranks x lines): 256 ranks' tracebacks
    in one chunk, ~2 s. Past that point one pass reads every line's rank and text, and every block
    after it costs its own lines (issue 16: at most about twice the one pass, whatever the ranks).

    Args:
        data: the chunk (complete lines).
    """

    def __init__(self, data: bytes):
        self.data = data
        self.passed = 0                         # other ranks' lines the blocks' reads passed over
        self.budget = -1                        # the chunk's lines (counted when first passed over)
        self.starts: dict[int | None, list[int]] | None = None   # rank -> its lines' starts, in order
        self.texts: dict[int, str] = {}         # line start -> its text, prefix removed

    def passed_over(self) -> bool:
        """One more line of another rank passed over; True once the index is built (read it then)."""
        if self.starts is not None:
            return True
        self.passed += 1
        if self.budget < 0:
            self.budget = max(64, chunks.newlines(self.data))
        if self.passed < self.budget:
            return False
        starts: dict[int | None, list[int]] = {}
        data, texts, pos = self.data, self.texts, 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            end = len(data) if end < 0 else end
            rank, texts[pos] = fields.split_rank_prefix(fields.clean(data[pos:end]))
            starts.setdefault(rank, []).append(pos)
            pos = end + 1
        self.starts = starts
        return True

    def after(self, rank: int | None, pos: int) -> list[int]:
        """The starts of ``rank``'s lines after offset ``pos`` (once built)."""
        own = self.starts.get(rank, []) if self.starts is not None else []
        return own[bisect.bisect_right(own, pos):]


def collect_block(data: bytes, start: int, final: bool,
                  index: RankLines | None = None) -> tuple[list[int], list[str], int | None] | None:
    """The lines of the block starting at ``start``, same rank only: ``(line offsets, texts,
    rank)``; None if still open (``final``, a block of ``MAX_BLOCK_LINES`` lines or one past
    ``MAX_CARRY_BYTES`` closes it where it is). ``index``: the chunk's :class:`RankLines`, shared
    by its blocks (None: every other rank's line is read where it is passed over)."""
    first_rank, first_text = fields.split_rank_prefix(fields.clean(line_at(data, start)))
    line_starts, texts = [start], [first_text]
    # every line behind a `kubectl/docker logs --timestamps` stamp: the frames' indentation
    # comes after it, so the block's other lines are read without it (the first keeps its time)
    stamped = fields.strip_stamp_prefix(first_text) != first_text
    lead = _traceback_lead(fields.strip_stamp_prefix(first_text) if stamped else first_text)
    # its indented lines behind its own prefix, read together (not with a lead or a stamp to remove)
    frames = _frame_run(data, start, first_text) if not stamped and not lead else None
    # a rank prefix glued to the end of the lead: the traceback is that rank's, from its first
    # line on (the bar before it is another writer's), and only that rank's lines go on with it
    glued = _glued_rank(lead) if first_rank is None and lead else None
    if glued is not None:
        first_rank, lead = glued, ""
        texts[0] = first_text[first_text.find(multiline.PY_START):]
    ends = multiline.BlockEnd(texts)   # reads each line once as texts grows: O(n) in the block's lines
    pos = data.find(b"\n", start)
    truncated = False
    own = None      # once the chunk's index is built (``index``): this rank's next lines, the others passed by
    while pos >= 0 and pos + 1 < len(data):
        s = pos + 1
        run = frames[0].match(data, s) if frames is not None and own is None else None
        if run is not None and run.group(1) == frames[1]:
            # indented lines behind the first line's own prefix: taken together (see _frame_run)
            lines = data[s:run.end() - 1].split(b"\n")[:MAX_BLOCK_LINES - len(texts)]
            cut = len(frames[1])
            line_starts.extend(itertools.accumulate([len(line) + 1 for line in lines[:-1]], initial=s))
            texts.extend(text[cut:].rstrip("\r") for text in
                         b"\n".join(lines).decode("utf-8", errors="replace").split("\n"))
            pos = line_starts[-1] + len(lines[-1])
        else:
            if own is not None:
                s = next(own, -1)
                if s < 0:
                    break
                text = index.texts[s]
                pos = data.find(b"\n", s)
            else:
                pos = data.find(b"\n", s)
                raw = data[s:] if pos < 0 else data[s:pos]
                rank, text = fields.split_rank_prefix(fields.clean(raw))
                if rank != first_rank:
                    if index is not None and index.passed_over():
                        own = iter(index.after(first_rank, s))
                    continue
            if stamped:
                text = fields.strip_stamp_prefix(text)
            if lead and text.startswith(lead):
                text = text[len(lead):]
            line_starts.append(s)
            texts.append(text)
        end = ends.end()
        if end is not None:
            return line_starts[: end + 1], multiline.as_cpython(texts[: end + 1]), first_rank
        if len(texts) >= MAX_BLOCK_LINES:
            truncated = True
            break
    end = ends.end()
    if end is not None:
        return line_starts[: end + 1], multiline.as_cpython(texts[: end + 1]), first_rank
    if final or truncated or len(data) - start > MAX_CARRY_BYTES:
        return line_starts, texts, first_rank
    return None


class OpenBlocks:
    """The open blocks carried over, one per origin, and (after :meth:`track`) which changed."""

    def __init__(self) -> None:
        self._open: dict[Origin, OpenBlock] = {}
        self._changed: set[Origin] | None = None    # origins whose open block changed (track)

    def __contains__(self, origin: Origin) -> bool:
        return origin in self._open

    def __bool__(self) -> bool:
        return bool(self._open)

    def take(self, origin: Origin) -> OpenBlock | None:
        """Remove and return ``origin``'s open block (the next feed reads it again), if any."""
        block = self._open.pop(origin, None)
        if block is not None and self._changed is not None:
            self._changed.add(origin)
        return block

    def carry(self, origin: Origin, data: bytes, start: int, now: float, base: float,
              consumed: set[int]) -> None:
        """Keep ``data[start:]`` (an open block and what follows it) for the next feed."""
        rest = data[start:]
        if not rest.endswith(b"\n"):
            rest += b"\n"                          # the next feed starts a new line
        skip = frozenset(s - start for s in consumed if s > start)
        self._open[origin] = OpenBlock(rest, now, base, skip)
        if self._changed is not None:
            self._changed.add(origin)

    def origins(self) -> list[Origin]:
        """Origins with an open block carried over."""
        return list(self._open)

    def stale(self, now: float, timeout: float, job: str | None = None) -> list[Origin]:
        """The origins whose blocks were last carried ``timeout`` seconds or more before ``now``;
        only those of ``job`` when given."""
        return [o for o, p in self._open.items() if now - p.since >= timeout and (job is None or o.job == job)]

    def over(self, max_blocks: int, max_bytes: int) -> list[Origin]:
        """The origins past the caps, the least recently carried first (``Engine.pending_over``)."""
        total = sum(len(p.data) for p in self._open.values())
        if len(self._open) <= max_blocks and total <= max_bytes:
            return []
        out, count = [], len(self._open)
        for origin, p in sorted(self._open.items(), key=lambda item: item[1].since):
            if count <= max_blocks and total <= max_bytes:
                break
            out.append(origin)
            count, total = count - 1, total - len(p.data)
        return out

    def track(self) -> None:
        """From now on note which origins' open blocks change, for :meth:`changed`."""
        if self._changed is None:
            self._changed = set()

    def changed(self) -> list[tuple[Origin, bytes | None, float, frozenset[int]]]:
        """The open blocks that changed since the last call (after :meth:`track`): per origin
        ``(origin, data, base, skip)``, ``data`` None when the origin has none open any more."""
        if not self._changed:
            return []
        changed, self._changed = self._changed, set()
        out = []
        for origin in changed:
            p = self._open.get(origin)
            out.append((origin, None, 0.0, frozenset()) if p is None else (origin, p.data, p.base, p.skip))
        return out

    def restore(self, origin: Origin, data: bytes, base: float, skip: frozenset[int], now: float) -> None:
        """Open ``origin``'s block again as a stored batch left it; it goes stale from ``now``."""
        self._open[origin] = OpenBlock(data, now, base, frozenset(skip))
