"""Root cause and action of representative multi-rank failures (SPEC R7, D1-D2), end to end through
the real rule packs, exit-code table, hang timer and policy, under the AIMaster flags `make run`
uses (Sync, --enable-job-restart=True, ExitCodeAndErrorMsg, hang detection at 60 s).

Each row is one situation: the lines each rank printed (with the second they were read), how each
rank ended, and the root-cause rule, rank and action the policy must decide. The lines are in the
form PyTorch, NCCL, gloo, the NVIDIA driver and the Ascend driver print them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ftwatch.config.model import Config, parse_aimaster_flags
from ftwatch.events import Action, Finding, Origin, ProcessExit
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules
from ftwatch.policy.policy import Incident, Policy
from ftwatch.rules.timers import HangTracker

JOB = "table"
T0 = 1_795_219_200.0
MAKE_RUN_FLAGS = ("--enable-job-restart=True --max-num-of-job-restart=3 "
                  "--enable-job-hang-detection=True --job-hang-interval=60")
WORLD = 4

KEYERROR = ("Traceback (most recent call last):\n"
            '  File "/srv/train/train.py", line 182, in <module>\n'
            '    warmup = config["warmup_steps"]\n'
            "KeyError: 'warmup_steps'")
SYSTEM_ERROR = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), "
                "NCCL version 2.21.5")
SYSTEM_ERROR_TB = ("Traceback (most recent call last):\n"
                   '  File "/srv/train/train.py", line 40, in <module>\n'
                   "    dist.all_reduce(t)\n"
                   "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
                   "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
                   "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
                   "device error.\nLast error:\n"
                   "socketStartConnect: Connect to 10.42.0.7<35731> failed : Software caused connection abort")
REMOTE_ERROR = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                "ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, NCCL version 2.21.5")
GLOO_CLOSED = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
               "[10.42.0.5]:23456")
WATCHDOG = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48213, OpType=ALLREDUCE, "
            "NumelIn=25165824, NumelOut=25165824, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.")
CUDA_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 79.15 GiB of which 1.02 GiB is free.")
PCIE_WARN = "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
NPU_SEPARATE = "[ERROR] DRV: device 2 fault code 0x80E18402"
NPU_USER_INPUT = "[ERROR] RUNTIME: device 2 fault code 0x80C98002"
WATCHDOG_SYSTEM_ERROR = ("[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with "
                         "exception: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), "
                         "NCCL version 2.21.5")
CUDA_ERROR = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error "
              "(run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1")
GLOO_TIMEOUT = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                "1800000ms for send operation to complete")
CONNECT_REFUSED = ("gpu-node-3:2111:2190 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: connect to "
                   "10.42.0.7<43261> failed : Connection refused")
XID79 = "NVRM: Xid (PCI:0000:61:00): 79, pid=48211, name=python, GPU has fallen off the bus."


@dataclass(frozen=True)
class Case:
    """lines: (rank, second, text); exits: (rank, second, returncode, signal); hang_at: when the job
    hang timer is checked (None: never); expected root-cause rule, rank, class (``fallout``: only
    fallout was found, which the policy treats as retryable) and action."""

    id: str
    lines: tuple[tuple[int, float, str], ...]
    exits: tuple[tuple[int, float, int | None, int | None], ...]
    rule: str
    rank: int | None
    cls: str
    action: Action
    hang_at: float | None = None


CASES = [
    Case("keyerror_then_exit_1", ((1, 10.0, KEYERROR),), ((1, 11.0, 1, None),),
         "python.key_error", 1, "user_code", Action.FAIL_JOB),
    # The reported bug: the rank that prints an NCCL system error and exits 1 was decided as
    # exit.1 (user_code). On the rank that reports it, it is a real infra fault.
    Case("nccl_system_error_then_exit_1", ((1, 10.0, SYSTEM_ERROR),), ((1, 11.0, 1, None),),
         "nccl.unhandled_system_error", 1, "retryable_infra", Action.RESTART_JOB),
    Case("nccl_system_error_traceback_then_exit_1", ((1, 10.0, SYSTEM_ERROR_TB),), ((1, 11.0, 1, None),),
         "nccl.unhandled_system_error", 1, "retryable_infra", Action.RESTART_JOB),
    # ... unless another rank had a real error first: then it is that error's fallout.
    Case("keyerror_before_peer_system_error",
         ((0, 10.0, KEYERROR), (1, 10.5, SYSTEM_ERROR)), ((0, 11.0, 1, None), (1, 12.0, 1, None)),
         "python.key_error", 0, "user_code", Action.FAIL_JOB),
    Case("watchdog_system_error_then_sigabrt", ((1, 10.0, WATCHDOG_SYSTEM_ERROR),), ((1, 11.0, None, 6),),
         "nccl.unhandled_system_error", 1, "retryable_infra", Action.RESTART_JOB),
    Case("nccl_cuda_error_then_exit_1", ((0, 10.0, CUDA_ERROR),), ((0, 11.0, 1, None),),
         "nccl.unhandled_cuda_error", 0, "retryable_infra", Action.RESTART_JOB),
    Case("keyerror_before_peer_gloo_timeout",
         ((2, 10.0, KEYERROR), (0, 1810.0, GLOO_TIMEOUT)), ((2, 11.0, 1, None), (0, 1811.0, 1, None)),
         "python.key_error", 2, "user_code", Action.FAIL_JOB),
    Case("oom_before_peer_watchdog_timeout",
         ((0, 10.0, CUDA_OOM), (1, 600.0, WATCHDOG)), ((0, 11.0, 1, None), (1, 601.0, None, 6)),
         "cuda.out_of_memory", 0, "oom", Action.FAIL_JOB),
    # A SIGKILLed rank prints nothing; its exit is seen after its pipes close, often after the
    # survivors already printed their errors: still the SIGKILL is the root cause.
    Case("sigkill_and_gloo_survivors",
         ((0, 20.1, GLOO_CLOSED), (2, 20.2, GLOO_CLOSED)),
         ((1, 20.5, None, 9), (0, 21.0, 1, None), (2, 21.0, 1, None)),
         "exit.sigkill", 1, "retryable_infra", Action.RESTART_JOB),
    Case("sigkill_and_nccl_system_error_survivors",
         ((0, 20.1, SYSTEM_ERROR), (2, 20.2, SYSTEM_ERROR_TB)),
         ((1, 20.5, None, 9), (0, 21.0, 1, None), (2, 21.0, 1, None)),
         "exit.sigkill", 1, "retryable_infra", Action.RESTART_JOB),
    Case("sigkill_and_nccl_remote_error_survivors",
         ((0, 20.1, REMOTE_ERROR), (2, 20.2, REMOTE_ERROR)),
         ((1, 20.5, None, 9), (0, 21.0, 1, None), (2, 21.0, 1, None)),
         "exit.sigkill", 1, "retryable_infra", Action.RESTART_JOB),
    Case("sigkill_and_a_survivor_refused_connect",
         ((0, 20.1, CONNECT_REFUSED),), ((1, 20.5, None, 9), (0, 21.0, 1, None)),
         "exit.sigkill", 1, "retryable_infra", Action.RESTART_JOB),
    Case("refused_connect_alone_then_exit_1", ((0, 5.0, CONNECT_REFUSED),), ((0, 6.0, 1, None),),
         "nccl.socket_connect_failed", 0, "retryable_infra", Action.RESTART_JOB),
    # Watchdog timeouts and the SIGABRT they end in are fallout: only fallout restarts the job.
    Case("watchdog_timeout_then_sigabrt",
         ((0, 600.0, WATCHDOG), (2, 600.2, WATCHDOG)), ((0, 601.0, None, 6), (2, 601.1, 134, None)),
         "torch.nccl_watchdog_timeout", 0, "fallout", Action.RESTART_JOB),
    # A warning-level line beside the fallout does not turn the generic exit into user code.
    Case("remote_error_and_a_warning_then_exit_1",
         ((1, 10.0, PCIE_WARN), (1, 11.0, REMOTE_ERROR)), ((1, 12.0, 1, None),),
         "nccl.remote_error", 1, "fallout", Action.RESTART_JOB),
    # A rank that exits 1 with nothing in its log, before anyone else failed, is the first failure.
    Case("silent_exit_1_before_peer_fallout",
         ((0, 6.0, GLOO_CLOSED),), ((3, 5.0, 1, None), (0, 7.0, 1, None)),
         "exit.1", 3, "user_code", Action.FAIL_JOB),
    Case("job_hang", ((0, 1.0, "step 1"), (1, 0.5, "step 1"), (2, 2.0, "step 1"), (3, 1.5, "step 1")), (),
         "hang.job", 1, "hang", Action.RESTART_JOB, hang_at=63.0),
    Case("npu_separate_fault_code_then_exit_1", ((2, 10.0, NPU_SEPARATE),), ((2, 11.0, 1, None),),
         "npu.80E18402", 2, "hardware_node", Action.ISOLATE_NODE),
    Case("npu_user_input_code_then_exit_1", ((2, 10.0, NPU_USER_INPUT),), ((2, 11.0, 1, None),),
         "npu.80C98002", 2, "user_code", Action.RESTART_IN_PLACE),
    Case("xid79_then_exit_1", ((3, 10.0, XID79),), ((3, 11.0, 1, None),),
         "xid.79", 3, "hardware_node", Action.ISOLATE_NODE),
    Case("xid79_then_sigabrt", ((3, 10.0, XID79),), ((3, 11.0, None, 6),),
         "xid.79", 3, "hardware_node", Action.ISOLATE_NODE),
]


@pytest.fixture(scope="module")
def rules():
    return load_rules([], builtin=True)


def origin(rank: int) -> Origin:
    return Origin(f"worker-{rank}", rank, JOB, f"node-{rank}", "stderr", "process")


def decide(case: Case, rules, tmp_path: Path):
    flags, unknown = parse_aimaster_flags(MAKE_RUN_FLAGS)
    assert not unknown
    config = Config().with_policy(**flags)
    policy = Policy.for_config(config, BudgetStore(tmp_path / "budgets.json", JOB), JOB, state_dir=tmp_path)
    engine, table = Engine(rules), ExitCodeTable.load()
    tracker = HangTracker.from_policy(config.policy)
    for rank in range(WORLD):
        tracker.started(origin(rank), T0)
    findings: list[Finding] = []
    for rank, t, text in sorted(case.lines, key=lambda line: line[1]):
        findings += engine.feed(origin(rank), text.encode() + b"\n", T0 + t, final=True)
        tracker.output(origin(rank).instance, T0 + t)
    exits = [exit_finding(ProcessExit(origin(r), 100 + r, rc, sig, T0 + t), table, seq=engine.next_seq())
             for r, t, rc, sig in case.exits]
    findings += exits
    trigger = min(exits, key=lambda f: f.time) if exits else None
    if case.hang_at is not None:
        [hang] = tracker.check(T0 + case.hang_at)
        findings.append(hang)
        trigger = trigger or hang
    assert trigger is not None
    failed = frozenset(f.origin.instance for f in exits)
    return policy.decide(Incident(trigger, tuple(findings), WORLD, failed, 0), T0 + 700)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_root_cause_and_action(case: Case, rules, tmp_path):
    d = decide(case, rules, tmp_path)
    assert d.root_cause is not None, d.policy_clause
    got = (d.root_cause.rule_id, d.root_cause.rank, d.root_cause.failure_class.value, d.action)
    assert got == (case.rule, case.rank, case.cls, case.action), d.policy_clause
