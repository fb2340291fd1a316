"""``ftwatch bootcheck``, ``ftwatch nodecheck`` and ``ftwatch run --network-check`` (SPEC H1, H2).

A hub (it sees the store through ``ftwatch.cli``'s recorder); ``ftwatch.cli`` only registers
these commands and calls :func:`network_check` before a run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ftwatch.config import Config
from ftwatch.health.ftlog import FaultToleranceLog, format_block, verdict
from ftwatch.health.nodecheck import parse_range


def _config(args: argparse.Namespace) -> Config:
    from ftwatch.config import load_config
    config = load_config(args.config) if args.config else Config()
    if args.state_dir:
        config = config.model_copy(update={"storage": config.storage.model_copy(update={"state_dir": Path(args.state_dir)})})
    return config


def _recorder(config: Config) -> Any:
    from ftwatch.clistorage import build_store
    from ftwatch.pipeline.recorder import Recorder
    state = Path(config.storage.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    return Recorder(build_store(config, state), state_dir=state)     # SQLite, and ES when configured


def cmd_bootcheck(argv: list[str]) -> int:
    """Run the Bootcheck once by hand; exit 0 when nothing failed (warnings allowed), else 1."""
    p = argparse.ArgumentParser(prog="ftwatch bootcheck", description="Run the Bootcheck (seed 001) by hand: "
                                "disks, accelerators, versions, all-reduce; appended to the fault-tolerance log.")
    p.add_argument("--config")
    p.add_argument("--state-dir")
    p.add_argument("--nproc-per-node", type=int, help="worker slots for the all-reduce (default: config)")
    p.add_argument("--path", action="append", type=Path, help="a folder to disk-test (repeatable)")
    p.add_argument("--no-allreduce", action="store_true", help="skip the all-reduce check")
    p.add_argument("--job-id", default="bootcheck")
    args = p.parse_args(argv)
    config = _config(args)
    from ftwatch.health.bootcheck import run_checks
    health = config.health
    state = Path(config.storage.state_dir)
    started = time.time()
    results = run_checks(args.path or health.paths or [state], health.disk_test_bytes, health.disk_min_mb_s,
                         args.nproc_per_node or config.supervisor.nproc_range.max,
                         health.allreduce_check and not args.no_allreduce, health.allreduce_bytes,
                         health.check_timeout, health.python, health.min_busbw_gbs)
    outcome = verdict(results)
    ending = "Check Finished." if outcome in ("ok", "warned") else f"Check Finished: {outcome}."
    log = FaultToleranceLog(state, _recorder(config), args.job_id, _host())
    log.write("Bootchecking", started, results, ending, ended=time.time())
    print(format_block("Bootchecking", started, results, ending, time.time()), end="")
    print(f"(appended to {log.path})")
    return 0 if outcome in ("ok", "warned") else 1


def _host() -> str:
    import socket
    return socket.gethostname()


def _run_nodecheck(config: Config, nnodes: int, nproc: int, exclude: bool, min_nodes: int, job: str,
                   name: str = "node", out=None) -> tuple[int, Any]:
    """Run the node check, print and log it; returns (exit status, Outcome)."""
    from ftwatch.health.nodes import LocalNodes, outcome, report_lines, results_of
    out = out or sys.stdout
    started = time.time()
    print(f"ftwatch: node check of {nnodes} {name}s x {nproc} process(es), 2 rounds", file=out, flush=True)
    rounds, found, notes = LocalNodes(nnodes, nproc, config.health.nodecheck, config.health.python).check()
    lines = report_lines(rounds, found, notes, exclude, name)
    result = outcome(found, min_nodes, exclude)
    tail = (f"Check Finished: {len(result.usable)} of {nnodes} {name}s usable {list(result.usable)}"
            + (f", excluded {list(result.excluded)}" if result.excluded else "")
            + ("." if result.can_start else f"; fewer than the {min_nodes} needed."))
    results = results_of(found, exclude, lines)
    FaultToleranceLog(Path(config.storage.state_dir), _recorder(config), job, _host()).write(
        "NodeCheck", started, results, tail)
    for line in lines + [tail]:
        print(line, file=out, flush=True)
    return (0 if result.can_start else 1), result


def cmd_nodecheck(argv: list[str]) -> int:
    """DLRover-style node check on this machine: each node is a worker group (seed 003)."""
    p = argparse.ArgumentParser(prog="ftwatch nodecheck", description="Node check (DLRover --network-check, "
                                "seed 003): timed GEMM + allgather / all-reduce in pairs, two rounds.")
    p.add_argument("--nnodes", default="2", help="nodes (worker groups) to check: N or MIN:MAX (elastic: "
                   "MAX are checked, the check passes when MIN are usable)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1", help="processes per node: N or MIN:MAX "
                   "(MAX are started; a node is judged as a whole)")
    p.add_argument("--exclude-straggler", action="store_true", help="stragglers exit and are excluded")
    p.add_argument("--config")
    p.add_argument("--state-dir")
    p.add_argument("--job-id", default="nodecheck")
    args = p.parse_args(argv)
    try:
        lo, hi = parse_range(args.nnodes)
        _, nproc = parse_range(args.nproc_per_node, "--nproc-per-node")
    except ValueError as exc:
        p.error(str(exc))
    config = _config(args)
    exclude = args.exclude_straggler or config.health.exclude_straggler
    status, _ = _run_nodecheck(config, hi, nproc, exclude, lo, args.job_id)
    return status


def network_check(config: Config, job: str, exclude: bool) -> tuple[int, Config]:
    """``ftwatch run --network-check``: check the worker slots (each a node of one process) before
    the first start; faulty (and, with ``exclude``, straggling) slots are left out. Returns (0, the
    config with the reduced ``nproc_per_node``), or (1, config) when fewer than
    ``health.nodecheck.min_nodes`` (default: the MIN of ``supervisor.nproc_per_node``, all
    slots for a plain N) are usable."""
    slots = config.supervisor.nproc_range          # N or MIN:MAX: MAX slots are checked
    nproc = slots.max
    need = config.health.nodecheck.min_nodes or slots.min
    status, result = _run_nodecheck(config, nproc, 1, exclude, min(need, nproc), job, name="worker slot")
    if status != 0:
        return status, config
    if len(result.usable) != nproc:
        print(f"ftwatch: starting {len(result.usable)} workers instead of {nproc}", flush=True)
    usable = len(result.usable)         # an elastic range keeps its MIN (capped), MAX shrinks
    sup = config.supervisor.model_copy(update={"nproc_per_node": usable if slots.fixed
                                               else f"{min(slots.min, usable)}:{usable}"})
    return 0, config.model_copy(update={"supervisor": sup})
