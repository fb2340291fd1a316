"""A device fault explains a job hang and AMD's runtime errors (ftwatch.policy.devicefault rules 1 and 5).

A training whose GPU stopped answering blocks in the driver and goes silent; NVML then cannot reach
the GPU (``Unable to determine the device handle ... Unknown Error``). The job hang the timer reports
is how that fault reached the job, so the fault of the silent instance's node that takes a device
away is the root cause (isolate), not the hang (restart). A fault that only restarts, a corrected
error or another node's fault explains no hang.

AMD's runtime errors (HIP's ``HIP error: ...``, the HSA runtime's queue aborts, rocm_vocab.tsv) are
device errors as CUDA's are: an amdgpu RAS uncorrectable error of their node explains them, and the
node's unranked kernel line carries the one rank that reported the abort.
"""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.devicefault import device_error
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
NVML_LOST = "[gpu-health] nvidia-smi: Unable to determine the device handle for GPU 0000:81:00.0: Unknown Error"
XID94 = ("NVRM: Xid (PCI:0000:3b:00): 94, pid=3004, name=python3, Contained: SM (0x1). RST: No, "
         "D-RST: No")
AER_CORRECTED = "pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0"
RAS = "amdgpu 0000:75:00.0: amdgpu: uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!"


def worker(rank: int, node: str = "node-0") -> Origin:
    return Origin(f"worker-{rank}", rank, "dev", node, "stderr", "process")


def logged(origin: Origin, t: float, *lines: str) -> list[Finding]:
    return ENGINE.feed(origin, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def host(t: float, *lines: str, node: str = "node-0") -> list[Finding]:
    return logged(Origin(f"host/{node}", None, "dev", node, "kernel", "host"), t, *lines)


def job_hang(origin: Origin, t: float) -> Finding:
    """The timer's job hang (ftwatch.rules.timers.HangTracker._job_hang), ``origin`` silent first."""
    return Finding("hang.job", "hang", FailureClass.HANG, Action.RESTART_JOB, Severity.ERROR, origin,
                   "no output from any of 1 instance for 1800 s", T0 + t, 1, fields={"interval": 1800})


def decide(found: list[Finding], tmp_path: Path):
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", "dev"), "dev")
    return pol.decide(Incident(found[0], tuple(found), 8, frozenset({"worker-0"}), 0), T0 + 4000)


def test_a_gpu_nvml_cannot_reach_explains_the_hang_of_its_node(tmp_path: Path):
    w = worker(0)
    found = [job_hang(w, 1800.0), *logged(w, 1950.0, NVML_LOST)]
    rc = analyse(found).root_cause
    assert rc is not None and rc.rule_id == "nvml.gpu_handle_lost"
    d = decide(found, tmp_path)
    assert d.action is Action.ISOLATE_NODE and d.root_cause.failure_class is FailureClass.HARDWARE_NODE


def test_the_host_logs_gpu_off_the_bus_explains_the_hang_of_a_rank_on_that_node():
    found = [job_hang(worker(2), 1800.0),
             *host(1900.0, "NVRM: Xid (PCI:0000:3b:00): 79, pid=3004, name=python3, GPU has fallen off the bus.")]
    assert analyse(found).root_cause.rule_id == "xid.79"


def test_a_hang_stays_a_hang_beside_another_nodes_fault_or_a_fault_that_takes_no_device():
    w = worker(0)
    for other in (host(1900.0, NVML_LOST.removeprefix("[gpu-health] "), node="node-9"),
                  host(1900.0, XID94), host(1900.0, AER_CORRECTED)):
        rc = analyse([job_hang(w, 1800.0), *other]).root_cause
        assert rc is not None and rc.rule_id == "hang.job", other


def test_hip_and_hsa_errors_are_device_errors_a_ras_fault_of_their_node_explains(tmp_path: Path):
    for line in ("[rank5]: RuntimeError: HIP error: unspecified launch failure",
                 "[rank5]::0:rocdevice.cpp            :2875: 1726715563281 us: [pid:48810 tid:0x7f6a2dbff640] "
                 "Callback: Queue 0x7f5c18600000 aborting with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL "
                 "operation resulted in a hardware exception. code: 0x1016",
                 "[rank5]:HW Exception by GPU node-7 (Agent handle: 0x5581f0a2c4d0) reason :GPU Hang"):
        own = logged(worker(5), 1.0, line)
        assert own and all(device_error(f) for f in own), line
        found = [*own, *host(3.0, RAS)]
        rc = analyse(found).root_cause
        assert rc is not None and rc.rule_id == "amdgpu.ras_uncorrectable" and rc.rank == 5, line
        assert decide(found, tmp_path).action is Action.ISOLATE_NODE


def test_a_hip_error_on_a_node_without_a_device_fault_stays_the_programs():
    rc = analyse(logged(worker(5), 1.0, "[rank5]: RuntimeError: HIP error: an illegal memory access was encountered")
                 + host(3.0, RAS, node="node-9")).root_cause
    assert rc is not None and rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB


NOT_USABLE = "habanalabs 0000:1a:00.0: Failed to initialize hl2. Device is NOT usable !"
SYN_FAIL = "[1,2]<stderr>:RuntimeError: synStatus=26 [Generic failure] Device acquire failed."


def test_a_gaudi_runtime_error_is_explained_by_the_device_its_driver_disabled(tmp_path: Path):
    """Intel Gaudi's synStatus errors are device errors as CUDA's are: a generic synFail (26,
    relaunch once) beside the habanalabs driver's 'Device is NOT usable' on its node is that device."""
    own = logged(worker(2), 5.0, SYN_FAIL)
    assert own and all(device_error(f) for f in own)
    found = [*own, *host(1.0, NOT_USABLE)]
    rc = analyse(found).root_cause
    assert rc is not None and rc.rule_id == "habanalabs.device_not_usable", rc
    assert decide(found, tmp_path).action is Action.ISOLATE_NODE
    alone = analyse(own).root_cause     # no fault of its device logged: relaunch once
    assert alone is not None and alone.rule_id == "synapse.status.generic" and alone.action is Action.RESTART_IN_PLACE
