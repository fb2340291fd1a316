"""Knowledge round 26 (issue 12): a dead FUSE mount is the mount's daemon, not the node; an API
client's 5xx in the Stainless SDKs' wording is the service of that moment; PyTorch's XPU build saying
it sees no device is the node's, as its CUDA and ROCm builds' same check."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def grades(line: str) -> set[tuple[str, FailureClass, Action]]:
    found = ENGINE.feed(Origin("launcher"), f"{line}\n".encode(), 1000.0, final=True)
    return {(f.rule_id, f.failure_class, f.action) for f in found}


def test_a_fuse_mount_whose_daemon_went_away_restarts_the_job_not_isolates_the_node():
    for line in ["OSError: [Errno 107] Transport endpoint is not connected: '/content/drive/MyDrive/data/x.npy'",
                 "ls: cannot access '/mnt/s3fs/ckpt': Transport endpoint is not connected"]:
        assert grades(line) == {("storage.transport_endpoint_not_connected", FailureClass.RETRYABLE_INFRA,
                                 Action.RESTART_JOB)}


def test_a_stainless_sdk_status_error_is_graded_by_its_status():
    assert ("http.server_error_status", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) in grades(
        "tinker.APIStatusError: Error code: 503 - {'detail': 'Service Unavailable'}")
    assert ("http.server_error_status", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) in grades(
        "openai.InternalServerError: Error code: 500 - {'error': {'message': 'The server had an error'}}")
    assert ("http.client_error_status", FailureClass.USER_CODE, Action.FAIL_JOB) in grades(
        "openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Incorrect API key provided'}}")
    assert not {g for g in grades("NCCL error code: 5") if g[0].startswith("http.")}


def test_no_xpu_device_is_the_nodes_as_no_cuda_gpu_is():
    assert ("torch.no_xpu_devices", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE) in grades(
        "20: RuntimeError: No XPU devices are available.")
