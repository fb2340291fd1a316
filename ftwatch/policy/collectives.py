"""The rank the others wait for (SPEC R7 "a rank that went silent first", issue 12 item 3).

When every error of an incident is a collective timeout (fallout), the ranks that report one
are the victims: the cause is the rank that never reached the collective. The watchdog and
flight-recorder lines carry the work's sequence number and the ranks' progress
(``ftwatch.parsers.collective``: ``seq``, ``op``, ``timeout_ms``, ``last_completed``); from them:

1. *silent*: with the world size known, a rank that reported no timeout for the collective
   (nothing at all, or only lines without a sequence number) while the others did: the silent
   ranks must be fewer than the reporters (one rank's timeout beside three quiet ranks names
   no one: the others may simply have been killed before their watchdogs fired);
2. else *behind*: among the reporters, the rank(s) whose progress (``last_completed``, else the
   timed-out work's ``seq`` - 1) is lowest, when it is below the others'.

The suspect becomes the root cause, a finding ``collective.silent_rank`` (or
``collective.behind_rank``) on that rank: class ``hang`` / ``restart_job`` (PyTorch's own advice
for a timeout: "the order of collectives is not same for all ranks or the scheduled collective,
for some reason, didn't run", ProcessGroupNCCL.cpp), or ``hardware_node`` / ``isolate_node`` when
the suspect's own findings include a hardware warning (the node's fault, per the evidence). No
suspect when every rank reports the same collective (a network stall looks like that), nor when
several ranks are suspects on different nodes (one may only wait behind the other).

One more reading of timeout-only incidents (issue 12 item 3):

* :func:`mismatch`: two ranks timed out at the *same* sequence number of the same process group
  on *different* operations (rank 0 in ALLREDUCE, rank 1 in ALLGATHER, both SeqNum=2437): the
  ranks issued different collectives, which only the program's control flow does (PyTorch's
  watchdog: "the order of collectives is not same for all ranks"; torch.distributed's
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` check reports the same thing as "Detected mismatch between
  collectives on ranks", an application error). Finding ``collective.mismatch``: user_code /
  fail_job: a restart replays the same control flow. A rank is the line's origin's, else the one
  the c10d line names in the default group (:func:`rank_of`: ``[Rank 1] Watchdog caught ...`` on a
  stream a launcher did not prefix, torch 1.x under ``torch.distributed.launch``, one log file).
* the same reading when they timed out at one SeqNum in the same operation on tensors of
  *different sizes* (``NumelIn``), for the operations whose size every rank must agree on
  (:data:`SIZED_OPS`: NCCL's AllReduce, Broadcast, Reduce, AllGather and ReduceScatter take one
  ``count`` that is the same on every rank, NCCL user guide "Collective Operations"; PyTorch's
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` fingerprint, ``CollectiveFingerPrint`` in
  torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp, compares the tensor sizes as well as the
  op and reports a difference as "Detected mismatch between collectives"): one rank's all-gather
  of one parameter beside another's all-gather of another parameter is two different collectives
  (a rank that left a data-dependent loop early, then entered the next layer's gather). The list
  forms (``ALLGATHER``, ``REDUCE_SCATTER``) and all-to-all / gather / scatter / point-to-point
  are left out: PyTorch accepts uneven sizes there (uneven all_gather falls back to broadcasts,
  all-to-all takes split sizes, a root's buffers differ from the others').
* the same reading when NCCL's own device check said so before a collective timed out
  (:data:`SUSPECTED_MISMATCH_RULES`: "Your program may be hanging, this may be caused by a
  collective mismatch around rank N", NVIDIA/nccl src/init.cc ncclCommGetAsyncError, raised when
  "the peer advanced opcount so many times yet we are still waiting for credit of current op, so
  it is _most likely_ a mismatch", src/collectives/device/primitives.h checkMismatch): a peer went
  on to later collectives while this rank waited in its current one, which is the evidence the
  SeqNum comparison reads, taken by NCCL on the device.
* the same reading when the ranks of one process group disagree on *how many* collectives they
  issued (:func:`_ahead`): rank A timed out in collective N while rank B of the same group had
  already completed work N+1 or later (its ``last completed work``, else the SeqNum it timed out
  in, less one). ProcessGroupNCCL numbers every operation a rank issues in a group (``seq_``) and
  runs them in order on the group's stream, and a collective completes only when every rank of the
  group took part; so B completed collectives A never entered, which no stalled link or wedged
  node can do (they stop every rank at the same collective) and which only the ranks' control
  flow does: "A distributed training job hangs when the ranks of a NCCL communicator disagree
  about which collective comes next. For example, if one rank takes a code path that skips an
  all_reduce, calls an extra one, or launches a collective with a different shape" (Ray Train,
  "Detect NCCL hangs": its detector compares the ranks' collective counts); PyTorch's flight
  recorder analyser (tools/flight_recorder) likewise groups the ranks' entries by process group
  and sequence id to find where they diverge. A gap of one is left out: B may have completed
  work N an instant before a fault stopped A in its tail. Point-to-point operations are left out
  (:data:`P2P_OPS`: a pipeline stage sends and receives a count of its own, so its numbers differ
  by design), and so is a coalesced work unless its output outgrows its input (a gather's shape; a
  batched send/receive is ``COALESCED`` too). Lines that name no process group (torch < 2.3) are
  compared only in a world of two ranks where each reported one SeqNum: with more ranks a job may
  have subgroups (tensor- and data-parallel groups), and a rank of one data-parallel group waits,
  by another group's numbering, for a peer stuck in its tensor-parallel collective, which a
  stalled link does; two ranks share every group that communicates at all.
"""

