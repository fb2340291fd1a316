"""``ftwatch run``: supervise a training job on this machine."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ftwatch.cli.common import (EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_USAGE, ArgumentParser, aimaster_epilog, job_id_for,
                                load_config_from_args, split_flags)
from ftwatch.errors import ConfigError, Issue
from ftwatch.pipeline.build import build_recorder, build_run


def cmd_run(argv: list[str]) -> int:
    """``ftwatch run``: supervise a training job on this machine (exit status: the job's outcome)."""
    argv, torchrun_style = torchrun_argv(argv)
    flags, rest, command = split_flags(argv)
    p = ArgumentParser(prog="ftwatch run", description="Supervise a training job on this machine.",
                       epilog=aimaster_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--aimaster-args", help="AIMaster flags as one string")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node",
                   help="workers to start: N or MIN:MAX (default: config, else 1)")
    p.add_argument("--state-dir", help="where the SQLite store, budgets and spool live")
    p.add_argument("--decisions-file", type=Path, help="append each decision as a JSON line")
    p.add_argument("--job-id", help="job id (default: derived from the command and directory)")
    p.add_argument("--grace-period", type=float, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any free one)")
    p.add_argument("--kernel-log", type=Path, metavar="PATH",
                   help="this host's kernel log, tailed from its end (default: /dev/kmsg or journalctl -k "
                        "when readable): its lines are evidence about this node (Xid 79 isolates it)")
    add_run_flags(p)
    p.add_argument("--actuator", choices=("local", "slurm"),
                   help="who carries out restart_job, isolate_node, fail_job: the local workers (default) or "
                        "Slurm (requeue, drain, scancel; inside an sbatch script; README \"Slurm\")")
    add_cluster_flags(p)
    p.add_argument("--network-check", action="store_true", help="node check of the worker slots first (H2)")
    p.add_argument("--exclude-straggler", action="store_true", help="with --network-check: leave stragglers out")
    args = p.parse_args(rest)
    if not command:
        p.error("give the training command after -- (or, as with torchrun, the script and its arguments)")
    if torchrun_style:                    # torchrun's way: python SCRIPT, python -m MODULE, or as is
        command = (command if args.no_python else [sys.executable, "-m", *command] if args.module
                   else [sys.executable, *command])
    unusable = _unusable(command[0])
    if unusable is not None:
        status, why = unusable
        print(f"ftwatch run: {command[0]}: {why}", file=sys.stderr)
        return status
    config = apply_run_flags(load_config_from_args(args, flags), args)
    try:                                  # inside a Slurm step, what the flags leave out comes from Slurm
        cluster_config = cluster_from_args(args, os.environ, lambda nodes: hostnames(config.slurm.scontrol, nodes))
    except ValueError as exc:
        p.error(str(exc))
    if cluster_config is not None and args.max_restarts and "enable_job_restart" not in flags:
        config = config.with_policy(enable_job_restart=True)   # torchrun's --max-restarts N restarts
    if args.state_dir:
        config = config.model_copy(update={"storage": config.storage.model_copy(update={"state_dir": args.state_dir})})
    from ftwatch.telemetry import start_metrics
    state_dir = Path(config.storage.state_dir)
    run_id = cluster_config.run_id if cluster_config is not None and cluster_config.run_id != "none" else None
    job = job_id_for(args.job_id or config.job.id or run_id, command)   # --rdzv-id names the job on every node
    from ftwatch.pipeline.sources.orphans import reap     # workers a killed ftwatch left running here
    reap(state_dir, config.supervisor.grace_period, lambda text: print(text, flush=True))
    if (args.network_check or config.health.network_check) and cluster_config is None:
        from ftwatch.cli.health import network_check
        status, config = network_check(config, job, args.exclude_straggler or config.health.exclude_straggler)
        if status:
            return status
    cluster = None
    if cluster_config is not None:       # this node's agent: the store, the node id (before any output)
        from ftwatch.pipeline.cluster.agent import connect
        try:
            cluster = connect(cluster_config, job, lambda text: print(text, flush=True), network_check=bool(
                args.network_check or config.health.network_check), exclude_straggler=bool(
                args.exclude_straggler or config.health.exclude_straggler), nodecheck=config.health.nodecheck)
        except (RuntimeError, TimeoutError) as exc:    # no torch, or no store answered
            print(f"ftwatch run: multi-node: {exc}", file=sys.stderr)
            return 1
    from ftwatch.pipeline.sources.hostlog import gpu_bus_ids, open_kernel_log
    try:                       # from its end, before the workers start: their time is what counts
        kernel, said = open_kernel_log(args.kernel_log)
    except OSError as e:
        print(f"ftwatch run: --kernel-log {args.kernel_log}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    recorder = build_recorder(config, state_dir, args.decisions_file)
    metrics = recorder.metrics = start_metrics(config.storage, args.metrics_port, state_dir, recorder.say)
    recorder.say(f"ftwatch: {said}")
    try:
        runner = build_run(config, command, job, recorder, kernel=kernel,
                           bus_ids=gpu_bus_ids() if kernel is not None else None, cluster=cluster)
    except BaseException:
        if kernel is not None:
            kernel.close()
        if cluster is not None:
            cluster.close(1)
        raise
    status = 1
    try:
        status = runner.run()
    finally:
        if cluster is not None:
            cluster.close(status)
        recorder.close()           # waiting alert groups sent (or spooled), then the store closed (ES flushed)
        if metrics is not None:
            metrics.close()
    _summary(runner, recorder, status, state_dir)
    return status

def _unusable(program: str) -> tuple[int, str] | None:
    """Why the workers could not start ``program`` (exit status, words), or None when they can:
    looked up as the workers' exec will (``PATH`` for a bare name; they share ftwatch's directory)."""
    if os.sep not in program:
        return None if shutil.which(program) else (EXIT_NOT_FOUND, "command not found")
    if not os.path.exists(program):
        return EXIT_NOT_FOUND, "no such file"
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        return EXIT_CANNOT_EXECUTE, "not executable"
    return None

def _summary(runner, recorder, status: int, state_dir: Path) -> None:
    """The short summary printed when ``ftwatch run`` ends."""
    from ftwatch.events import Action
    stats = runner.engine.stats
    actions = [d.action.label for d in recorder.decisions]
    verdict = "REQUEUED" if runner.requeued else {0: "SUCCEEDED", 130: "INTERRUPTED"}.get(status, "FAILED")
    recorder.say("")
    recorder.say("ftwatch summary")
    recorder.say(f"  job        {runner.job}: {verdict} (exit {status})")
    recorder.say(f"  attempts   {runner.budgets.attempt + 1} (this job, across ftwatch restarts)")
    recorder.say(f"  decisions  {', '.join(actions) or 'none'}")
    recorder.say(f"  lines      {stats.lines} scanned, {recorder.finding_count} findings")
    recorder.say(f"  store      {recorder.store.path if recorder.store else '-'}")
    acted = [d for d in recorder.decisions if d.action is not Action.NONE] or recorder.decisions
    if acted:
        recorder.say(f"  explain    {recorder.link(acted[-1])}")


# -- the recovery flags (MindCluster's, torchrun's spellings, keep-scene) ---------------------------

def add_run_flags(p: argparse.ArgumentParser) -> None:
    """``ftwatch run`` flags for recovery: MindCluster's (torchrun spellings too) and keep-scene."""
    p.add_argument("--recover-strategy", help="MindCluster recover-strategy, e.g. recover-in-place,dump")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int,
                   help="torchrun/MindCluster restart budget")
    p.add_argument("--monitor-interval", "--monitor_interval", dest="monitor_interval", type=float,
                   help="seconds between checks of the workers")
    p.add_argument("--keep-scene", dest="keep_scene", type=float, metavar="SECONDS",
                   help="on a final failure keep the workers for SECONDS and print how to attach")


_FLAG = {"recover_strategy": "--recover-strategy", "max_restarts": "--max-restarts",
         "monitor_interval": "--monitor-interval", "nproc_per_node": "--nproc-per-node",
         "grace_period": "--grace-period", "keep_scene_seconds": "--keep-scene"}


def apply_run_flags(config: Any, args: argparse.Namespace) -> Any:
    """The config with the flags of ``add_run_flags`` (and ``--nproc-per-node``,
    ``--grace-period``) applied and validated.

    Raises:
        ConfigError: a bad value, naming the flag (file ``<argv>``).
    """
    mc = {k: v for k, v in (("recover_strategy", args.recover_strategy), ("max_restarts", args.max_restarts),
                            ("monitor_interval", args.monitor_interval)) if v is not None}
    sup = {k: v for k, v in (("nproc_per_node", getattr(args, "nproc_per_node", None)),
                             ("grace_period", getattr(args, "grace_period", None)),
                             ("keep_scene_seconds", args.keep_scene),
                             ("actuator", getattr(args, "actuator", None))) if v is not None}
    updates, issues = {}, []
    for section, overrides in (("mindcluster", mc), ("supervisor", sup)):
        if overrides:
            model = getattr(config, section)
            try:
                updates[section] = type(model).model_validate(model.model_dump() | overrides)
            except ValidationError as exc:
                issues += [Issue("<argv>", 0, f"{_FLAG.get(str(e['loc'][0]), e['loc'][0])}: "
                                              f"{e['msg'].removeprefix('Value error, ')}") for e in exc.errors()]
    if issues:
        raise ConfigError(issues)
    return config.model_copy(update=updates) if updates else config


# -- torchrun's multi-node flags (ftwatch.pipeline.cluster) ----------------------------------------

_BARE = frozenset({"--standalone", "--network-check", "--exclude-straggler", "--no-python", "--no_python",
                   "-m", "--module"})


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """torchrun's flags for a job over several nodes (both spellings), and its script form."""
    p.add_argument("--nnodes", help="nodes: N or MIN:MAX (torchrun; elastic within MIN:MAX)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, help="this node's rank (static)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", help="node rank 0's address")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int,
                   help="the agents' store port on --master-addr (default 29500)")
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", help="c10d (PyTorch's TCPStore)")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", help="HOST[:PORT] of the store")
    p.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", help="the job's rendezvous id")
    p.add_argument("--rdzv-conf", "--rdzv_conf", dest="rdzv_conf", default="",
                   help="KEY=VALUE,...: last_call_timeout, heartbeat, node_timeout (seconds)")
    p.add_argument("--local-addr", "--local_addr", dest="local_addr", help="this node's address for the others")
    p.add_argument("--standalone", action="store_true", help="one node, a local store (torchrun)")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run the script as is, not with python (torchrun)")
    p.add_argument("-m", "--module", action="store_true", help="run the script as python -m (torchrun)")


def torchrun_argv(argv: list[str]) -> tuple[list[str], bool]:
    """torchrun's form ``[flags] SCRIPT [ARGS]`` as ftwatch's ``[flags] -- SCRIPT [ARGS]``;
    (argv, whether it was torchrun's form). A flag takes the next word as its value unless it
    is written ``--flag=value`` or is a bare one (``--standalone``, ``--network-check`` ...)."""
    if "--" in argv:
        return argv, False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            return argv[:i] + ["--"] + argv[i:], True
        i += 1 if "=" in arg or arg in _BARE else 2
    return argv, False


_CONF = {"last_call_timeout": "last_call", "heartbeat": "heartbeat", "node_timeout": "lost_after",
         "settle": "settle"}


def hostnames(scontrol: str, nodelist: str) -> list[str]:
    """Slurm's node list (``gpu-[1-2],cpu-3``) as host names: ``scontrol show hostnames`` (a
    plain name or comma list needs no scontrol).

    Raises:
        ValueError: scontrol is missing or failed (its message).
    """
    import subprocess
    if "[" not in nodelist:
        return [h for h in nodelist.split(",") if h]
    try:
        proc = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"{scontrol} show hostnames {nodelist}: {exc}; give --rdzv-endpoint HOST:PORT") from None
    if proc.returncode != 0:
        raise ValueError(f"{scontrol} show hostnames {nodelist}: {(proc.stderr or proc.stdout).strip()}; "
                         f"give --rdzv-endpoint HOST:PORT")
    return proc.stdout.split()


def cluster_from_args(args: argparse.Namespace, env=None, expand=None):
    """The multi-node settings (``ftwatch.config.cluster``) from the flags, or None for one node.

    Args:
        args: the parsed flags.
        env: the environment: inside a Slurm job, the flags not given come from it
            (``config.cluster.slurm_flags``); None: none read.
        expand: a Slurm node list -> its host names (:func:`hostnames` with the configured scontrol).

    Raises:
        ValueError: a bad flag value (the message names the flag), or a Slurm environment that
            does not give the job's endpoint.
    """
    from ftwatch.config.cluster import cluster_from_flags, slurm_flags
    timing = {}
    for item in filter(None, args.rdzv_conf.split(",")):
        key, _, value = item.partition("=")
        if key.strip() not in _CONF:
            continue                      # torchrun's other keys (join_timeout, ...): not used here
        try:
            timing[_CONF[key.strip()]] = float(value)
        except ValueError:
            raise ValueError(f"--rdzv-conf {item}: not a number of seconds") from None
    given = {"node_rank": args.node_rank, "master_addr": args.master_addr, "master_port": args.master_port,
             "rdzv_id": args.rdzv_id}
    if env is not None and not args.standalone:
        given.update(slurm_flags(env, expand or (lambda nodes: hostnames("scontrol", nodes)), nnodes=args.nnodes,
                                 rdzv_endpoint=args.rdzv_endpoint, **given))
    return cluster_from_flags(nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint,
                              rdzv_backend=args.rdzv_backend, standalone=args.standalone,
                              local_addr=args.local_addr, **given, **timing)
