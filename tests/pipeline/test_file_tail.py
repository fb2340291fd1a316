"""File tails (S2, Q1) on real files: growth, globs, rotation, truncation, long lines, restarts.

The source is driven pass by pass with ``poll_once()`` and a fake monotonic clock for
``rotate_wait``; the restart test SIGKILLs a real tailing process while another real process is
still appending. Nothing sleeps to let time pass: waits are for an observable condition, with a
deadline.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.sources.checkpoints import OffsetStore
from ftwatch.pipeline.sources.file_tail import TRUNCATED_MARKER, FileTailSource, ShippedBatch

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


class FakeMono:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A source on a queue, with helpers that run passes and collect what came out."""

    def __init__(self, tmp_path: Path, globs: list[str], **kw) -> None:
        self.q: queue.Queue = queue.Queue()
        self.clock = FakeMono()
        self.offsets_path = tmp_path / "offsets.json"
        self.store = OffsetStore(self.offsets_path)
        kw.setdefault("clock", self.clock)
        self.src = FileTailSource(globs, self.q, self.store, **kw)

    def batches(self) -> list[list[Shipped]]:
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                return out

    def poll(self) -> list[bytes]:
        """One pass; returns its lines (checking the return value and one batch per file)."""
        n = self.src.poll_once()
        batches = self.batches()
        files = [b[0].meta["inode"] for b in batches]
        assert len(files) == len(set(files)), "more than one batch for a file in one pass"
        lines = [s.line for b in batches for s in b]
        assert n == len(lines)
        return lines

    def drain(self) -> list[bytes]:
        """Passes until nothing is left to read now."""
        lines = self.poll()
        while self.src.backlog:
            lines += self.poll()
        return lines


def write(path: Path, data: bytes, mode: str = "ab") -> None:
    with open(path, mode) as f:
        f.write(data)


def test_growth_partial_lines_and_meta(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"one\ntwo\n")
    rig = Rig(tmp_path, [str(tmp_path / "*.log")], read_from_head=True, envelope="cri")
    before = time.time()
    n = rig.src.poll_once()
    [batch] = rig.batches()
    assert n == 2 and [s.line for s in batch] == [b"one", b"two"]
    ino = os.stat(log).st_ino
    assert batch[0].meta == {"path": str(log), "inode": ino, "envelope": "cri"}
    assert before <= batch[0].time <= time.time()
    write(log, b"three\nfo")
    assert rig.poll() == [b"three"]       # the partial "fo" waits for its newline
    assert rig.poll() == []
    write(log, b"ur\n")
    assert rig.poll() == [b"four"]
    assert rig.src.stats["lines"] == 4 and rig.src.stats["bytes"] == len(b"one\ntwo\nthree\nfour\n")
    assert rig.store.get(os.stat(log).st_dev, ino, b"one\n") == log.stat().st_size


def test_meta_without_envelope(tmp_path: Path) -> None:
    write(tmp_path / "a.log", b"x\n")
    rig = Rig(tmp_path, [str(tmp_path / "a.log")], read_from_head=True)
    rig.src.poll_once()
    assert set(rig.batches()[0][0].meta) == {"path", "inode"}


def test_globs_pick_up_new_files_from_their_head(tmp_path: Path) -> None:
    (tmp_path / "pods").mkdir()
    write(tmp_path / "pods" / "a.log", b"old a\n")
    write(tmp_path / "pods" / "ignored.txt", b"nope\n")
    (tmp_path / "pods" / "dir.log").mkdir()  # matches, but is no regular file
    rig = Rig(tmp_path, [str(tmp_path / "pods" / "*.log"), str(tmp_path / "more" / "**" / "*.log")])
    assert rig.poll() == []  # read_from_head=False: what was there at the first scan is skipped
    write(tmp_path / "pods" / "a.log", b"new a\n")
    write(tmp_path / "pods" / "b.log", b"b1\nb2\n")  # appears later: always read from its head
    (tmp_path / "more" / "deep").mkdir(parents=True)
    write(tmp_path / "more" / "deep" / "c.log", b"c1\n")
    assert sorted(rig.poll()) == [b"b1", b"b2", b"c1", b"new a"]
    assert rig.src.stats["files"] == 3


def test_read_from_head_false_starts_after_the_last_newline(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"old 1\nold 2\nhalf of a li")
    rig = Rig(tmp_path, [str(log)])
    assert rig.poll() == []
    write(log, b"ne\nfresh\n")
    assert rig.poll() == [b"half of a line", b"fresh"]  # the line being written is not cut


