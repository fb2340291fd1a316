"""AMD's GPU runtimes, the amdgpu driver's kernel lines, a TPU held by another process and a node whose
container runtime is broken, graded by their sources (issue 12 item 2, round 8).

HIP prints the CUDA runtime's texts for the errors of the same names (ROCm/clr ``hip_error.cpp``), so
each carries the CUDA grade: ECC and no device isolate, an illegal address is the program's, a launch
failure and HIP's ``unknown error`` (printed for every code HIP does not list) relaunch once. The HSA
runtime's memory fault says why (ROCR ``runtime.cpp``): an ECC failure is the device's, a page not
present is the program's address. A HW exception by ECC isolates; by a GPU hang the driver reset the
GPU (hang, restart). A TPU whose vfio group is busy at start is held outside the job (isolate, as
``cudaErrorDevicesUnavailable``); libtpu's lockfile message names a holder the job shares ``/tmp``
with, most often its own process, and is not graded so. enroot's helpers without their capabilities
and pyxis failing to create the container file system are the node's, before the job ran; so is an
NVIDIA kernel module that is not loaded (NVML_ERROR_DRIVER_NOT_LOADED).
Sources: ``ftwatch/rules/packs/{rocm_vocab,kernel_vocab,stacks_vocab,env_vocab}.tsv``.
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
ORIGIN = Origin("worker-0", 0, "job-7", "node-a", "stderr", "process")
ISOLATE = (FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)


def _graded(line: str) -> set[tuple[str, FailureClass, Action]]:
    found = Engine(BUILTIN).feed(ORIGIN, f"{line}\n".encode(), 1_795_253_763.0, final=True)
    return {(f.rule_id, f.failure_class, f.action) for f in found}


@pytest.mark.parametrize(("line", "rule_id", "grade"), [
    # the CUDA rule reads the same text without a prefix and carries the same grade
    ("RuntimeError: HIP error: uncorrectable ECC error encountered", "cuda.uncorrectable_ecc", ISOLATE),
    ("hipErrorECCNotCorrectable returned by hipMemcpy", "hip.rt.ecc_uncorrectable", ISOLATE),
    ("RuntimeError: HIP error: no ROCm-capable device is detected", "hip.rt.no_device", ISOLATE),
    ("[rank1]: RuntimeError: HIP error: an illegal memory access was encountered", "hip.rt.sticky_program",
     (FailureClass.USER_CODE, Action.FAIL_JOB)),
    ("RuntimeError: HIP error: invalid device function", "hip.rt.usage", (FailureClass.USER_CODE, Action.FAIL_JOB)),
    (":1:hip_code_object.cpp       :616 : 4145912745 us: 3012 : [tid:0x7f0c3] hipErrorNoBinaryForGpu: Unable to find code "
     "object for all current devices!", "hip.rt.usage", (FailureClass.USER_CODE, Action.FAIL_JOB)),
    ("RuntimeError: HIP error: unspecified launch failure", "hip.rt.launch_failure",
     (FailureClass.USER_CODE, Action.RESTART_IN_PLACE)),
    ("RuntimeError: HIP error: unknown error", "hip.rt.unknown", (FailureClass.USER_CODE, Action.RESTART_IN_PLACE)),
    ("RuntimeError: HIP error: out of memory", "hip.rt.out_of_memory", (FailureClass.OOM, Action.FAIL_JOB)),
    # RCCL prints the same texts as NCCL's hipified 'Cuda failure'
    ("node-3:2111:2190 [1] NCCL WARN HIP failure 'unknown error' at /src/rccl/src/transport/p2p.cc:221",
     "hip.rt.unknown", (FailureClass.USER_CODE, Action.RESTART_IN_PLACE)),
    ("Memory access fault by GPU node-9 (Agent handle: 0x55e1a4f2b9c0) on address 0x7f2a00000000. Reason: DRAM ECC failure.",
     "hsa.memory_fault_ecc", ISOLATE),
    ("Memory access fault by GPU node-9 (Agent handle: 0x55e1a4f2b9c0) on address 0x7f2a00000000(may not be exact "
     "address). Reason: SRAM ECC failure.", "hsa.memory_fault_ecc", ISOLATE),
    ("Memory access fault by GPU node-2 (Agent handle: 0x55e1a4f2b9c0) on address 0x7f13c09d4000. Reason: Page not "
     "present or supervisor privilege.", "hsa.memory_fault_program", (FailureClass.USER_CODE, Action.FAIL_JOB)),
    ("HW Exception by GPU node-7 (Agent handle: 0x5581f0a2c4d0) reason :ECC", "hsa.hw_exception_ecc", ISOLATE),
    ("[default5]:HW Exception by GPU node-7 (Agent handle: 0x5581f0a2c4d0) reason :GPU Hang", "hsa.hw_exception_gpu_hang",
     (FailureClass.HANG, Action.RESTART_JOB)),
    (":0:rocdevice.cpp            :2672: 0891442307 us: 7133 : [tid:0x7f1a2c3fe640] Device::callbackQueue aborting with "
     "error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to access memory beyond the largest legal "
     "address. code: 0x29", "hsa.status_program", (FailureClass.USER_CODE, Action.FAIL_JOB)),
    ("[14302.551902] amdgpu 0000:75:00.0: amdgpu: 3 uncorrectable hardware errors detected in umc block",
     "amdgpu.ras_uncorrectable_count", ISOLATE),
    ("amdgpu 0000:75:00.0: amdgpu: {7}socket: 0, die: 1, 1 new uncorrectable hardware errors detected in gfx block",
     "amdgpu.ras_uncorrectable_count", ISOLATE),
    ("[14302.551902] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring comp_1.0.0 timeout, signaled seq=91823, emitted "
     "seq=91825", "amdgpu.ring_timeout", (FailureClass.HANG, Action.RESTART_JOB)),
    ("amdgpu 0000:03:00.0: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:24 vmid:3 pasid:32777, for process "
     "python3 pid 4412 thread python3 pid 4412)", "amdgpu.vm_page_fault", (FailureClass.USER_CODE, Action.RESTART_IN_PLACE)),
    ("(EngineCore_0 pid=2311) jax.errors.JaxRuntimeError: UNKNOWN: TPU initialization failed: open(/dev/vfio/0): Device "
     "or resource busy: Device or resource busy; Couldn't open iommu group /dev/vfio/0", "tpu.device_busy", ISOLATE),
    ("RuntimeError: Failed to initialize TPU system with error: FAILED_PRECONDITION: open(/dev/vfio/0): Device or "
     "resource busy: Device or resource busy; Couldn't open iommu group /dev/vfio/0", "tpu.device_busy", ISOLATE),
    ("enroot-aufs2ovlfs: failed to set capabilities: Operation not permitted", "enroot.helper_capabilities_failed", ISOLATE),
    ("enroot-nsenter: failed to create user namespace: Operation not permitted", "enroot.helper_capabilities_failed",
     ISOLATE),
    ("pyxis: failed to create container filesystem", "pyxis.container_filesystem_failed", ISOLATE),
    ("[ 9121.004411] amdgpu 0000:03:00.0: amdgpu: device lost from bus!", "amdgpu.device_lost_from_bus", ISOLATE),
    ("[ 9121.120301] amdgpu 0000:03:00.0: amdgpu: GPU Recovery Failed: -19", "amdgpu.gpu_recovery_failed", ISOLATE),
    ("I0612 03:14:07.118203       1 server.go:245] 'nvidia.com/gpu' device marked unhealthy: "
     "GPU-c24840ec-8de1-43d5-b126-08000173ae32", "gpu.device_plugin_unhealthy",
     # notify since round 10: the plugin marks a GPU on any Xid outside its skip list (k8s-device-plugin#234);
     # the Xid it names (its XidCriticalError line, the kernel's NVRM line) decides through gpu_xid.tsv
     (FailureClass.HARDWARE_NODE, Action.NOTIFY)),
    ("        Remapping Failure Occurred        : Yes", "gpu.row_remapping_failure", ISOLATE),
    # the node's NVIDIA kernel module is not loaded, as nvidia-smi, pynvml and the container toolkit say it
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
     "driver is installed and running.", "nvml.driver_not_loaded", ISOLATE),
    ("pynvml.nvml.NVMLError_DriverNotLoaded: Driver Not Loaded", "nvml.driver_not_loaded", ISOLATE),
    ("nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown", "nvml.driver_not_loaded",
     ISOLATE),
])
def test_each_line_carries_its_sources_grade(line, rule_id, grade):
    graded = _graded(line)
    assert (rule_id, *grade) in graded, graded


@pytest.mark.parametrize("line", [
    # HIP's texts without HIP's prefix belong to no HIP rule (CUDA's rules read CUDA's prefix)
    "RuntimeError: CUDA error: unknown error",
    # the all-clear of a RAS query and a corrected count
    "amdgpu 0000:75:00.0: amdgpu: no uncorrectable hardware errors detected in umc block",
    "amdgpu 0000:75:00.0: amdgpu: 12 correctable hardware errors detected in umc block",
    # the ring came back without a reset
    "amdgpu 0000:75:00.0: amdgpu: ring gfx_0.0.0 timeout, but soft recovered",
    # libtpu's lockfile: the holder shares the job's /tmp (its own other process, most often)
    "RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 27846. "
    "Not attempting to load libtpu.so in this process.",
    # a remapped row with no failure is healthy (leptonai/gpud#108)
    "        Remapping Failure Occurred        : No",
    # a GPU the device plugin gives back, a reset that worked
    "I0612 03:20:07.118203       1 server.go:245] 'nvidia.com/gpu' device marked healthy: GPU-c24840ec",
    "amdgpu 0000:03:00.0: amdgpu: GPU reset(2) succeeded!",
    # pyxis naming the user's own arguments or a missing image file
    "slurmstepd: error: pyxis: --container-mounts: source path does not exist: /data/run7",
    "slurmstepd: error: pyxis:     [ERROR] No such file or directory: /scratch/ci/vllm-openai-rocm_v0.21.0.sqsh",
])
def test_lines_that_name_no_node_fault_isolate_nothing(line):
    assert not [g for g in _graded(line) if g[2] is Action.ISOLATE_NODE and g[0].startswith(
        ("hip.", "hsa.", "amdgpu.", "tpu.", "enroot.", "pyxis.", "gpu."))], _graded(line)
    assert not [g for g in _graded(line) if g[0].startswith(("hip.rt.", "tpu.", "enroot.", "pyxis."))]
