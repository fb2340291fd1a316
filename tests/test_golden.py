"""Golden replays: real multi-rank logs recorded here (torchrun + the example trainer, paths
scrubbed), and on a GPU machine (``gpu_*``: ``tools/gpu_capture.sh`` with examples/train_gpu.py, real
NCCL and CUDA output) -> the decision `ftwatch replay --json` must print and the alerts it sends
(tests/golden/<case>/expected.json).

Every driver decides through the one incident core (``ftwatch.pipeline.incidents``), so each
scenario is also fed to ``watch`` (its lines as shipped records, a FakeClock, then the input's
end), to ``replay`` and to ``evaluate`` in-process, and to ``run``'s loop with scripted workers
(:func:`decide_by_run`), and the decisions must be the same.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from ftwatch.alerting.notify import Sender
from ftwatch.alerting.rendering import TemplateRenderer
from ftwatch.alerting.spool import Spool
from ftwatch.cli.evaluate import Case, CaseSpec, Expected, run_case
from ftwatch.config.health import HealthConfig
from ftwatch.config.model import Config, parse_aimaster_flags
from ftwatch.config.supervisor import SupervisorConfig
from ftwatch.events import Decision
from ftwatch.parsers.fields import clean, parse_timestamp, split_rank_prefix
from ftwatch.parsers.torchelastic import parse_summary
from ftwatch.pipeline.build import build_engine, build_policy, build_run
from ftwatch.pipeline.recorder import Recorder
from ftwatch.pipeline.replay import origin_for, replay
from ftwatch.pipeline.sources.base import Shipped
from ftwatch.pipeline.watch import Watcher
from ftwatch.policy.budgets import BudgetStore
from ftwatch.testing import (T0, CaptureNotifier, CaptureSink, Exit, FakeClock, FakeControl, FakeSupervisor, Say,
                             script_of)

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p for p in GOLDEN.iterdir() if (p / "expected.json").exists())
JOB = "golden"


def expected_of(case: Path) -> dict:
    return json.loads((case / "expected.json").read_text())


def logs_of(case: Path) -> list[Path]:
    return sorted(p for p in case.iterdir() if p.suffix in (".log", ".out", ".err"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden_replay(case: Path):
    """The recorded logs replay to the expected action and root cause."""
    expected = expected_of(case)
    logs = [str(p) for p in logs_of(case)]
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "replay", "--json", *expected["flags"], *logs],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    decision = json.loads(proc.stdout.strip().splitlines()[-1])
    assert decision["action"] == expected["action"], decision
    rc = decision["root_cause"]
    if expected["rule_id"] is None:
        assert rc is None
    else:
        assert rc["rule_id"] == expected["rule_id"], rc
        assert rank_ok(expected, rc["rank"]), rc
        assert rc["failure_class"] == expected["failure_class"], rc


def rank_ok(expected: dict, rank: int | None) -> bool:
    """``rank`` is the expected root-cause rank; a list in ``expected.json`` names ranks that failed
    alike at the same moment (each reports the same error), any of which may be named."""
    want = expected["rank"]
    return rank in want if isinstance(want, list) else rank == want


# --- through the Recorder: the alerts, and every driver -------------------------------------------

class Verdict(NamedTuple):
    """What the drivers must agree on: the action, the root cause's rule and rank, the target."""

    action: str
    rule: str | None
    rank: int | None
    target: tuple | None


def verdict(d: Decision | None) -> Verdict:
    """A decision as compared; no decision at all (``watch`` of a clean job) reads as ``none``."""
    if d is None:
        return Verdict("none", None, None, None)
    rc = d.root_cause
    t = d.target
    # the target: its rank, and whether it names an instance and a node (their names are each
    # driver's own: run's worker-0 on this host, replay's rank0 on "replay")
    return Verdict(d.action.label, rc.rule_id if rc else None, rc.rank if rc else None,
                   (t.rank, t.instance is not None, t.node is not None) if d.action.label != "none" else None)


