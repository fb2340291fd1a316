"""Configuration errors NCCL names itself decide over the ncclSystemError PyTorch raises after them
(nccl_vocab.tsv: 'No usable listening interface found', 'No interface found in the same subnet',
'Invalid NCCL_COMM_ID', 'Duplicate GPU detected'): user_code / fail_job, a retry repeats them; a connect failure that names
no configuration stays retryable (a dead or unreachable peer looks the same)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
RAISED = "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled system error"


def logged(*lines: str) -> list[Finding]:
    o = Origin("worker-1", 1, "init", "node-1", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), T0, final=True)


def test_a_named_interface_error_is_the_root_cause_of_the_system_error():
    for warn, rule in [
        ("node-1:4410:4410 [0] bootstrap.cc:1043 NCCL WARN NET/Socket : No usable listening interface found",
         "nccl.no_listening_interface"),
        ("node-1:4410:4410 [0] misc/socket.cc:353 NCCL WARN Net : No interface found in the same subnet as "
         "remote address 192.168.10.11<29500>", "nccl.no_interface_in_subnet"),
        ("node-1:4410:4410 [0] bootstrap.cc:33 NCCL WARN Invalid NCCL_COMM_ID [head-0.cluster:37917], please "
         "use format: <ipv4>:<port> or [<ipv6>]:<port> or <hostname>:<port>", "nccl.invalid_comm_id"),
        ("node-1:4410:4493 [1] init.cc:871 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA "
         "device 1a000", "nccl.duplicate_gpu"),
    ]:
        rc = analyse(logged(warn, RAISED)).root_cause
        assert rc is not None and rc.rule_id == rule, (warn, rc)
        assert rc.failure_class is FailureClass.USER_CODE and rc.action is Action.FAIL_JOB


def test_a_connect_failure_naming_no_configuration_stays_retryable():
    rc = analyse(logged("node-1:4410:4493 [0] misc/socket.cc:484 NCCL WARN socketPollConnect: connect to "
                        "10.42.0.7<43261> failed : Connection refused", RAISED)).root_cause
    assert rc is not None and rc.failure_class is FailureClass.RETRYABLE_INFRA, rc
