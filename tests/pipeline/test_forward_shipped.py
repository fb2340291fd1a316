"""A Forward request's entries become Shipped lines in C passes (``forward._shipped``, issue 16):
the same objects, fields and key order as ``to_shipped`` makes one by one."""

from __future__ import annotations

import copy
import pickle
from types import MappingProxyType

import pytest

from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.forward import _shipped, to_shipped

NO_META = MappingProxyType({})


def entries(*records: dict, metadata: list | None = None) -> list:
    metas = metadata or [NO_META] * len(records)
    return [(float(i), r, m) for i, (r, m) in enumerate(zip(records, metas))]


@pytest.mark.parametrize("make", [
    lambda: entries({"log": "a\n", "stream": "stderr"}, {"stream": "stdout", "log": "b é"}),
    lambda: entries({"log": "a"}, {"log": "b"}, metadata=[NO_META, {"otlp": {"x": 1}}]),   # fluent-bit 2.1
    lambda: entries({"log": "a"}, {"message": "b"}),          # no log: one by one
    lambda: entries({"log": "a"}, {"log": b"raw\n"}),         # a bin log: one by one
    lambda: entries({"log": "\udcff ok"}),                    # surrogateescape'd bytes
])
def test_fast_path_makes_what_to_shipped_makes(make):
    fast = _shipped("kube.x", make())
    slow = [to_shipped("kube.x", t, r, m) for t, r, m in make()]
    assert fast == slow
    assert [list(s.meta) for s in fast] == [list(s.meta) for s in slow]    # same key order
    assert all(type(s) is Shipped for s in fast)


def test_shipped_is_an_immutable_record_with_a_fresh_default_meta():
    a, b = Shipped(1.0, b"x"), Shipped(1.0, b"x")
    assert a.meta == {} and a.meta is not b.meta
    assert Shipped(2.0, b"y", None).meta is None              # given is kept, as the dataclass did
    with pytest.raises(AttributeError):
        a.line = b"z"
    s = Shipped(time=3.0, line=b"l", meta={"k": "v"})
    assert (s.time, s.line, s.meta) == (3.0, b"l", {"k": "v"})
    assert pickle.loads(pickle.dumps(s)) == s and copy.deepcopy(s) == s
