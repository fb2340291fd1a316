"""The stdin source: a real writer process piped into a child that runs StdinSource (SPEC S4, Q1)."""

from __future__ import annotations

import io
import json
import queue
import subprocess
import sys

from ftwatch.pipeline.sources import stdin as stdin_module
from ftwatch.pipeline.sources.stdin import StdinSource

# Writes lines in small, uneven pieces (a line split across writes), invalid UTF-8, a 10 MB
# line, an empty line, and a last line without a newline.
WRITER = r"""
import os, sys
out = sys.stdout.buffer
data = b"".join(b"[rank%d]: step %d loss 0.5\n" % (i % 4, i) for i in range(2000))
data += b"bad \xff\xfe utf8\n" + b"\n" + b"x" * (10 * 1024 * 1024) + b"\n" + b"no newline at the end"
i = 0
sizes = [1, 7, 300, 4096, 65537]
while i < len(data):
    n = sizes[i % len(sizes)]
    out.write(data[i:i + n]); out.flush()
    i += n
"""

# Runs the source on its stdin and prints what it got: each line as latin-1 JSON, then a summary.
CHILD = r"""
import json, queue, sys
from ftwatch.pipeline.sources.stdin import StdinSource
q = queue.Queue(maxsize=4)
src = StdinSource(q, meta={"instance": "launcher"})
src.start()
lines, batches, metas = [], 0, set()
while not (src.ended.is_set() and q.empty()):
    try:
        batch = q.get(timeout=0.1)
    except queue.Empty:
        continue
    batches += 1
    for s in batch:
        lines.append(s.line.decode("latin-1"))
        metas.add(json.dumps(dict(s.meta), sort_keys=True))
        assert isinstance(s.time, float)
print(json.dumps({"lines": lines, "batches": batches, "metas": sorted(metas), "counted": src.lines,
                  "error": repr(src.error)}))
"""


def test_piped_into_a_child_process():
    writer = subprocess.Popen([sys.executable, "-c", WRITER], stdout=subprocess.PIPE)
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=writer.stdout, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    writer.stdout.close()           # the child holds the only read end now
    out, err = child.communicate(timeout=120)
    assert writer.wait(timeout=60) == 0
    assert child.returncode == 0, err.decode()
    got = json.loads(out)
    lines = [line.encode("latin-1") for line in got["lines"]]
    expected = [b"[rank%d]: step %d loss 0.5" % (i % 4, i) for i in range(2000)]
    expected += [b"bad \xff\xfe utf8", b"", b"x" * (10 * 1024 * 1024), b"no newline at the end"]
    assert lines == expected
    assert got["counted"] == len(expected) and got["error"] == "None"
    assert got["metas"] == ['{"instance": "launcher"}']
    assert 1 < got["batches"] < len(expected)       # lines travel in batches, not one by one


def test_a_line_over_max_line_comes_out_in_pieces(monkeypatch):
    monkeypatch.setattr(stdin_module, "MAX_LINE", 100)
    monkeypatch.setattr(stdin_module, "READ_SIZE", 30)
    q: queue.Queue = queue.Queue()
    data = b"a" * 250 + b"\nshort\n" + b"b" * 120
    src = StdinSource(q, io.BytesIO(data))
    src.start()
    assert src.ended.wait(10)
    lines = []
    while not q.empty():
        lines += [s.line for s in q.get_nowait()]
    assert b"".join(lines) == data.replace(b"\n", b"")
    assert all(len(line) <= 100 + 30 for line in lines)
    assert b"short" in lines


def test_stop_while_the_queue_is_full():
    q: queue.Queue = queue.Queue(maxsize=1)
    q.put_nowait(["occupied"])
    src = StdinSource(q, io.BytesIO(b"one\ntwo\n"))
    src.start()
    src.stop(timeout=10)
    assert src.ended.is_set()
    assert q.get_nowait() == ["occupied"]


def test_a_broken_stream_ends_the_source_without_raising():
    class Broken(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, b):
            raise OSError("EIO")

    q: queue.Queue = queue.Queue()
    src = StdinSource(q, Broken())
    src.start()
    assert src.ended.wait(10)
    assert isinstance(src.error, OSError) and q.empty()
