"""The one place a Config becomes components: the rules, the engine with its step tap (compiled
once), the policy, the store (SQLite, plus Elasticsearch when configured), the recorder with its
event center and receivers. A hub: it wires every stage together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftwatch.errors import ConfigError, RuleError


def build_rules(config, *, hyperscan: bool = True):
    """The built-in packs (unless ``rules.builtin`` is off), the rule files, and the retryable
    keywords as rules. ``hyperscan``: ``load_rules``' (False: an engine's compile checks the
    rule files' patterns on Hyperscan). Raises RuleError naming file:line."""
    from ftwatch.rules.loader import load_rules, rules_from_keywords
    rules = load_rules(config.rules.files, builtin=config.rules.builtin, hyperscan=hyperscan)
    if config.rules.retryable_errors:
        rules += rules_from_keywords(list(config.rules.retryable_errors))
    return rules


def build_engine(config, rules=None, say=None, like=None):
    """The rule engine of ``run``, ``watch``, ``replay`` and ``evaluate``, its database compiled
    once, with the step-line tap (H3 stragglers) when ``health.straggler`` is on.

    Args:
        config: the Config.
        rules: the rules, when already loaded (``evaluate`` shares them between cases); default
            :func:`build_rules`.
        say: where the tap also tells each straggler it finds (``run``: the terminal), or None.
        like: an engine to share the compiled database with when its rules and step patterns
            are the same (``evaluate``: one compile for every case; ``Engine``'s ``like``).

    Raises:
        RuleError: a rule file is bad (file:line). Rules loaded here are compiled once, by the
            engine (``load_rules``' ``hyperscan``); a pattern it rejects has the rule files
            loaded again with the check, so each problem is named at its own line.
    """
    from ftwatch.rules.engine import Engine
    steps = None
    straggler = config.health.straggler
    if straggler.enabled:
        if say is not None:
            from ftwatch.health.runhook import SayingStepTracker
            steps = SayingStepTracker(straggler, say, max_ranks=config.limits.max_instances_per_job)
        else:
            from ftwatch.rules.stragglers import StepTracker
            steps = StepTracker(straggler, max_ranks=config.limits.max_instances_per_job)
    if rules is not None:
        return Engine(rules, steps=steps, like=like)
    try:
        return Engine(build_rules(config, hyperscan=False), steps=steps, like=like)
    except RuleError as exc:
        rejected = exc
    build_rules(config)                 # the files' own check: every problem at its own line
    raise rejected                      # none in the files (a built-in pack's): the engine's


def build_policy(config, job: str, budgets=None, state_dir: Path | None = None, in_memory: bool = False):
    """The one place a job's Policy is made: the AIMaster flags, ModelArts and the recovery
    settings of ``config``.

    Args:
        config: the Config.
        job: the job id.
        budgets: the job's BudgetStore; default ``BudgetStore.for_job`` under the state dir.
        state_dir: where budgets, chip-fault history and node blame live; default
            ``config.storage.state_dir``.
        in_memory: the chip-fault history and node blame stay in memory (``replay``,
            ``evaluate``: a replay never counts against the real jobs).
    """
    from ftwatch.policy.budgets import BudgetStore
    from ftwatch.policy.policy import Policy
    state = Path(state_dir if state_dir is not None else config.storage.state_dir)
    if budgets is None:
        budgets = BudgetStore.for_job(state, job)
    return Policy.for_config(config, budgets, job, state_dir=state, in_memory=in_memory)


def build_store(config: Any, state_dir: Path) -> Any:
    """The store the recorder writes to: the SQLite store, fanned out to Elasticsearch when
    ``storage.elasticsearch`` is set (its background flusher started).

    Raises:
        ConfigError: the Elasticsearch buffer directory cannot be used (e.g. another ftwatch
            holds it).
    """
    from ftwatch.pipeline.sinks.downsample import OutputDownsampler
    from ftwatch.pipeline.sinks.retention import JobRetention
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    metrics, keep = config.storage.metrics, config.storage.sqlite_retention
    downsample = (OutputDownsampler(metrics.output_full_window, metrics.coarse_bucket)
                  if metrics.output_full_window is not None else None)
    sqlite = SqliteStore(Path(config.storage.sqlite) if config.storage.sqlite else state_dir / "ftwatch.db",
                         downsample, JobRetention(keep) if keep is not None else None)
    es_cfg = config.storage.elasticsearch
    if es_cfg is None:
        return sqlite
    from ftwatch.pipeline.sinks.elasticsearch.sink import ElasticsearchSink
    from ftwatch.pipeline.sinks.fanout import FanOut
    from ftwatch.errors import SinkError
    try:
        sink = ElasticsearchSink.from_config(es_cfg, state_dir)
    except SinkError as exc:
        sqlite.close()
        raise ConfigError(f"storage.elasticsearch: {exc}") from None
    sink.start(es_cfg.flush_interval)
    return FanOut(sqlite, [sink])

