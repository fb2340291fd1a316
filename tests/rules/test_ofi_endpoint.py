"""aws-ofi-nccl's endpoint that libfabric's EFA provider could not enable for lack of memory
(``nccl.ofi_enable_endpoint_out_of_memory``, nccl_vocab.tsv): the hosts' locked-memory limit or EFA
install, a set-up a restart repeats; NCCL's ``unhandled system error`` after it is its consequence."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from tests.rules.test_stacks_vocab import findings

ENGINE = Engine(load_rules())
T0 = 1_795_219_200.0
LINE = ("ip-172-31-6-189:8811:8952 [0] create_nccl_ofi_component:496 NCCL WARN NET/OFI Couldn't enable endpoint. "
        "RC: -12, ERROR: Cannot allocate memory")


def test_the_endpoint_enomem_is_the_hosts_set_up():
    hit = [f for f in findings(LINE) if f.rule_id == "nccl.ofi_enable_endpoint_out_of_memory"]
    assert hit and (hit[0].failure_class, hit[0].action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_another_return_code_is_not_read_so():
    other = LINE.replace("RC: -12, ERROR: Cannot allocate memory", "RC: -22, ERROR: Invalid argument")
    assert not [f for f in findings(other) if f.rule_id == "nccl.ofi_enable_endpoint_out_of_memory"]


def test_it_explains_the_unhandled_system_error_after_it():
    o = Origin("rank0", 0, "hvd", "ip-172-31-6-189", "stdout", "file")
    found = ENGINE.feed(o, (LINE + "\n").encode(), T0, final=True)
    found += ENGINE.feed(o, b"tensorflow.python.framework.errors_impl.UnknownError: ncclCommInitRank failed: "
                            b"unhandled system error\n", T0 + 1, final=True)
    rc = analyse(found, world=4).root_cause
    assert rc is not None and rc.rule_id == "nccl.ofi_enable_endpoint_out_of_memory", rc