from __future__ import annotations

import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity

SOURCE = ("pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (WorkNCCL SeqNum, "
          "last enqueued / last completed NCCL work); ftwatch R7 silent-rank reading")
_PROGRESS = ("seq", "last_completed")
#: the process group a ProcessGroupNCCL line names ("[PG 5 Rank 0]", "[PG ID 0 PG GUID 0(default_pg) Rank 4]")
_PG = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)")


def _progress(f: Finding) -> int | None:
    done = f.fields.get("last_completed")
    if isinstance(done, int):
        return done
    seq = f.fields.get("seq")
    return seq - 1 if isinstance(seq, int) else None


def _origins_for(ranks: Sequence[int], findings: Sequence[Finding], reporters: dict[int, Finding]) -> list[Origin]:
    """The suspects' origins, in the order of ``ranks``: a suspect's own first finding's when it
    has any, else a reporter's with the rank swapped in (``worker-2`` -> ``worker-3``); the node
    only when every reporter shares it. One pass over ``findings`` for all of them (a suspect
    each looked through every finding: O(ranks²) with thousands of silent ranks, issue 16)."""
    wanted = set(ranks)
    own: dict[int, Origin] = {}
    for f in findings:
        if f.rank in wanted and f.rank not in own:
            own[f.rank] = f.origin
    o = next(iter(reporters.values())).origin
    node = o.node if len({f.origin.node for f in reporters.values()}) == 1 else "unknown"
    swap = o.rank is not None and o.instance.endswith(str(o.rank))
    return [own[rank] if rank in own else
            Origin(re.sub(r"\d+$", str(rank), o.instance) if swap else f"rank{rank}", rank, o.job, node,
                   o.stream, o.source)
            for rank in ranks]