def build_recorder(config, state_dir: Path, decisions_file: Path | None, out=None):
    """The Recorder of a run or watch: the store (SQLite, plus Elasticsearch when configured),
    the decisions file, and the alert path: the event center (``alerting.dispatch``) in front of
    the sender (``alerting.notify``: receivers, rate limits, spool, one delivery thread per
    receiver). Alerts an earlier run spooled or left waiting in a group are sent now."""
    from ftwatch.alerting.dispatch import EventCenter
    from ftwatch.alerting.notifiers import build_notifiers
    from ftwatch.alerting.notify import Sender
    from ftwatch.alerting.ratelimit import RateLimiter
    from ftwatch.alerting.rendering import TemplateRenderer
    from ftwatch.alerting.spool import Spool
    from ftwatch.clock import SystemClock
    from ftwatch.pipeline.recorder import Recorder
    state_dir.mkdir(parents=True, exist_ok=True)
    store = build_store(config, state_dir)
    alerting = config.alerting
    now = SystemClock().time
    notifiers = build_notifiers(alerting.receivers, out=out)
    limiter = RateLimiter.from_config(alerting.rate_limits, {n.name: n.kind for n in notifiers}, now(),
                                      state_dir / "ratelimit.json")
    renderer = TemplateRenderer(alerting.language, {k: Path(v) for k, v in alerting.templates.items()})
    sender = Sender(notifiers, renderer, Spool(state_dir / "spool"), limiter=limiter,
                    background=True, language=alerting.language)   # deciding and acting never wait on a receiver (N4)
    center = EventCenter(alerting, sender, now, state_dir, config.limits)
    recorder = Recorder(store, decisions_file, center, out=out, state_dir=state_dir,
                        resolve_after=resolve_after_of(config),
                        output_bucket=config.storage.metrics.output_bucket,
                        link_url=alerting.link_url, max_kept=config.limits.max_kept_decisions,
                        max_origins=config.limits.max_tracked_instances)
    if config.storage.mining.enabled:        # catch-all evidence -> signatures (ftwatch mine)
        from ftwatch.mining.miner import Miner
        recorder.miner = Miner.in_state_dir(state_dir, new_jobs=config.storage.mining.new_signature_jobs)
    sender.resend_pending()                  # alerts spooled by an earlier run, to the workers
    center.recover()                         # alerts an earlier run left waiting in a group
    recorder.collect()
    return recorder

def mine_catch_alls(recorder, engine):
    """Tell the recorder's miner (if any) which of ``engine``'s rules are catch-alls (tagged
    ``catch_all``), from the rules the engine already loaded. Returns ``engine``."""
    if getattr(recorder, "miner", None) is not None:
        from ftwatch.mining.miner import catch_all_ids
        recorder.miner.catch_all = catch_all_ids(engine.rules)
    return engine


def resolve_after_of(config) -> float:
    """Seconds without a new incident before open alerts resolve: the smallest ``resolve_after``
    of the Alertmanager receivers, else the recorder's default (300)."""
    from ftwatch.pipeline.recorder import RESOLVE_AFTER
    values = [r.resolve_after for r in config.alerting.receivers if r.type == "alertmanager"]
    return min(values, default=RESOLVE_AFTER)

