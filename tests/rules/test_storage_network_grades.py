"""Transient storage and network failures that printed no ``[Errno N]`` (issue 12 item 2): a short
checkpoint write, an errno's C-library text as a bare ``RuntimeError``, libcurl's transfer errors."""

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


def test_a_short_checkpoint_write_is_a_storage_failure_not_the_program():
    """miniz's MZ_ZIP_FILE_WRITE_FAILED through PytorchStreamWriter: the OS refused the write."""
    [finding] = _feed("RuntimeError: [enforce fail at inline_container.cc:857] . PytorchStreamWriter "
                      "failed writing file data/322: file write failed")
    assert finding.rule_id == "torch_npu.save_write_failed"
    assert (finding.failure_class, finding.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


@pytest.mark.parametrize("line, name, failure_class", [
    ("RuntimeError: Connection reset by peer", "ECONNRESET", FailureClass.RETRYABLE_INFRA),
    ("RuntimeError: Connection timed out", "ETIMEDOUT", FailureClass.RETRYABLE_INFRA),
    ("RuntimeError: No such file or directory", "ENOENT", FailureClass.USER_CODE),
])
def test_a_generic_exception_whose_message_is_an_errnos_text_takes_the_errnos_grade(line, name, failure_class):
    grade = ExceptionCatalog.load().grade(line)
    assert (grade.name, grade.failure_class) == (name, failure_class)


@pytest.mark.parametrize("line, name", [
    ("RuntimeError: Connection reset by peer, retrying in 5 s", "RuntimeError"),   # not the whole message
    ("ValueError: Connection reset by peer", "ValueError"),                         # the class decides
    ("RuntimeError: expected scalar type Float but found Half", "RuntimeError"),
])
def test_only_a_whole_strerror_message_of_a_generic_class_counts(line, name):
    grade = ExceptionCatalog.load().grade(line)
    assert grade.name == name and grade.failure_class is FailureClass.USER_CODE


@pytest.mark.parametrize("line, rule_id", [
    ("2026-11-01 07:42:19.441201: E tensorflow/core/platform/s3/aws_logging.cc:60] Curl returned error code 55",
     "curl.send_error"),
    ("curl: (56) Recv failure: Connection reset by peer", "curl.recv_error"),
    ("curl: (28) Operation timed out after 30001 milliseconds with 0 bytes received", "curl.operation_timedout"),
    ("W op_kernel.cc:1273] OP_REQUIRES failed at save_restore_v2_ops.cc:137 : Unknown: : Unable to connect "
     "to endpoint", "aws.unable_to_connect_to_endpoint"),
])
def test_libcurl_network_errors_are_transient_infrastructure(line, rule_id):
    """libcurl-errors(3): 7, 28, 55, 56 are connect, time-out, send and receive failures."""
    [finding] = _feed(line)
    assert finding.rule_id == rule_id
    assert (finding.failure_class, finding.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


@pytest.mark.parametrize("line", [
    "E tensorflow/core/platform/s3/aws_logging.cc:60] Curl returned error code 3",   # URL malformed
    "curl: (22) The requested URL returned error: 404",
])
def test_other_curl_codes_make_no_network_finding(line):
    assert not [f for f in _feed(line) if f.rule_id.startswith("curl.")]


def test_a_write_to_a_read_only_mount_is_the_set_up_as_the_errno_catalog_grades_erofs():
    """EROFS says only that the mount is read-only (mkdir(2), errno(3)); most are so by set-up."""
    [finding] = _feed("OSError: [Errno 30] Read-only file system: '/fsx'")
    assert finding.rule_id == "storage.read_only_fs"
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_the_kernels_remount_after_a_disk_error_is_what_isolates_the_node():
    [finding] = _feed("[Sat Nov 21 09:36:04 2026] EXT4-fs (nvme0n1p1): Remounting filesystem read-only")
    assert finding.rule_id == "os.fs_remounted_read_only"
    assert (finding.failure_class, finding.action) == (FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)


@pytest.mark.parametrize("line", [
    "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
    "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:152] "
    "read: Connection reset by peer",
])
def test_a_failed_connect_handshake_of_glooS_full_mesh_is_a_transient_of_the_network(line):
    """ProcessGroupGloo wraps pair.cc's connectCallback error (its errno lost to 'no error' before gloo #412)."""
    findings = _feed(line)
    assert [f.rule_id for f in findings] == ["gloo.connect_full_mesh_handshake_failed"]
    assert (findings[0].failure_class, findings[0].action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


def test_a_libtpu_lookup_fatal_whose_time_prefix_was_cut_is_still_the_version_mismatch():
    [finding] = _feed("F ./tensorflow/compiler/xla/stream_executor/tpu/tpu_library_init_fns.inc:73] "
                      "TpuNodeContext_StopChipHeartbeats not available in this library.")
    assert finding.rule_id == "tpu.library_function_missing"
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


@pytest.mark.parametrize("line", [
    "[I 14:10:31.604 NotebookApp] KernelRestarter: restarting kernel (1/5), keep random ports",
    "WARNING:root:kernel 5c0e7a4b-1f3d-4a9e-8d2b-93f0e61c7a58 restarted",
    "[W 14:12:02.310 NotebookApp] Kernel 5c0e7a4b-1f3d-4a9e-8d2b-93f0e61c7a58 died, removing from map.",
])
def test_the_jupyter_servers_report_of_its_kernels_death_is_fallout_naming_no_cause(line):
    [finding] = _feed(line)
    assert (finding.rule_id, finding.failure_class) == ("jupyter.kernel_died", FailureClass.FALLOUT)


def test_a_notebook_platform_that_names_its_ram_as_the_crash_is_an_oom():
    [finding] = _feed("Your session crashed after using all available RAM.")
    assert (finding.rule_id, finding.failure_class, finding.action) == (
        "colab.session_crashed_out_of_ram", FailureClass.OOM, Action.FAIL_JOB)
    assert _feed("Your session crashed for an unknown reason.") == []
