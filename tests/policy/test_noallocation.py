"""Rule 19 of rootcause: no GPU because the job's allocation gave it none (ftwatch.policy.noallocation)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.noallocation import NOT_ALLOCATED_RULE, not_allocated
from ftwatch.policy.rootcause import analyse

T0 = 1_795_219_200.0


def finding(rule: str, cls: FailureClass, action: Action, severity: Severity, line: str, instance: str = "trial",
            t: float = 0.0) -> Finding:
    return Finding(rule, "keyword", cls, action, severity, Origin(instance, None, "job", "node-0", "stderr", "process"),
                   line, T0 + t, seq=int(t))


def no_device(rule: str = "cuda.no_device", t: float = 10.0) -> Finding:
    return finding(rule, FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE, Severity.CRITICAL,
                   "RuntimeError: CUDA error: no CUDA-capable device is detected", t=t)


def said(rule: str = "allocation.no_gpu.ray", instance: str = "driver", t: float = 1.0) -> Finding:
    return finding(rule, FailureClass.INFO, Action.NONE, Severity.INFO, "Resources requested: 2/12 CPUs, 0/2 GPUs",
                   instance, t)


def test_no_device_with_the_allocators_word_is_the_jobs_request():
    head = no_device()
    got = not_allocated(head, [said(), head])
    assert got is not None
    assert (got.rule_id, got.failure_class, got.action) == (NOT_ALLOCATED_RULE, FailureClass.USER_CODE,
                                                           Action.FAIL_JOB)
    assert got.fields["allocation"] == "allocation.no_gpu.ray"


def test_the_allocation_stands_whatever_the_streams_times_say():
    head = no_device("torch.no_cuda_gpus", t=1.0)
    assert not_allocated(head, [head, said("allocation.no_gpu.nni", t=30.0)]) is not None


def test_no_device_without_it_stays_the_nodes():
    head = no_device()
    assert not_allocated(head, [head]) is None
    an = analyse([head])
    assert (an.root_cause.rule_id, an.root_cause.action) == ("cuda.no_device", Action.ISOLATE_NODE)


def test_other_errors_are_not_regraded():
    oom = finding("cuda.out_of_memory", FailureClass.OOM, Action.FAIL_JOB, Severity.ERROR, "CUDA out of memory")
    assert not_allocated(oom, [said(), oom]) is None


def test_analyse_reads_it_as_the_root_cause():
    head = no_device()
    an = analyse([said("allocation.no_gpu.visible_devices"), head])
    assert (an.root_cause.rule_id, an.root_cause.failure_class) == (NOT_ALLOCATED_RULE, FailureClass.USER_CODE)


def test_the_xpu_builds_no_device_error_is_read_the_same_way():
    head = no_device("torch.no_xpu_devices")
    got = not_allocated(head, [said("allocation.no_gpu.visible_devices"), head])
    assert got is not None and got.failure_class == FailureClass.USER_CODE
    assert not_allocated(head, [head]) is None