def silent_rank(findings: Sequence[Finding], world: int | None) -> Finding | None:
    """The suspect finding (see the module docstring), or None.

    Args:
        findings: one incident's findings (every one fallout or below: the caller checks).
        world: the number of ranks (0..world-1), or None / 0 when unknown.
    """
    reports = [f for f in findings if f.rank is not None and any(k in f.fields for k in _PROGRESS)]
    if not reports:
        return None
    reporters: dict[int, Finding] = {}
    for f in sorted(reports, key=lambda f: (f.time, f.seq)):
        reporters.setdefault(f.rank, f)
    first = min(reports, key=lambda f: (f.time, f.seq))
    seq, op = first.fields.get("seq"), first.fields.get("op")
    rule, suspects, why = "", [], ""
    if world and world > 1:
        suspects = [r for r in range(world) if r not in reporters]
        if suspects and len(suspects) < len(reporters):     # "everyone else" reports: the few are silent
            rule = "collective.silent_rank"
            why = (f"ranks {sorted(reporters)} report a timeout of collective SeqNum={seq} ({op}); "
                   f"rank(s) {suspects} reported none")
    if not rule:
        progress: dict[int, int] = {}               # rank -> the least work its reports completed
        for f in reports:                           # (one pass: per rank over every report was O(ranks²))
            p = _progress(f)
            if p is not None and (f.rank not in progress or p < progress[f.rank]):
                progress[f.rank] = p
        if len(progress) > 1 and min(progress.values()) < max(progress.values()):
            low = min(progress.values())
            suspects = sorted(r for r, p in progress.items() if p == low)
            rule = "collective.behind_rank"
            why = (f"rank(s) {suspects} last completed work {low}, the others up to {max(progress.values())}")
    if not rule:
        return None
    origins = _origins_for(suspects, findings, reporters)
    nodes = {o.node for o in origins}
    if len(suspects) > 1 and (len(nodes) != 1 or "unknown" in nodes):
        return None                 # several suspects on different (or unknown) nodes: no one culprit
    rank, origin = suspects[0], origins[0]
    hardware = next((f for f in findings if f.rank == rank and f.failure_class is FailureClass.HARDWARE_NODE), None)
    cls, action = ((FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE) if hardware
                   else (FailureClass.HANG, Action.RESTART_JOB))
    line = f"rank {rank} is the suspect: {why}" + (f"; its own hardware evidence: {hardware.rule_id}"
                                                   if hardware else "")
    return Finding(rule, "collective", cls, action, Severity.ERROR, origin, line, first.time, first.seq,
                   fields={"suspects": suspects, "seq": seq, "op": op, "reporters": sorted(reporters),
                           "timeout_ms": first.fields.get("timeout_ms")},
                   source=SOURCE)


#: Fallout that says a collective (or the watchdog that watches collectives) timed out: the rules
#: of the packs that their sources grade ``hang`` (``source_class: hang``: ProcessGroupNCCL's
#: watchdog timeout, watchdog stall and heartbeat monitor, torch_npu's HCCL watchdog, HCCL/CANN
#: notify-wait timeouts) and gloo's "Timed out waiting <ms>ms for recv|send operation"
#: (pytorch/gloo gloo/transport/tcp/unbound_buffer.cc: the same process-group timeout on a gloo
#: collective). tests/rules/test_collectives.py keeps it in step with the packs.
TIMEOUT_RULES = frozenset({
    "torch.nccl_watchdog_timeout", "torch.nccl_watchdog_stuck", "torch.nccl_heartbeat_timeout",
    "torch_npu.hccl_watchdog_stuck", "hccl.ei0002_notify_wait_timeout", "cann.notify_wait_timeout",
    "hccl.task_notify_wait_failed", "cann.notify_wait_execute_failed", "gloo.wait_timeout"})
#: Fallout that only follows such a timeout: ProcessGroupNCCL's own follow-on lines ("Some NCCL
#: operations have failed or timed out", "NCCL communicator was aborted ... Original reason",
#: both graded ``hang`` by their source), its flight-recorder progress and dump lines, the
#: ``DistBackendError`` it raises, and torchelastic reporting the SIGABRT the watchdog ends the
#: process with ("To avoid data inconsistency, we are taking the entire process down") and the
#: SIGTERM it then sends the survivors (torch/distributed/elastic/multiprocessing/api.py,
#: errors/__init__.py).
FOLLOW_ON_RULES = frozenset({
    "torch.nccl_operations_failed", "torch.nccl_communicator_aborted", "torch.dist_backend_error",
    "c10d.watchdog_progress", "c10d.dump_signal", "c10d.nccl_work_progress",
    "torch_elastic.exitcode_sigabrt", "torch_elastic.child_failed", "torch_elastic.root_cause_summary",
    "torch_elastic.survivor_sigterm"})
_NOT_LOGGED = ("exit_code", "hang", "exit_hang")


