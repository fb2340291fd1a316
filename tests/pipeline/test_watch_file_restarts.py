"""`ftwatch watch` with a file source in its DEFAULT configuration survives kill -9 (issue 17).

The cycle itself (a writer rotating by rename and copytruncate, five SIGKILLs at random moments,
every line matched by a rule so each line seen is one finding row) lives in
``bench/soak/rotation.py``, which ``make soak`` runs at a larger scale: its module doc says what
it does and why it loses nothing. At the end every line written is there exactly once.

Random moments rarely hit the narrow windows of a batch's delivery, so each is also hit on
purpose: a ``watch`` process SIGKILLs itself at one point of the protocol (a hook wrapped
around the function that marks it), is restarted over rotated files and killed there again,
and a last ``watch`` must then hold every line exactly once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))       # bench/ is beside the package, not in it

from bench.soak.rotation import DEADLINE, RULES, kill_cycles, seen, wait_for, watch_config  # noqa: E402


def test_kill_9_of_watch_with_rotation_loses_and_repeats_no_line(tmp_path: Path) -> None:
    outcome = kill_cycles(tmp_path, kills=5)
    assert outcome.exit_status == 0, outcome.stderr
    assert outcome.written >= 6000 and outcome.rotated >= 3      # rotated both ways
    expected = {f"tick {i:08d}" for i in range(outcome.written)}
    assert not outcome.lost and set(outcome.lines) == expected, outcome.describe()
    # A kill -9 between the store's commit of a batch's findings and the batch's ack once repeated
    # that batch (250 lines in a fresh-clone run); the offsets are now stored in that transaction
    # (file_tail's docstring, "Delivery"), and the kill at exactly that point is tested below.
    assert outcome.repeated == 0, outcome.describe()


def test_watch_fails_at_start_in_one_line_when_it_cannot_keep_offsets(tmp_path: Path) -> None:
    """Before issue 17 every pass warned "cannot save offsets" and a restart lost its place."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "offsets").write_text("a file where the offsets directory should be")
    config = tmp_path / "watch.yaml"
    config.write_text(f'watch:\n  sources:\n    - {{type: file, name: app, paths: ["{tmp_path / "*.log"}"]}}\n')
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "watch", "--config", str(config), "--state-dir",
                           str(state)], cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE)
    assert proc.returncode == 1                            # a file that could not be used (README)
    assert proc.stderr.splitlines() == [
        f"ftwatch watch: file source app: cannot create the offsets directory {state / 'offsets'}: File exists"]


def test_the_watcher_stores_a_batchs_position_in_the_transaction_of_its_findings(tmp_path: Path) -> None:
    """In process: the position comes back from the store with the findings, and a batch whose
    handling fails (as a kill would end it) leaves neither."""
    import io

    from ftwatch.config.model import Config
    from ftwatch.events import Origin
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    from ftwatch.pipeline.sources.base import Position, Shipped, ShippedBatch
    from ftwatch.pipeline.sources.batches import positions_of
    from ftwatch.pipeline.watch import Watcher
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.loader import rules_from_text

    store = SqliteStore(tmp_path / "ftwatch.db")
    recorder = Recorder(store, out=io.StringIO(), resolve_after=None)
    origin = Origin("w0", 0, "j", "n0", "stdout", "file")
    watcher = Watcher(Config.model_validate({"storage": {"state_dir": str(tmp_path)}}),
                      Engine(rules_from_text(RULES, "rules.yaml", [])), recorder,
                      lambda batch: [(origin, s.line, s.time) for s in batch])
    first = ShippedBatch([Shipped(1.0, b"tick 00000000")], position=Position("offsets/app.json", 3, b"{}"))
    watcher.ingest(first)
    assert first.acked and store.positions() == {"offsets/app.json": (3, b"{}")}
    failing = ShippedBatch([Shipped(2.0, b"tick 00000001")], position=Position("offsets/app.json", 4, b"{}"))
    watcher._ingest_jobs = lambda *a: (recorder.findings(watcher.engine.feed(origin, b"tick 00000001\n", 2.0)),
                                       1 / 0)
    with pytest.raises(ZeroDivisionError):
        watcher.ingest(failing)
    assert not failing.acked and store.positions() == {"offsets/app.json": (3, b"{}")}
    assert [f["line"] for f in store.findings_for("j")] == ["tick 00000000"]
    parts = [ShippedBatch([Shipped(3.0, b"x")], position=Position("offsets/app.json", 5, b"a")),
             ShippedBatch([Shipped(3.0, b"y")], position=Position("offsets/sys.json", 1, b"s")), [Shipped(3.0, b"z")]]
    merged = type("Merged", (list,), {})(s for part in parts for s in part)   # batches taken together
    merged.batches = parts
    assert positions_of(merged) == [parts[0].position, parts[1].position]


