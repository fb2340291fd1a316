"""Root cause rule 13: NCCL's ``Last error:`` text, printed by PyTorch after the generic NCCL result
code it raised, is the specific reading of that failure (``ftwatch.policy.lasterror``).

The log lines here are built the way PyTorch prints them (torch/csrc/distributed/c10d/NCCLUtils.cpp
``getNcclErrorDetailStr``: the result code's interpretation, then ``"\\nLast error:\\n"`` and
``ncclGetLastError()``), and NCCL's last error is the WARN's message without its
``host:pid:tid [dev] file:line NCCL WARN`` prefix (NVIDIA/nccl src/debug.cc ``ncclDebugLogV``).
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.policy.lasterror import named_by_last_error, nccl_result
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
T0 = 1_795_253_763.0
INTERNAL = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:3356, internal error - please report this issue to the NCCL developers, "
            "NCCL version 2.27.7")
SYSTEM = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
          "ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), "
          "NCCL version 2.21.5")
DETAIL = {INTERNAL: "ncclInternalError: Internal check failed.",
          SYSTEM: "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error."}


def raised(rank: int, code: str, last: str | None, between: str | None = None) -> list[str]:
    """One rank's traceback as torchrun's ``[rankN]:`` prefix shows it, ending in ``code``, its detail
    line and (when ``last`` is given) ``Last error:`` and NCCL's last WARN text."""
    lines = ["Traceback (most recent call last):", '  File "/srv/app/train.py", line 140, in <module>',
             "    dist.barrier()", code, DETAIL[code]]
    if between is not None:
        lines.append(between)
    if last is not None:
        lines += ["Last error:", last]
    return [f"[rank{rank}]: {x}" for x in lines]


def findings(*lines: str) -> list:
    origin = Origin("combined", None, "job-13", "node-a", "stderr", "process")
    return Engine(BUILTIN).feed(origin, "".join(f"{x}\n" for x in lines).encode(), T0, final=True)


