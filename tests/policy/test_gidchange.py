"""A RoCE GID entry that moved under a pinned NCCL_IB_GID_INDEX (ftwatch.policy.gidchange, rootcause
rule 20): NCCL binds its connections to the pinned index at connect time and does not reconnect
(NVIDIA/nccl#1333), so the retry-exceeded completions after an HCA's "GID table change" are that
node's NIC state; without the pinned index, or without the event, they keep their retryable grade."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.gidchange import pinned_gid_moved
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
PINNED = "{host}:31200:31200 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3."
EVENT = "{host}:31211:31502 [3] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_3:1 Got async event : GID table change"
ERR12 = ("{host}:31203:31498 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
         "10.61.3.9<48811> with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.61.3.4 "
         "remoteGids::ffff:10.61.3.9 hca mlx5_3")


def fed(line: str, rank: int, node: str, t: float) -> list[Finding]:
    origin = Origin(f"{node}/rank{rank}", rank, "gid", node, "stderr", "process")
    return ENGINE.feed(origin, f"{line.format(host=node)}\n".encode(), t, final=True)


def incident(pinned: bool = True, event: bool = True) -> list[Finding]:
    found: list[Finding] = []
    if pinned:
        found += fed(PINNED, 0, "n04", T0)
        found += fed(PINNED, 8, "n09", T0 + 0.1)
    if event:
        found += fed(EVENT, 11, "n09", T0 + 40_000)
    found += fed(ERR12, 3, "n04", T0 + 40_030)
    return found


def test_a_gid_change_under_a_pinned_index_isolates_the_node_it_moved_on():
    found = incident()
    assert {f.rule_id for f in found} >= {"nccl.ib_gid_index_pinned", "nccl.ib_async_info", "rdma.ib_retry_exceeded"}
    rc = analyse(found).root_cause
    assert rc is not None and rc.rule_id == "rdma.pinned_gid_moved"
    assert (rc.failure_class, rc.action) == (FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)
    assert rc.origin.node == "n09" and rc.rank == 11 and "nccl#1333" in rc.source


def test_without_the_pinned_index_or_the_event_the_completion_error_stays_retryable():
    for found in (incident(pinned=False), incident(event=False)):
        rc = analyse(found).root_cause
        assert rc is not None and rc.rule_id == "rdma.ib_retry_exceeded"
        assert rc.action is Action.RESTART_JOB


def test_only_a_retry_exceeded_head_is_read():
    found = incident()
    pinned = next(f for f in found if f.rule_id == "nccl.ib_gid_index_pinned")
    assert pinned_gid_moved(pinned, sorted(found, key=lambda f: (f.time, f.seq))) is None
