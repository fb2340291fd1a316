"""Where ``collect_block`` closes a block read line by line, and what it costs (issue 16)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftwatch.parsers import multiline
from ftwatch.rules.blocks import MAX_BLOCK_LINES, collect_block
from tests.parsers.test_multiline import BLOCKS, WATCHDOG

# the prefixes the engine reads a block's lines behind: ranks (interleaved ranks never mix), a
# launcher's label, a logger's repeated lead, a `--timestamps` stamp, a bar a rank's line is glued to
PREFIXES = ["", "[rank0]:", "[rank1]: ", "[default0]:[rank0]: ", "ws-gpu-2: [rank0]: ",
            "ERROR 06-03 09:46:31 worker_base.py:464] ", "2026-11-21T09:36:03.123456789Z ",
            "Epoch 0:  16%|##| 7212/44871 [rank0]: "]


class _FromTheStart:
    """``BlockEnd`` as collect_block asked before issue 16: ``block_end`` over all lines, every time
    (a fresh scan from the block's first line)."""

    scan = multiline.BlockEnd

    def __init__(self, lines, start=0):
        self._lines, self._start = lines, start

    def end(self):
        return self.scan(self._lines, self._start).end()


@given(st.sampled_from(["Traceback (most recent call last):", WATCHDOG[2]]), BLOCKS,
       st.lists(st.sampled_from(PREFIXES), min_size=1, max_size=3), st.data(), st.booleans())
def test_collect_block_closes_where_block_end_over_all_lines_would(first, rest, prefixes, data, final):
    lines = [first, *rest]
    chunk = b"".join((data.draw(st.sampled_from(prefixes)) + line).encode() + b"\n" for line in lines)
    starts = [0] + [i + 1 for i, byte in enumerate(chunk[:-1]) if byte == ord("\n")]
    got = [collect_block(chunk, start, final) for start in starts]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multiline, "BlockEnd", _FromTheStart)
        assert got == [collect_block(chunk, start, final) for start in starts]


def test_a_long_tracebacks_cost_grows_linearly(monkeypatch):
    calls = [0]
    indented = multiline._indented

    def counted(line):
        calls[0] += 1
        return indented(line)

    monkeypatch.setattr(multiline, "_indented", counted)
    cost = {}
    for n in (50, MAX_BLOCK_LINES - 2):                # frames, under the cap where a block closes anyway
        frames = [f'  File "x.py", line {i}, in f' if i % 2 else "    f()" for i in range(n)]
        chunk = "\n".join(f"[rank3]: {line}" for line in
                          ["Traceback (most recent call last):", *frames, "RecursionError: too deep"]).encode()
        calls[0] = 0
        lines, texts, rank = collect_block(chunk + b"\n[rank3]: next\n", 0, final=False)
        assert (len(lines), texts[-1], rank) == (n + 2, "RecursionError: too deep", 3)
        cost[n] = calls[0]
    assert cost[50] <= 50 + 2
    assert cost[MAX_BLOCK_LINES - 2] <= MAX_BLOCK_LINES     # was ~n^2/2: 79,000 for 398 frames


def test_an_ipython_traceback_is_collected_and_handed_on_in_cpythons_shape():
    from tests.parsers.test_multiline import IPYTHON
    data = ("\n".join(IPYTHON) + "\n").encode()
    _, texts, _ = collect_block(data, 0, final=True)
    assert texts[0] == multiline.PY_START and texts[-1] == "RuntimeError: Training failed with:"


@given(st.lists(st.tuples(st.sampled_from(["[rank0]: ", "[rank1]:", "[default1]:[rank1]: ", "[rank2]: ", "",
                                           "2: "]),
                          st.sampled_from(["Traceback (most recent call last):", '  File "x.py", line 3, in f',
                                           "    f()", "KeyError: 'lr'", "step 3 loss 2.0", "During handling of "
                                           "the above exception, another exception occurred:", WATCHDOG[2]])),
                min_size=1, max_size=40),
       st.booleans(), st.integers(min_value=1, max_value=8))