# -- a kill at each point of a batch's delivery ---------------------------------------------------------

# Runs ``ftwatch watch`` (argv[2:]) with a hook that SIGKILLs the process at one point (argv[1]) the
# first time a batch of lines passes it:
#   prepared     the tail wrote the offsets after the batch aside (<offsets>.next), before queueing it
#   in_store     the batch's findings and position are written in the store's open transaction
#   stored       the store committed that transaction; the batch is not acknowledged yet (the window
#                that once repeated a batch)
#   renamed      the ack renamed <offsets>.next over the offsets file; the tail has not noted it yet
ARMED = """
import os, signal, sys
point, argv = sys.argv[1], sys.argv[2:]

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "prepared":
    from ftwatch.pipeline.sources.checkpoints import OffsetStore
    prepare = OffsetStore.prepare
    def hooked(self, *a, **k):
        prepare(self, *a, **k)
        kill()
    OffsetStore.prepare = hooked
elif point == "in_store":
    from ftwatch.pipeline.sinks.base import SourcePosition
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    write = SqliteStore.write
    def hooked(self, batch):
        write(self, batch)
        if any(isinstance(r, SourcePosition) for r in batch):
            kill()
    SqliteStore.write = hooked
elif point == "stored":
    from ftwatch.pipeline.sources.base import ShippedBatch
    ack = ShippedBatch.ack
    def hooked(self):
        if self.position is not None:
            kill()
        ack(self)
    ShippedBatch.ack = hooked
elif point == "renamed":
    from ftwatch.pipeline.sources.checkpoints import Commit
    commit = Commit.__call__
    def hooked(self):
        commit(self)
        kill()
    Commit.__call__ = hooked
else:
    raise SystemExit(f"no such point {point}")
from ftwatch.cli import main
sys.exit(main(argv))
"""


