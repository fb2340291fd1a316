"""Transient infrastructure in every wording a Python client prints it (issue 12 item 2: a
traceback's final exception decides user code unless its class or its message says infrastructure).

An HTTP status is graded once, by RFC 9110 (5xx and 429 transient, 408 may be repeated, the other
listed 4xx the request's own), in the wording of each client that raises it (requests, aiohttp,
httpx, urllib, google-resumable-media: ``net_vocab.tsv`` ``http.*``); a client's exhausted retries
by the cause urllib3 names, whatever class wraps the text (``urllib3.max_retries_transient_cause``);
the transport errors of httpx and azure-core by their docs (``python_exceptions.tsv``); gsutil's
fatal ``OSError: <strerror>.`` by the errno; W&B's backend death as fallout; Determined's lost
agent as a restart (``scheduler.yaml``). A vocabulary row holds one example: the other wordings
are checked here, and each test fails without its change (the line was the catch-all's or the
class fallback's user_code, or made no finding).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.pipeline.build import build_engine, build_policy
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
T0 = 1_795_253_763.0
HEAD = ["Traceback (most recent call last):", '  File "/srv/train.py", line 88, in <module>', "    step()"]
RETRY = (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
OWN = (FailureClass.USER_CODE, Action.FAIL_JOB)


def fed(lines: list[str]) -> list[Finding]:
    origin = Origin("worker-1", 1, "wordings", "node-1", "stderr", "process")
    return Engine(BUILTIN).feed(origin, "".join(f"{line}\n" for line in lines).encode(), T0, final=True)


def decided(lines: list[str]) -> Finding:
    errors = [f for f in fed(lines) if f.failure_class is not FailureClass.INFO]
    assert len(errors) == 1, [(f.rule_id, f.line) for f in errors]
    return errors[0]


def replayed(text: str):
    """The decision ``ftwatch replay`` makes on ``text`` under restarts (evaluate's default flags)."""
    config = Config().with_policy(enable_job_restart=True, max_num_of_job_restart=3)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "job.log"
        log.write_text(text)
        policy = build_policy(config, "job", BudgetStore(Path(tmp) / "b.json", "job"), state_dir=Path(tmp),
                              in_memory=True)
        return replay([log], build_engine(config), policy, "job").decision


@pytest.mark.parametrize("final, rule, grade", [
    # aiohttp ClientResponseError.__str__: '{status}, message={message!r}, url={url!r}'
    ("aiohttp.client_exceptions.ClientResponseError: 503, message='Service Unavailable', "
     "url=URL('https://huggingface.co/datasets/org/data/resolve/main/a.parquet')", "http.server_error_status", RETRY),
    ("aiohttp.client_exceptions.ClientResponseError: 429, message='Too Many Requests', url='https://hf.co/x'",
     "http.too_many_requests", RETRY),
    ("aiohttp.client_exceptions.ClientResponseError: 403, message='Forbidden', url='https://hf.co/x'",
     "http.client_error_status", OWN),
    # httpx Response.raise_for_status: "{error_type} '{status_code} {reason_phrase}' for url '{url}'"
    ("httpx.HTTPStatusError: Server error '502 Bad Gateway' for url 'https://huggingface.co/api/models/org/m'",
     "http.server_error_status", RETRY),
    ("httpx.HTTPStatusError: Client error '408 Request Timeout' for url 'https://huggingface.co/api/models/org/m'",
     "http.request_timeout", RETRY),
    ("httpx.HTTPStatusError: Client error '401 Unauthorized' for url 'https://huggingface.co/api/models/org/m'",
     "http.client_error_status", OWN),
    # urllib.error.HTTPError.__str__: 'HTTP Error %s: %s'
    ("urllib.error.HTTPError: HTTP Error 504: Gateway Time-out", "http.server_error_status", RETRY),
    ("urllib.error.HTTPError: HTTP Error 429: Too Many Requests", "http.too_many_requests", RETRY),
    ("urllib.error.HTTPError: HTTP Error 410: Gone", "http.client_error_status", OWN),
    # requests
    ("requests.exceptions.HTTPError: 408 Client Error: Request Timeout for url: https://hf.co/api/x",
     "http.request_timeout", RETRY),
    # google-resumable-media: InvalidResponse's args tuple
    ("google.resumable_media.common.InvalidResponse: ('Request failed with status code', 503, 'Expected one of', "
     "<HTTPStatus.OK: 200>)", "http.server_error_status", RETRY),
    ("google.resumable_media.common.InvalidResponse: ('Request failed with status code', 404, 'Expected one of', "
     "<HTTPStatus.OK: 200>)", "http.client_error_status", OWN),
    # requests' Response repr, as wandb's API client quotes it
    ("wandb.errors.CommError: Error while calling W&B API: An internal error occurred. Please contact support. "
     "(<Response [500]>)", "http.server_error_status", RETRY),
    ("wandb.errors.CommError: Error while calling W&B API: Duplicate entry for key 'PRIMARY' (<Response [404]>)",
     "http.client_error_status", OWN),
])
def test_an_http_status_is_graded_alike_in_every_clients_wording(final, rule, grade):
    f = decided(HEAD + [final])
    assert (f.rule_id, f.failure_class, f.action) == (rule, *grade)


@pytest.mark.parametrize("line, rule, grade", [
    # libcurl's CURLE_HTTP_RETURNED_ERROR text, as curl -f and git print it
    ("curl: (22) The requested URL returned error: 503", "http.server_error_status", RETRY),
    ("fatal: unable to access 'https://github.com/org/repo.git/': The requested URL returned error: 502",
     "http.server_error_status", RETRY),
    ("fatal: unable to access 'https://github.com/org/repo.git/': The requested URL returned error: 403",
     "http.client_error_status", OWN),
])
def test_a_status_outside_a_traceback_is_graded_alike(line, rule, grade):
    f = decided([line])
    assert (f.rule_id, f.failure_class, f.action) == (rule, *grade)


@pytest.mark.parametrize("line, grade", [
    # containerd ErrUnexpectedStatus ('unexpected status from %s request to %s: %s'), as the kubelet's
    # image pull event quotes it; the registry's token service answering 5xx is the service of that moment
    ('Warning  Failed  pod/w-0  Failed to pull image "ubuntu:24.04": failed to pull and unpack image '
     '"docker.io/library/ubuntu:24.04": failed to resolve reference "docker.io/library/ubuntu:24.04": failed to '
     'authorize: failed to fetch anonymous token: unexpected status from GET request to https://auth.docker.io/'
     'token?scope=repository%3Alibrary%2Fubuntu%3Apull&service=registry.docker.io: 503 Service Unavailable', RETRY),
    ('Failed to pull image "reg.example/team/train:v3": failed to resolve reference "reg.example/team/train:v3": '
     'unexpected status from HEAD request to https://reg.example/v2/team/train/manifests/v3: 401 Unauthorized', OWN),
    # distribution's UnexpectedHTTPStatusError ('received unexpected HTTP status: %s'), Docker's pulls
    ("Error response from daemon: received unexpected HTTP status: 502 Bad Gateway", RETRY),
])
def test_an_image_pull_status_is_graded_by_the_status(line, grade):
    """An image pull's registry status is graded as any HTTP status (RFC 9110): 5xx retry, 401/404 the job's."""
    found = [f for f in fed([line]) if f.rule_id.startswith("http.")]
    assert [(f.failure_class, f.action) for f in found] == [grade]


def test_a_status_no_rule_lists_keeps_the_class_fallback():
    """409 Conflict: neither transient by RFC 9110 nor in the listed 4xx; the class decides (user code)."""
    f = decided(HEAD + ["httpx.HTTPStatusError: Client error '409 Conflict' for url 'https://hf.co/api/repos/create'"])
    assert (f.failure_class, f.action) == OWN and not f.rule_id.startswith("http.")


def test_a_retried_status_warning_is_no_status_line():
    """huggingface_hub's http_backoff warns 'HTTP Error 502 thrown while requesting ...' and retries."""
    assert not [f for f in fed(["HTTP Error 502 thrown while requesting GET https://huggingface.co/api/x"])
                if f.rule_id.startswith("http.")]


CAUSES = "HTTPSConnectionPool(host='mlflow.example', port=443): Max retries exceeded with url: /api/2.0/mlflow/x"


@pytest.mark.parametrize("final", [
    f"mlflow.exceptions.MlflowException: API request to https://mlflow.example failed with exception {CAUSES} "
    "(Caused by ResponseError('too many 503 error responses'))",
    f"requests.exceptions.RetryError: {CAUSES} (Caused by ResponseError('too many 429 error responses'))",
    f"google.auth.exceptions.TransportError: {CAUSES} (Caused by ReadTimeoutError(\"HTTPSConnectionPool(host="
    "'mlflow.example', port=443): Read timed out. (read timeout=10)\"))",
    f"some.sdk.SdkError: {CAUSES} (Caused by ProtocolError('Connection aborted.', RemoteDisconnected('Remote end "
    "closed connection without response')))",
])
def test_a_clients_exhausted_retries_read_by_their_cause_whatever_wraps_them(final):
    f = decided(HEAD + [final])
    assert (f.failure_class, f.action) == RETRY, f.rule_id


@pytest.mark.parametrize("final", [
    f"some.sdk.SdkError: {CAUSES} (Caused by ResponseError('too many 404 error responses'))",
    f"requests.exceptions.SSLError: {CAUSES} (Caused by SSLError(SSLCertVerificationError(1, '[SSL: "
    "CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate (_ssl.c:1007)')))",
])
def test_a_cause_of_the_requests_own_stays_the_programs(final):
    f = decided(HEAD + [final])
    assert (f.failure_class, f.action) == OWN, f.rule_id


@pytest.mark.parametrize("final, grade", [
    ("httpx.RemoteProtocolError: peer closed connection without sending complete message body (incomplete "
     "chunked read)", RETRY),
    ("httpcore.RemoteProtocolError: Server disconnected without sending a response.", RETRY),
    ("httpx.ReadError: [Errno 104] Connection reset by peer", RETRY),
    ("httpcore.ReadError", RETRY),
    ("httpx.PoolTimeout: Timed out waiting to acquire a connection from the pool.", RETRY),
    ("httpx.UnsupportedProtocol: Request URL is missing an 'http://' or 'https://' protocol.", OWN),
    ("tarfile.ReadError: file could not be opened successfully", OWN),
    ("azure.core.exceptions.ServiceResponseError: ('Connection aborted.', RemoteDisconnected('Remote end closed "
     "connection without response'))", RETRY),
    ("socket.timeout: The read operation timed out", RETRY),
    ("botocore.exceptions.ResponseStreamingError: An error occurred while reading from response stream: ('Connection "
     "broken: IncompleteRead(1048576 bytes read, 2097152 more expected)', IncompleteRead(1048576 bytes read))", RETRY),
    ("google.auth.exceptions.TransportError: Failed to retrieve http://metadata.google.internal/computeMetadata/v1/"
     "instance/service-accounts/default/token from the Google Compute Engine metadata service. Status: 503", RETRY),
    # huggingface_hub _raise_on_head_call_error: 'most likely a connection issue or Hub downtime'
    ("huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub "
     "and we cannot find the requested files in the local cache. Please check your connection and try again or make "
     "sure your Internet connection is on.", RETRY),
    ("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache and outgoing "
     "traffic has been disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' to False.", OWN),
    ("socket.timeout: timed out", RETRY),
    ("requests.exceptions.SSLError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with "
     "url: /x (Caused by SSLError(SSLEOFError(8, 'EOF occurred in violation of protocol (_ssl.c:2426)')))", RETRY),
])
def test_transport_errors_are_graded_by_their_docs(final, grade):
    f = decided(HEAD + [final])
    assert (f.failure_class, f.action) == grade, f.rule_id


@pytest.mark.parametrize("line, grade", [
    # gslib/__main__.py: 'OSError: %s.' % e.strerror, exit 1
    ("Epoch 0: : 382it [2:24:43, 22.73s/it, loss=5.81]OSError: Connection reset by peer.", RETRY),
    ("OSError: Connection timed out.", RETRY),
    ("OSError: No route to host.", RETRY),
    ("OSError: No such file or directory.", None),
    ("raise OSError: Connection reset by peer, retrying", None),
])
def test_gsutils_fatal_oserror_is_graded_by_its_errno(line, grade):
    found = [(f.failure_class, f.action) for f in fed([line]) if f.rule_id == "gsutil.network_oserror"]
    assert found == ([grade] if grade else [])


def test_a_dead_wandb_backend_is_fallout_of_its_own_failure():
    """The file-stream thread's HTTP 502 ended a thread (a notice); the training process then found
    the backend process gone: fallout, and only fallout restarts (before: Exception's user code)."""
    thread = ["Exception in thread Thread-5:", *HEAD[:1],
              '  File "/venv/lib/python3.10/site-packages/wandb/sdk/internal/file_stream.py", line 301, in _send',
              "    self._client.post, self._endpoint, json={\"files\": fs}",
              "requests.exceptions.HTTPError: 502 Server Error: Bad Gateway for url: https://api.wandb.ai/files/a/b/c/"
              "file_stream"]
    main = [*HEAD, '  File "/venv/lib/python3.10/site-packages/wandb/sdk/interface/interface_queue.py", line 44, '
            "in _publish", '    raise Exception("The wandb backend process has shutdown")',
            "Exception: The wandb backend process has shutdown"]
    assert decided(main).rule_id == "wandb.backend_process_shutdown"
    assert decided(main).failure_class is FailureClass.FALLOUT
    d = replayed("\n".join(["iter 185000 | return 418.3", *thread, "wandb: ERROR Internal wandb error: file data was "
                            "not synced", *main]) + "\n")
    assert d.action is Action.RESTART_JOB, d.policy_clause
    assert d.root_cause.rule_id == "wandb.backend_process_shutdown"


def test_a_dataloader_worker_reraising_a_5xx_restarts():
    """torch's DataLoader re-raises the worker's exception ('Caught X in DataLoader worker process N.'
    and its 'Original Traceback'); the worker's final line is aiohttp's status line."""
    text = "\n".join([
        *HEAD, "aiohttp.client_exceptions.ClientResponseError: Caught ClientResponseError in DataLoader worker "
        "process 1.", "Original Traceback (most recent call last):",
        '  File "/venv/lib/python3.10/site-packages/aiohttp/client_reqrep.py", line 1060, in raise_for_status',
        "    raise ClientResponseError(",
        "aiohttp.client_exceptions.ClientResponseError: 502, message='Bad Gateway', url=URL('https://huggingface.co/"
        "datasets/org/data/resolve/main/train-01187.parquet')"]) + "\n"
    d = replayed(text)
    assert (d.action, d.root_cause.rule_id) == (Action.RESTART_JOB, "http.server_error_status"), d.policy_clause


@pytest.mark.parametrize("line, restart", [
    ("[2023-01-09T22:43:31.004Z]          || ERROR: Trial (Experiment 83) was terminated: allocation failed due to "
     "agent failure: agent failed while the container was running: agent closed with allocated containers", True),
    ("<error> [2024-03-02, 10:11:12] allocation failed due to restore error: RM failed to restore the allocation: "
     "container is gone on reattachment", True),
    ("ERROR: Trial 211 (Experiment 83) was terminated: allocation failed: resources failed with non-zero exit "
     "code: 1", False),
])
def test_determined_ends_a_trial_whose_agent_went_away(line, restart):
    found = [f for f in fed([line]) if f.rule_id == "determined.agent_failure"]
    assert bool(found) is restart
    if restart:
        assert (found[0].failure_class, found[0].action) == RETRY
        assert replayed(line + "\n").action is Action.RESTART_JOB


def test_a_status_error_the_run_outlives_takes_no_action():
    """W&B logs its API's 5xx and retries; training goes on and finishes: a notice, no restart."""
    steps = [f"2024-05-01 10:{i:02d}:00,000 - INFO - step {i * 100} | loss {2.0 - i * 0.01:.3f}" for i in range(40)]
    error = "wandb: ERROR Error while calling W&B API: An internal error occurred. Please contact support. " \
            "(<Response [500]>)"
    d = replayed("\n".join(steps[:20] + [error, error] + steps[20:] + ["2024-05-01 10:41:00,000 - INFO - Training "
                                                                        "completed."]) + "\n")
    assert d.action is Action.NONE, d.policy_clause


@pytest.mark.parametrize("line, restart", [
    ("I 06-11 05:13:00 controller.py:412] Cluster is preempted or failed (status: STOPPED). Recovering...", True),
    ("I 06-11 05:13:00 controller.py:431] The user job failed (FAILED). Please check the logs below.", False),
])
def test_skypilots_controller_tells_a_lost_cluster_from_the_programs_failure(line, restart):
    found = [f for f in fed([line]) if f.rule_id == "skypilot.cluster_preempted_recovering"]
    assert [(f.failure_class, f.action) for f in found] == ([RETRY] if restart else [])
