"""Fake Slurm client commands for tests: ``scontrol``, ``scancel`` and ``sinfo`` as small scripts in
a directory put first on PATH. Each records its argv (one JSON list per line in ``calls.jsonl``);
its answers are queued per command and first argument (``respond("scontrol requeue", 1, "...")``),
an empty queue answers exit 0; ``sinfo`` prints ``sinfo.txt``, ``scontrol show hostnames``
``hostnames.txt``. Several agents run them at once, so each takes one file lock around the log
and the queue and replaces the queue's file whole."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCRIPT = """#!{python}
import fcntl, json, os, sys
d = {dir!r}
name = os.path.basename(sys.argv[0])
key = " ".join([name] + sys.argv[1:2]) if name == "scontrol" else name
path = os.path.join(d, "answers.json")
# several agents run these at once: one lock around the log and the answer queue
with open(os.path.join(d, "lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(os.path.join(d, "calls.jsonl"), "a") as f:
        f.write(json.dumps([name] + sys.argv[1:]) + "\\n")
    answers = json.load(open(path)) if os.path.exists(path) else {{}}
    queue = answers.get(key) or []
    status, message = queue.pop(0) if queue else (0, "")
    with open(path + ".new", "w") as f:
        json.dump(answers, f)
    os.replace(path + ".new", path)
if name == "sinfo" and status == 0 and os.path.exists(os.path.join(d, "sinfo.txt")):
    sys.stdout.write(open(os.path.join(d, "sinfo.txt")).read())
if sys.argv[1:3] == ["show", "hostnames"] and status == 0 and os.path.exists(os.path.join(d, "hostnames.txt")):
    sys.stdout.write(open(os.path.join(d, "hostnames.txt")).read())
if message:
    sys.stderr.write(message + "\\n")
sys.exit(status)
"""


class FakeSlurm:
    """The fake commands in ``directory`` (made on construction)."""

    COMMANDS = ("scontrol", "scancel", "sinfo")

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in self.COMMANDS:
            path = self.dir / name
            path.write_text(SCRIPT.format(python=sys.executable, dir=str(self.dir)))
            path.chmod(0o755)
        self.nodes([("gpu-1", "mixed", "Unknown", "none"), ("gpu-2", "idle", "Unknown", "none")])

    def calls(self) -> list[list[str]]:
        """Every command run so far, argv with the command's name first."""
        path = self.dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def writes(self) -> list[list[str]]:
        """The commands that change something (all but sinfo)."""
        return [c for c in self.calls() if c[0] != "sinfo" and c[1:2] != ["show"]]

    def respond(self, key: str, status: int, message: str = "") -> None:
        """Queue one answer of ``key`` (``"scontrol requeue"``, ``"scancel"``, ``"sinfo"``)."""
        path = self.dir / "answers.json"
        answers = json.loads(path.read_text()) if path.exists() else {}
        answers.setdefault(key, []).append([status, message])
        path.write_text(json.dumps(answers))

    def nodes(self, rows: list[tuple[str, str, str, str]]) -> None:
        """What sinfo -N -o '%N|%T|%H|%E' prints: (node, state, reason time, reason) per row."""
        (self.dir / "sinfo.txt").write_text("".join("|".join(r) + "\n" for r in rows))

    def hosts(self, names: list[str]) -> None:
        """What ``scontrol show hostnames LIST`` prints (any LIST): one host name a line."""
        (self.dir / "hostnames.txt").write_text("".join(n + "\n" for n in names))