def _watch_until(args: list[str], done) -> None:
    """Runs ``ftwatch`` ``args`` until ``done()`` holds (or it exits), then SIGTERMs it: it must end
    with status 0."""
    child = subprocess.Popen([sys.executable, "-m", "ftwatch", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: done() or child.poll() is not None, "every line", must=False)
        time.sleep(0.3)                            # a repeat would come with the batch it repeats
        child.send_signal(signal.SIGTERM)
        assert child.wait(DEADLINE) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()


def _append(path: Path, first: int, count: int) -> int:
    with open(path, "ab") as f:
        f.write(b"".join(b"tick %08d\n" % i for i in range(first, first + count)))
    return first + count


class _Tail:
    """``watch`` (its default config, ``read_from_head``) on ``<tmp>/logs/app.log``, killed at a point or run to the end."""

    def __init__(self, tmp_path: Path, glob: str = "app.log"):
        self.logs, state = tmp_path / "logs", tmp_path / "state"
        self.logs.mkdir()
        self.log = self.logs / "app.log"
        self.args = ["watch", "--config", str(watch_config(tmp_path, self.logs / glob, "read_from_head: true")),
                     "--state-dir", str(state)]
        self.db = state / "ftwatch.db"

    def killed_at(self, point: str) -> None:
        proc = subprocess.run([sys.executable, "-c", ARMED, point, *self.args], cwd=ROOT, capture_output=True,
                              text=True, timeout=DEADLINE)
        assert proc.returncode == -signal.SIGKILL, proc.stderr

    def every_line_read(self, written: int) -> None:
        _watch_until(self.args, lambda: len(set(seen(self.db))) >= written)
        lines = seen(self.db)
        expected = [f"tick {i:08d}" for i in range(written)]
        assert sorted(set(lines)) == expected, f"{len(set(expected) - set(lines))} lines lost"
        assert len(lines) == len(expected), f"{len(lines) - len(expected)} lines repeated"


@pytest.mark.parametrize("point", ["prepared", "in_store", "stored", "renamed"])
def test_a_kill_at_each_point_of_a_batchs_delivery_loses_and_repeats_no_line(tmp_path: Path, point: str) -> None:
    """Killed at ``point`` in its first batch, three times: with lines waiting, over a rename
    rotation, over a copytruncate; a restart in between reads all. (A copytruncate is only done
    after some of the file was delivered: of a file nothing of which was delivered, a copy cannot
    be recognised, ``ftwatch.pipeline.sources.rotated``.)"""
    tail = _Tail(tmp_path)
    log, logs = tail.log, tail.logs
    written = _append(log, 0, 200)
    tail.killed_at(point)                          # in its first batch
    written = _append(log, written, 200)           # then rotated by rename while down
    os.rename(log, logs / "app.log.1")
    written = _append(log, written, 200)
    tail.killed_at(point)
    tail.every_line_read(written)
    written = _append(log, written, 100)           # then by copytruncate while down
    shutil.copyfile(log, logs / "app.log.2")
    os.truncate(log, 0)
    written = _append(log, written, 200)
    tail.killed_at(point)
    written = _append(log, written, 100)
    tail.every_line_read(written)


@pytest.mark.parametrize("grown, glob", [(False, "app.log"), (True, "app.log"), (True, "app.log*")])
def test_a_file_copytruncated_then_renamed_while_watch_is_down_loses_no_line(tmp_path: Path, grown: bool,
                                                                             glob: str) -> None:
    """The kill -9 soak once lost "2050 lines [(3950, 5999)]" on a loaded machine: watch, killed
    50 lines before a copytruncate, took longer to restart than the 2 s to the next rotation, a
    rename. The saved file was then found by its inode beside its path but with other content,
    taken for a reused inode and forgotten: the 50 lines in its copy and all the file got after
    the truncation were never read. It is now salvaged from its copy and read from its head.
    ``grown``: the file had grown past the saved offset again when renamed (as in the soak);
    ``glob`` ``app.log*``: the rotated file and the copy are found by the scan (the copy, not
    recognised, was read from its head: its lines twice)."""
    tail = _Tail(tmp_path, glob)
    log, logs = tail.log, tail.logs
    written = _append(log, 0, 200)
    tail.killed_at("renamed")                      # the first batch delivered and its offsets current
    written = _append(log, written, 50)            # unread when the file is copied and truncated
    shutil.copyfile(log, logs / "app.log.2")
    os.truncate(log, 0)
    written = _append(log, written, 300 if grown else 100)
    os.rename(log, logs / "app.log.3")             # then rotated by rename, all while down
    written = _append(log, written, 10)
    tail.every_line_read(written)


CRASH_RULE = """\
  - id: test.frame
    keywords: ["in train_step"]
    class: user_code
    action: none
    severity: error
"""
HEAD = (b'Traceback (most recent call last):\n  File "train.py", line 9, in train_step\n'
        b'    loss = step(batch)\n')
TAIL = b"RuntimeError: boom\n"


def test_a_traceback_open_when_its_batch_is_stored_survives_a_kill(tmp_path: Path) -> None:
    """Issue 17: a block still open when its batch commits (a traceback whose exception line has
    not come) was only in memory, while the stored position had passed its lines: a kill lost it,
    and the finding of a rule that hit one of its frames never came. The open blocks are now
    stored in the batch's transaction and reopened at start; killed again in the batch that
    closes the block, the finding is still stored once."""
    import json
    import sqlite3

    logs, state = tmp_path / "logs", tmp_path / "state"
    logs.mkdir()
    log = logs / "app.log"
    config = watch_config(tmp_path, log, "read_from_head: true")
    (tmp_path / "rules.yaml").write_text(RULES + CRASH_RULE)
    args = ["watch", "--config", str(config), "--state-dir", str(state)]
    db = state / "ftwatch.db"

    def killed_when_stored() -> None:
        proc = subprocess.run([sys.executable, "-c", ARMED, "stored", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=DEADLINE)
        assert proc.returncode == -signal.SIGKILL, proc.stderr

    def frames() -> list[list[str]]:
        with sqlite3.connect(db) as conn:
            return [json.loads(e) for (e,) in conn.execute("SELECT evidence FROM findings WHERE rule_id = 'test.frame'")]

    _append(log, 0, 50)
    with open(log, "ab") as f:
        f.write(HEAD)                              # the batch ends inside the traceback
    killed_when_stored()
    assert frames() == [] and len(seen(db)) == 50
    with open(log, "ab") as f:
        f.write(TAIL)
    _append(log, 50, 10)
    killed_when_stored()                           # the batch that closes the block
    _append(log, 60, 1)                            # seen once the next watch runs
    _watch_until(args, lambda: len(seen(db)) >= 61)
    assert frames() == [(HEAD + TAIL).decode().splitlines()]
    assert sorted(seen(db)) == [f"tick {i:08d}" for i in range(61)]


def test_a_stale_block_closed_at_a_tick_is_stored_with_its_closing(tmp_path: Path) -> None:
    """In process (FakeClock): the open block is stored with its batch; a tick that closes it as
    stale stores its finding and drops its row in one transaction (a tick whose store write fails,
    as a kill would end it, leaves both as they were, so the restart closes it once); a restart
    reopens a stored block and the next line completes it."""
    import io

    from ftwatch.clock import FakeClock
    from ftwatch.config.model import Config
    from ftwatch.errors import SinkError
    from ftwatch.events import Origin
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.sinks.base import OpenBlocks
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    from ftwatch.pipeline.sources.base import Shipped
    from ftwatch.pipeline.watch import Watcher
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.loader import rules_from_text

    origin = Origin("w0", 0, "j", "n0", "/logs/app.log", "file")

    def watcher(store: SqliteStore, clock: FakeClock) -> Watcher:
        w = Watcher(Config.model_validate({"storage": {"state_dir": str(tmp_path)}}),
                    Engine(rules_from_text(RULES + CRASH_RULE, "rules.yaml", [])),
                    Recorder(store, out=io.StringIO(), resolve_after=None),
                    lambda batch: [(origin, s.line, s.time) for s in batch], clock=clock)
        w.restore_blocks(store.open_blocks())
        return w

    def frames(store: SqliteStore) -> list:
        return [f["evidence"] for f in store.findings_for("j") if f["rule_id"] == "test.frame"]

    clock = FakeClock()
    store = SqliteStore(tmp_path / "ftwatch.db")
    w = watcher(store, clock)
    w.ingest([Shipped(clock.time(), line) for line in HEAD.splitlines()])
    assert [o for o, *_ in store.open_blocks()] == [origin] and frames(store) == []
    clock.advance(5)
    write = store.write

    def killed_at_the_closing(batch):             # the finding is written, then the process dies
        if any(isinstance(r, OpenBlocks) for r in batch):
            raise SinkError("killed")
        write(batch)

    store.write = killed_at_the_closing
    with pytest.raises(SinkError):
        w.tick()
    store.write = write
    assert [o for o, *_ in store.open_blocks()] == [origin] and frames(store) == []

    clock = FakeClock(clock.time())                # the restart: the block is open again
    w = watcher(store, clock)
    w.ingest([Shipped(clock.time(), TAIL.rstrip(b"\n"))])
    assert store.open_blocks() == []
    assert frames(store) == [(HEAD + TAIL).decode().splitlines()]
    clock.advance(5)
    w.tick()
    assert len(frames(store)) == 1
