"""A GPU the Kubernetes device plugin marked unhealthy is graded by the Xid it marked it for
(ftwatch.policy.pluginmark): after an Xid NVIDIA grades IGNORE (63, a row remap recorded) the mark
is a notice and a job that runs on needs nothing; after any other Xid, or with no Xid line of the
plugin's, the mark keeps its grade (notify)."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, Finding, Origin
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.pluginmark import MARK, explained_marks
from ftwatch.policy.policy import Incident, Policy
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
GPU = "GPU-7c0a91d2-5e3b-4f61-8a27-d90b1e4f6c35"
OTHER = "GPU-3c1d9b02-6f4e-1a87-d2c5-8e0f71a4b93e"
XID = "I1025 02:19:08.048201       1 health.go:186] XidCriticalError: Xid={xid} on Device={gpu}, the device will go unhealthy."
MARKED = "I1025 02:19:08.048233       1 server.go:276] 'nvidia.com/gpu' device marked unhealthy: {gpu}"


def plugin(*lines: str) -> list[Finding]:
    o = Origin("nvidia-device-plugin", None, "dev", "node2", "stderr", "file")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0, final=True)


def decide(found: list[Finding], tmp_path: Path):
    mark = next(f for f in found if f.rule_id == MARK)
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", "dev"), "dev")
    return pol.decide(Incident(mark, tuple(found), 8, frozenset(), 0), T0 + 60)


def test_a_mark_after_an_ignorable_xid_of_its_gpu_needs_no_action(tmp_path: Path):
    found = plugin(XID.format(xid=63, gpu=GPU), MARKED.format(gpu=GPU))
    [mark] = [f for f in explained_marks(found) if f.rule_id == MARK]
    assert mark.action is Action.NONE
    d = decide(found, tmp_path)
    assert d.action is Action.NONE and d.root_cause is None


def test_a_mark_after_another_xid_or_another_gpus_or_alone_keeps_its_notify(tmp_path: Path):
    for i, found in enumerate((plugin(XID.format(xid=48, gpu=GPU), MARKED.format(gpu=GPU)),     # DBE: not ignorable
                               plugin(XID.format(xid=63, gpu=OTHER), MARKED.format(gpu=GPU)),   # another GPU's Xid
                               plugin(MARKED.format(gpu=GPU)))):                                # no Xid line
        assert [f.action for f in explained_marks(found) if f.rule_id == MARK] == [Action.NOTIFY]
        assert decide(found, tmp_path / str(i)).action is not Action.NONE
