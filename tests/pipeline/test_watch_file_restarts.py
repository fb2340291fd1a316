"""`ftwatch watch` with a file source in its DEFAULT configuration survives kill -9 (issue 17).

Nothing is prepared: the state directory is empty, so ``<state-dir>/offsets/`` must be made by
ftwatch itself. A writer appends numbered lines and rotates its file every 2,000 lines (~2 s), by
rename and by copytruncate in turn; ``watch`` is killed with SIGKILL several times, at a random
moment, and restarted. Rotations are 2 s apart, longer than a restart takes: a downtime that
spans two rotations, the second a copytruncate of content ftwatch never saw, is the one case
that loses lines (``ftwatch.pipeline.sources.rotated``). A rule matches every line, so each line seen is one finding row in the
store. At the end every line written is there exactly once: none lost, none repeated.

Waits are for observable conditions (rows in the store, a file appearing), with a deadline.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0

WRITER = """
    import os, shutil, sys, time
    log, stop, count = sys.argv[1:4]
    i, generation = 0, 0
    f = open(log, "ab", buffering=0)
    while not os.path.exists(stop):
        f.write(b"".join(b"tick %08d\\n" % j for j in range(i, i + 10)))
        i += 10
        if i % 2000 == 0:                      # rotate: rename and copytruncate in turn
            generation += 1
            rotated = f"{log}.{generation}"
            if generation % 2:
                f.close()
                os.rename(log, rotated)
                f = open(log, "ab", buffering=0)
            else:
                shutil.copyfile(log, rotated)
                os.truncate(log, 0)            # f has O_APPEND: the next write lands at 0
        time.sleep(0.01)                       # ~1,000 lines/s: a log being written, not copied
    f.close()
    with open(count, "w") as out:
        out.write(str(i))
"""

RULES = """\
rules:
  - id: test.every_line
    keywords: ["tick "]
    class: info
    action: none
    severity: info
"""


def seen(db: Path) -> list[str]:
    """The lines the store holds a finding for, one entry per finding row."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
            return [row[0] for row in conn.execute("SELECT line FROM findings WHERE rule_id = 'test.every_line'")]
    except sqlite3.OperationalError:          # the schema is not there yet
        return []


def wait_for(cond, what: str, must: bool = True) -> bool:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            if must:
                raise AssertionError(f"timed out waiting for {what}")
            return False
        time.sleep(0.01)
    return True


def ranges(numbers: list[int]) -> list[tuple[int, int]]:
    """[1, 2, 3, 7] -> [(1, 3), (7, 7)]: the lost lines, readably."""
    out: list[list[int]] = []
    for n in sorted(numbers):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return [tuple(r) for r in out]


def test_kill_9_of_watch_with_rotation_loses_and_repeats_no_line(tmp_path: Path) -> None:
    logs, state = tmp_path / "logs", tmp_path / "state"
    logs.mkdir()
    log, stop, count = logs / "app.log", tmp_path / "stop", tmp_path / "count"
    log.touch()
    (tmp_path / "rules.yaml").write_text(RULES)
    config = tmp_path / "watch.yaml"
    config.write_text(textwrap.dedent(f"""\
        rules:
          builtin: false
          files: [{tmp_path / "rules.yaml"}]
        watch:
          sources:
            - {{type: file, name: app, paths: ["{log}"]}}
        """))
    db = state / "ftwatch.db"
    procs: list[subprocess.Popen] = []

    def watch() -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-m", "ftwatch", "watch", "--config", str(config),
                                       "--state-dir", str(state)], cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        return procs[-1]

    rng = random.Random(17)
    try:
        child = watch()
        wait_for(lambda: (state / "offsets" / "app.json").exists() or child.poll() is not None,
                 "the offsets file (made in a directory nobody prepared)")
        assert child.poll() is None, child.stderr.read().decode()
        writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(log), str(stop),
                                   str(count)], cwd=ROOT)
        procs.append(writer)
        for _ in range(5):
            before = len(seen(db))
            wait_for(lambda: len(seen(db)) >= before + 600 or child.poll() is not None, "lines seen")
            time.sleep(rng.uniform(0, 0.3))      # kill at a random moment, not just after a commit
            assert child.poll() is None and writer.poll() is None
            child.send_signal(signal.SIGKILL)
            assert child.wait(DEADLINE) == -signal.SIGKILL
            child = watch()
        wait_for(lambda: len(list(logs.glob("app.log.*"))) >= 3, "rename, copytruncate, rename")
        stop.touch()
        assert writer.wait(DEADLINE) == 0
        written = int(count.read_text())
        wait_for(lambda: len(set(seen(db))) >= written or child.poll() is not None, "every line", must=False)
        child.send_signal(signal.SIGTERM)
        assert child.wait(DEADLINE) == 0, child.stderr.read().decode()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = seen(db)
    expected = {f"tick {i:08d}" for i in range(written)}
    assert written >= 6000 and len(list(logs.glob("app.log.*"))) >= 3      # rotated both ways
    lost = expected - set(lines)
    repeated = len(lines) - len(set(lines))
    assert not lost and repeated == 0 and set(lines) == expected, \
        f"{len(lost)} lines lost {ranges([int(x.split()[1]) for x in lost])[:10]}, {repeated} repeated of {written}"


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
