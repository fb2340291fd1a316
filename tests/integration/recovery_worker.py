"""A small worker for the recovery tests (no torch: quick to start on a shared CPU).

``RW_MODE`` picks the behaviour; ``RW_DIR`` is where it leaves files the test reads:

- ``xid``: the worker whose slot holds a device listed in ``RW_BAD_DEVICES`` (default ``1``), or
  whose LOCAL_RANK is ``RW_BAD_SLOT``, prints a kernel Xid 79 line and exits 1; the others print
  their environment and exit 0.
- ``dump``: every worker (but rank ``RW_NO_DUMP_RANK``) installs ``Monitor.on_dump`` (last words
  into ``RW_DIR``); rank 1 exits 1 after a moment, the others wait to be stopped.
- ``scene``: rank 1 fails with a KeyError (user code: fail_job), the others keep running.
- ``hang``: rank 1 SIGSTOPs itself, the others wait silently (a job hang).
- ``retry``: every worker registers ``Monitor.on_retry`` and reports steps; rank 1 prints a
  retryable fault once; the job finishes at step 30.
- ``inplace``: rank 1 SIGKILLs itself on its first start; the others run 4 s; all exit 0.
- ``quiet``: every worker says one line, is silent ``RW_QUIET`` seconds (default 4), says ``done``
  and exits 0 (a hang that ends by itself).
- ``c4d``: in the first attempt rank 0 prints a C4D Warn, then a C4D Error naming rank 1; every
  worker waits to be stopped. In later attempts all exit 0 after a moment.
- ``once``: rank 1 exits 1 in the first attempt (marker file in ``RW_DIR``); then all exit 0.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from ftwatch.sdk import Monitor

MODE = os.environ.get("RW_MODE", "")
RANK = int(os.environ.get("RANK", "0"))
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
OUT = Path(os.environ.get("RW_DIR", "."))
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, GPU has fallen off the bus."


def say(text: str) -> None:
    print(text, flush=True)


def _shared_deadline(quiet: float) -> float:
    """The wall time every worker of this attempt ends its silence at: the first worker to get here
    writes it (now + ``quiet``), the others read it, so a busy machine's start skew between the
    workers does not make a second silence after the first worker's ``done``."""
    path = OUT / "quiet-deadline"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        for _ in range(200):                 # the writer is between open and write
            text = path.read_text().strip()
            if text:
                return float(text)
            time.sleep(0.01)
        return time.time() + quiet
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{time.time() + quiet}\n")
    return float(path.read_text())


def main() -> int:
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    say(f"rank {RANK} pid {os.getpid()} world {os.environ.get('WORLD_SIZE')} devices "
        f"{os.environ.get('CUDA_VISIBLE_DEVICES')} start {os.environ.get('MA_PROC_START_CNT')} "
        f"sched {os.environ.get('MA_SCHEDULE_CNT')}")
    if MODE == "xid":
        bad = os.environ.get("RW_BAD_DEVICES", "1").split(",")
        time.sleep(0.3)
        if (LOCAL < len(devices) and devices[LOCAL] in bad) or os.environ.get("RW_BAD_SLOT") == str(LOCAL):
            say(XID.format(pid=os.getpid()))
            return 1
        return 0
    if MODE == "dump":
        monitor = Monitor()

        def last_words() -> str:
            path = OUT / f"last-words-rank{RANK}.txt"
            path.write_text(f"rank {RANK} saved at {time.time()}\n")
            return str(path)

        if os.environ.get("RW_NO_DUMP_RANK") != str(RANK):
            monitor.on_dump(last_words)
        if RANK == 1:
            time.sleep(0.5)
            say("rank 1 giving up")
            return 1
        return _wait(60)
    if MODE == "scene":
        if RANK == 1:
            time.sleep(0.3)
            config = {"lr": 0.1}
            return config["warmup_steps"]
        return _wait(60)
    if MODE == "hang":
        if RANK == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        return _wait(60)
    if MODE == "retry":
        return _retry()
    if MODE == "inplace":
        if RANK == 1 and os.environ.get("MA_PROC_START_CNT") == "1":
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(4.0 if RANK != 1 else 0.5)
        return 0
    if MODE == "quiet":
        time.sleep(max(0.0, _shared_deadline(float(os.environ.get("RW_QUIET", "4"))) - time.time()))
        say(f"rank {RANK} done")
        return 0
    if MODE == "c4d":
        marker = OUT / "c4d-printed"
        if marker.exists():
            time.sleep(0.5)
            return 0
        if RANK == 0:
            time.sleep(0.3)
            say("[C4D] Warn RankCommHang rank=1 node=c4d-node-1 duration=12s times=1")
            time.sleep(1.5)
            marker.write_text("")
            say("[C4D] Error RankCommHang rank=1 node=c4d-node-1 times=18")
        return _wait(60)
    if MODE == "once":
        marker = OUT / "failed-once"
        if RANK == 1 and not marker.exists():
            marker.write_text("")
            time.sleep(0.3)
            say("rank 1 giving up")
            return 1
        time.sleep(0.5)
        return 0
    raise SystemExit(f"unknown RW_MODE {MODE!r}")


def _wait(seconds: float) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
    return 0


def _retry() -> int:
    monitor = Monitor()
    recovered = []

    def recover(notice: dict) -> bool:
        say(f"rank {RANK} recovering in place from {notice['rule']}")
        (OUT / f"retry-rank{RANK}.txt").write_text(notice["id"])
        recovered.append(notice["id"])
        return True

    if not monitor.on_retry(recover).ok():
        say("on_retry failed")
        return 3
    step = 0
    while step < 30:
        if recovered or step < 5 or RANK != 1:
            step += 1
        if RANK == 1 and step == 5 and not recovered and not (OUT / "faulted").exists():
            (OUT / "faulted").write_text("")
            say("ERROR transient link flap detected on port 2")
        monitor.report_step(step)
        time.sleep(0.1)
    say(f"rank {RANK} finished at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
