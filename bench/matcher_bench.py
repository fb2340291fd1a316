"""Measures ``Matcher.scan`` throughput (lines/s) on 1 MiB chunks of synthetic training logs.

Usage::

    .venv/bin/python bench/matcher_bench.py [--patterns 300 | --packs] [--seconds 2] [--backend re2]

The corpus mixes PyTorch / NCCL / gloo / CUDA output with ordinary progress lines, about 1% of
lines hitting a rule; the rule set mixes real error strings, generated keywords and regexes.
Prints one line per backend; no thresholds (tests never assert timings).
"""

from __future__ import annotations

import argparse
import random
import time

from ftwatch.rules.matcher import BACKENDS, Matcher
from ftwatch.rules.model import Pattern

_NORMAL = [
    "[rank{r}]:[I1121 09:36:{s:02d}.735000 {t} ProcessGroupNCCL.cpp:{n}] [PG ID 0 PG GUID 0 Rank {r}] "
    "ProcessGroupNCCL initialization options: size: 8, global rank: {r}, TIMEOUT(ms): 600000",
    "{h}:{t}:{t} [{r}] NCCL INFO Channel 0{r}/0 : {r}[{r}] -> {n}[{n}] via P2P/IPC/read",
    "2026-11-21 09:36:{s:02d},123 - INFO - iteration {n}/100000 | consumed samples: {t} | "
    "lm loss: 2.{n} | loss scale: 65536.0 | grad norm: 1.{r} | tokens/s: {t}",
    " [2026-11-21 09:36:{s:02d}] iteration {n}/ 5000 | elapsed time per iteration (ms): 1{n}.3 | "
    "learning rate: 2.999E-04 | global batch size: 1024",
    "Epoch {r}: {n}%|███████▌ | {n}/1000 [00:{s:02d}<01:02, 12.{r}it/s, loss=0.{n}]",
    "{h}:{t}:{t} [{r}] NCCL INFO comm 0x55d0 rank {r} nRanks 8 nNodes 1 localRanks 8 localRank {r}",
    "[default{r}]:step {n} loss 3.{n} lr 0.0003 throughput {t} samples/s",
]
_ERRORS = [
    "[rank{r}]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "{h}:{t}:{t} [{r}] NCCL WARN Cuda failure 'out of memory'",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:29500",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {r} has a total "
    "capacity of 79.15 GiB of which 1.2 GiB is free.",
    "[rank{r}]:[E1121 09:36:{s:02d}.735000 {t} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600010 milliseconds before timing out.",
    "Traceback (most recent call last):",
]
_REAL_KEYWORDS = [
    "unhandled system error", "unhandled cuda error", "Connection closed by peer", "CUDA out of memory",
    "Watchdog caught collective operation timeout", "NCCL WARN", "ChildFailedError",
    "Traceback (most recent call last):", "Segmentation fault", "illegal memory access",
    "ECC error", "NCCL communicator was aborted", "Connection reset by peer", "No space left on device",
    "Killed", "RendezvousTimeoutError", "socketStartConnect: Connect to", "EI0006", "EJ0001", "E39999",
]
_REGEXES = [
    r"NCCL error in: \S+:\d+, unhandled (system|cuda) error", r"Xid \(PCI:[0-9a-fA-F:.]+\): \d+",
    r"OpType=\w+, NumelIn=\d+", r"^\w+Error: ", r"exitcode\s*:\s*-?\d+", r"\bE[IJ]\d{4}\b",
    r"[0-9A-F]{8} error code", r"gloo/transport/tcp/pair\.cc:\d+\]", r"CUDA error: [a-z ]+",
    r"ran for \d+ milliseconds before timing out",
]


def make_corpus(n_lines: int, seed: int = 1) -> list[bytes]:
    """Returns ``n_lines`` synthetic log lines (bytes, no newline), about 1% errors."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n_lines):
        tpl = rnd.choice(_ERRORS) if rnd.random() < 0.01 else rnd.choice(_NORMAL)
        out.append(tpl.format(r=rnd.randrange(8), s=rnd.randrange(60), t=rnd.randrange(10**6),
                              n=rnd.randrange(1000), h=f"node{rnd.randrange(64)}").encode())
    return out


def make_patterns(count: int, seed: int = 7) -> list[Pattern]:
    """Returns ``count`` patterns: the real keywords and regexes, then generated ones."""
    rnd = random.Random(seed)
    pats = [Pattern(k) for k in _REAL_KEYWORDS] + [Pattern(r, regex=True) for r in _REGEXES]
    words = ["error", "failure", "timeout", "device", "socket", "driver", "rank", "fatal", "abort"]
    while len(pats) < count:
        w = f"{rnd.choice(words)}_{rnd.randrange(10**5)}"
        if rnd.random() < 0.3:
            pats.append(Pattern(w + r"\s+code=\d+", regex=True))
        else:
            pats.append(Pattern(w, caseless=rnd.random() < 0.2))
    return pats[:count]


def bench(backend: str, lines: list[bytes], patterns: list[Pattern], seconds: float) -> tuple[float, int]:
    """Scans 1 MiB chunks of ``lines`` for about ``seconds``; returns (lines/s, hits per pass)."""
    matcher = Matcher(patterns, backend=backend)
    chunks, cur, size = [], [], 0
    for line in lines:
        cur.append(line)
        size += len(line) + 1
        if size >= 1 << 20:
            chunks.append((b"\n".join(cur) + b"\n", len(cur)))
            cur, size = [], 0
    if cur:
        chunks.append((b"\n".join(cur) + b"\n", len(cur)))
    hits = sum(len(matcher.scan(c)) for c, _ in chunks)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for chunk, n in chunks:
            matcher.scan(chunk)
            done += n
    return done / (time.perf_counter() - start), hits


def main() -> None:
    """Parses arguments and prints lines/s per backend."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patterns", type=int, default=300)
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--backend", choices=BACKENDS, action="append")
    ap.add_argument("--packs", action="store_true", help="use the built-in rule packs' patterns instead")
    args = ap.parse_args()
    lines = make_corpus(args.lines)
    if args.packs:
        from ftwatch.rules.loader import load_rules

        patterns = [p for rule in load_rules() for p in rule.patterns]
    else:
        patterns = make_patterns(args.patterns)
    avg = sum(map(len, lines)) / len(lines) + 1
    for backend in args.backend or list(BACKENDS):
        rate, hits = bench(backend, lines, patterns, args.seconds)
        print(f"{backend:9s} {len(patterns)} patterns, {avg:.0f} B/line: {rate / 1e6:.2f} M lines/s "
              f"({rate * avg / 1e6:.0f} MB/s), {hits} hits in {len(lines)} lines")


if __name__ == "__main__":
    main()