def test_read_from_head_true_reads_existing_content(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"old 1\nold 2\n")
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    assert rig.poll() == [b"old 1", b"old 2"]


def test_a_saved_offset_wins_over_read_from_head(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"1\n2\n")
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    assert rig.poll() == [b"1", b"2"]
    rig.src.stop()
    write(log, b"3\n")
    again = Rig(tmp_path, [str(log)], read_from_head=True)
    assert again.poll() == [b"3"]


def test_a_file_replaced_while_down_is_read_from_its_head(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"1\n")
    rig = Rig(tmp_path, [str(log)])
    rig.poll()
    rig.src.stop()
    os.rename(log, tmp_path / "w.log.1")   # rotated while ftwatch was down
    write(log, b"new 1\n")
    again = Rig(tmp_path, [str(log)])  # read_from_head=False, but the path was followed before
    assert again.poll() == [b"new 1"]
    assert again.src.stats["rotations"] == 1   # w.log.1 found by its inode: read on (nothing new)
    again.clock.now += again.src.rotate_wait
    assert again.poll() == []
    assert [e.path for e in again.store.entries()] == [str(log)]  # the stale entry is pruned


def test_rename_rotation_reads_the_old_file_for_rotate_wait(tmp_path: Path) -> None:
    log, old = tmp_path / "app.log", tmp_path / "app.log.1"
    rig = Rig(tmp_path, [str(log)], read_from_head=True, rotate_wait=5.0)
    writer = open(log, "ab", buffering=0)  # the application keeps its file open across the rename
    writer.write(b"a1\na2\n")
    assert rig.poll() == [b"a1", b"a2"]
    old_key = (os.stat(log).st_dev, os.stat(log).st_ino)
    os.rename(log, old)
    writer.write(b"a3 after rename\n")
    write(log, b"b1\n")
    assert sorted(rig.poll()) == [b"a3 after rename", b"b1"]
    assert rig.src.stats["rotations"] == 1 and rig.src.stats["files"] == 2
    rig.clock.now += 4.9
    writer.write(b"a4\na5 partial")
    write(log, b"b2\n")
    assert sorted(rig.poll()) == [b"a4", b"b2"]
    rig.clock.now += 0.2  # rotate_wait is over: the old file is read to its end and closed
    assert rig.poll() == [b"a5 partial"]
    writer.write(b"a6 too late\n")
    write(log, b"b3\n")
    assert rig.poll() == [b"b3"]
    assert rig.src.stats["files"] == 1 and rig.src.stats["rotations"] == 1
    assert all((e.dev, e.ino) != old_key for e in rig.store.entries())
    writer.close()


def test_a_rotated_file_renamed_within_the_globs_is_not_read_twice(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, b"1\n2\n")
    rig = Rig(tmp_path, [str(tmp_path / "app.log*")], read_from_head=True)
    assert rig.poll() == [b"1", b"2"]
    os.rename(log, tmp_path / "app.log.1")
    write(tmp_path / "app.log.1", b"3\n")
    write(log, b"new\n")
    assert sorted(rig.poll()) == [b"3", b"new"]
    assert rig.src.stats["rotations"] == 0


@pytest.mark.parametrize("after", [b"x\n", b"a much longer first line after the truncation\n" * 3])
def test_copytruncate(tmp_path: Path, after: bytes) -> None:
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    writer = open(log, "ab", buffering=0)  # O_APPEND, as copytruncate needs
    writer.write(b"line 1\nline 2\n")
    assert rig.poll() == [b"line 1", b"line 2"]
    shutil.copyfile(log, tmp_path / "app.log.1")
    os.truncate(log, 0)
    writer.write(after)  # shorter or longer than the old read position: both are noticed
    assert rig.poll() == after.rstrip(b"\n").split(b"\n")
    assert rig.src.stats["truncations"] == 1
    writer.close()


# -- issue 17: rotation and copytruncate neither lose nor repeat, also across a restart --------------

def copytruncate(log: Path, copy: Path) -> None:
    shutil.copyfile(log, copy)
    os.truncate(log, 0)