def build_run(config, command, job: str, recorder, *, engine=None, out=None, clock=None, supervisor=None,
              control=None, node: str | None = None, kernel=None, bus_ids=None, cluster=None, echo: bool = True):
    """The run loop of ``ftwatch run`` with every collaborator it drives, built once here.

    The MindCluster section is first translated into the policy (M4: a recovering strategy enables
    restarts, ``max_restarts`` is the budget). Then: the job's budgets, slots (A1) and policy
    under ``storage.state_dir``, the incident desk (its hang tracker: Sync only), the SDK's
    control socket and its handler, the supervisor (one worker per active slot), the health hooks
    (H1, H3; the engine's step tap), the scene and the local actuator.

    Args:
        config: the validated config.
        command: the training command (argv), run once per worker.
        job: the job id.
        recorder: where decisions, findings and events go.
        engine: the rule engine; None: :func:`build_engine` (its step tap tells the terminal).
        out: where worker output is echoed (default stdout).
        echo: echo the workers' output at all (``--quiet``: not).
        clock: default the system clock; tests give a FakeClock.
        supervisor, control: default the real ``Supervisor`` and ``ControlServer``; tests give
            fakes (``ftwatch.testing.FakeSupervisor``, ``FakeControl``).
        node: this machine's name (default: the host name).
        kernel: this host's kernel log, opened (``ftwatch.pipeline.sources.hostlog.open_kernel_log``),
            or None: its lines are host evidence of ``node`` for the job.
        bus_ids: PCI bus id -> the names of that GPU (``hostlog.gpu_bus_ids``), so that a kernel
            line naming a GPU is tied to the job's slot on it; None: none known.
        cluster: a multi-node job's agent (``ftwatch.pipeline.cluster.agent.ClusterAgent``): bound
            to the run loop, with the job's desk it decides through should it lead (the job's
            own budgets, ``<job>@cluster``), or None for a job on this machine.

    Returns:
        A ``JobRunner`` over its incident desk (``ftwatch.pipeline.incidents``); ``run()`` it.

    Raises:
        ConfigError: fewer devices than MIN, a device listed twice, a corrupt state file;
            ``supervisor.actuator: slurm`` outside a Slurm job or without scontrol.
        RuleError: a rule file that does not load (engine None).
    """
    import socket

    from ftwatch.clock import SystemClock
    from ftwatch.config.mindcluster import policy_overrides
    from ftwatch.health.runhook import HealthChecks
    from ftwatch.pipeline.actuators.local import LocalActuator
    from ftwatch.pipeline.actuators.recovery import RecoveryHandler
    from ftwatch.pipeline.actuators.scene import Scene
    from ftwatch.pipeline.actuators.slots import Slots
    from ftwatch.pipeline.incidents import IncidentDesk
    from ftwatch.pipeline.run import JobRunner, RunParts
    from ftwatch.pipeline.sources.control import ControlServer
    from ftwatch.pipeline.sources.orphans import WorkerRecord
    from ftwatch.pipeline.sources.supervisor import Supervisor
    from ftwatch.policy.budgets import BudgetStore
    from ftwatch.rules.loader import rules_from_keywords

    if policy_overrides(config.mindcluster):           # M3 translated into the policy (M4)
        config = config.with_policy(**policy_overrides(config.mindcluster))
    mc, sup, pol = config.mindcluster, config.supervisor, config.policy
    clock = clock or SystemClock()
    node = node or socket.gethostname()
    engine = mine_catch_alls(recorder, engine if engine is not None else build_engine(config, say=recorder.say))
    state_dir = Path(config.storage.state_dir)
    budgets = BudgetStore.for_job(state_dir, job)
    policy = build_policy(config, job, budgets)
    slots = Slots.for_job(state_dir, job, sup.nproc_range, sup.devices)
    sync = pol.job_execution_mode == "Sync"
    hang = float(pol.job_hang_interval) if pol.enable_job_hang_detection and sync else None
    # the job's incident desk: engine, hang tracker (from the policy), findings, incidents
    desk = IncidentDesk(job, engine, policy, recorder, exits=True, settle=sup.settle_max if sync else 0.0,
                        summaries="exit")
    from ftwatch.policy.lifecycle import launcher_of_command, reports_own_status
    launcher = launcher_of_command(command)     # `dlrover-run ...`: DLRover's private exit codes apply
    desk.own_status = reports_own_status(command)   # `python ...`, `torchrun ...`: no pipe hides an exit
    if launcher is not None:
        desk.launchers.add(launcher)
    controls = RecoveryHandler(
        engine, desk.tracker, recorder, job, rules_from_keywords, hang, hang_supported=hang is not None,
        budgets=lambda: (budgets.restarts_used, max(0, policy.max_restarts - budgets.restarts_used)),
        node=node, clock=clock.time)
    if control is None:
        control = ControlServer(state_dir)          # the SDK's socket (ftwatch.sdk), started by run()
    if supervisor is None:
        env = control.env()
        if mc.has("dump"):
            env["FTWATCH_DUMP_SIGNAL"] = mc.dump_signal
        supervisor = Supervisor(list(command), max(1, slots.nproc), job=job, node=node,
                                grace_period=sup.grace_period, master_addr=sup.master_addr,
                                master_port=sup.master_port, env=env,
                                record=WorkerRecord(state_dir, recorder.say))   # the next start reaps orphans
    health = HealthChecks(config, recorder, job, node, slots.nproc, slots.checked, steps=engine.steps)  # H1, H3
    scene = Scene()
    actuator = LocalActuator(supervisor, control, controls, slots, scene, recorder, clock, job=job, mindcluster=mc,
                             restart_delay=sup.restart_delay, keep_scene_seconds=sup.keep_scene_seconds,
                             state_dir=config.storage.state_dir)
    scheduler = None
    if sup.actuator == "slurm":                        # decisions for the whole job go to Slurm (README "Slurm")
        from ftwatch.pipeline.actuators.slurm import SlurmActuator
        scheduler = SlurmActuator.for_run(config.slurm, clock=clock,
                                          log=lambda line: recorder.say(f"ftwatch: slurm {line}"))
        if cluster is not None:                        # several nodes: the leader tells Slurm, once
            from ftwatch.pipeline.cluster.handover import JobHandOver
            scheduler = JobHandOver(cluster, scheduler)
    parts = RunParts(supervisor, control, controls, desk, policy, budgets, slots, health, scene, actuator, clock,
                     kernel, node, bus_ids or {}, scheduler, cluster)
    runner = JobRunner(config, command, parts, recorder, job, out=out, echo=echo)
    if cluster is not None:
        cluster.bind(runner, lambda: IncidentDesk(
            job, engine, build_policy(config, job, BudgetStore.for_job(state_dir, f"{job}@cluster")),
            recorder, exits=True))
    return runner
