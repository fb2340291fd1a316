"""A fault of the device explains the program's error on it (SPEC R7 rule 10, issue 12 items 2-3).

A GPU or NPU fault reaches a training process as an error of the runtime it calls: the driver
logs the fault (``NVRM: Xid 79``, ``Xid 48``, an Ascend chip event) and the next CUDA / ACL call of
the process on that device returns an error, which PyTorch raises as ``CUDA error: unspecified
launch failure``, ``an illegal memory access was encountered``, ``unknown error``, NCCL as
``unhandled cuda error``, torch_npu as ``error code is 507015`` with an ``EZ9999 ... aicore error``.
Read alone, those errors are graded as the program's (``cuda_errors.tsv``: the CUDA Runtime API
names program faults first for ``cudaErrorIllegalAddress`` / ``cudaErrorLaunchFailure`` and
"system specific" causes second; CANN's ``aclError`` rule 4: 5XXXXX codes are "internal software
or hardware errors"). Beside a fault of the device they are its consequence:

* NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, via gpu_xid.tsv) grades the hardware
  Xids (48 DBE, 64 remap failure, 74 NVLink, 79 off the bus, 95 uncontained ECC, 119/120 GSP ...)
  ``isolate_node_and_restart`` and the application Xids 13/31/43 ``RESTART_APP`` with the note that
  the app error follows; Xid 48's workflow pairs it with 63/64/94/95 ("pair with Xid 63/64/94/95
  and row-remap status"). ``cuda.unspecified_launch_failure``'s own note: "bug or hardware ...
  correlate with Xid".
* Huawei's CANN troubleshooting guide (hiascend.com canncommercial 800, maintenref
  troubleshooting_0008, "AI Core error": the device log's HBM multi-bit ECC event 0x80E01809 is
  the cause of the AI Core exception the process reported) reads an NPU's uncorrectable memory
  event on the chip of a failed AI Core task as the failure's cause, although MindCluster grades
  the patrol-scrub event alone NotHandleFault (nothing failed then).

So :func:`device_fault` returns, for an incident whose earliest real error is such a *device
error* (:func:`device_error`: a GPU/NPU runtime error the catalogs grade neither ``hardware_node``
nor ``oom``), the fault of the device that explains it:

1. a real finding of the same node graded ``hardware_node``, a printed line and not an exit, of
   an accelerator (``DEVICE_FAULT_PREFIXES``: an Xid or NVRM line of the host log, an uncorrectable
   ECC the runtime reported on another line, an NPU chip fault graded SeparateNPU ...; not the
   node's network, storage or corrected-error lines); when the device error is an application Xid, which names
   its GPU, a fault of that GPU), whatever its time within the incident (the kernel's clock and
   the process's are not the same clock, and the process may report the fault at its next
   synchronising call, before or after the driver's line is stamped); or
2. an NPU chip fault of the incident on the failing chip (:func:`ftwatch.policy.escalation.chip_of`
   of any device error of the failing instance: torch_npu and CANN name the chip on the lines after
   the one that raised) whose meaning in the fault table is an uncorrectable (multi-bit) memory error, within
   ``CHIP_WINDOW`` seconds of the device error, whatever its MindCluster level: graded up to
   ``hardware_node`` / ``isolate_node`` (the memory the failed task used is bad: an uncorrectable
   ECC is ``cudaErrorECCUncorrectable``'s and Xid 48's grade, device / isolate); or
3. an application fault that stays with one GPU: Xids of the catalog's ``app_or_gpu`` group
   (13 graphics exception, 31 MMU fault: ``RESTART_APP`` first, then NVIDIA's investigatory
   workflow ``WORKFLOW_XID_13`` / ``_31``, which checks the application and then the GPU; the Xid
   table's note: "repeated on one GPU with known-good code -> hardware") logged on the node's same
   GPU (``pci``) for ``REPEAT_PROCESSES`` or more different processes (the line's ``pid``): the
   fault followed the GPU from one run to the next, where a program's fault follows the program
   to whatever GPU it gets (escalation.py's device repeat reads two attempts the same way). The
   latest of them is returned graded ``hardware_node`` / ``isolate_node``. One process's Xids,
   however many, say nothing of the GPU (a kernel bug gives 13, 31 and 43 together).

4. for a native crash (a segmentation fault, an exit by SIGSEGV) as the earliest real error, a
   hardware Xid of the same node (graded ``hardware_node``, not one the application can cause):
   OpenPAI's maintainers found jobs failing with a segmentation fault on a GPU with an ECC error
   and ruled that reading the segfault as the user's permanent failure was wrong, the device being
   at fault (microsoft/pai#4314); NVIDIA's catalog has the application that touched a DBE's memory
   fail (Xid 48), and a program dies of it however its code handles the error. Not an NVRM line
   without an Xid, a network or storage fault, or an application Xid (13/31/43, 109: a crashing
   program causes those itself).

5. for a job hang as the earliest real error (``hang.job``: no output from any instance for the hang
   interval; its origin is the instance that went silent first), a fault of that instance's node that
   takes a device away (graded ``hardware_node`` / ``isolate_node``, of ``DEVICE_FAULT_PREFIXES``: NVML's
   ``Unable to determine the device handle ... Unknown Error`` / ``GPU is lost``, an Xid 79 off the bus,
   ``RmInitAdapter failed``, an amdgpu reset that failed), whatever its time within the incident: a
   process whose GPU stopped answering blocks in its next call to the driver and prints nothing, so the
   silence is how the device's fault reached it. NVML's reference reads NVML_ERROR_GPU_IS_LOST as "the
   target GPU has fallen off the bus or is otherwise inaccessible"; the maintainers' diagnoses of hung
   trainings whose GPU nvidia-smi could no longer reach (rwth-i6/returnn#1486, limbo0000/InstanceLoc#20:
   not the code, the GPU/node) read the hang as that fault's. A device fault that only restarts (a
   contained ECC, restart in place) or is no device's (the node's network, storage, a corrected error)
   explains no hang, nor does one of another node. The kernel's hung-task report of a process of the
   node (``os.hung_task``: a task in D state past ``hung_task_timeout_secs``) is such a hang too, and
   the GPU driver found hung on that node (``gpu.driver_hung_task``: nvidia-smi itself stuck in D
   state, "this means the driver is hung", NVIDIA/gpu-monitoring-tools#46) explains it.

6. for a collective stall (``interconnect_stall``: the incident's errors are only collective timeouts,
   every rank waited and none failed on its own, ``collectives.timeouts_only``), an NVLink Xid of a node
   of the waiting ranks (an Xid whose catalog meaning is an NVLink error: 74, 137, the NVLink5 Xids
   144-150, whatever its grade: a ``Nonfatal`` NVLink5 Xid is a notice alone, ``faultcodes``): the
   collective's traffic crosses that link, and NCCL's maintainers read such a stall beside NVLink Xids
   on one link as the node's fabric, not NCCL (NVIDIA/nccl#2241, an all-gather stuck on every rank of a
   B200 node with Xid 145 RLW_RXPIPE Nonfatal and Xid 137 on one link: "a hardware/fabric bug"). The Xid
   is returned graded ``hardware_node`` / ``isolate_node``. Not an NVLink Xid of another node, not one
   beside a rank's own error (that error decides), not a run that went on (no incident).

Counterexamples (nothing is paired): an application Xid (13/31/43) of one process beside a CUDA
error (both the program's: the catalog's ``RESTART_APP``); an Xid graded for isolation that NVIDIA's table says the
application can cause (109, context switch timeout, logged after a program's Xid 31 MMU fault on
that GPU: the program's fault, not the GPU's, as threads where the same fault followed the code
across GPUs found); a hardware fault on another node; a network, storage or exit finding graded
hardware; a program error that no device returns (a Python exception, an out-of-memory); an NPU
memory event on another chip, long before the failure, or reporting its recovery.

:func:`reporting_rank` names the rank a node's fault hit. A host's report of a device (the kernel's
``NVRM: Xid`` line, an ``mlx5_core`` health event, ``RmInitAdapter failed``) names a PCI address or
a pid, never a rank, while the process on that device reports the same fault through its runtime
(Xid 79's ``CUDA error: unknown error``, Xid 48's ``uncorrectable ECC error encountered``, NCCL's
``IBV_EVENT_DEVICE_FATAL``): NVIDIA's Xid catalog reads the application's error as following the
Xid on that GPU, and NCCL's IB transport reports the HCA's asynchronous events on the ranks that use
it. So when the root cause is such a host line with no rank, and exactly one rank of its node logged a
real error of a device (one graded ``hardware_node``, or a runtime device error), that rank is the
one the fault hit, and the root cause carries it. Counterexamples: two ranks of the node report
device errors (which GPU is which rank is not in the logs: no rank is named); the only ranked
errors are fallout (a peer's collective timeout) or exits; the rank's node is another.

:func:`worst_of_gpu` reads one GPU's several Xids by the worst of them. NVIDIA's catalog grades a
contained error (Xid 94, ``ROBUST_CHANNEL_CONTAINED_ERROR``) ``RESTART_APP`` with the investigatory
bucket ``IGNORE (sympathetic)``: it reports what the application hit, not the memory's state; Xid
48's workflow says to pair such an ECC Xid "with Xid 63/64/94/95 and row-remap status", and Xid 64
(``INFOROM_DRAM_RETIREMENT_FAILURE``: the row remapper failed) is ``RESET_GPU`` then
``CONTACT_SUPPORT``. So when the root cause is a hardware Xid graded ``restart_in_place`` and the
same GPU (the line's ``pci``) logged, in the incident, a hardware Xid graded ``isolate_node``, that one
decides: a restart in place would run on memory that can no longer be remapped. Counterexamples:
the isolating Xid names another GPU; it is an application Xid; the contained Xid is alone.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Sequence

from ftwatch.events import NOT_LOG_LINES, Action, FailureClass, Finding, Severity
from ftwatch.policy.escalation import chip_of, is_npu, is_recovery, npu_code
from ftwatch.rules.faultcodes import FaultTables, xid_groups

#: Rule families of errors a device returns to the program that calls it (CUDA runtime / driver as
#: PyTorch, THC, JAX and NCCL print them, cuDNN / cuBLAS / cuFFT / cuSOLVER / cuSPARSE / cuRAND status codes,
#: NVRM Xid lines, torch_npu, ACL runtime codes, CANN error codes, HCCL return codes, and AMD's: HIP's
#: hipError_t texts and the HSA runtime's memory faults, HW exceptions and queue statuses, rocm_vocab.tsv;
#: Intel Gaudi's synStatus codes as its PyTorch bridge raises them, stacks_vocab.tsv).
DEVICE_ERROR_PREFIXES = ("cuda.", "cudnn.", "cublas.", "cufft.", "cusolver.", "cusparse.", "curand.", "xid.",
                         "torch_npu.", "acl.", "aclnn.", "cann.", "hccl.result_", "hip.", "hsa.", "synapse.")
#: NCCL's wrappers of a CUDA error (ncclUnhandledCudaError, CUDACHECK's ``Cuda failure``).
DEVICE_ERROR_RULES = frozenset({"nccl.unhandled_cuda_error", "nccl.code.unhandled_cuda_error", "nccl.cuda_failure"})
#: Rule families of a GPU's or NPU's own fault reports (driver Xid / NVRM / NVML lines, DCGM, the
#: CUDA enum's device grades, NCCL's NVLS transport failing on the node's NVSwitch fabric
#: (``gpu.nvls_*``), NPU chip codes, ACL / torch_npu / CANN device errors): a node's network, storage
#: or corrected-error lines are hardware_node too but explain no device error. Also the node's
#: reports that an accelerator is missing or faulty: lspci's ``rev ff`` (``pci.gpu_*``), the amdgpu driver's RAS
#: uncorrectable error and failed reset (``amdgpu.*``), the HIP / HSA runtime's ECC reports (``hip.*``, ``hsa.*``), Slurm's GPU
#: count below the configured one (``slurm.gres_gpu_*``), Ascend DMI's diagnosis (``ascend_dmi.*``), the
#: habanalabs driver's disabled Gaudi devices (``habanalabs.*``), Tenstorrent's board and chip faults (``tt.*``),
#: AWS Neuron's hardware errors (``neuron.*``).
DEVICE_FAULT_PREFIXES = ("xid.", "gpu.", "nvml.", "nvrm.", "dcgm.", "cuda.", "npu.", "acl.", "torch_npu.", "cann.",
                         "ascend_dmi.", "pci.gpu_", "slurm.gres_gpu_", "amdgpu.", "hip.", "hsa.", "habanalabs.", "tt.",
                         "neuron.")
#: Runtime errors graded ``hardware_node`` whose text names no fault: CUDA's ``cudaErrorUnknown`` (999,
#: "an unknown internal error has occurred", CUDA Runtime API enum cudaError) is what a process's
#: next call returns after a fault (this module's docstring lists ``unknown error`` among the
#: consequences), not the device's report of one: it explains no other device error (rule 1).
NAMES_NO_FAULT = frozenset({"cuda.rt.unknown"})
#: a task of the node asleep uninterruptibly in the kernel past the hung-task threshold (Linux
#: kernel/hung_task.c): read as a job hang by rule 5 (a process blocked in a driver whose device
#: is gone is how that device's fault reached it)
HUNG_TASKS = frozenset({"os.hung_task"})
#: seconds between an NPU memory event and the device error on that chip (pairing rule 2)
CHIP_WINDOW = 120.0
#: processes (distinct pids) whose application Xids on one GPU make it the GPU's fault (pairing rule 3)
REPEAT_PROCESSES = 2
#: a fault table meaning that names an uncorrectable memory error (``multi-bit ECC``, ``UCE``)
_UNCORRECTABLE = re.compile(r"(?i)multi-bit|uncorrectable|\bUCE\b|double[- ]bit")
_REPEAT_SOURCE = ("docs.nvidia.com/deploy/xid-errors (Xid 13/31: RESTART_APP, then WORKFLOW_XID_13/31: the "
                  "application, then the GPU; a fault that stays with one GPU across runs is the GPU's)")
_STALL_SOURCE = ("NVIDIA/nccl#2241 (a collective stuck on every rank beside NVLink Xids 145/137 on one link: the "
                 "node's NVLink fabric, not NCCL); NVIDIA Xid catalog (NVLink Xids: WORKFLOW_NVLINK_ERR / _NVLINK5_ERR)")
_SOURCE = ("docs.nvidia.com/deploy/xid-errors (Xid catalog: hardware Xids isolate, application Xids follow "
           "the app error); hiascend.com CANN 8.0 troubleshooting_0008 (AI Core error caused by HBM multi-bit "
           "ECC 0x80E01809)")


@functools.lru_cache(maxsize=1)
def _tables() -> FaultTables:
    """The packaged fault tables, read once."""
    return FaultTables.load()


@functools.lru_cache(maxsize=1)
def _app_cause_xids() -> frozenset[int]:
    """The Xids NVIDIA's table says the user application can cause (``xid_groups()["app_cause"]``)."""
    return xid_groups()["app_cause"]


