"""Soak part 2 (and tests/pipeline/test_watch_file_restarts.py): ``kill -9`` of ``ftwatch watch``
following a file under rotation, in its DEFAULT configuration.

Nothing is prepared: the state directory is empty, so ``<state-dir>/offsets/`` must be made by
ftwatch itself. A writer appends numbered lines and rotates its file every 2,000 lines (~2 s), by
rename and by copytruncate in turn; ``watch`` is killed with SIGKILL several times, at a random
moment, and restarted. Rotations are 2 s apart; on a loaded machine a restart can take longer
(restart gaps of 2-5 s were measured with CPU burners beside it), so a downtime may span a
rotation or two: a copytruncate and the rename after it are handled (that downtime once lost
"2050 lines [(3950, 5999)]", tests/pipeline/test_watch_file_restarts.py). What cannot be handled
is a copytruncate of a file none of whose lines was delivered (its copy cannot be recognised,
``ftwatch.pipeline.sources.rotated``; fluent-bit has the same limit): a downtime from just after
a rename over the next copytruncate lost "2000 lines [(2000, 3999)]", the whole file. So the
writer does a copytruncate only once the store holds the file's first line (rename rotations
need no such wait); the kills stay at random moments. A rule matches every line, so each line
seen is one finding row in the store: lost = written - distinct rows, repeated = rows - distinct.

Waits are for observable conditions (rows in the store, a file appearing), with a deadline.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from bench.soak.common import Figure, say, scale, zero

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0

WRITER = """
    import os, shutil, sqlite3, sys, time
    log, stop, count, db = sys.argv[1:5]

    def delivered(line):                       # watch stored it (with the file's offset past it)
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
                return conn.execute("SELECT 1 FROM findings WHERE line = ? LIMIT 1",
                                    (f"tick {line:08d}",)).fetchone() is not None
        except sqlite3.Error:
            return False

    i, generation, first = 0, 0, 0             # first: the first line the file holds now
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
            else:                              # not before some of the file was delivered (doc)
                deadline = time.monotonic() + 60
                while not delivered(first) and time.monotonic() < deadline:
                    time.sleep(0.01)
                shutil.copyfile(log, rotated)
                os.truncate(log, 0)            # f has O_APPEND: the next write lands at 0
            first = i
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


def watch_config(tmp: Path, log: Path, source: str = "") -> Path:
    """Writes ``tmp/rules.yaml`` (:data:`RULES` alone) and ``tmp/watch.yaml``: one file source
    ``app`` on ``log`` (``source``: more of its keys, YAML flow items). Returns the config's path."""
    (tmp / "rules.yaml").write_text(RULES)
    config = tmp / "watch.yaml"
    config.write_text(textwrap.dedent(f"""\
        rules:
          builtin: false
          files: [{tmp / "rules.yaml"}]
        watch:
          sources:
            - {{type: file, name: app, paths: ["{log}"]{", " + source if source else ""}}}
        """))
    return config


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
    """Poll ``cond`` until it holds; past DEADLINE s raise AssertionError (``must``) or return False."""
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


@dataclass(frozen=True)
class Outcome:
    """What a kill cycle run left.

    Attributes:
        written: lines the writer wrote (``tick 00000000`` .. ``tick <written-1>``).
        lines: the line of each finding row in the store, repeats included.
        rotated: rotated files left beside the log.
        kills: SIGKILLs of ``watch``.
        exit_status: the last ``watch``'s exit status at SIGTERM.
        stderr: the last ``watch``'s stderr.
        gaps: seconds from each SIGKILL to the first new row of the restarted ``watch`` (a gap
            longer than the 2 s between rotations can span two of them).
    """

    written: int
    lines: list[str]
    rotated: int
    kills: int
    exit_status: int | None
    stderr: str
    gaps: tuple[float, ...] = ()

    @property
    def lost(self) -> set[str]:
        return {f"tick {i:08d}" for i in range(self.written)} - set(self.lines)

    @property
    def repeated(self) -> int:
        return len(self.lines) - len(set(self.lines))

    def describe(self) -> str:
        """The counts, and the first lost ranges, in one line."""
        lost = ranges([int(x.split()[1]) for x in self.lost])[:10]
        return f"{len(self.lost)} lines lost {lost}, {self.repeated} repeated of {self.written}"