def timeouts_only(fallout: Sequence[Finding]) -> bool:
    """Every rank reports only collective timeouts (issue 12 item 3, the hang class).

    True when the logged findings of ``fallout`` (exits aside: an exit explained by fallout adds
    nothing) include a collective timeout (:data:`TIMEOUT_RULES`) and nothing but timeouts and
    their follow-on lines (:data:`FOLLOW_ON_RULES`). A peer that closed its connection, a refused
    connect or a store error says a peer went away, which is not that reading: then False.

    Args:
        fallout: the findings of an incident that are fallout (no rank shows an error of its own:
            the caller checks, ``ftwatch.policy.rootcause.analyse``).
    """
    logged = [f for f in fallout if f.kind not in _NOT_LOGGED]
    return (any(f.rule_id in TIMEOUT_RULES for f in logged)
            and all(f.rule_id in TIMEOUT_RULES or f.rule_id in FOLLOW_ON_RULES for f in logged))


#: The rank a c10d line names, with its process group when the line gives one
#: (``[Rank 2]``, ``[PG 0 Rank 2]``, ``[PG ID 0 PG GUID 0(default_pg) Rank 2]``).
_NAMED = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d+)[^\]]*? )?Rank (?P<rank>\d+)\]")
#: The rank ProcessGroupNCCL names when its read of the communicator's unique id from the store
#: fails (``broadcastUniqueNCCLID``: ``"[" << rank_ << "] is setting up NCCL communicator and
#: retrieving ncclUniqueId from [0] via c10d key-value store by key ..., but store->get(...) got
#: error: ..."``; ``rank_`` is the rank in the group whose communicator it sets up). The line gives
#: the group only through the store keys some releases append (``keys: /default_pg/0//cuda//0``:
#: the group named ``0``, the default one); a line naming another group's keys names no global rank.
_UNIQUE_ID = re.compile(r"\[(?P<rank>\d+)\] is setting up NCCL communicator and retrieving ncclUniqueId from \[0\]")
_KEYS_GROUP = re.compile(r"default_pg/(?P<pg>\d+)/")


def rank_of(f: Finding) -> int | None:
    """The finding's rank: its origin's, else the one a c10d line names in the default group
    (``[Rank 2]``, ``[PG 0 Rank 2]``: a launcher that prefixes nothing, ``accelerate launch``; the
    ``[2] is setting up NCCL communicator and retrieving ncclUniqueId from [0]`` of a failed unique-id
    read, :data:`_UNIQUE_ID`, unless its keys name another group)."""
    if f.rank is not None:
        return f.rank
    m = _NAMED.search(f.line)
    if m:
        return int(m.group("rank")) if m.group("pg") in (None, "0") else None
    u = _UNIQUE_ID.search(f.line)
    if u is None or any(k.group("pg") != "0" for k in _KEYS_GROUP.finditer(f.line)):
        return None
    return int(u.group("rank"))


def _pg(f: Finding) -> str | None:
    m = _PG.search(f.line)
    return m.group("pg") if m else None


#: Operations whose input size (``NumelIn``) every rank of the group must give alike (the module
#: docstring): NCCL's single-count collectives as ProcessGroupNCCL names them (``OpType``).
SIZED_OPS = frozenset({"ALLREDUCE", "BROADCAST", "REDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE"})


def _sizes(ranks: dict[int, Finding]) -> dict[int, int] | None:
    """The ranks' ``NumelIn`` when they all ran one :data:`SIZED_OPS` operation and at least two
    of them report a size; else None."""
    ops = {g.fields["op"] for g in ranks.values()}
    sizes = {r: n for r, g in sorted(ranks.items()) if isinstance(n := g.fields.get("numel_in"), int)}
    return sizes if len(ops) == 1 and ops <= SIZED_OPS and len(sizes) > 1 else None