@functools.lru_cache(maxsize=1)
def _app_or_gpu_xids() -> frozenset[int]:
    """The Xids NVIDIA answers by restarting the application, then checking it and the GPU
    (``xid_groups()["app_or_gpu"]``: 13, 31)."""
    return xid_groups()["app_or_gpu"]


def device_error(f: Finding) -> bool:
    """Says whether ``f`` is an error a GPU/NPU runtime returned to the program, graded neither as
    the node's hardware nor as out of memory (a device fault may be its cause)."""
    family = f.rule_id.startswith(DEVICE_ERROR_PREFIXES) or f.rule_id in DEVICE_ERROR_RULES
    return family and f.failure_class not in (FailureClass.HARDWARE_NODE, FailureClass.OOM)


def app_caused(f: Finding) -> bool:
    """Says whether ``f`` is an Xid that NVIDIA's table says the application itself can cause
    (Xid 109, context switch timeout: "User App Error" among its causes), which follows an
    application's own fault as often as it explains one."""
    xid = f.fields.get("xid")
    return xid is not None and int(xid) in _app_cause_xids()


def uncorrectable_chip_fault(f: Finding) -> bool:
    """Says whether ``f`` is an NPU chip fault code whose table meaning is an uncorrectable memory
    error (``HBM multi-bit ECC found by patrol scrub`` ...), whatever its level."""
    if not is_npu(f) or is_recovery(f):
        return False
    entry = _tables().npu(npu_code(f))
    return entry is not None and bool(_UNCORRECTABLE.search(entry.meaning))


