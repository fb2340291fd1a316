"""Rule 18 of rootcause: an OOM on a device the failing process held none of (ftwatch.policy.heldmemory)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.heldmemory import HELD_RULE, figures, held_elsewhere
from ftwatch.policy.rootcause import analyse

T0 = 1_795_219_200.0
# PyTorch < 2.1: the device is full, this process's allocator holds 22 MiB of 7.93 GiB.
HELD_OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.93 GiB total capacity; "
            "14.25 MiB already allocated; 9.56 MiB free; 22.00 MiB reserved in total by PyTorch)")
# The program's own need: its allocator holds almost all of the device.
OWN_OLD = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 3; 39.59 GiB total "
           "capacity; 37.80 GiB already allocated; 181.19 MiB free; 38.11 GiB reserved in total by PyTorch)")
# PyTorch 2.1+: a co-located engine holds most of the GPU, but this process had used 5 GiB of it.
SHARED_NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 7 has a total capacity "
              "of 79.10 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 5.77 GiB "
              "memory in use. Process 918273 has 72.19 GiB memory in use. Of the allocated memory 4.92 GiB is "
              "allocated by PyTorch, and 371.20 MiB is reserved by PyTorch but unallocated.")
HELD_NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
            "of 79.15 GiB of which 6.75 MiB is free. Process 4242 has 79.10 GiB memory in use. Of the allocated "
            "memory 8.00 MiB is allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but unallocated.")


def oom(line: str, instance: str = "train", t: float = 0.0) -> Finding:
    return Finding("cuda.out_of_memory", "keyword", FailureClass.OOM, Action.FAIL_JOB, Severity.ERROR,
                   Origin(instance, None, "job", "node-0", "stderr", "process"), line, T0 + t, seq=int(t))


def test_figures_read_both_formats():
    total, free, own = figures(HELD_OLD)
    assert round(total, 2) == 7.93 and free < 0.01 and round(own * 1024) == 22
    total, free, own = figures(SHARED_NEW)
    assert round(total, 2) == 79.10 and round(own, 1) == 5.3
    assert figures("RuntimeError: CUDA error: out of memory") is None


def test_full_device_the_process_never_used_isolates_its_node():
    for line in (HELD_OLD, HELD_NEW):
        an = analyse([oom(line)])
        assert an.root_cause.rule_id == HELD_RULE
        assert an.root_cause.failure_class is FailureClass.HARDWARE_NODE
        assert an.root_cause.action is Action.ISOLATE_NODE


def test_the_programs_own_need_stays_oom():
    for line in (OWN_OLD, SHARED_NEW):
        assert held_elsewhere(oom(line), [oom(line)]) is None
        assert analyse([oom(line)]).root_cause.rule_id == "cuda.out_of_memory"


def test_a_peer_of_the_same_job_may_hold_the_gpu():
    """Several instances: a misplaced peer on the same GPU takes memory the same way (the program's)."""
    fs = [oom(HELD_OLD, "rank1", 1.0), oom(OWN_OLD, "rank0", 0.5)]
    assert held_elsewhere(fs[0], fs) is None
    assert analyse([oom(HELD_OLD, "rank1")] * 1 + [oom(OWN_OLD, "rank0", 5.0)]).root_cause.rule_id == "cuda.out_of_memory"


# Recorded on an H200 (tools/gpu_capture.sh gpu_held): another process held 139 of 140 GiB, and the
# one-rank job's torch.cuda.set_device failed while making its CUDA context.
CONTEXT = ("Traceback (most recent call last):",
           '  File "/work/main/examples/train_gpu.py", line 108, in main',
           "    torch.cuda.set_device(device)",
           '  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/__init__.py", line 638, in set_device',
           "    torch._C._cuda_setDevice(device)",
           "torch.AcceleratorError: CUDA error: out of memory")
# The same error at a tensor's move to the GPU: the program's first use of the device, not its context.
MOVED = ("Traceback (most recent call last):",
         '  File "/site-packages/torch/nn/modules/module.py", line 379, in convert',
         "    return t.to(device, dtype if t.is_floating_point() else None, non_blocking)",
         "RuntimeError: CUDA error: out of memory")


def runtime_oom(evidence: tuple[str, ...], instance: str = "rank0", rank: int | None = 0) -> Finding:
    return Finding("cuda.error_out_of_memory", "keyword", FailureClass.OOM, Action.FAIL_JOB, Severity.ERROR,
                   Origin(instance, rank, "job", "node-0", "stderr", "process"), evidence[-1], T0, seq=0,
                   evidence=evidence)


def test_out_of_memory_while_making_the_cuda_context_isolates_its_node():
    """Also with the launcher's own lines in the incident (torchrun's summary: no process on the GPU)."""
    launcher = Finding("torchelastic.child_failed", "keyword", FailureClass.FALLOUT, Action.RESTART_JOB,
                       Severity.ERROR, Origin("combined", None, "job", "node-0", "stderr", "process"),
                       "failed (exitcode: 1) local_rank: 0", T0 + 1, seq=1)
    head = runtime_oom(CONTEXT)
    held = held_elsewhere(head, [head, launcher])
    assert held is not None and held.rule_id == HELD_RULE and held.fields["at"] == "context creation"
    assert held.failure_class is FailureClass.HARDWARE_NODE and held.action is Action.ISOLATE_NODE


def test_out_of_memory_elsewhere_or_beside_a_peer_stays_the_jobs():
    moved = runtime_oom(MOVED)
    assert held_elsewhere(moved, [moved]) is None
    first, peer = runtime_oom(CONTEXT), runtime_oom(CONTEXT, "rank1", 1)
    assert held_elsewhere(first, [first, peer]) is None      # every rank on one GPU: the program's placement