def mismatch(findings: Sequence[Finding], world: int | None = None) -> Finding | None:
    """``collective.mismatch`` (see the module docstring): ranks that timed out at one SeqNum of one
    process group on different operations, or in one :data:`SIZED_OPS` operation on different
    sizes; None when there are none. The finding is on the odd one out: the earliest rank of the
    smallest group that ran one (operation, size) (with 7 ranks in one all-gather and rank 3 in
    another, rank 3 left the common path); on a tie, the earliest rank. ``world`` (the number of
    ranks, None when unknown) lets :func:`_ahead` compare lines that name no process group."""
    seen: dict[tuple[str | None, int], dict[int, Finding]] = {}
    for f in sorted(findings, key=lambda f: (f.time, f.seq)):
        seq, op, rank = f.fields.get("seq"), f.fields.get("op"), rank_of(f)
        if rank is not None and isinstance(seq, int) and op:
            seen.setdefault((_pg(f), seq), {}).setdefault(rank, f)
    for (pg, seq), ranks in seen.items():
        ops = {r: g.fields["op"] for r, g in sorted(ranks.items())}
        sizes = _sizes(ranks)
        if len(set(ops.values())) == 1 and not (sizes and len(set(sizes.values())) > 1):
            continue
        groups: dict[tuple[str, int | None], list[Finding]] = {}
        for r, g in ranks.items():
            groups.setdefault((ops[r], (sizes or {}).get(r)), []).append(g)
        odd = min(groups.values(), key=lambda gs: (len(gs), min((g.time, g.seq) for g in gs)))
        first = min(odd, key=lambda g: (g.time, g.seq))
        odd_rank = rank_of(first)
        said = ", ".join(f"rank {r} {o}" + (f" NumelIn={sizes[r]}" if sizes and r in sizes else "")
                         for r, o in ops.items())
        what = "different operations" if len(set(ops.values())) > 1 else "different tensor sizes"
        line = (f"ranks timed out in collective SeqNum={seq} on {what} ({said}): they issued different "
                f"collectives, which the program's control flow does; rank {odd_rank} is the odd one out")
        return Finding("collective.mismatch", "collective", FailureClass.USER_CODE, Action.FAIL_JOB,
                       Severity.ERROR, first.origin, line, first.time, first.seq,
                       fields={"seq": seq, "ops": ops, "sizes": sizes or {}, "pg": pg},
                       source=SOURCE + "; TORCH_DISTRIBUTED_DEBUG=DETAIL collective mismatch check")
    return _ahead(findings, world) or _suspected(findings)


#: The rule id of a job hang (``ftwatch.rules.timers``: no output from any instance for the hang interval).
JOB_HANG = "hang.job"


def mismatch_under_hang(order: Sequence[Finding], real: Sequence[Finding], world: int | None) -> Finding | None:
    """``collective.mismatch`` (:func:`mismatch`; ``ftwatch.policy.rootcause`` rule 8) when every real error is a job
    hang and the ranks' own watchdog reports say they timed out at one sequence number on different
    operations or sizes: the hang says only that output stopped, the ranks' reports say why (ranks that
    issued different collectives, which only the program's control flow does; PyTorch's
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` check reports it as "Detected mismatch between collectives on
    ranks"). The same reading as with no hang detection, where those reports are the only errors."""
    if not real or any(f.rule_id != JOB_HANG for f in real):
        return None
    return mismatch(order, world)


#: Point-to-point operations as ProcessGroupNCCL names them (``OpType``): only two ranks take part,
#: so the ranks of a group number them differently by design (the module docstring).
P2P_OPS = frozenset({"SEND", "RECV", "RECVANYSOURCE"})


def _collective(f: Finding) -> bool:
    """Whether the timed-out work of ``f`` is one every rank of its group takes part in."""
    op = f.fields.get("op")
    if op in P2P_OPS:
        return False
    if op == "COALESCED":
        n_in, n_out = f.fields.get("numel_in"), f.fields.get("numel_out")
        return isinstance(n_in, int) and isinstance(n_out, int) and n_out > n_in > 0
    return True


