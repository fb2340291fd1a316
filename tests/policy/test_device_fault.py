"""A fault of the device explains the program's error on it (ftwatch.policy.devicefault, R7 rule 10):
a hardware Xid on the node outranks the rank's CUDA error whatever the two clocks say; an
uncorrectable NPU memory event on the failing chip outranks the AI Core error it caused. Application
Xids, other nodes, other chips, non-device errors and out-of-memory stay as they were."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.devicefault import device_error, uncorrectable_chip_fault
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())


def logged(rank: int, t: float, *lines: str, node: str = "node-0") -> list[Finding]:
    o = Origin(f"worker-{rank}", rank, "dev", node, "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def host(t: float, *lines: str, node: str = "node-0") -> list[Finding]:
    o = Origin(f"host/{node}", None, "dev", node, "kernel", "host")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


def cuda(rank: int, t: float, message: str, node: str = "node-0") -> list[Finding]:
    return logged(rank, t, f"[rank{rank}]: Traceback (most recent call last):",
                  f'[rank{rank}]:   File "train.py", line 10, in <module>',
                  f"[rank{rank}]:     loss.backward()", f"[rank{rank}]: RuntimeError: CUDA error: {message}",
                  node=node)


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=3004, name=python3, GPU has fallen off the bus."
XID48 = ("NVRM: Xid (PCI:0000:3b:00): 48, pid=3004, name=python3, An uncorrectable double bit error (DBE) "
         "has been detected on GPU in the framebuffer at partition 2, subpartition 0.")
XID13 = ("NVRM: Xid (PCI:0000:3b:00): 13, pid=3004, name=python3, Graphics SM Warp Exception on "
         "(GPC 2, TPC 5, SM 0): Out Of Range Address")
XID43 = "NVRM: Xid (PCI:0000:3b:00): 43, pid=3004, name=python3, Ch 00000008"


def decide(found: list[Finding], tmp_path: Path):
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", "dev"), "dev")
    return pol.decide(Incident(found[0], tuple(found), 8, frozenset({"worker-3"}), 0), T0 + 60)


def test_a_hardware_xid_stamped_after_the_cuda_error_is_its_root_cause(tmp_path: Path):
    found = [*cuda(3, 1.0, "unspecified launch failure"), *host(5.0, XID79)]
    an = analyse(found)
    assert an.root_cause is not None and an.root_cause.rule_id == "xid.79"
    d = decide(found, tmp_path)
    assert d.action is Action.ISOLATE_NODE and d.root_cause.failure_class is FailureClass.HARDWARE_NODE


def test_a_dbe_beside_an_application_xid_outranks_the_illegal_address(tmp_path: Path):
    """Xid 48's workflow pairs it with the others; Xid 13 alone is the application's."""
    found = [*cuda(3, 1.0, "an illegal memory access was encountered"), *host(2.0, XID13, XID48)]
    assert analyse(found).root_cause.rule_id == "xid.48"
    assert decide(found, tmp_path).action is Action.ISOLATE_NODE


def test_nccl_unhandled_cuda_error_is_a_device_error_too():
    line = ("[rank3]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5")
    found = [*logged(3, 1.0, line), *host(4.0, XID79)]
    assert any(device_error(f) for f in found)
    assert analyse(found).root_cause.rule_id == "xid.79"


def test_application_xids_beside_a_cuda_error_stay_the_programs(tmp_path: Path):
    found = [*cuda(3, 1.0, "an illegal memory access was encountered"), *host(2.0, XID13, XID43)]
    rc = analyse(found).root_cause
    assert rc is not None and rc.failure_class is FailureClass.USER_CODE
    assert decide(found, tmp_path).action is Action.FAIL_JOB


def test_a_hardware_xid_on_another_node_explains_nothing():
    found = [*cuda(3, 1.0, "unspecified launch failure", node="node-0"), *host(5.0, XID79, node="node-1")]
    assert analyse(found).root_cause.rule_id != "xid.79"


def test_errors_no_device_returns_are_left_alone():
    """A Python exception and an out-of-memory are not how a device fault reaches the program."""
    value = logged(3, 1.0, "Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
                   "ValueError: bad shape")
    assert analyse([*value, *host(5.0, XID79)]).root_cause.failure_class is FailureClass.USER_CODE
    oom = cuda(3, 1.0, "out of memory")
    assert analyse([*oom, *host(5.0, XID79)]).root_cause.failure_class is FailureClass.OOM


AICORE = [
    "RuntimeError: npuSynchronizeDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:467 NPU function "
    "error: AclrtSynchronizeDeviceWithTimeout, error code is 507015",
    "[ERROR] 2026-04-20-16:24:17 (PID:47113, Device:2, RankID:2) ERR00100 PTA call acl api failed",
    "EZ9999: Inner Error!",
    "EZ9999: [PID: 47113] 2026-04-20-16:24:17.702.441 The error from device(chipId:2, dieId:0), serial number "
    "is 11, there is an aicore error exception, core id is 23, error code = 0x800000",
]


def hbm_event(device: int, at: str = "16:24:17") -> str:
    return (f"[ERROR] DRV(1203,dmp_daemon):2026-04-20-{at}.298.110 [fault_manager] event_id: [0x80E01809], "
            f"node_type: HBMC, sub_node_type: 0, sub_node_id: 0, err_level: critical, device_id: {device}")


def device_log(t: float, line: str) -> list[Finding]:
    o = Origin("device-os", None, "dev", "node-0", "stderr", "process")
    return ENGINE.feed(o, f"{line}\n".encode(), T0 + t, final=True)


def test_an_hbm_multi_bit_event_on_the_failing_chip_is_the_aicore_errors_cause(tmp_path: Path):
    event = device_log(20.0, hbm_event(2))
    assert any(uncorrectable_chip_fault(f) for f in event)
    found = [*logged(2, 1.0, *AICORE), *event]
    rc = analyse(found).root_cause
    assert rc is not None and rc.rule_id == "npu.80E01809" and rc.rank == 2
    assert rc.failure_class is FailureClass.HARDWARE_NODE and rc.action is Action.ISOLATE_NODE
    assert rc.fields["explains"].startswith(("torch_npu.", "acl.", "cann."))


def test_an_hbm_event_on_another_chip_or_long_before_explains_nothing():
    other = [*logged(2, 1.0, *AICORE), *device_log(20.0, hbm_event(5))]
    assert analyse(other).root_cause.rule_id != "npu.80E01809"
    stale = [*logged(2, 1.0, *AICORE), *device_log(20.0, hbm_event(2, at="15:04:17"))]   # 80 min before
    assert analyse(stale).root_cause.rule_id != "npu.80E01809"


def test_an_application_xid_is_explained_only_by_a_fault_of_its_own_gpu():
    other_gpu = host(2.0, XID48.replace("0000:3b:00", "0000:86:00"))
    assert analyse([*host(1.0, XID13), *other_gpu]).root_cause.rule_id == "xid.13"
    assert analyse([*host(1.0, XID13), *host(2.0, XID48)]).root_cause.rule_id == "xid.48"


def test_nvidia_smi_device_handle_lines_with_or_without_a_space_name_a_lost_gpu():
    """nvidia-smi prints ``for GPU <pci>`` or, in some versions, ``for GPU<pci>`` (kernel_vocab.tsv)."""
    for text in ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
                 "Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost"):
        [f] = logged(0, 1.0, text)
        assert f.rule_id == "nvml.gpu_handle_lost" and f.action is Action.ISOLATE_NODE


def test_an_xid_the_application_can_cause_does_not_explain_the_illegal_address(tmp_path: Path):
    """Xid 109 (context switch timeout) is graded RESET_GPU, but NVIDIA's table lists the user
    application among its causes: after the program's Xid 31 MMU fault it is that fault's follow-on."""
    xid31 = ("NVRM: Xid (PCI:0000:3b:00): 31, pid=3004, name=python3, channel 0x00000201, intr 00000000. "
             "MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x70a2_c8000000. "
             "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE")
    xid109 = ("NVRM: Xid (PCI:0000:3b:00): 109, pid=3004, name=python3, Ch 00000008, errorString CTX SWITCH "
              "TIMEOUT, Info 0x2c014")
    found = [*cuda(3, 1.0, "an illegal memory access was encountered"), *host(2.0, xid31, xid109)]
    assert any(f.rule_id == "xid.109" and f.action is Action.ISOLATE_NODE for f in found)
    assert analyse(found).root_cause.rule_id != "xid.109"
    assert decide(found, tmp_path).action is Action.FAIL_JOB


def test_an_exit_graded_as_hardware_explains_no_device_error():
    """An exit code is the process's end, not a report of the device (DLRover's private 14 under
    its launcher reads as a GPU fault; it still says nothing of why the CUDA call failed)."""
    head = cuda(3, 1.0, "an illegal memory access was encountered")
    ex = exit_finding(ProcessExit(head[0].origin, pid=103, returncode=14, signal=None, time=T0 + 3),
                      ExitCodeTable.load(), seq=0, launchers={"dlrover"})
    assert ex is not None and ex.failure_class is FailureClass.HARDWARE_NODE
    assert analyse([*head, ex]).root_cause.rule_id == "cuda.illegal_memory_access"


def test_a_network_or_storage_fault_of_the_node_explains_no_cuda_error():
    """mlx5 / IB port and file-system lines are hardware_node as well, but not the GPU's."""
    port = "mlx5_core 0000:5e:00.0: Port module event[error]: module 0, Cable error, Bus stuck (I2C or data shorted)"
    found = [*cuda(3, 1.0, "an illegal memory access was encountered"), *host(2.0, port)]
    assert any(f.failure_class is FailureClass.HARDWARE_NODE for f in found[1:]), [f.rule_id for f in found]
    assert analyse(found).root_cause.rule_id == "cuda.illegal_memory_access"


