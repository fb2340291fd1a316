"""Engine properties (P1, Q1): interleaving ranks, cutting chunks or changing the matcher backend
changes no finding.

The units are real output (``engine_samples``: PyTorch tracebacks, a gloo peer error, a c10 stack
dump, the NCCL watchdog, an Xid; and an Ascend fault-code line), each rank's lines prefixed as
PyTorch does.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftwatch.events import Finding, Origin
from ftwatch.rules import matcher as matcher_mod
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

from engine_samples import (C10_DUMP, GLOO_TB, HAVE_HS, KEYERROR_TB, NCCL_INFO, STEP, T0, WATCHDOG, XID79,
                            needs_hs, summary)


def _engine_with(rules, backend: str) -> Engine:
    """An engine on ``backend``, chosen the way users do: ``FTWATCH_MATCHER``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(matcher_mod.ENV_VAR, backend)
        return Engine(rules)


# --- properties over interleavings and chunkings -----------------------------------------------

UNITS: list[list[str]] = [
    KEYERROR_TB, GLOO_TB, C10_DUMP, [STEP], [NCCL_INFO], [WATCHDOG],
    ["KeyError: 'lr'"], [XID79], ["[ERROR] device-plugin: npu 3 has fault code 0x80C98002"],
    KEYERROR_TB[:3],  # a traceback cut off by the process's death
    ["\x1b[1;35mKeyError\x1b[0m: \x1b[35m'lr'\x1b[0m"],  # Python 3.13 on a terminal
    ["\x1b]0;train\x07Traceback (most recent call last):", '  File "x.py", line 1, in <module>'],
    ["\xff\xfe\x00 NCCL WARN garbage"],
]
# Each stream's prefix: PyTorch's, torchrun --tee's, both stacked, and the agent's own unprefixed lines.
PREFIXES: dict[int | None, str] = {0: "[rank0]: ", 1: "[default1]:", 2: "[default2]:[rank2]: ", None: ""}
_streams = itertools.count()


@pytest.fixture(scope="module")
def engines() -> dict[str, Engine]:
    """One engine per backend, shared by the examples (each example uses fresh origins)."""
    rules = load_rules()
    out = {"re2": _engine_with(rules, "re2")}
    if HAVE_HS:
        out["hyperscan"] = _engine_with(rules, "hyperscan")
    return out


def _script(draw_data) -> tuple[dict[int | None, list[bytes]], list[bytes]]:
    """Per-rank raw lines (each rank a sequence of UNITS) and one order-preserving interleaving."""
    per_rank: dict[int | None, list[bytes]] = {}
    for r, prefix in PREFIXES.items():
        units = draw_data.draw(st.lists(st.sampled_from(range(len(UNITS))), max_size=5), label=f"rank {r}")
        per_rank[r] = [f"{prefix}{line}".encode() for u in units for line in UNITS[u]]
    queues = {r: list(ls) for r, ls in per_rank.items() if ls}
    merged: list[bytes] = []
    while queues:
        r = draw_data.draw(st.sampled_from(list(queues)), label="next rank")
        merged.append(queues[r].pop(0))
        if not queues[r]:
            del queues[r]
    return per_rank, merged


def _feed_chunks(engine: Engine, origin: Origin, raw_lines: list[bytes], cuts: set[int]) -> list[Finding]:
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(raw_lines)), len(raw_lines)]
    found: list[Finding] = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        chunk = b"".join(line + b"\n" for line in raw_lines[a:b])
        found += engine.feed(origin, chunk, T0, final=(i == len(bounds) - 2))
    return found


def _fresh_origin() -> Origin:
    return Origin(f"combined-{next(_streams)}", None, "job-7", "node-a", "combined.log", "replay")


def _per_rank(findings: list[Finding]) -> dict[int | None, list[tuple]]:
    out: dict[int | None, list[tuple]] = {}
    for f in findings:
        out.setdefault(f.rank, []).append((f.rule_id, f.line, f.evidence))
    return out


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_interleaving_ranks_changes_no_finding_of_any_rank(engines, data):
    engine = engines["re2"]
    per_rank, merged = _script(data)
    alone = {r: _per_rank(engine.feed(_fresh_origin(), b"".join(l + b"\n" for l in ls), T0, final=True))
             for r, ls in per_rank.items()}
    together = _per_rank(engine.feed(_fresh_origin(), b"".join(l + b"\n" for l in merged), T0, final=True))
    for r in per_rank:
        assert together.get(r, []) == alone[r].get(r, [])
    assert set(together) <= set(per_rank)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_chunk_boundaries_change_no_finding(engines, data):
    engine = engines.get("hyperscan", engines["re2"])
    _, merged = _script(data)
    cuts = data.draw(st.sets(st.integers(1, max(1, len(merged) - 1))), label="cuts")
    whole = _feed_chunks(engine, _fresh_origin(), merged, set())
    chunked = _feed_chunks(engine, _fresh_origin(), merged, cuts)
    assert _per_rank(chunked) == _per_rank(whole)
    assert [f.rank for f in chunked] == [f.rank for f in whole]


@needs_hs
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_backends_agree_on_any_interleaving_and_chunking(engines, data):
    _, merged = _script(data)
    merged += [data.draw(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), label="garbage")]
    cuts = data.draw(st.sets(st.integers(1, max(1, len(merged) - 1))), label="cuts")
    origin = _fresh_origin()
    assert (summary(_feed_chunks(engines["re2"], origin, merged, cuts))
            == summary(_feed_chunks(engines["hyperscan"], origin, merged, cuts)))