def device_fault(head: Finding, real: Sequence[Finding], findings: Sequence[Finding],
                 crashed: bool = False) -> Finding | None:
    """The fault of the device that explains the device error ``head`` (see the module docstring).

    Args:
        head: the incident's earliest real error (R7).
        real: its real errors, earliest first.
        findings: every finding of the incident (NPU events graded below an error are not in ``real``).
        crashed: ``head`` is a native crash (a segmentation fault, an exit by SIGSEGV): explained
            only by a hardware Xid of its node (rule 4 of the module docstring). A ``head`` of kind
            ``hang`` (a job hang) is explained only by an isolating device fault of its node (rule 5).

    Returns:
        The first ``hardware_node`` finding of ``real`` on ``head``'s node (rule 1), else a copy of
        the first uncorrectable NPU memory event on ``head``'s chip within ``CHIP_WINDOW`` seconds,
        graded ``hardware_node`` / ``isolate_node`` / critical, with the pairing in
        ``fields["explains"]`` and ``head``'s origin (the process that drives the chip: the target
        to isolate) (rule 2), else the latest application Xid of a GPU that several processes
        faulted on (rule 3, :func:`repeated_on_gpu`); None when ``head`` is no device error or
        nothing explains it.
    """
    if head.kind == "hang" or head.rule_id in HUNG_TASKS:   # a job hang: a lost device of its node (rule 5)
        return next((f for f in real if f is not head and f.kind not in NOT_LOG_LINES
                     and f.failure_class is FailureClass.HARDWARE_NODE and f.action is Action.ISOLATE_NODE
                     and f.rule_id.startswith(DEVICE_FAULT_PREFIXES) and f.origin.node == head.origin.node), None)
    if crashed:         # a native crash: only a hardware Xid of its node explains it (module docstring)
        return next((f for f in real if f is not head and "xid" in f.fields and f.kind not in NOT_LOG_LINES
                     and f.failure_class is FailureClass.HARDWARE_NODE and f.origin.node == head.origin.node
                     and not app_caused(f)), None)
    if not device_error(head):
        return None
    pci = head.fields.get("pci")        # an application Xid names its GPU: the fault must be that GPU's
    fault = next((f for f in real if f is not head and f.failure_class is FailureClass.HARDWARE_NODE
                  and f.kind not in NOT_LOG_LINES and f.rule_id.startswith(DEVICE_FAULT_PREFIXES)
                  and f.origin.node == head.origin.node
                  and not device_error(f) and not app_caused(f) and f.rule_id not in NAMES_NO_FAULT
                  and (not pci or f.fields.get("pci") == pci or pci in f.line)), None)
    if fault is not None:
        return fault
    ordered = sorted(findings, key=lambda x: (x.time, x.seq))
    repeat = repeated_on_gpu(head, ordered)
    if repeat is not None:
        return repeat
    # the chips the failing process named: torch_npu's "(PID:..., Device:2, RankID:2)", CANN's
    # "error from device(chipId:2, ...)" print it on lines after the one that raised
    chips = {chip_of(f) for f in ordered if f.origin.instance == head.origin.instance and device_error(f)}
    event = next((f for f in ordered
                  if uncorrectable_chip_fault(f) and f.origin.node == head.origin.node
                  and chip_of(f) in chips and abs(f.time - head.time) <= CHIP_WINDOW), None)
    if event is None:
        return None
    fields = dict(event.fields) | {"explains": head.rule_id, "table_level": event.fields.get("level")}
    return dataclasses.replace(event, origin=head.origin, failure_class=FailureClass.HARDWARE_NODE,
                               action=Action.ISOLATE_NODE, severity=Severity.CRITICAL, fields=fields,
                               source=f"{event.source}; paired: {_SOURCE}".lstrip("; "))


