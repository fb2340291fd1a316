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

from ftwatch.config.model import Config
from ftwatch.config.supervisor import default_devices, hidden_devices, parse_elastic_range
from ftwatch.health.ftlog import FaultToleranceLog, ending, format_block, verdict
from ftwatch.health.nodecheck import parse_range
from ftwatch.cli.common import ArgumentParser


def _config(args: argparse.Namespace) -> Config:
    from ftwatch.config.model import load_config
    config = load_config(args.config) if args.config else Config()
    if args.state_dir:
        config = config.model_copy(update={"storage": config.storage.model_copy(update={"state_dir": Path(args.state_dir)})})
    return config


def _recorder(config: Config) -> Any:
    """A recorder over the configured store (SQLite, and Elasticsearch when configured). The
    caller closes it (an Elasticsearch sink holds its buffer's lock until then): see
    :func:`_write_log`."""
    from ftwatch.pipeline.build import build_store
    from ftwatch.pipeline.recorder import Recorder
    state = Path(config.storage.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    return Recorder(build_store(config, state), state_dir=state)


def _write_log(config: Config, recorder: Any, job: str, kind: str, started: float, results, tail: str) -> Path:
    """Append one block to the fault-tolerance log and the store. ``recorder`` None: a recorder of
    our own, closed after (so that ``ftwatch run --network-check`` can open the store again, the
    Elasticsearch buffer included); else the caller's (left open). Returns the log's path."""
    own = recorder is None
    rec = _recorder(config) if own else recorder
    try:
        log = FaultToleranceLog(Path(config.storage.state_dir), rec, job, _host())
        log.write(kind, started, results, tail, ended=time.time())
        return log.path
    finally:
        if own:
            rec.close()


def cmd_bootcheck(argv: list[str]) -> int:
    """Run the Bootcheck once by hand; exit 0 when nothing failed (warnings allowed), else 1."""
    p = ArgumentParser(prog="ftwatch bootcheck", description="Run the Bootcheck (seed 001) by hand: "
                       "disks, accelerators, versions, all-reduce; appended to the fault-tolerance log.")
    p.add_argument("--config")
    p.add_argument("--state-dir")
    p.add_argument("--nproc-per-node", "--nproc_per_node", help="worker slots for the all-reduce: N or MIN:MAX "
                   "(MAX are checked; default: supervisor.nproc_per_node)")
    p.add_argument("--path", action="append", type=Path, help="a folder to disk-test (repeatable); it must exist")
    p.add_argument("--no-allreduce", action="store_true", help="skip the all-reduce check")
    p.add_argument("--job-id", default="bootcheck")
    args = p.parse_args(argv)
    try:
        nproc = parse_elastic_range(args.nproc_per_node).max if args.nproc_per_node else None
    except ValueError as exc:
        p.error(f"--nproc-per-node: {exc}")
    config = _config(args)
    from ftwatch.health.bootcheck import run_checks
    health = config.health
    state = Path(config.storage.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    nproc = nproc or config.supervisor.nproc_range.max
    devices = config.supervisor.devices or (None if hidden_devices() else default_devices(nproc))
    started = time.time()
    results = run_checks(args.path or health.paths or [state], health.disk_test_bytes, health.disk_min_mb_s,
                         nproc, health.allreduce_check and not args.no_allreduce, health.allreduce_bytes,
                         health.check_timeout, health.python, health.min_busbw_gbs,
                         devices[:nproc] if devices else None, health.gpu_in_use)
    outcome = verdict(results)
    tail = ending(outcome)
    path = _write_log(config, None, args.job_id, "Bootchecking", started, results, tail)
    print(format_block("Bootchecking", started, results, tail, time.time()), end="")
    print(f"(appended to {path})")
    return 0 if outcome in ("ok", "warned") else 1


def _host() -> str:
    import socket
    return socket.gethostname()


def _run_nodecheck(config: Config, nnodes: int, nproc: int, exclude: bool, min_nodes: int, job: str,
                   name: str = "node", out=None, devices: list[str] | None = None) -> tuple[int, Any]:
    """Run the node check, print and log it; returns (exit status, Outcome).

    Args:
        devices: one device per node (``nproc`` 1: the worker slots of ``ftwatch run``): node
            ``n``'s agent sees only ``devices[n]``. None: agent ``p`` of node ``n`` uses device
            ``n * nproc + p`` (modulo what it sees), so that a node keeps its devices in both rounds.
    """
    from ftwatch.health.bootcheck import device_env
    from ftwatch.health.nodes import LocalNodes, outcome, report_lines, results_of
    out = out or sys.stdout
    started = time.time()
    print(f"ftwatch: node check of {nnodes} {name}s x {nproc} process(es), 2 rounds", file=out, flush=True)
    nodes = LocalNodes(nnodes, nproc, config.health.nodecheck, config.health.python)
    for n, agents in nodes.agents.items():
        for p, agent in enumerate(agents):
            agent.env = device_env(devices[n] if devices else None, n * nproc + p)
    rounds, found, notes = nodes.check()
    lines = report_lines(rounds, found, notes, exclude, name)
    result = outcome(found, min_nodes, exclude)
    tail = (f"Check Finished: {len(result.usable)} of {nnodes} {name}s usable {list(result.usable)}"
            + (f", excluded {list(result.excluded)}" if result.excluded else "")
            + ("." if result.can_start else f"; fewer than the {min_nodes} needed."))
    results = results_of(found, exclude, lines)
    _write_log(config, None, job, "NodeCheck", started, results, tail)
    for line in lines + [tail]:
        print(line, file=out, flush=True)
    return (0 if result.can_start else 1), result


def cmd_nodecheck(argv: list[str]) -> int:
    """DLRover-style node check on this machine: each node is a worker group (seed 003)."""
    p = ArgumentParser(prog="ftwatch nodecheck", description="Node check (DLRover --network-check, "
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
    """``ftwatch run --network-check``: check the worker slots (each a node of one process, on its
    own device) before the first start; the devices of faulty (and, with ``exclude``, straggling)
    slots are isolated in the job's slots store (``ftwatch.pipeline.actuators.slots.Slots``,
    ``<state_dir>/isolation/<job>.json``), which the run then continues from, so that no later
    start uses them.

    Returns:
        (0, the config with ``supervisor.devices`` set to every device the job may use (the
        slots then take the first MAX healthy ones: a spare past MAX, not checked, may fill an
        excluded slot) and, where fewer than MIN are left (``min_nodes`` below MIN allowed it),
        ``nproc_per_node`` lowered to what is left), or (1, config) when fewer than ``health.nodecheck.min_nodes`` (default: the MIN of
        ``supervisor.nproc_per_node``, all slots for a plain N) are usable.
    """
    from ftwatch.pipeline.actuators.slots import Slots
    sup = config.supervisor
    slots = Slots.for_job(config.storage.state_dir, job, sup.nproc_range, sup.devices)
    active = list(slots.active)          # devices already isolated for this job are not checked
    rng = sup.nproc_range
    need = config.health.nodecheck.min_nodes or rng.min
    nproc = len(active)
    status, result = _run_nodecheck(config, nproc, 1, exclude, min(need, nproc), job, name="worker slot",
                                    devices=active if slots.checked is not None else None)
    for slot in result.excluded:
        slots.isolate(active[slot], rank=slot, rule="health.nodecheck", time=time.time(), attempt=0,
                      line=f"network check: worker slot {slot} excluded")
    if status != 0:
        slots.close("failed")             # the job does not start: a later run starts afresh
        return status, config
    count = min(rng.max, len(slots.healthy))     # a spare device (past MAX) may fill an excluded slot
    if count != nproc:
        print(f"ftwatch: starting {count} workers instead of {nproc}; {slots.describe()}", flush=True)
    update: dict[str, Any] = {"devices": list(slots.devices)}
    if count < rng.min:                # allowed by health.nodecheck.min_nodes: start with what is left
        update["nproc_per_node"] = count
    return 0, config.model_copy(update={"supervisor": sup.model_copy(update=update)})
