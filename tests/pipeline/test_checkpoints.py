"""The offsets file of file tails (S2): keys, fingerprints, the atomic write protocol, corruption.

A crash in the middle of a write is made real: a child process SIGKILLs itself between writing
the tmp file and ``os.replace``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ftwatch.pipeline.sources import checkpoints
from ftwatch.pipeline.sources.checkpoints import OffsetStore, fingerprints_agree

ROOT = Path(__file__).resolve().parents[2]


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    store = OffsetStore(path)
    assert store.get(1, 2, b"abc") is None
    store.set(1, 2, b"first line\n", 11, "/var/log/a.log")
    store.set(1, 3, b"", 0, "/var/log/b.log")
    store.flush()
    again = OffsetStore(path)
    assert again.get(1, 2, b"first line\nsecond") == 11  # the file grew past its old fingerprint
    assert again.get(1, 3, b"anything") == 0           # an empty fingerprint agrees with anything
    assert {(e.dev, e.ino, e.path) for e in again.entries()} == {(1, 2, "/var/log/a.log"), (1, 3, "/var/log/b.log")}


def test_a_reused_inode_gets_no_offset(tmp_path: Path) -> None:
    store = OffsetStore(tmp_path / "o.json")
    store.set(7, 42, b"2026-11-21 rank0 started\n", 500, "/logs/x.log")
    assert store.get(7, 42, b"another file entirely\n") is None
    assert store.get(7, 42, b"2026-11-21") == 500  # a prefix: the same file, read while it was short
    assert store.get(8, 42, b"2026-11-21 rank0 started\n") is None  # another device


def test_fingerprints_are_cut_to_64_bytes(tmp_path: Path) -> None:
    store = OffsetStore(tmp_path / "o.json")
    store.set(1, 1, b"x" * 200, 5, "p")
    assert store.entries()[0].fingerprint == b"x" * checkpoints.FINGERPRINT_BYTES
    assert fingerprints_agree(b"abc", b"abcdef") and fingerprints_agree(b"abcdef", b"abc")
    assert not fingerprints_agree(b"abd", b"abcdef")


def test_forget_and_negative_offsets(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    store = OffsetStore(path)
    store.set(1, 1, b"a", 1, "p")
    store.flush()
    store.forget(1, 1)
    store.forget(9, 9)  # absent: a no-op
    store.flush()
    assert OffsetStore(path).entries() == []
    with pytest.raises(ValueError):
        store.set(1, 1, b"a", -1, "p")


def test_flush_writes_only_when_something_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "o.json"
    store = OffsetStore(path)
    store.flush()
    assert not path.exists()  # nothing to say yet
    writes: list[bytes] = []
    real = checkpoints._write_atomically
    monkeypatch.setattr(checkpoints, "_write_atomically", lambda p, d: (writes.append(d), real(p, d)))
    store.set(1, 1, b"a", 1, "p")
    store.flush()
    store.set(1, 1, b"a", 1, "p")  # the same value again
    store.flush()
    assert len(writes) == 1


def test_the_write_protocol_is_tmp_fsync_replace_dirfsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "o.json"
    calls: list[tuple[str, str]] = []
    names: dict[int, str] = {}
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace

    def fake_open(p, flags, *a):
        fd = real_open(p, flags, *a)
        names[fd] = os.fspath(p)
        return fd

    def fake_fsync(fd):
        calls.append(("fsync", names.get(fd, "?")))
        real_fsync(fd)

    def fake_replace(a, b):
        calls.append(("replace", f"{os.fspath(a)} -> {os.fspath(b)}"))
        real_replace(a, b)

    monkeypatch.setattr(checkpoints.os, "open", fake_open)
    monkeypatch.setattr(checkpoints.os, "fsync", fake_fsync)
    monkeypatch.setattr(checkpoints.os, "replace", fake_replace)
    store = OffsetStore(path)
    store.set(1, 1, b"a", 1, "p")
    store.flush()
    tmp = f"{path}.tmp"
    assert calls == [("fsync", tmp), ("replace", f"{tmp} -> {path}"), ("fsync", str(tmp_path))]
    assert not Path(tmp).exists()


CRASH_MID_WRITE = """
    import os, signal, sys
    from ftwatch.pipeline.sources import checkpoints
    from ftwatch.pipeline.sources.checkpoints import OffsetStore
    store = OffsetStore(sys.argv[1])
    store.set(1, 1, b"old", 100, "/old")
    store.flush()
    store.set(1, 1, b"old", 200, "/old")
    store.set(1, 2, b"new", 5, "/new")
    # die the hard way between the fsync'd tmp file and the rename
    checkpoints.os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
    store.flush()
    print("not reached")