def _nvlink_xid(f: Finding) -> bool:
    """Says whether ``f`` is an Xid whose catalog meaning is an NVLink error (74, 137, 144-150 ...)."""
    xid = f.fields.get("xid")
    if xid is None or not f.rule_id.startswith("xid."):
        return False
    entry = _tables().xid(int(xid))
    return entry is not None and "nvlink" in entry.meaning.lower()


def interconnect_stall(fallout: Sequence[Finding], findings: Sequence[Finding]) -> Finding | None:
    """Pairing rule 6 (module docstring): the NVLink Xid that explains a collective stall.

    Args:
        fallout: the incident's errors, all fallout, that ``collectives.timeouts_only`` read as
            every rank waiting in a collective (the caller checks).
        findings: every finding of the incident, by (time, seq).

    Returns:
        A copy of the first NVLink Xid logged on a node of the waiting ranks, graded
        ``hardware_node`` / ``isolate_node`` / critical with ``fields["explains"]``; None when none.
    """
    nodes = {f.origin.node for f in fallout if f.kind not in NOT_LOG_LINES}
    xid = next((f for f in findings if f.kind not in NOT_LOG_LINES and _nvlink_xid(f) and f.origin.node in nodes),
               None)
    if xid is None:
        return None
    fields = dict(xid.fields) | {"explains": fallout[0].rule_id}
    return dataclasses.replace(xid, failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                               severity=Severity.CRITICAL, fields=fields,
                               source=f"{xid.source}; paired: {_STALL_SOURCE}")