def test_a_later_unknown_cuda_error_names_no_fault_and_explains_no_device_error():
    """cudaErrorUnknown (999) is what a call returns after a fault, not the device's report of one:
    an NCCL build's 'named symbol not found' (500) stays the root cause beside it."""
    found = [*logged(0, 1.0, "node-0:48:48 [0] include/alloc.h:125 NCCL WARN Cuda failure 500 'named symbol not found'"),
             *cuda(0, 2.0, "unknown error")]
    assert [f.rule_id for f in found] == ["cuda.rt.symbol_not_found", "cuda.rt.unknown"]
    assert analyse(found).root_cause.rule_id == "cuda.rt.symbol_not_found"
    found = [*cuda(3, 1.0, "an illegal memory access was encountered"), *host(5.0, XID79)]
    assert analyse(found).root_cause.rule_id == "xid.79"        # a fault the driver reports still explains it


XID13_PID = ("NVRM: Xid (PCI:0000:3b:00): 13, pid={pid}, name=python3, Graphics SM Warp Exception on "
             "(GPC 2, TPC 5, SM 0): Out Of Range Address")
XID31_PID = ("NVRM: Xid (PCI:0000:{bus}:00): 31, pid={pid}, name=python3, Ch 00000008, intr 00000000. MMU Fault: "
             "ENGINE GRAPHICS GPCCLIENT_T1_10 faulted @ 0x7fd7_90743000. Fault is of type FAULT_PDE ACCESS_TYPE_READ")