def config_of(case: Path, tmp_path: Path) -> Config:
    flags, unknown = parse_aimaster_flags(expected_of(case)["flags"])
    assert not unknown
    return Config.model_validate({"storage": {"state_dir": str(tmp_path / "state")}}).with_policy(**flags)


def capture(tmp_path: Path, name: str) -> tuple[Recorder, CaptureSink, CaptureNotifier]:
    """A Recorder over capture doubles: a sink that keeps what is stored, a receiver that keeps
    what is sent (synchronous delivery)."""
    sink, notifier = CaptureSink(), CaptureNotifier()
    dispatcher = Sender([notifier], TemplateRenderer("en"), Spool(tmp_path / f"spool-{name}"))
    return Recorder(sink, None, dispatcher, out=io.StringIO()), sink, notifier


def decide_by_replay(case: Path, tmp_path: Path, recorder: Recorder | None = None) -> Decision:
    config = config_of(case, tmp_path)
    policy = build_policy(config, JOB, BudgetStore(tmp_path / "budgets-replay.json", JOB), state_dir=tmp_path,
                          in_memory=True)
    return replay(logs_of(case), build_engine(config), policy, JOB, recorder=recorder).decision


def decide_by_watch(case: Path, tmp_path: Path) -> Decision | None:
    """Each file's lines as shipped records (origin as replay names it), at one FakeClock time,
    then the end of the input (``watch`` on stdin at EOF). The clock starts at the first stamp the
    logs carry (as ftwatch reads it), if any: a shipper sends lines as they are written, so their
    shipped time and their own stamps agree (a recorded NCCL WARN line's stamp is days from the
    clock's default start)."""
    config = config_of(case, tmp_path)
    recorder, _, _ = capture(tmp_path, "watch")
    clock = FakeClock(first_stamp(case) or T0)
    watcher = Watcher(config, build_engine(config), recorder,
                      lambda batch: ((s.meta["origin"], s.line, s.time) for s in batch), clock=clock)
    for path in logs_of(case):
        origin = origin_for(path, JOB)
        watcher.ingest([Shipped(clock.time(), line, {"origin": origin}) for line in path.read_bytes().splitlines()])
        watcher.tick()
    watcher.close()
    assert len(recorder.decisions) <= 1, recorder.decisions
    return recorder.decisions[0] if recorder.decisions else None


def first_stamp(case: Path) -> float | None:
    """The first time of day a line of the case's logs carries, in epoch seconds (None: none)."""
    for path in logs_of(case):
        for raw in path.read_bytes().splitlines():
            at = parse_timestamp(clean(raw), None)
            if at is not None:
                return at
    return None


def decide_by_evaluate(case: Path, tmp_path: Path) -> Verdict:
    """``ftwatch evaluate``'s run of the scenario as a corpus case (it reports no target)."""
    exp = expected_of(case)
    spec = CaseSpec(id=case.name, title=case.name, source="tests/golden", software="pytorch", conclusion="-",
                    expected=Expected(action=exp["action"], failure_class=exp["failure_class"] or "none"),
                    flags=exp["flags"])
    out = run_case(Case(spec, case, tuple(logs_of(case))), build_engine(Config()).rules)
    return Verdict(out.action, out.rule, out.rank, None)