def reporting_rank(cause: Finding, real: Sequence[Finding]) -> Finding:
    """The root cause with the rank its fault hit (module docstring, last paragraph).

    Args:
        cause: the root cause an analysis chose.
        real: the incident's real errors (the ranks' own reports of the fault among them).

    Returns:
        ``cause`` itself, or a copy whose origin names the one rank of its node that reported a
        device's error, when ``cause`` is an unranked ``hardware_node`` line.
    """
    if cause.rank is not None or cause.failure_class is not FailureClass.HARDWARE_NODE or cause.kind in NOT_LOG_LINES:
        return cause
    ranks = {f.rank for f in real if f is not cause and f.rank is not None and f.kind not in NOT_LOG_LINES
             and f.origin.node == cause.origin.node
             and (f.failure_class is FailureClass.HARDWARE_NODE or device_error(f))}
    if len(ranks) != 1:
        return cause
    return dataclasses.replace(cause, origin=dataclasses.replace(cause.origin, rank=ranks.pop()))


def worst_of_gpu(cause: Finding, real: Sequence[Finding]) -> Finding:
    """The root cause, or the same GPU's isolating Xid that outranks it (module docstring).

    Args:
        cause: the root cause an analysis chose.
        real: the incident's real errors.

    Returns:
        ``cause``, or the earliest hardware Xid of ``real`` on ``cause``'s GPU graded ``isolate_node``
        when ``cause`` is a hardware Xid graded ``restart_in_place``.
    """
    pci = cause.fields.get("pci")
    if (not pci or "xid" not in cause.fields or cause.failure_class is not FailureClass.HARDWARE_NODE
            or cause.action is not Action.RESTART_IN_PLACE):
        return cause
    return next((f for f in real if "xid" in f.fields and f.fields.get("pci") == pci
                 and f.origin.node == cause.origin.node and f.failure_class is FailureClass.HARDWARE_NODE
                 and f.action is Action.ISOLATE_NODE), cause)