def test_a_chunks_blocks_read_over_its_rank_index_as_line_by_line(lines, final, budget):
    """``RankLines`` (a chunk's lines by rank, built once the blocks passed over enough other ranks'
    lines) gives every block the lines, texts and end that reading each line where it is gives."""
    from ftwatch.rules.blocks import RankLines
    chunk = b"".join((prefix + text).encode() + b"\n" for prefix, text in lines)
    starts = [0] + [i + 1 for i, byte in enumerate(chunk[:-1]) if byte == ord("\n")]
    index = RankLines(chunk)
    index.budget = budget                             # built after this many lines passed over
    assert [collect_block(chunk, s, final, index) for s in starts] == [collect_block(chunk, s, final) for s in starts]


def test_a_chunk_of_many_ranks_tracebacks_costs_its_lines_not_ranks_times_lines(monkeypatch):
    """256 ranks each print a traceback that nothing of theirs follows (they died): each block used
    to read every later line of every other rank; with the chunk's rank index the lines are read
    about twice in all."""
    from ftwatch.parsers import fields
    from ftwatch.rules.blocks import RankLines
    body = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', "    dist.barrier()",
            "torch.distributed.DistBackendError: store->get('0') got error: Socket Timeout",
            "Exception raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:604 (most recent call first):"]
    chunk = "".join(f"[rank{r}]: {line}\n" for r in range(256) for line in body).encode()
    starts, pos = [], 0
    for line in chunk.split(b"\n")[:-1]:
        if line.partition(b"]: ")[2].startswith(b"Traceback"):
            starts.append(pos)
        pos += len(line) + 1
    assert len(starts) == 256
    calls = [0]
    clean = fields.clean
    monkeypatch.setattr(fields, "clean", lambda raw: (calls.__setitem__(0, calls[0] + 1), clean(raw))[1])
    index = RankLines(chunk)
    blocks = [collect_block(chunk, s, True, index) for s in starts]
    assert calls[0] <= 4 * 256 * len(body)             # was ~256 x 1,280 / 2 (every later line, per block)
    assert [b[2] for b in blocks] == list(range(256))
    assert blocks[::51] == [collect_block(chunk, s, True) for s in starts[::51]]


def test_thousands_of_ranks_tracebacks_share_one_frame_pattern_and_keep_their_own_lines(monkeypatch):
    """Each rank's traceback, its frames interleaved with the next rank's (same shape of prefix,
    another number): one pattern for the runs of every rank's frames (one per rank was compiled
    anew past ``re``'s cache of 512), and each block still takes only its own rank's lines."""
    import re

    from ftwatch.rules import blocks as module
    module._run_of.cache_clear()
    compiled = []
    real = re.compile
    monkeypatch.setattr(re, "compile", lambda *a, **k: compiled.append(a[0]) or real(*a, **k))
    frames = ['  File "train.py", line 9, in <module>', "    dist.barrier()"]
    lines = []
    for r in range(0, 1200, 2):                       # ranks r and r + 1 print their frames by turns
        lines += [f"[rank{r}]: Traceback (most recent call last):", f"[rank{r + 1}]: Traceback (most recent call last):"]
        for frame in frames:
            lines += [f"[rank{r}]: {frame}", f"[rank{r}]: {frame}", f"[rank{r + 1}]: {frame}"]
        lines += [f"[rank{r}]: RuntimeError: rank {r} failed", f"[rank{r + 1}]: RuntimeError: rank {r + 1} failed"]
    chunk = "".join(line + "\n" for line in lines).encode()
    starts, pos = [], 0
    for line in chunk.split(b"\n")[:-1]:
        if line.endswith(b"Traceback (most recent call last):"):
            starts.append(pos)
        pos += len(line) + 1
    index = module.RankLines(chunk)
    found = [collect_block(chunk, s, True, index) for s in starts]
    assert [b[2] for b in found] == list(range(1200))
    assert all(b[1][1:] == [*frames[:1], *frames[:1], *frames[1:], *frames[1:], f"RuntimeError: rank {r} failed"]
               if r % 2 == 0 else b[1][1:] == [*frames[:1], *frames[1:], f"RuntimeError: rank {r} failed"]
               for r, b in enumerate(found))
    assert len([p for p in compiled if b"[ \\t][^\\n\\x1b]*\\n" in p]) == 1     # one frame-run pattern