def test_an_application_fault_that_stays_with_one_gpu_across_processes_is_the_gpus(tmp_path: Path):
    """Xid 13/31: NVIDIA restarts the application, then its workflow checks the application and the
    GPU; the fault on the same GPU for another process (another run) is the GPU's."""
    found = [*host(0.0, XID13_PID.format(pid=3643), XID43), *cuda(3, 1.0, "an illegal memory access was encountered"),
             *host(1500.0, XID31_PID.format(bus="3b", pid=4120))]
    rc = analyse(found).root_cause
    assert rc.rule_id == "xid.31" and rc.failure_class is FailureClass.HARDWARE_NODE
    assert rc.fields["pids"] == "3643,4120"
    assert decide(found, tmp_path).action is Action.ISOLATE_NODE


def test_one_process_or_other_gpus_or_other_xids_are_no_repeat(tmp_path: Path):
    """One process's Xids (a kernel bug gives 13, 31 and 43 at once), two processes on two GPUs (the
    program's fault follows it), Xid 43 (follow the application's error) stay the program's."""
    one = [*host(0.0, XID13_PID.format(pid=3643), XID31_PID.format(bus="3b", pid=3643), XID43),
           *cuda(3, 1.0, "an illegal memory access was encountered")]
    two_gpus = [*host(0.0, XID13_PID.format(pid=3643)), *cuda(3, 1.0, "an illegal memory access was encountered"),
                *host(900.0, XID31_PID.format(bus="5e", pid=4120))]
    xid43 = [*host(0.0, XID43, XID43.replace("pid=3004", "pid=4120")),
             *cuda(3, 1.0, "an illegal memory access was encountered")]
    for found in (one, two_gpus, xid43):
        assert analyse(found).root_cause.failure_class is FailureClass.USER_CODE
        assert decide(found, tmp_path).action is Action.FAIL_JOB


# --- a node's own reports that an accelerator is missing or faulty (issue 12, round 6) ---------------

NPU_507015 = ("[rank5]:RuntimeError: npuSynchronizeDevice:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:467 "
              "NPU function error: AclrtSynchronizeDeviceWithTimeout, error code is 507015")


def test_a_node_diagnosis_or_a_missing_gpu_explains_the_device_error_on_that_node():
    """Ascend DMI's EMERGENCY_WARN (the processor is faulty: replace it), lspci's rev ff and Slurm's
    GPU count below the configured one are the node's word on its accelerator: the runtime error
    of a rank on that node is how the fault reached it."""
    for report in ("        EMERGENCY_WARN",
                   "1c:00.0 VGA compatible controller: NVIDIA Corporation TU102GL [Quadro RTX 6000/8000] (rev ff)",
                   "gres/gpu count reported lower than configured (7 < 8)  slurm  2023-05-04T09:12:32 node-0"):
        an = analyse(logged(5, 10.0, NPU_507015) + host(600.0, report))
        assert an.root_cause.failure_class is FailureClass.HARDWARE_NODE, report
        assert an.root_cause.action is Action.ISOLATE_NODE, report
        # on another node it explains nothing
        other = analyse(logged(5, 10.0, NPU_507015) + host(600.0, report, node="node-9"))
        assert other.root_cause.rule_id == "torch_npu.synchronize_failed", report


