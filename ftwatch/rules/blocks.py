"""Multiline blocks in the engine: where one closes in a chunk, and the open ones carried over.

``collect_block`` reads the lines of the block that starts at an offset of a chunk (same rank
only, P1), or says it is still open; ``OpenBlocks`` is the table of open blocks carried to the
next feed of their origin (``Engine.feed`` takes one back, ``flush``/``flush_stale`` close
them), with what ``watch`` stores of them across restarts (issue 17: which changed since the
last batch, and a stored one opened again). Split out of ``ftwatch.rules.engine``, which scans
and dates the lines and uses both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ftwatch.events import Origin
from ftwatch.parsers import fields, multiline
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


def glued_start(text: str) -> tuple[int | None, str]:
    """A Python traceback whose first line was glued behind another writer's unterminated line:
    ``(rank, text from the traceback on)`` when a rank prefix stands right before ``Traceback
    (most recent call last):`` inside ``text``, else ``(None, text)``.

    A progress bar redraws its line with carriage returns and writes no newline until it closes
    (tqdm's docs: it "uses carriage return"), so when a rank's traceback starts while the bar is
    open, the traceback's first line lands on the bar's line (``Epoch 0: 16%|... [rank3]:
    Traceback ...``) and its other lines, each under ``[rank3]:``, would read as another rank's.
    """
    at = text.find(multiline.PY_START, 1)
    if at < 0:
        return None, text
    m = _GLUED_PREFIX.search(text, 0, at)
    if m is None:
        return None, text
    return int(m.group(1)), text[at:]


# a rank prefix that ends right where the traceback starts (fields._RANK_PREFIX's bracketed form),
# glued to the text before it: a bar's last character, not a launcher's label ("host: ", pdsh)
_GLUED_PREFIX = re.compile(r"(?<=\S)\[[A-Za-z_][A-Za-z_-]*?(\d{1,7})\]: ?$")


# vLLM's log header, which its formatter writes before every line of a multi-line message (a
# traceback logged with logger.exception): vllm/logging_utils/formatter.py NewLineFormatter ("Adds
# logging prefix to newlines to align multi-line messages"), vllm/logger.py _FORMAT
# "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s" with _DATE_FORMAT
# "%m-%d %H:%M:%S" (releases before 0.6: "%(filename)s:%(lineno)d] " without the bracket); the
# format and formatter come from SkyPilot's sky/sky_logging.py and OpenRLHF and LightLLM copy them.
# A block that starts under it reads its other lines without it, or the frames' indentation is lost.
_LOGGER_HEADER = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w.-]+:\d+\] ")


def collect_block(data: bytes, start: int, final: bool) -> tuple[list[int], list[str], int | None] | None:
    """The lines of the block starting at ``start``, same rank only: ``(line offsets, texts,
    rank)``; None if still open (``final``, a block of ``MAX_BLOCK_LINES`` lines or one past
    ``MAX_CARRY_BYTES`` closes it where it is). A traceback glued behind a progress bar's line
    takes the rank that stands before it (:func:`glued_start`)."""
    first_rank, first_text = fields.split_rank_prefix(fields.clean(line_at(data, start)))
    if first_rank is None:
        first_rank, first_text = glued_start(first_text)
    line_starts, texts = [start], [first_text]
    # every line behind a `kubectl/docker logs --timestamps` stamp: the frames' indentation
    # comes after it, so the block's other lines are read without it (the first keeps its time)
    stamped = fields.strip_stamp_prefix(first_text) != first_text
    headed = _LOGGER_HEADER.match(fields.strip_stamp_prefix(first_text)) is not None
    pos = data.find(b"\n", start)
    truncated = False
    while pos >= 0 and pos + 1 < len(data):
        s = pos + 1
        pos = data.find(b"\n", s)
        raw = data[s:] if pos < 0 else data[s:pos]
        rank, text = fields.split_rank_prefix(fields.clean(raw))
        if rank != first_rank:
            continue
        if stamped:
            text = fields.strip_stamp_prefix(text)
        if headed:
            text = _LOGGER_HEADER.sub("", text, count=1) if _LOGGER_HEADER.match(text) else text
        line_starts.append(s)
        texts.append(text)
        end = multiline.block_end(texts, 0)
        if end is not None:
            return line_starts[: end + 1], texts[: end + 1], first_rank
        if len(texts) >= MAX_BLOCK_LINES:
            truncated = True
            break
    end = multiline.block_end(texts, 0)
    if end is not None:
        return line_starts[: end + 1], texts[: end + 1], first_rank
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