def kill_cycles(tmp: Path, kills: int = 5, seed: int = 17, lines_between: int = 600) -> Outcome:
    """Runs the writer and ``watch``, SIGKILLs ``watch`` ``kills`` times, and collects the store.

    Args:
        tmp: a fresh directory (logs, state, config go there).
        kills: SIGKILL-and-restart cycles.
        seed: the random kill moments.
        lines_between: new finding rows to wait for before each kill.

    Raises:
        AssertionError: a wait ran past DEADLINE, or ``watch`` or the writer died on its own.
    """
    logs, state = tmp / "logs", tmp / "state"
    logs.mkdir(parents=True)
    log, stop, count = logs / "app.log", tmp / "stop", tmp / "count"
    log.touch()
    config = watch_config(tmp, log)
    db = state / "ftwatch.db"
    procs: list[subprocess.Popen] = []

    def watch() -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-m", "ftwatch", "watch", "--config", str(config),
                                       "--state-dir", str(state)], cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        return procs[-1]

    rng = random.Random(seed)
    gaps: list[float] = []
    killed: list[tuple[float, int]] = []        # (monotonic time, rows) of the kill not yet followed by a row

    def rows() -> int:
        n = len(seen(db))
        if killed and n > killed[0][1]:
            gaps.append(time.monotonic() - killed.pop()[0])
        return n

    try:
        child = watch()
        wait_for(lambda: (state / "offsets" / "app.json").exists() or child.poll() is not None,
                 "the offsets file (made in a directory nobody prepared)")
        assert child.poll() is None, child.stderr.read().decode()
        writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(log), str(stop),
                                   str(count), str(db)], cwd=ROOT)
        procs.append(writer)
        for _ in range(kills):
            before = rows()
            wait_for(lambda: rows() >= before + lines_between or child.poll() is not None, "lines seen")
            time.sleep(rng.uniform(0, 0.3))      # kill at a random moment, not just after a commit
            assert child.poll() is None and writer.poll() is None, "watch or the writer died on its own"
            child.send_signal(signal.SIGKILL)
            assert child.wait(DEADLINE) == -signal.SIGKILL
            killed.append((time.monotonic(), len(seen(db))))
            child = watch()
        wait_for(lambda: len(list(logs.glob("app.log.*"))) >= 3, "rename, copytruncate, rename")
        stop.touch()
        assert writer.wait(DEADLINE) == 0
        written = int(count.read_text())
        wait_for(lambda: rows() and len(set(seen(db))) >= written or child.poll() is not None, "every line",
                 must=False)
        child.send_signal(signal.SIGTERM)
        status = child.wait(DEADLINE)
        stderr = child.stderr.read().decode(errors="replace")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stderr is not None:
                p.stderr.close()
    return Outcome(written, seen(db), len(list(logs.glob("app.log.*"))), kills, status, stderr, tuple(gaps))


def run(tmp: Path, kills: int | None = None) -> list[Figure]:
    """Soak part 2 in ``tmp`` (``kills`` SIGKILLs, default 5 x SOAK_SCALE); returns its figures."""
    kills = kills or max(1, round(5 * scale()))
    say(f"file tails: kill -9 of watch x{kills} under rotation (rename and copytruncate)")
    outcome = kill_cycles(tmp, kills=kills)
    return [zero("file tails kill -9: lines lost", len(outcome.lost),
                 f"{outcome.describe()}; {outcome.rotated} rotations, {kills} kills; restart gaps "
                 f"{', '.join(f'{g:.1f}' for g in outcome.gaps)} s (rotations ~2 s apart)"),
            zero("file tails kill -9: lines duplicated", outcome.repeated),
            Figure("file tails kill -9: exit status at SIGTERM", outcome.exit_status, "0", outcome.exit_status == 0,
                   outcome.stderr[-300:] if outcome.exit_status else "")]