def test_copytruncate_takes_the_unread_lines_from_the_copy(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    writer = open(log, "ab", buffering=0)
    writer.write(b"line 1\nline 2\n")
    assert rig.poll() == [b"line 1", b"line 2"]
    writer.write(b"line 3\nline 4\n")               # not read before logrotate copies and truncates
    copytruncate(log, tmp_path / "app.log.1")
    writer.write(b"line 5\n")
    assert rig.poll() == [b"line 3", b"line 4", b"line 5"]
    assert rig.src.stats["salvaged"] == 2 and rig.src.stats["truncations"] == 1
    writer.close()


def test_a_copy_the_globs_match_is_never_read_again(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(tmp_path / "app.log*")], read_from_head=True)
    writer = open(log, "ab", buffering=0)
    writer.write(b"line 1\nline 2\n")
    assert rig.poll() == [b"line 1", b"line 2"]
    writer.write(b"line 3\n")
    copytruncate(log, tmp_path / "app.log.1")
    writer.write(b"line 4\n")
    assert rig.poll() == [b"line 3", b"line 4"]       # the copy is followed from its end
    os.rename(tmp_path / "app.log.1", tmp_path / "app.log.2")   # the next rotation moves it on
    writer.write(b"line 5\n")
    copytruncate(log, tmp_path / "app.log.1")
    assert rig.poll() == [b"line 5"]
    assert rig.src.stats["files"] == 3 and rig.src.stats["salvaged"] == 2   # line 3, then line 5
    writer.close()


def test_a_sibling_that_begins_like_a_followed_file_is_no_copy(tmp_path: Path) -> None:
    """The same banner in every worker's log: content alone cannot tell a copy; only a
    truncated original makes one."""
    banner = b"=" * 80 + b" trainer v1.2 starting " + b"=" * 80 + b"\n"
    rig = Rig(tmp_path, [str(tmp_path / "*.log")], read_from_head=True)
    write(tmp_path / "worker-0.log", banner)
    assert rig.poll() == [banner[:-1]]
    write(tmp_path / "worker-1.log", banner + b"rank 1 up\n")
    assert rig.poll() == [banner[:-1], b"rank 1 up"]
    write(tmp_path / "worker-0.log", b"rank 0 up\n")
    os.truncate(tmp_path / "worker-0.log", 0)          # truncated, yet worker-1 is no copy of it
    write(tmp_path / "worker-0.log", b"again\n")
    assert rig.poll() == [b"again"] and rig.src.stats["salvaged"] == 0


def test_copytruncate_while_down_is_salvaged_at_restart(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(log)], read_from_head=True, require_ack=True)
    write(log, b"line 1\nline 2\n")
    passing = threading.Thread(target=rig.src.poll_once)
    passing.start()
    rig.q.get(timeout=DEADLINE).ack()
    passing.join(DEADLINE)
    rig.src.stop()
    write(log, b"line 3\n")
    copytruncate(log, tmp_path / "app.log.1")
    write(log, b"line 4\n")
    again = Rig(tmp_path, [str(log)])
    assert again.poll() == [b"line 3", b"line 4"]
    assert again.src.stats["salvaged"] == 1


def test_rename_rotation_while_down_reads_the_old_file_on(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, b"a1\n")
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    assert rig.poll() == [b"a1"]
    rig.src.stop()                                     # killed, or stopped inside rotate_wait
    write(log, b"a2\n")
    os.rename(log, tmp_path / "app.log.1")
    write(log, b"b1\n")
    again = Rig(tmp_path, [str(log)], rotate_wait=5.0)
    batches = again.src.poll_once() and again.batches()
    assert {s.line for b in batches for s in b} == {b"a2", b"b1"}
    assert all(b[0].meta["path"] == str(log) for b in batches)   # the same origin as before
    again.clock.now += 5.0
    assert again.poll() == [] and again.src.stats["files"] == 1


def test_truncation_by_rewrite_and_by_shrink_while_down(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"first\nsecond\n")
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    rig.poll()
    write(log, b"again\n", mode="wb")
    assert rig.poll() == [b"again"]
    rig.src.stop()
    os.truncate(log, 2)  # shorter than the saved offset while ftwatch is down
    again = Rig(tmp_path, [str(log)])
    assert again.poll() == []
    assert again.src.stats["truncations"] == 1
    write(log, b"\n")
    assert again.poll() == [b"ag"]


