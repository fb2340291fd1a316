"""Remote data reads graded as their client libraries grade them, and set-up files NCCL reads
(issue 12, round 22): gcsfs's retriable HTTP errors and download checksum mismatch, a
mosaicml-streaming shard that failed its checksum right after download, and NCCL's XML graph and
topology files, which only the environment hands it."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def grades(lines: list[str]) -> list[tuple[str, FailureClass, Action]]:
    found = ENGINE.feed(Origin("launcher"), "".join(f"{x}\n" for x in lines).encode(), 1000.0, final=True)
    return [(f.rule_id, f.failure_class, f.action) for f in found]


def traceback(*last: str) -> list[str]:
    return ["Traceback (most recent call last):",
            '  File "/opt/env/lib/python3.10/site-packages/gcsfs/core.py", line 1098, in validate_response',
            "    raise HttpError(error)", *last]


@pytest.mark.parametrize("last", [
    "gcsfs.utils.HttpError: Backend Error",                                 # before gcsfs 0.7: the message alone
    "gcsfs.retry.HttpError: We encountered an internal error. Please try again., 500",
    "gcsfs.retry.HttpError: The service is currently unavailable., 503",
    "gcsfs.retry.HttpError: The rate of change requests to the object is too high., 429",
])
def test_a_gcs_server_error_gcsfs_retries_is_transient(last):
    assert grades(traceback(last)) == [("gcsfs.retriable_http_error", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)]


@pytest.mark.parametrize("last", [
    "gcsfs.retry.HttpError: Invalid bucket name: 'my bucket', 400",
    "gcsfs.retry.HttpError: Anonymous caller does not have storage.objects.get access, 401",
])
def test_a_gcs_error_gcsfs_does_not_retry_is_not_graded_transient(last):
    assert not [g for g in grades(traceback(last)) if g[1] is FailureClass.RETRYABLE_INFRA]


def test_gcsfs_checksum_error_is_the_transfer_of_that_moment():
    assert grades(traceback("gcsfs.retry.ChecksumError: Checksum failure")) == [
        ("python.exception.gcsfs.retry.ChecksumError", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)]


def test_a_streaming_shard_that_fails_its_checksum_after_download_is_restarted_not_failed_as_a_value_error():
    found = grades(["[rank5]: Traceback (most recent call last):",
                    '[rank5]:   File "/usr/lib/python3/dist-packages/streaming/base/stream.py", line 401, in x',
                    "[rank5]:     raise ValueError(f'Checksum failure: {raw_filename}')",
                    "[rank5]: ValueError: Checksum failure: /nvme/cache/v4/shard.27731.mds"])
    assert found == [("streaming.shard_download_checksum_failure", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)]


def test_other_value_errors_of_the_streaming_library_stay_the_programs():
    found = grades(["ValueError: Hash algorithm `sha1` chosen for data validation does not match with those "
                    "provided during dataset creation `['xxh64']`. Provide one of those."])
    assert [g[1:] for g in found] == [(FailureClass.USER_CODE, Action.FAIL_JOB)]


@pytest.mark.parametrize("line, rule", [
    ("::16822:17141 [0] graph/search.cc:703 NCCL WARN XML Import Channel : dev 1 not found.",
     "nccl.xml_graph_file_mismatch"),
    ("node-1:77:90 [0] graph/xml.cc:1256 NCCL WARN Could not open XML graph file /etc/nccl/graph.xml : "
     "No such file or directory", "nccl.xml_graph_file_mismatch"),
    ("node-3:2211:2290 [0] graph/xml.cc:394 NCCL WARN XML Topology has wrong version 1, 2 needed",
     "nccl.xml_topology_file_invalid"),
    ("node-3:2211:2290 [0] graph/xml.cc:149 NCCL WARN XML Parse error : expecting '<', got 'x'",
     "nccl.xml_topology_file_invalid"),
    ("node-3:2211:2290 [0] graph/xml.cc:219 NCCL WARN XML Mismatch : gpu / pci", "nccl.xml_topology_file_invalid"),
])
def test_an_xml_file_the_environment_hands_nccl_that_does_not_fit_is_set_up(line, rule):
    assert grades([line]) == [(rule, FailureClass.USER_CODE, Action.FAIL_JOB)]


def test_the_graph_file_error_decides_over_the_unhandled_system_error_it_returns():
    found = grades(["::16822:17141 [0] NCCL INFO NCCL_GRAPH_FILE set by environment to /opt/microsoft/ncv4/graph.xml",
                    "::16822:17141 [0] graph/search.cc:703 NCCL WARN XML Import Channel : dev 1 not found.",
                    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                    "ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for details), "
                    "NCCL version 2.18.6"])
    assert found[0] == ("nccl.xml_graph_file_mismatch", FailureClass.USER_CODE, Action.FAIL_JOB)


@pytest.mark.parametrize("line", [
    "::16822:17141 [0] NCCL INFO NCCL_GRAPH_FILE set by environment to /opt/microsoft/ncv4/graph.xml",
    "node-1:77:90 [0] NCCL INFO Could not open XML topology file /etc/nccl/topo.xml : No such file or directory",
    "node-1:77:90 [0] NCCL INFO Loading topology file /var/run/nvidia-topologyd/virtualTopology.xml",
])
def test_nccls_info_lines_about_its_xml_files_are_no_finding(line):
    assert grades([line]) == []


@pytest.mark.parametrize("line", [
    "2022-08-20 21:51:52.172999: F external/org_tensorflow/tensorflow/core/tpu/tpu_library_init_fns.inc:100] "
    "TpuEmbeddingEngine_CollateMemory not available in this library.",
    "F0820 21:51:52.172999   48213 tpu_library_init_fns.inc:100] TpuExecutable_Free not available in this library.",
])
def test_a_fatal_lookup_of_a_function_libtpu_lacks_is_a_version_mismatch_not_a_bare_abort(line):
    assert grades([line]) == [("tpu.library_function_missing", FailureClass.USER_CODE, Action.FAIL_JOB)]


def test_the_same_lookup_logged_at_error_level_is_not_this_rule():
    """TensorFlow releases whose TFTPU_SET_FN logged at ERROR went on; only the FATAL form ends the run."""
    line = ("2021-05-01 10:00:00.000000: E tensorflow/core/tpu/tpu_library_init_fns.inc:100] "
            "TpuEmbeddingEngine_CollateMemory not available in this library.")
    assert "tpu.library_function_missing" not in {g[0] for g in grades([line])}


def test_a_hub_download_cut_short_is_the_network_as_huggingface_hub_says_not_an_oserror_of_the_program():
    found = grades(["Traceback (most recent call last):",
                    '  File "/opt/env/lib/python3.10/site-packages/huggingface_hub/file_download.py", line 473, '
                    "in http_get",
                    "    raise OSError(",
                    "OSError: Consistency check failed: file should be of size 4972489328 but has size 2143289344 "
                    "((…)model-00001-of-00002.safetensors).",
                    "This is usually due to network issues while downloading the file. Please retry with "
                    "`force_download=True`."])
    assert found[0] == ("hf.download_size_mismatch", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