def _ahead(findings: Sequence[Finding], world: int | None) -> Finding | None:
    """``collective.mismatch`` when a rank of a process group completed collectives after the one
    another rank of it timed out in (the module docstring), else None. The finding is on the rank
    furthest behind (the earliest on a tie)."""
    stuck: dict[str | None, dict[int, list[Finding]]] = {}
    done: dict[tuple[str | None, int, int], int] = {}    # (group, rank, the work it timed out in)
    p2p: set[str | None] = set()
    for f in sorted(findings, key=lambda f: (f.time, f.seq)):
        seq, rank, pg = f.fields.get("seq"), rank_of(f), _pg(f)
        if rank is None or not isinstance(seq, int):
            continue
        if f.fields.get("op"):
            if not _collective(f):
                p2p.add(pg)
            stuck.setdefault(pg, {}).setdefault(rank, []).append(f)
        last = f.fields.get("last_completed")
        if isinstance(last, int) and pg is not None:
            done[(pg, rank, seq)] = max(last, done.get((pg, rank, seq), last))
    for pg, ranks in stuck.items():
        if pg in p2p or len(ranks) < 2:
            continue
        if pg is None and (world != 2 or any(len({g.fields["seq"] for g in gs}) > 1 for gs in ranks.values())):
            continue
        waits = {r: min(gs, key=lambda g: g.fields["seq"]) for r, gs in ranks.items()}
        # a rank's progress as its line about the work it waits in states it (never another
        # attempt's or another work's line), else that work's SeqNum less one
        progress = {r: max(done.get((pg, r, w.fields["seq"]), -1), w.fields["seq"] - 1) for r, w in waits.items()}
        behind = min(waits, key=lambda r: (waits[r].fields["seq"], waits[r].time, waits[r].seq))
        low = waits[behind].fields["seq"]
        ahead = sorted(r for r, p in progress.items() if p >= low + 1)
        if not ahead:
            continue
        w = waits[behind]
        line = (f"rank {behind} timed out in collective SeqNum={low} ({w.fields['op']}) of process group "
                f"{pg if pg is not None else '(unnamed)'} while rank(s) {ahead[:4]} had completed work up to "
                f"{max(progress[r] for r in ahead)}: they completed collectives rank {behind} never entered, "
                "so the ranks issued different numbers of collectives, which the program's control flow does")
        return Finding("collective.mismatch", "collective", FailureClass.USER_CODE, Action.FAIL_JOB,
                       Severity.ERROR, w.origin, line, w.time, w.seq,
                       fields={"seq": low, "pg": pg, "behind": behind, "ahead": ahead,
                               "progress": {r: progress[r] for r in sorted(progress)}},
                       source=SOURCE + "; docs.ray.io train/user-guides/nccl-hang-detection (ranks of a "
                              "communicator disagree about which collective comes next); pytorch "
                              "tools/flight_recorder (entries matched by process group and sequence id)")


#: NCCL's device-side "most likely a mismatch" warning (nccl_vocab.tsv; the module docstring).
SUSPECTED_MISMATCH_RULES = frozenset({"nccl.collective_mismatch_suspected"})


def _suspected(findings: Sequence[Finding]) -> Finding | None:
    """``collective.mismatch`` on NCCL's suspected-mismatch warning when a collective timeout
    (:data:`TIMEOUT_RULES`) came at or after it (the module docstring); else None."""
    order = sorted(findings, key=lambda f: (f.time, f.seq))
    warned = next((f for f in order if f.rule_id in SUSPECTED_MISMATCH_RULES), None)
    if warned is None:
        return None
    timeout = next((f for f in order if f.rule_id in TIMEOUT_RULES and (f.time, f.seq) >= (warned.time, warned.seq)),
                   None)
    if timeout is None:
        return None
    line = (f"NCCL's device check said a peer moved on to later collectives while this rank waited "
            f"({warned.line.strip()[:160]}), then {timeout.rule_id}: the ranks issued different collectives, "
            "which the program's control flow does")
    return Finding("collective.mismatch", "collective", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                   warned.origin, line, timeout.time, timeout.seq, (warned.line, timeout.line),
                   fields={"warning": warned.rule_id, "timeout": timeout.rule_id},
                   source="NVIDIA/nccl src/init.cc ncclCommGetAsyncError (ncclDevSuspectedMismatch); "
                          "src/collectives/device/primitives.h checkMismatch")
