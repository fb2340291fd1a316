"""Progress bars redraw with a bare \\r: the sources hand their updates over while the bar runs (SPEC S1, S4, H3)."""

from __future__ import annotations

import io
import os
import queue
import threading

from ftwatch.events import Origin
from ftwatch.pipeline.sources.process import Output, line_end, read_lines
from ftwatch.pipeline.sources.stdin import StdinSource

BAR = b"\r 45%|####5     | 45/100 [00:10<00:12,  4.50it/s]"


def test_line_end_takes_a_bare_cr_but_never_half_of_a_crlf():
    assert line_end(b"a\nb") == 1
    assert line_end(b"\rbar1\rbar2") == 5                 # the start of the last (incomplete) update
    assert line_end(b"x\r\ny") == 2                       # \r\n: the \n
    assert line_end(b"abc\r") == -1                       # its \n may be in the next read
    assert line_end(b"a\rb\nc") == 3                      # a \r before the last \n: the \n
    assert line_end(b"no end") == -1


def test_process_reader_hands_over_bar_updates_before_the_bar_closes():
    r, w = os.pipe()
    out: queue.SimpleQueue = queue.SimpleQueue()
    reader = threading.Thread(target=read_lines, args=(os.fdopen(r, "rb"), Origin("w0", 0), out))
    reader.start()
    got: list[bytes] = []
    for n in range(1, 4):
        os.write(w, BAR.replace(b"45/100", b"%d/100" % n))
    while b"".join(got).count(b"/100 [") < 2:            # updates 1 and 2 are complete: handed over
        item = out.get(timeout=5)
        assert isinstance(item, Output)
        got.append(item.data)
    assert b"3/100" not in b"".join(got) and out.empty()  # update 3 may still grow: it waits
    os.write(w, b"\n")                                    # the bar closes
    os.close(w)
    reader.join(5)
    while not out.empty():
        got.append(out.get().data)
    data = b"".join(got)
    assert data.endswith(b"3/100 [00:10<00:12,  4.50it/s]\n") and data.count(b"/100 [") == 3


def test_stdin_source_hands_over_bar_updates_as_lines():
    q: queue.Queue = queue.Queue()
    src = StdinSource(q, stream=io.BufferedReader(io.BytesIO(BAR + BAR + b"\r\nafter\r\n")))
    src.start()
    src.ended.wait(5)
    lines: list[bytes] = []
    while not q.empty():
        lines += [s.line for s in q.get_nowait()]
    assert lines[0].count(b"/100 [") == 2 and lines[-1] == b"after\r"