"""


def test_a_crash_between_tmp_and_replace_keeps_the_previous_offsets(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASH_MID_WRITE), str(path)],
                          cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert b"not reached" not in proc.stdout
    tmp = tmp_path / "offsets.json.tmp"
    assert json.loads(tmp.read_bytes())["files"][0]["offset"] == 200  # the new set was complete, not adopted
    store = OffsetStore(path)
    assert store.get(1, 1, b"old") == 100 and store.get(1, 2, b"new") is None
    store.set(1, 1, b"old", 300, "/old")
    store.flush()  # the stale tmp file is simply overwritten
    assert OffsetStore(path).get(1, 1, b"old") == 300


@pytest.mark.parametrize("content", [
    b"\x00\xff garbage",
    b'{"version": 1, "files": [{"dev": 1, "ino": 2',  # cut off mid-write by something else
    b'{"version": 99, "files": []}',
    b'[1, 2, 3]',
    b'{"version": 1, "files": [{"dev": 1, "ino": 2, "path": "p", "fingerprint": "zz", "offset": 3}]}',
    b'{"version": 1, "files": [{"dev": 1, "ino": 2, "path": "p", "fingerprint": "", "offset": -3}]}',
    b'{"version": 1, "files": [{"dev": "1", "ino": 2, "path": "p", "fingerprint": "", "offset": 3}]}',
    b'{"version": 1, "files": ["x"]}',
])
def test_a_corrupt_file_is_kept_aside_and_the_store_starts_empty(tmp_path: Path, content: bytes,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "offsets.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        store = OffsetStore(path)
    assert store.entries() == []
    assert (tmp_path / "offsets.json.corrupt").read_bytes() == content
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    store.set(1, 1, b"a", 1, "p")
    store.flush()
    assert OffsetStore(path).get(1, 1, b"a") == 1


def test_a_failed_flush_raises_and_is_retried(tmp_path: Path) -> None:
    path = tmp_path / "later" / "offsets.json"
    store = OffsetStore(path)
    path.parent.rmdir()            # the store made it; gone again, flushing fails
    store.set(1, 1, b"a", 1, "p")
    with pytest.raises(OSError):
        store.flush()
    path.parent.mkdir()
    store.flush()  # still dirty: written now
    assert OffsetStore(path).get(1, 1, b"a") == 1


# -- issue 17: the store makes its directory, and commits with delivery ----------------------------

def test_the_store_creates_its_directory_and_fails_at_once_when_it_cannot(tmp_path: Path) -> None:
    path = tmp_path / "state" / "offsets" / "file.json"
    OffsetStore(path).flush()
    assert path.parent.is_dir()
    (tmp_path / "blocked").write_text("a file where the directory should be")
    with pytest.raises(OSError, match="cannot create the offsets directory .*blocked/offsets"):
        OffsetStore(tmp_path / "blocked" / "offsets" / "file.json")


def test_a_prepared_commit_changes_nothing_until_it_is_called(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    store = OffsetStore(path)
    store.set(1, 1, b"a", 1, "p", b"x" * 100)
    store.flush()
    commit = store.prepare(1, 1, b"a", 7, "p", b"m")
    assert OffsetStore(path).get(1, 1, b"a") == 1 and store.get(1, 1, b"a") == 1   # not yet
    assert commit() is True
    again = OffsetStore(path)
    assert again.get(1, 1, b"a") == 7 and store.get(1, 1, b"a") == 7
    assert again.entry(1, 1).mark == b"m"
    assert OffsetStore(tmp_path / "o2.json").entry(1, 1) is None
    assert store.prepare(1, 1, forget=True)() and OffsetStore(path).entries() == []


def test_a_commit_refuses_when_the_store_changed_since_it_was_prepared(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    store = OffsetStore(path)
    commit = store.prepare(1, 1, b"a", 7, "p")
    store.set(2, 2, b"b", 3, "q")          # e.g. stop() saved the state without the batch
    assert commit() is False
    store.flush()
    assert OffsetStore(path).get(1, 1, b"a") is None and OffsetStore(path).get(2, 2, b"b") == 3
    assert OffsetStore(path).entry(2, 2).mark == b""      # no mark recorded: none in the file


# -- the position stored with the consumer's effects (issue 17) ----------------------------------------

def test_a_commit_carries_its_offsets_as_a_position_that_a_restart_adopts_when_newer(tmp_path: Path) -> None:
    """Killed between the consumer's transaction (which stored the position) and the rename: the
    next start takes the stored position, so the batch is not read again."""
    path = tmp_path / "offsets" / "app.json"
    store = OffsetStore(path)
    store.set(1, 1, b"a", 3, "p", b"m")
    store.flush()
    commit = store.prepare(1, 1, b"a", 9, "p", b"n")
    position = commit.position
    assert position.key == "offsets/app.json" and position.seq > 0
    # (killed here: the consumer stored `position`, the rename never happened)
    again = OffsetStore(path)
    assert again.get(1, 1, b"a") == 3
    assert again.adopt(position) is True
    assert again.get(1, 1, b"a") == 9 and again.entry(1, 1).mark == b"n"
    third = OffsetStore(path)                      # written to the file at once
    assert third.get(1, 1, b"a") == 9 and third.adopt(position) is False   # not newer any more
    third.set(1, 1, b"a", 12, "p")
    third.flush()
    assert OffsetStore(path).adopt(position) is False and OffsetStore(path).get(1, 1, b"a") == 12


def test_a_position_older_than_the_file_or_unreadable_is_not_adopted(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "o.json"
    store = OffsetStore(path)
    position = store.prepare(1, 1, b"a", 9, "p").position
    assert position is not None and store.prepare(1, 1, b"a", 10, "p")() is True   # a later batch renamed
    assert OffsetStore(path).adopt(position) is False and OffsetStore(path).get(1, 1, b"a") == 10
    assert OffsetStore(path).adopt(None) is False
    bad = position._replace(seq=10 ** 6, document=b"{not json")
    with caplog.at_level(logging.WARNING):
        assert OffsetStore(path).adopt(bad) is False
    assert "unreadable" in caplog.text and OffsetStore(path).get(1, 1, b"a") == 10


def test_a_file_written_before_the_seq_reads_as_seq_0(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"version": 1, "files": [
        {"dev": 1, "ino": 1, "path": "p", "fingerprint": b"a".hex(), "offset": 4}]}))
    store = OffsetStore(path)
    assert store.get(1, 1, b"a") == 4
    store.set(1, 1, b"a", 5, "p")
    store.flush()
    assert json.loads(path.read_text())["seq"] > 0
