"""Configuration and environment errors against transient infrastructure (issue 12, h12-config):
each case is graded by what its source says (the rows' ``source`` columns), not by a corpus case.

- NCCL's socket layer retries a connect only on refused / timed-out / unreachable; a connect a local
  firewall rule refused (EPERM/EACCES, connect(2)) is the host's configuration
  (``nccl.socket_connect_not_retried``), and old NCCL's capitalised ``Connect to`` reads like the new one.
- c10d prints warnings for connect attempts it retries: notices, never the decision.
- HTTP status and object-store error codes (RFC 9110 / RFC 6585 / the S3 error table) and the
  exception classes of requests, urllib3, botocore and huggingface_hub (their docs).
"""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.exceptions import ExceptionCatalog
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
W1 = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")
T0 = 1_795_253_763.0


def _feed(*lines: str) -> list:
    return Engine(BUILTIN).feed(W1, "".join(f"{line}\n" for line in lines).encode(), T0, final=True)


def _decisive(findings: list) -> list:
    return [f for f in findings if f.failure_class is not FailureClass.INFO]


@pytest.mark.parametrize("errno_text", ["Operation not permitted", "Permission denied"])
def test_a_connect_a_local_firewall_refused_is_the_hosts_configuration(errno_text):
    [finding] = _feed(f"gpu-node-3:2111:2190 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: "
                      f"Connect to 10.42.0.7<43261> failed : {errno_text}")
    assert finding.rule_id == "nccl.socket_connect_not_retried"
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


@pytest.mark.parametrize("line", [
    "gpu-node-3:2111:2190 [1] include/socket.h:390 NCCL WARN Connect to 10.42.0.7<43261> failed : No route to host",
    "gpu-node-3:2111:2190 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: connect to 10.42.0.7<43261> "
    "failed : Connection refused",
])
def test_the_connect_errors_nccl_retries_stay_transient_in_both_spellings(line):
    [finding] = _feed(line)
    assert finding.rule_id == "nccl.socket_connect_failed"
    assert finding.action is Action.RESTART_JOB


def test_an_aborted_connect_is_no_configuration_by_itself():
    # ECONNABORTED names no local rule (unlike EPERM/EACCES): mid-run it is how an aborted connection
    # shows (tests/golden nccl_system_error_*), so it is left to NCCL's 'unhandled system error'
    findings = _feed("gpu-node-3:2111:2190 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                     "10.42.0.7<43261> failed : Software caused connection abort")
    assert all(f.action is not Action.FAIL_JOB for f in findings)


def test_c10d_warnings_for_attempts_it_retries_decide_nothing():
    findings = _feed(
        "[W socket.cpp:601] [c10d] The IPv6 network addresses of (node-a, 44685) cannot be retrieved "
        "(gai error: -2 - Name or service not known).",
        "[W socket.cpp:426] [c10d] The server socket cannot be initialized on [::]:29500 "
        "(errno: 97 - Address family not supported by protocol).",
        "[W socket.cpp:436] [c10d] The client socket has failed to connect to [localhost]:29500 "
        "(errno: 99 - Cannot assign requested address).")
    assert _decisive(findings) == []


RETRY = (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
FAIL = (FailureClass.USER_CODE, Action.FAIL_JOB)
HUB = "https://huggingface.co/api/models/org/model"
#: final exception lines of a download or upload, and their grade
TRANSFERS = [
    (f"huggingface_hub.errors.HfHubHTTPError: 504 Server Error: Gateway Time-out for url: {HUB}", RETRY),
    (f"requests.exceptions.HTTPError: 429 Client Error: Too Many Requests for url: {HUB}", RETRY),
    (f"requests.exceptions.HTTPError: 404 Client Error: Not Found for url: {HUB}/config.json", FAIL),
    ("huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-6745a1b2)", FAIL),
    ("requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='hub', port=443): Read timed out.", RETRY),
    ("botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the PutObject operation: "
     "Please reduce your request rate.", RETRY),
    ("botocore.exceptions.ClientError: An error occurred (NoSuchKey) when calling the GetObject operation: "
     "The specified key does not exist.", FAIL),
    ('botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL: "https://s3/b/ckpt"',
     RETRY),
    ("socket.gaierror: [Errno -3] Temporary failure in name resolution", RETRY),
    ("OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the cached "
     "files and it looks like org/model is not the path to a directory containing a file named config.json.", RETRY),
    ("OSError: org/modle is not a local folder and is not a valid model identifier listed on "
     "'https://huggingface.co/models'", FAIL),
]


@pytest.mark.parametrize("exception, grade", TRANSFERS)
def test_a_download_or_upload_that_failed_is_graded_by_its_status_or_class(exception, grade):
    [finding] = _feed("Traceback (most recent call last):",
                      '  File "/workspace/train.py", line 12, in <module>',
                      "    model = load(args.model)",
                      exception)
    assert (finding.failure_class, finding.action) == grade, finding.rule_id
    assert finding.rule_id != "python.uncaught_exception"


@pytest.mark.parametrize("line, name", [
    ("urllib3.exceptions.ReadTimeoutError: HTTPSConnectionPool(host='hub', port=443): Read timed out.",
     "urllib3.exceptions.ReadTimeoutError"),
    ("botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: \"https://s3/bucket\"",
     "urllib3.exceptions.ReadTimeoutError"),       # same short name, same meaning
    ("http.client.RemoteDisconnected: Remote end closed connection without response",
     "http.client.RemoteDisconnected"),
])
def test_library_timeouts_and_disconnects_are_transient(line, name):
    grade = ExceptionCatalog.load().grade(line)
    assert (grade.name, grade.failure_class) == (name, FailureClass.RETRYABLE_INFRA)