@pytest.mark.parametrize("last, rule_id, failure_class, action", [
    ("ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)",
     "nccl.socket_address_not_ip", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Bootstrap : no socket interface found", "nccl.bootstrap_no_interface", FailureClass.USER_CODE,
     Action.FAIL_JOB),
    ("NET/Socket : No usable listening interface found", "nccl.no_listening_interface", FailureClass.USER_CODE,
     Action.FAIL_JOB),
    ("Net : No interface found in the same subnet as remote address 192.168.10.11<29500>",
     "nccl.no_interface_in_subnet", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Invalid NCCL_COMM_ID [queue-trn2-1.cluster:37917], please use format: <ipv4>:<port> or [<ipv6>]:<port> "
     "or <hostname>:<port>", "nccl.invalid_comm_id", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("socketStartConnect: Connect to 10.42.0.7<43261> failed : Operation not permitted",
     "nccl.socket_connect_not_retried", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Connect to fe80::4811:8aff:fe89:315f%vethe2e6725<43261> failed : Network is unreachable",
     "nccl.socket_connect_net_unreachable", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("Call to ibv_modify_qp failed with error Connection timed out errno 110", "nccl.ibv_call_failed",
     FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("Could not find real path of /sys/class/net/usb0/device", "nccl.topo_sysfs_path_missing",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Could not find real path of mlx5_0 (/sys/class/infiniband/mlx5_0/device)", "nccl.topo_sysfs_path_missing",
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("NET/OFI Unable to register memory (type = 2) for device 4. RC: -22, Error: Invalid argument",
     "nccl.ofi_register_mr_invalid_argument", FailureClass.USER_CODE, Action.FAIL_JOB),
    ("Cuda failure 2 'out of memory'", None, FailureClass.OOM, None),
    ("Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 1 'invalid argument'",
     "gpu.nvls_multicast_bind_failed", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
])
def test_nccls_last_error_decides_the_generic_code_torch_raised(last, rule_id, failure_class, action):
    fs = findings(*raised(0, INTERNAL, last))
    assert [f.rule_id for f in fs][:2] == ["nccl.internal_error", "nccl.code.internal_error"]
    rc = analyse(fs).root_cause
    assert rc is fs[2] and rc.line == last
    assert rc.failure_class is failure_class
    if rule_id is not None:
        assert (rc.rule_id, rc.action) == (rule_id, action)


def test_the_vocabulary_still_needs_nccls_own_wording_without_the_warn_prefix():
    # a connect failure of another program (no NCCL address<port>) is no NCCL rule's
    assert not [f for f in findings("connect to 10.0.0.4:29500 failed: Network is unreachable")
                if f.rule_id.startswith("nccl.socket_connect")]


def test_a_last_error_text_no_rule_knows_leaves_the_generic_code():
    fs = findings(*raised(0, INTERNAL, "ncclSomethingNew: a check NCCL adds one day failed"))
    assert [f.rule_id for f in fs] == ["nccl.internal_error", "nccl.code.internal_error"]
    assert analyse(fs).root_cause is fs[0]


def test_without_a_last_error_the_generic_code_stays_the_root_cause():
    fs = findings(*raised(0, SYSTEM, None))
    assert analyse(fs).root_cause.rule_id == "nccl.unhandled_system_error"


def test_the_last_error_must_follow_on_the_same_instance():
    # rank 0 raised the code; the text NCCL names comes from rank 1, which raised nothing
    fs = findings(*raised(0, INTERNAL, None), "[rank1]: Bootstrap : no socket interface found")
    code = next(f for f in fs if f.rule_id == "nccl.internal_error")
    assert not named_by_last_error(code, fs, fs)
    assert analyse(fs).root_cause is code


def test_another_finding_in_between_breaks_the_reading():
    # a line of the instance that is no error (here fallout) between the code and NCCL's text
    between = "torch/distributed/elastic/multiprocessing/api.py:900] Sending process 1959 closing signal SIGTERM"
    fs = findings(*raised(0, INTERNAL, "Bootstrap : no socket interface found", between=between))
    code = next(f for f in fs if f.rule_id == "nccl.internal_error")
    assert [f.rule_id for f in fs][-2:] == ["torch_elastic.survivor_sigterm", "nccl.bootstrap_no_interface"]
    assert not named_by_last_error(code, fs, [f for f in fs if f.failure_class is not FailureClass.FALLOUT])
    assert analyse(fs).root_cause is code


def test_a_real_error_printed_right_after_the_code_is_its_reading():
    fs = findings(*raised(0, INTERNAL, None,
                          between="RuntimeError: CUDA error: an illegal memory access was encountered"))
    assert analyse(fs).root_cause.rule_id == "cuda.illegal_memory_access"


def test_only_result_codes_and_their_detail_lines_yield():
    assert nccl_result(findings(INTERNAL)[0]) and nccl_result(findings(DETAIL[SYSTEM])[0])
    boot = findings("Bootstrap : no socket interface found")[0]
    assert not nccl_result(boot)
    later = findings("Bootstrap : no socket interface found", "Invalid NCCL_COMM_ID [x:1]")
    assert not named_by_last_error(later[0], later, later)


def test_nccls_info_line_about_a_sysfs_path_it_skips_is_no_finding():
    """NVIDIA/nccl#367: NCCL prints the same text at INFO for a net device it skips; INFO makes no finding."""
    info = "c6ad99331184:117298:117385 [0] NCCL INFO Could not find real path of /sys/class/net/eth0/device"
    warn = "lambda-ws:20417:20533 [0] misc/socket.cc:441 NCCL WARN Could not find real path of /sys/class/net/usb0/device"
    assert findings(info) == []
    assert [f.rule_id for f in findings(warn)] == ["nccl.topo_sysfs_path_missing"]


def test_a_check_macros_location_line_does_not_spell_out_the_code_before_it():
    # Marian's NCCL_CHECK aborts through ABORT (marian-dev src/common/logging.h): the library's error
    # as the message, then "Aborted from <function> in <file>:<line>", which names no cause
    fs = findings("[2019-02-17 09:52:17] Error: NCCL error 2 'unhandled system error' - "
                  "/opt/marian/src/training/communicator_nccl.h:120: ncclAllReduce(...)",
                  "[2019-02-17 09:52:17] Error: Aborted from void marian::NCCLCommunicator::allReduce() "
                  "in /opt/marian/src/training/communicator_nccl.h:120")
    assert [f.rule_id for f in fs] == ["nccl.unhandled_system_error", "marian.abort_report"]
    assert not named_by_last_error(fs[0], fs, fs)
    assert analyse(fs).root_cause is fs[0]


def test_marians_own_check_with_no_library_error_is_the_root_cause():
    fs = findings("[2019-09-17 06:22:34] Error: mal-formed device config array??",
                  "[2019-09-17 06:22:34] Error: Aborted from void marian::MultiNodeGraphGroupBase::loadDeviceConfig"
                  "(std::vector<long unsigned int>) in /home/mt/marian-mpi/src/training/graph_group.h:180")
    rc = analyse(fs).root_cause
    assert rc.rule_id == "marian.abort_report" and rc.failure_class is FailureClass.USER_CODE


def test_the_next_finding_after_a_run_of_result_codes_is_read_once_per_instance_with_the_same_answers():
    """A job that prints its result code again on each retry: ``last_error_starts`` hands each code of
    a run the place of the finding after the run, and every answer is the one a read from the code's
    own place gives (root cause reads each instance's run once, not once per code in it)."""
    import random

    from ftwatch.policy.lasterror import last_error_starts
    from ftwatch.testing import finding
    rng = random.Random(16)
    rules = ["nccl.unhandled_system_error", "nccl.code.ncclSystemError", "marian.abort_report",
             "nccl.socket_address_not_ip", "python.key_error"]
    for _ in range(200):
        own, t = [], T0
        for seq in range(rng.randint(1, 40)):
            t += rng.choice([0.0, 0.0, 0.3, 2.0])
            own.append(finding(rng.choice(rules), time=t, seq=seq))
        errors = [f for f in own if rng.random() < 0.7]
        starts = last_error_starts(own)
        assert len(starts) == len(own) + 1 and starts[-1] == len(own)
        for place, f in enumerate(own, start=1):
            assert starts[place] >= place
            assert (named_by_last_error(f, own, errors, starts[place])
                    == named_by_last_error(f, own, errors, place) == named_by_last_error(f, own, errors))