def worker_script(case: Path) -> tuple[int, dict[tuple[int, int], list]]:
    """The scenario as ``ftwatch run``'s workers would have played it: (world size, the script
    of each rank's first start; later starts end well).

    Each line goes to the worker of its rank (a per-rank file's rank, else its rank prefix),
    in file order, on the file's stream; torchrun's own lines (no rank: its banner, its failure
    summary) are not a worker's, since under ``run`` ftwatch is the launcher. A rank's exit is
    the one the torchelastic summary names; without a summary, a rank whose output ends in a
    traceback exits 1 and the others 0. A rank the summary says torchrun stopped (SIGTERM)
    runs until ftwatch stops it.
    """
    lines: dict[int, list[tuple[str, str]]] = {}
    text: list[str] = []
    for path in logs_of(case):
        stream = "stderr" if path.suffix == ".err" else "stdout"
        file_rank = origin_for(path, JOB).rank
        for raw in path.read_bytes().splitlines():
            line = clean(raw)
            text.append(line)
            rank = file_rank if file_rank is not None else split_rank_prefix(line)[0]
            if rank is not None:
                lines.setdefault(rank, []).append((line, stream))
    if not lines:
        pytest.skip("no line names its rank (one node's log of a multi-node job): under ftwatch run "
                    "every line comes from a worker whose rank is known, so there is no run to compare")
    failures = {f.rank: f.exitcode for f in parse_summary(text)}
    script = {}
    for rank, said in lines.items():
        steps = [Say(0.001 * (n + 1), line, stream) for n, (line, stream) in enumerate(said)]
        end = 0.001 * (len(said) + 1) + 0.5
        code = failures.get(rank, 1 if not failures and "Traceback" in "".join(t for t, _ in said) else 0)
        if code != -signal.SIGTERM:
            steps.append(Exit(end, code if code >= 0 else None, -code if code < 0 else None))
        script[(rank, 1)] = steps
    return max(lines) + 1, script


def decide_by_run(case: Path, tmp_path: Path) -> Decision | None:
    """``ftwatch run``'s loop over the scenario: scripted workers (:func:`worker_script`) under
    a FakeSupervisor on a FakeClock (from the logs' first stamp, as :func:`decide_by_watch`), a
    capture Recorder; its first decision."""
    world, script = worker_script(case)
    config = config_of(case, tmp_path).model_copy(update={
        # one spare device: an isolation restarts on it, as replay's isolate_node reschedules the job
        "supervisor": SupervisorConfig(nproc_per_node=world, restart_delay=0, devices=[str(r) for r in range(world + 1)]),
        "health": HealthConfig(bootcheck=False, troubleshooting=False)})
    recorder, _, _ = capture(tmp_path, "run")
    clock = FakeClock(first_stamp(case) or T0)
    sup = FakeSupervisor(clock, script_of(script, [Exit(1)]), job=JOB)
    build_run(config, ["train"], JOB, recorder, out=io.StringIO(), clock=clock, supervisor=sup,
              control=FakeControl()).run()
    return recorder.decisions[0] if recorder.decisions else None


DRIVERS = [
    pytest.param("watch", id="watch"),
    pytest.param("evaluate", id="evaluate"),
    pytest.param("run", id="run"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden_replay_records_the_decision_and_sends_its_alerts(case: Path, tmp_path: Path):
    """In-process replay through the Recorder with capture doubles: the expected decision is
    stored once, and the alerts the receivers got are the expected ones."""
    expected = expected_of(case)
    recorder, sink, notifier = capture(tmp_path, "replay")
    decision = decide_by_replay(case, tmp_path, recorder)
    assert verdict(decision)[:2] == (expected["action"], expected["rule_id"])
    assert rank_ok(expected, verdict(decision).rank)
    assert sink.decisions == [decision]
    assert [(n.alert.event_type, n.alert.status) for n in notifier.sent] == [tuple(a) for a in expected["alerts"]]
    assert all(n.alert.labels["job"] == JOB for n in notifier.sent)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_driver_decides_the_golden_scenario_as_replay_does(case: Path, driver: str, tmp_path: Path):
    """run, watch, replay and evaluate decide through one incident core: same action, root-cause
    rule and rank, and target (evaluate reports no target)."""
    want = verdict(decide_by_replay(case, tmp_path / "replay"))
    (tmp_path / driver).mkdir()
    if driver == "evaluate":
        assert decide_by_evaluate(case, tmp_path / driver) == want._replace(target=None)
        return
    decide = {"watch": decide_by_watch, "run": decide_by_run}[driver]
    got = verdict(decide(case, tmp_path / driver))
    if isinstance(expected_of(case)["rank"], list):     # ranks that failed alike at once: any may be named
        assert rank_ok(expected_of(case), got.rank)
        got, want = got._replace(rank=None, target=None), want._replace(rank=None, target=None)
    assert got == want