NCCL_TIMEOUT = ("[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, "
                "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600073 milliseconds before timing out.")


def test_the_kernel_xid_root_cause_carries_the_rank_whose_device_reported_it(tmp_path: Path):
    """Rule 15: the host's Xid line names a PCI address, the rank's CUDA error names the rank."""
    for found in ([*host(0.0, XID79), *cuda(5, 3.0, "unknown error")],               # Xid first (rule 4 head)
                  [*cuda(5, 1.0, "unspecified launch failure"), *host(4.0, XID79)],  # CUDA error first (rule 10)
                  [*host(0.0, XID48), *cuda(5, 3.0, "uncorrectable ECC error encountered"),
                   *logged(0, 9.0, NCCL_TIMEOUT.format(r=0))]):                      # a peer's fallout names none
        rc = analyse(found).root_cause
        assert rc is not None and rc.rule_id in ("xid.79", "xid.48") and rc.rank == 5
        assert rc in analyse(found).real
        d = decide(found, tmp_path)
        assert d.action is Action.ISOLATE_NODE and d.root_cause.rank == 5 and d.target.node == "node-0"


def test_no_rank_is_guessed_for_two_ranks_another_node_or_fallout_only():
    """Counterexamples: which GPU is which rank is not in the logs when two ranks report device
    errors; a rank on another node is not the one hit; a peer's timeout is no device report."""
    two = [*host(0.0, XID79), *cuda(5, 3.0, "unknown error"), *cuda(6, 3.5, "unknown error")]
    other = [*host(0.0, XID79), *cuda(5, 3.0, "unknown error", node="node-1")]
    fallout = [*host(0.0, XID79), *logged(0, 9.0, NCCL_TIMEOUT.format(r=0))]
    for found in (two, other, fallout):
        rc = analyse(found).root_cause
        assert rc is not None and rc.rule_id == "xid.79" and rc.rank is None


XID94 = "NVRM: Xid (PCI:0000:3b:00): 94, pid=3004, name=python3, Contained ECC error"
XID64 = "NVRM: Xid (PCI:0000:{pci}:00): 64, pid='<unknown>', name=<unknown>, Row Remapper: Failed to remap row"


def test_a_contained_ecc_yields_to_its_gpus_failed_row_remap(tmp_path: Path):
    """Rule 16: Xid 94 is sympathetic (NVIDIA: RESTART_APP / IGNORE), Xid 64 on that GPU is RESET_GPU
    + CONTACT_SUPPORT: the GPU's worst Xid decides, and the rank its device error names stays."""
    found = [*host(0.0, XID94, XID64.format(pci="3b")), *cuda(2, 3.0, "uncorrectable ECC error encountered")]
    an = analyse(found)
    assert an.root_cause.rule_id == "xid.64" and an.root_cause.rank == 2 and an.real[0] is an.root_cause
    assert decide(found, tmp_path).action is Action.ISOLATE_NODE


def test_a_contained_ecc_alone_or_beside_another_gpus_remap_failure_stays_in_place():
    """Counterexamples: Xid 94 alone restarts in place; Xid 64 of another GPU says nothing of this one."""
    for kernel in ((XID94,), (XID94, XID64.format(pci="5e"))):
        rc = analyse([*host(0.0, *kernel), *cuda(2, 3.0, "uncorrectable ECC error encountered")]).root_cause
        assert rc.rule_id == "xid.94" and rc.action is Action.RESTART_IN_PLACE


SEGV = "/pai/run.sh: line 23:   318 Segmentation fault      (core dumped) python train.py"


def test_a_segfault_beside_a_hardware_xid_of_its_node_is_the_devices(tmp_path: Path):
    """Pairing rule 4 (microsoft/pai#4314): a job's segfault on a GPU with a DBE is the device's fault."""
    found = [*logged(3, 1.0, SEGV), *host(2.0, XID48)]
    assert analyse(found).root_cause.rule_id == "xid.48"
    assert decide(found, tmp_path).action is Action.ISOLATE_NODE


def test_a_segfault_beside_an_application_xid_or_another_nodes_fault_stays_the_programs():
    """Counterexamples: Xid 13/43 are what a crashing program causes itself; another node's Xid 48
    and a segfault alone say nothing of this node's device."""
    for found in ([*logged(3, 1.0, SEGV), *host(2.0, XID13, XID43)],
                  [*logged(3, 1.0, SEGV), *host(2.0, XID48, node="node-1")],
                  logged(3, 1.0, SEGV)):
        rc = analyse(found).root_cause
        assert rc.rule_id == "os.segfault" and rc.failure_class is FailureClass.USER_CODE
