"""The remaining false-fail candidates of issue 12 (h12-ff2): texts of c10d's store, NCCL, TLS and
gRPC that a ``RuntimeError`` (or an unknown class) carries, graded by their sources in the catalogs
(``dist_vocab.tsv``, ``nccl_vocab.tsv``, ``net_vocab.tsv``) instead of the class fallback (user
code: fail_job); grpcio's indented status lines joined to their traceback; and a SIGABRT that
nothing logged explains, read as fallout (``ftwatch.policy.rootcause`` rule 1).

Each test fails without its change: before, every line below was the ``RuntimeError`` class's
user_code (or the catch-all traceback rule's), and a bare exit 134 was a user-code root cause.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftwatch.config.model import PolicyConfig
from ftwatch.events import Action, FailureClass, Finding, Origin, ProcessExit, Severity
from ftwatch.parsers.multiline import block_end
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.policy import Incident, Policy
from ftwatch.policy.rootcause import analyse
from ftwatch.rules.engine import Engine
from ftwatch.rules.exitcodes import ExitCodeTable, exit_finding
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
JOB = "ff2"
T0 = 1_795_253_763.0
HEAD = ["Traceback (most recent call last):", '  File "/srv/train.py", line 88, in <module>', "    step()"]


def origin(rank: int) -> Origin:
    return Origin(f"worker-{rank}", rank, JOB, f"node-{rank}", "stderr", "process")


def fed(lines: list[str], rank: int = 1) -> list[Finding]:
    return Engine(BUILTIN).feed(origin(rank), "".join(f"{line}\n" for line in lines).encode(), T0, final=True)


def decided(lines: list[str]) -> Finding:
    errors = [f for f in fed(lines) if f.failure_class is not FailureClass.INFO]
    assert len(errors) == 1, [(f.rule_id, f.line) for f in errors]
    return errors[0]


@pytest.mark.parametrize("final, rule", [
    # c10d Utils.hpp SYSCHECK: EAGAIN on the store socket's receive timeout (older releases: RuntimeError)
    ("RuntimeError: Socket Timeout", "c10d.store_socket_timeout"),
    ("torch.distributed.DistNetworkError: Socket Timeout", "c10d.store_socket_timeout"),
    ("RuntimeError: [5] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
     "store by key '0', but store->get('0') got error: Socket Timeout", "c10d.store_socket_timeout"),
    # TCPStore::doWait: the server's reply to a wait was out of protocol
    ("RuntimeError: Stop_waiting response is expected", "c10d.store_wait_out_of_step"),
    ("torch.distributed.DistStoreError: wait_canceled response is expected", "c10d.store_wait_out_of_step"),
    # torch/csrc/cuda/nccl.cpp: "NCCL Error <ncclResult_t>: ..."; c10d with an older NCCL's "internal error"
    ("RuntimeError: NCCL Error 3: internal error", "nccl.internal_error_legacy"),
    ("RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, internal error, NCCL "
     "version 2.7.8", "nccl.internal_error_legacy"),
    ("RuntimeError: NCCL error: internal error, NCCL version 2.7.8", "nccl.internal_error_legacy"),
    # OpenSSL 3: the peer closed the TLS connection without close_notify
    ("ssl.SSLError: [SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of protocol (_ssl.c:1007)",
     "tls.unexpected_eof"),
    ("requests.exceptions.SSLError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded "
     "with url: /api/models/org/model (Caused by SSLError(SSLEOFError(8, '[SSL: UNEXPECTED_EOF_WHILE_READING] EOF "
     "occurred in violation of protocol (_ssl.c:1007)')))", "tls.unexpected_eof"),
])
def test_infrastructure_texts_in_a_generic_exception_are_retryable(final, rule):
    f = decided(HEAD + [final])
    assert (f.rule_id, f.failure_class, f.action) == (rule, FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


@pytest.mark.parametrize("final", [
    "RuntimeError: NCCL Error 5: invalid usage",                       # ncclInvalidUsage: the program's
    "ssl.SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get "
    "local issuer certificate (_ssl.c:1007)",
    "RuntimeError: socket timeout in my own client",                   # not c10d's text
])
def test_near_misses_stay_the_programs(final):
    f = decided(HEAD + [final])
    assert f.failure_class is FailureClass.USER_CODE and f.action is Action.FAIL_JOB, f.rule_id


GRPC = ["grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:",
        "\tstatus = StatusCode.{code}",
        '\tdetails = "failed to connect to all addresses"',
        '\tdebug_error_string = "UNKNOWN:failed to connect to all addresses {{grpc_status:14}}"',
        ">"]


@pytest.mark.parametrize("code, rule", [("UNAVAILABLE", "grpc.unavailable"),
                                        ("DEADLINE_EXCEEDED", "grpc.deadline_exceeded")])
def test_a_grpc_status_the_library_calls_transient_decides_its_traceback(code, rule):
    """grpcio's exception message goes on over tab-indented lines; the status is one of them."""
    f = decided(HEAD + [line.format(code=code) for line in GRPC])
    assert (f.rule_id, f.failure_class, f.action) == (rule, FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
    assert "Traceback (most recent call last):" in f.evidence[0]


def test_a_grpc_status_of_the_request_stays_the_programs():
    f = decided(HEAD + [line.format(code="INVALID_ARGUMENT") for line in GRPC])
    assert f.failure_class is FailureClass.USER_CODE, f.rule_id


def test_indented_lines_after_the_exception_line_continue_its_message():
    lines = HEAD + [line.format(code="UNAVAILABLE") for line in GRPC]
    assert block_end(lines, 0) == len(lines) - 2            # the ">" line is not indented: a line of its own
    plain = HEAD + ["KeyError: 'lr'", "step 9"]
    assert block_end(plain, 0) == 3


# ---------------------------------------------------------------------------------- bare SIGABRT

def died(rank: int, t: float, returncode: int | None = None, signal: int | None = None) -> Finding:
    f = exit_finding(ProcessExit(origin(rank), 100 + rank, returncode, signal, T0 + t), ExitCodeTable.load(),
                     seq=int(t * 100))
    assert f is not None
    return f


def decide(findings: list[Finding], trigger: Finding, tmp_path: Path):
    pol = Policy(PolicyConfig(enable_job_restart=True), BudgetStore(tmp_path / "b.json", JOB), JOB)
    failed = frozenset(f.origin.instance for f in findings if f.kind == "exit_code")
    return pol.decide(Incident(trigger, tuple(findings), 2, failed, 0), T0 + 100)


@pytest.mark.parametrize("code", [dict(returncode=134), dict(signal=6)])
def test_a_sigabrt_nothing_logged_explains_is_fallout_and_restarts(code, tmp_path):
    """abort(3) is how the process ended itself on a reason it prints first (torch's NCCL
    watchdog, glibc, libstdc++'s terminate, assert): with none of it captured the exit says no
    cause, and only-fallout reads as retryable (before: exit.134, user_code, fail_job)."""
    abort = died(1, 10.0, **code)
    an = analyse([abort])
    assert an.fallout_only and an.root_cause is abort
    d = decide([abort], abort, tmp_path)
    assert d.action is Action.RESTART_JOB, d.policy_clause
    assert "only fallout" in d.policy_clause


def test_a_bare_sigabrt_beside_another_ranks_real_error_leaves_it_the_root_cause(tmp_path):
    oom = Finding("cuda.oom", "keyword", FailureClass.OOM, Action.FAIL_JOB, Severity.ERROR, origin(0),
                  "torch.OutOfMemoryError: CUDA out of memory.", T0 + 5.0, 500)
    abort = died(1, 10.0, returncode=134)
    an = analyse([abort, oom])
    assert an.root_cause is oom and an.real == (oom,)
    assert decide([abort, oom], abort, tmp_path).action is Action.FAIL_JOB


def test_a_sigsegv_nothing_logged_explains_stays_the_programs(tmp_path):
    """Only SIGABRT: a SIGSEGV is the program's own invalid access (exit_codes.tsv 139)."""
    segv = died(1, 10.0, returncode=139)
    assert analyse([segv]).real == (segv,)
    assert decide([segv], segv, tmp_path).action is Action.FAIL_JOB
