"""``Origin``'s hash, made once (issue 16: an Origin keys the per-stream maps of the hot path many
times per chunk): equal origins hash alike whatever their labels, after ``dataclasses.replace``
and ``with_rank``, and after a pickle into a process whose str hashes differ."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys

from ftwatch.events import Origin


def test_equal_origins_hash_alike_labels_aside():
    a = Origin("llm-worker-3", 3, "train/llm", "node-1", "stderr", "shipped", (("team", "a"),))
    b = Origin("llm-worker-3", 3, "train/llm", "node-1", "stderr", "shipped")
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    moved = dataclasses.replace(a, rank=4)
    assert moved == Origin("llm-worker-3", 4, "train/llm", "node-1", "stderr", "shipped")
    assert hash(moved) == hash(Origin("llm-worker-3", 4, "train/llm", "node-1", "stderr", "shipped"))
    ranked = Origin("pod", None, "j").with_rank(2)
    assert hash(ranked) == hash(Origin("pod/rank2", 2, "j"))
    assert repr(b) == "Origin(instance='llm-worker-3', rank=3, job='train/llm', node='node-1', stream='stderr', source='shipped')"


def test_a_pickled_origin_hashes_as_the_receiving_process_hashes_it():
    a = Origin("llm-worker-3", 3, "train/llm", "node-1", "stderr", "shipped", (("team", "a"),))
    code = ("import pickle, sys; from ftwatch.events import Origin; o = pickle.loads(sys.stdin.buffer.read()); "
            "fresh = Origin('llm-worker-3', 3, 'train/llm', 'node-1', 'stderr', 'shipped'); "
            "print(hash(o) == hash(fresh), o == fresh, o.labels)")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(a), capture_output=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout.decode().split()
        assert out[:2] == ["True", "True"] and "team" in out[2]
