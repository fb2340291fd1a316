"""A platform's or driver's own word on why a run ended (``platform_vocab.tsv``), graded by its source:
the Ascend driver's managed-heap out-of-memory (CANN troubleshooting: the job's size or concurrency, oom),
AWS Batch's "Host EC2 ... terminated" status reason (the instance was taken: restart), ModelArts'
"Training end with return code: 137" (its troubleshooting page: the job's memory overflow, oom)."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass
from tests.rules.test_stacks_vocab import findings      # the built-in rules over lines of one stream


@pytest.mark.parametrize("line, rule, failure_class, action", [
    ("[ERROR] DRV(1184522,python3):2026-03-17-15:03:12.604.118 [ascend][curpid: 1184522, 1190377][drv][devmm]"
     "[devmm_alloc_managed 182]<errno:12, 6> Heap_alloc_managed out of memory. (temp_ptr=0x1; bytesize=12884901888)",
     "cann.devmm_heap_alloc_managed_out_of_memory", FailureClass.OOM, Action.FAIL_JOB),
    ("[ERROR] DRV(41852,python3.7):2021-11-11-11:19:04.908.459 [ascend][curpid: 41852, 50983][drv][devmm]"
     "[devmm_alloc_managed 126]<errno:12, 6> heap_alloc_managed out of memory, pp=0x1, bytesize=15069901824.",
     "cann.devmm_heap_alloc_managed_out_of_memory", FailureClass.OOM, Action.FAIL_JOB),
    ("Job train-0227 (queue gpuSpotQueue): Status: FAILED  Status Reason: Host EC2 Terminated",
     "aws_batch.host_ec2_terminated", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("statusReason: Host EC2 (instance i-0a1b2c3d4e5f60718) terminated.",
     "aws_batch.host_ec2_terminated", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("[Modelarts Service Log]Training end with return code: 137",
     "modelarts.training_end_return_code_137", FailureClass.OOM, Action.FAIL_JOB),
])
def test_each_end_report_is_graded_by_its_source(line, rule, failure_class, action):
    hit = [f for f in findings(line) if f.rule_id == rule]
    assert hit and (hit[0].failure_class, hit[0].action) == (failure_class, action)


@pytest.mark.parametrize("line, rule", [
    ("[Modelarts Service Log]Training end with return code: 0", "modelarts.training_end_return_code_137"),
    ("[Modelarts Service Log]Training end with return code: 1370", "modelarts.training_end_return_code_137"),
    ("Status Reason: Essential container in task exited", "aws_batch.host_ec2_terminated"),
    ("[ERROR] DRV(41852,python3.7):2021-11-11-11:19:04.817.448 [ascend][curpid: 41852, 50983][drv][devmm]"
     "[devmm_ioctl_alloc_dev 247]<errno:12, 6> advise mem error! ret=6", "cann.devmm_heap_alloc_managed_out_of_memory"),
])
def test_other_lines_of_the_same_sources_are_not_read_so(line, rule):
    assert not [f for f in findings(line) if f.rule_id == rule]