def repeated_on_gpu(head: Finding, ordered: Sequence[Finding]) -> Finding | None:
    """Pairing rule 3: an application Xid that stays with one GPU of ``head``'s node (that GPU
    when ``head`` names one) across ``REPEAT_PROCESSES`` or more processes.

    Args:
        head: the incident's earliest real error, a device error.
        ordered: every finding of the incident, by (time, seq).

    Returns:
        A copy of the latest such Xid, graded ``hardware_node`` / ``isolate_node`` / critical, with
        ``fields["pids"]`` (the processes, in order) and ``fields["explains"]``; None when no GPU
        has them.
    """
    pci = head.fields.get("pci")
    seen: dict[str, dict[str, Finding]] = {}        # GPU -> pid -> its latest app-or-GPU Xid
    for f in ordered:
        xid, gpu, pid = f.fields.get("xid"), f.fields.get("pci"), f.fields.get("pid")
        if (xid is None or not gpu or not pid or f.origin.node != head.origin.node
                or int(xid) not in _app_or_gpu_xids() or (pci and gpu != pci)):
            continue
        seen.setdefault(str(gpu), {})[str(pid)] = f
    for procs in seen.values():
        if len(procs) >= REPEAT_PROCESSES:
            last = max(procs.values(), key=lambda x: (x.time, x.seq))
            fields = dict(last.fields) | {"pids": ",".join(procs), "explains": head.rule_id}
            return dataclasses.replace(last, failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                                       severity=Severity.CRITICAL, fields=fields,
                                       source=f"{last.source}; paired: {_REPEAT_SOURCE}".lstrip("; "))
    return None
