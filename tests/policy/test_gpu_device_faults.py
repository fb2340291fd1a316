"""The GPU catalogs' new device reports and device errors take part in pairing rule 10
(``ftwatch.policy.devicefault``): NCCL's NVLS transport failing on the node's NVSwitch fabric
(``gpu.nvls_*``) explains the ``unhandled cuda error`` torch raises for it, and the CUDA math
libraries' status errors (cuFFT, cuSOLVER, cuSPARSE, cuRAND) are errors a device returns, as
cuDNN's and cuBLAS's are."""

from __future__ import annotations

from ftwatch.events import Origin
from ftwatch.policy.devicefault import device_error
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())


def logged(rank: int, t: float, *lines: str, node: str = "node-0"):
    o = Origin(f"worker-{rank}", rank, "dev", node, "stderr", "process")
    return ENGINE.feed(o, "".join(f"[rank{rank}]: {x}\n" for x in lines).encode(), T0 + t, final=True)


def host(t: float, *lines: str, node: str = "node-0"):
    o = Origin(f"host/{node}", None, "dev", node, "kernel", "host")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0 + t, final=True)


NCCL_NVLS = ["Traceback (most recent call last):",
             '  File "run.py", line 44, in main',
             "    dist.all_reduce(t)",
             "torch.distributed.DistBackendError: NCCL error in: /ws/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, "
             "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.29.3",
             "ncclUnhandledCudaError: Call to CUDA function failed.",
             "Last error:",
             "Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401 'the operation "
             "cannot be performed in the present state'."]
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=3004, name=python3, GPU has fallen off the bus."


def test_torchs_last_error_naming_the_nvls_fabric_is_the_root_cause():
    found = logged(2, 1.0, *NCCL_NVLS)
    assert [f.rule_id for f in found][0] == "nccl.unhandled_cuda_error"      # the traceback ends first
    an = analyse(found)
    assert an.root_cause is not None and an.root_cause.rule_id == "gpu.nvls_multicast_bind_failed"


def test_the_nvls_fault_on_another_node_explains_nothing():
    found = [*logged(2, 1.0, *NCCL_NVLS[:4]),
             *logged(9, 2.0, NCCL_NVLS[-1], node="node-1")]
    assert analyse(found).root_cause.rule_id == "nccl.unhandled_cuda_error"


def test_a_cuda_math_library_error_is_a_device_error():
    found = [*logged(3, 1.0, "Traceback (most recent call last):", '  File "t.py", line 9, in f',
                     "    torch.fft.rfft(x)", "RuntimeError: cuFFT error: CUFFT_EXEC_FAILED"), *host(4.0, XID79)]
    assert any(device_error(f) for f in found)
    assert analyse(found).root_cause.rule_id == "xid.79"