def test_deleted_files_are_read_to_their_end_and_closed(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    writer = open(log, "ab", buffering=0)
    writer.write(b"1\n")
    assert rig.poll() == [b"1"]
    writer.write(b"2\nlast")
    os.unlink(log)
    assert rig.poll() == [b"2", b"last"]
    assert rig.src.stats["files"] == 0 and rig.store.entries() == []
    writer.close()


def test_a_12_mb_line_is_cut_once_and_never_stalls_the_file(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    big = bytes(range(256)).replace(b"\n", b"") * (12 * 1024 * 1024 // 255 + 1)
    write(log, b"before\n" + big[: 12 * 1024 * 1024] + b"\nafter\n")
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    lines = rig.drain()
    limit = 10 * 1024 * 1024
    assert [len(x) for x in lines] == [6, limit + len(TRUNCATED_MARKER), 5]
    assert lines[1] == big[:limit] + TRUNCATED_MARKER and lines[2] == b"after"
    assert rig.src.stats["long_lines"] == 1
    # the same while the line is still being written, in pieces smaller than the limit
    for _ in range(12):
        write(log, b"y" * 1024 * 1024)
        rig.drain()
    write(log, b"tail of it\nnext\n")
    assert rig.drain() == [b"next"]
    assert rig.src.stats["long_lines"] == 2


def test_long_lines_with_a_small_limit_and_big_chunks(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"short\n" + b"L" * 50 + b"\nok\n" + b"M" * 40)
    rig = Rig(tmp_path, [str(log)], read_from_head=True, max_line_bytes=10, chunk_bytes=4096)
    assert rig.drain() == [b"short", b"L" * 10 + TRUNCATED_MARKER, b"ok", b"M" * 10 + TRUNCATED_MARKER]
    write(log, b"MMM\nafter\n")
    assert rig.drain() == [b"after"]
    assert rig.src.stats["long_lines"] == 2


def test_binary_garbage_and_invalid_utf8_pass_through(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    lines = [b"\xff\xfe\x00\x01 not utf-8 \xc3\x28", b"\x00" * 100, b"caf\xc3\xa9 ok", b"crlf\r", bytes(range(10))]
    write(log, b"\n".join(lines) + b"\n")
    rig = Rig(tmp_path, [str(log)], read_from_head=True, chunk_bytes=7)  # lines split across reads
    assert rig.drain() == lines


def test_require_ack_saves_the_offset_only_after_the_ack(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"1\n2\n")
    rig = Rig(tmp_path, [str(log)], read_from_head=True, require_ack=True)
    st = log.stat()
    passing = threading.Thread(target=rig.src.poll_once)
    passing.start()
    batch = rig.q.get(timeout=DEADLINE)
    assert isinstance(batch, ShippedBatch) and [s.line for s in batch] == [b"1", b"2"]
    assert OffsetStore(rig.offsets_path).get(st.st_dev, st.st_ino, b"1\n") == 0  # not yet
    batch.ack()
    assert batch.committed      # issue 17: on disk when ack() returned, not when the pass goes on
    assert OffsetStore(rig.offsets_path).get(st.st_dev, st.st_ino, b"1\n") == 4
    passing.join(DEADLINE)
    assert batch.acked and OffsetStore(rig.offsets_path).get(st.st_dev, st.st_ino, b"1\n") == 4


class SignallingQueue(queue.Queue):
    """A queue that says when a put starts (to observe a source blocked on it)."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.putting = threading.Event()

    def put(self, item, block=True, timeout=None):
        self.putting.set()
        super().put(item, block, timeout)


def test_a_full_queue_blocks_the_source_and_stop_still_returns(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"1\n")
    q = SignallingQueue(1)
    q.put_nowait(["occupied"])
    q.putting.clear()
    store = OffsetStore(tmp_path / "o.json")
    src = FileTailSource([str(log)], q, store, read_from_head=True)
    src.start()
    assert q.putting.wait(DEADLINE)
    src.stop()
    src.stop()  # idempotent
    st = log.stat()
    assert OffsetStore(tmp_path / "o.json").get(st.st_dev, st.st_ino, b"1\n") == 0  # undelivered: unsaved
    assert q.get_nowait() == ["occupied"] and q.empty()


def test_the_thread_follows_a_file(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    write(log, b"hello\n")
    q: queue.Queue = queue.Queue()
    src = FileTailSource([str(log)], q, OffsetStore(tmp_path / "o.json"), poll_interval=0.01, read_from_head=True)
    src.start()
    assert [s.line for s in q.get(timeout=DEADLINE)] == [b"hello"]
    write(log, b"world\n")
    assert [s.line for s in q.get(timeout=DEADLINE)] == [b"world"]
    src.stop()
    assert src.stats["files"] == 0


# -- restart after SIGKILL ------------------------------------------------------------------------

WRITER = """
    import os, sys, time
    path, stop = sys.argv[1:3]
    i = 0
    with open(path, "ab", buffering=0) as f:
        while not os.path.exists(stop):  # appends until told to stop, across every kill
            f.write(b"".join(b"%08d\\n" % j for j in range(i, i + 40)))
            i += 40
            time.sleep(0.002)  # pacing: a log being written, not a file copied
"""

# The consumer's half of exactly-once: its output and the offset are one transaction because at
# start it rolls its output back to the committed offset (its lines are the input's, byte for
# byte). Every batch is written and fsync'd BEFORE it is acked, and the offset is saved only after
# the ack, so the output can never be behind the committed offset (that would be a lost line).
TAILER = """
    import os, queue, sys
    from ftwatch.pipeline.sources.checkpoints import OffsetStore, read_fingerprint
    from ftwatch.pipeline.sources.file_tail import FileTailSource
    inp, outp, offp, rollback = sys.argv[1:5]
    store = OffsetStore(offp)
    fd = os.open(inp, os.O_RDONLY)
    st = os.fstat(fd)
    committed = store.get(st.st_dev, st.st_ino, read_fingerprint(fd)) or 0
    os.close(fd)
    size = os.path.getsize(outp) if os.path.exists(outp) else 0
    with open(rollback, "a") as r:
        r.write(f"{committed} {size}\\n")
    if size > committed:
        os.truncate(outp, committed)
    q = queue.Queue(maxsize=4)
    src = FileTailSource([inp], q, store, read_from_head=True, poll_interval=0.005, chunk_bytes=4096,
                         require_ack=True)
    src.start()
    out = open(outp, "ab")
    while True:
        batch = q.get()
        out.write(b"".join(s.line + b"\\n" for s in batch))
        out.flush()
        os.fsync(out.fileno())
        batch.ack()
"""


def wait_for(cond, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def test_restart_after_sigkill_loses_and_repeats_nothing(tmp_path: Path) -> None:
    inp, outp, offp, rollback, stop = (tmp_path / x for x in ("in.log", "out.log", "offsets.json", "rollback", "stop"))
    inp.touch()
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(inp), str(stop)], cwd=ROOT)]
    writer = procs[0]

    def tailer() -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(TAILER),
                                       *map(str, (inp, outp, offp, rollback))], cwd=ROOT))
        return procs[-1]

    def lines_out() -> int:
        return outp.stat().st_size // 9 if outp.exists() else 0

    try:
        for target in (3_000, 8_000, 13_000, 18_000):
            child = tailer()
            wait_for(lambda: lines_out() >= target or child.poll() is not None, f"{target} lines out")
            assert writer.poll() is None  # mid-stream: the writer is still appending
            child.send_signal(signal.SIGKILL)
            assert child.wait(DEADLINE) == -signal.SIGKILL
        stop.touch()
        assert writer.wait(DEADLINE) == 0
        n = inp.stat().st_size // 9
        child = tailer()
        wait_for(lambda: lines_out() >= n or child.poll() is not None, "every line")
        child.send_signal(signal.SIGKILL)
        child.wait(DEADLINE)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert outp.read_bytes() == inp.read_bytes() == b"".join(b"%08d\n" % i for i in range(n))
    restarts = [tuple(map(int, x.split())) for x in rollback.read_text().split("\n") if x]
    assert len(restarts) == 5
    assert all(size >= committed for committed, size in restarts), restarts  # the offset never ran ahead
    rolled = sum(size - committed for committed, size in restarts) // 9
    print(f"\nSIGKILL restarts: {len(restarts) - 1}; acked-but-unsaved lines re-read and rolled back: {rolled}")


# -- speed (printed, never asserted) --------------------------------------------------------------

def test_throughput_of_one_million_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    log = tmp_path / "big.log"
    n = 1_000_000
    with open(log, "wb") as f:
        for start in range(0, n, 10_000):
            f.write(b"".join(b"2026-11-21 09:36:03 [rank%d]: step %08d loss 0.1234 lr 3e-4\n" % (i % 8, i)
                             for i in range(start, start + 10_000)))
    t0 = time.perf_counter()
    with open(log, "rb") as f:  # the floor: read and split, nothing else
        floor_lines = sum(len(chunk.split(b"\n")) for chunk in iter(lambda: f.read(256 * 1024), b""))
    floor = time.perf_counter() - t0
    rig = Rig(tmp_path, [str(log)], read_from_head=True)
    t0 = time.perf_counter()
    got = 0
    while True:
        got += rig.src.poll_once()
        rig.batches()
        if not rig.src.backlog:
            break
    took = time.perf_counter() - t0
    assert got == n and floor_lines >= n
    with capsys.disabled():
        print(f"\nfile tail: {n / took:,.0f} lines/s ({log.stat().st_size / took / 1e6:.0f} MB/s), "
              f"{took / floor:.1f}x the read+split floor ({n / floor:,.0f} lines/s)")
