"""Transient infrastructure that a job's log reports in other software's words (issue 12, round 6):
the exception catalog's name lookup across packages, InfiniBand transport-retry errors in each
library's framing, a cloud's spot-reclaim notice and a failed Slurm prolog."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.exceptions import ExceptionCatalog
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
CATALOG = ExceptionCatalog.load()


def feed(lines: list[str]):
    return ENGINE.feed(Origin("launcher"), "".join(f"{x}\n" for x in lines).encode(), 1000.0, final=True)


def test_asyncio_and_futures_cancellations_are_their_own_classes_not_tensorflows():
    tf = CATALOG.lookup("tensorflow.python.framework.errors_impl.CancelledError")
    assert tf is not None and tf.name.startswith("tensorflow.")
    assert CATALOG.lookup("asyncio.exceptions.CancelledError").name == "asyncio.exceptions.CancelledError"
    assert CATALOG.lookup("concurrent.futures._base.CancelledError").name == "concurrent.futures._base.CancelledError"
    assert CATALOG.lookup("CancelledError").name == "asyncio.exceptions.CancelledError"   # a bare name: Python's own


def test_an_asyncio_cancellation_is_fallout_not_a_tensorflow_op_error():
    found = feed(["Traceback (most recent call last):", '  File "/srv/app.py", line 3, in gen',
                  "    out = await q.get()", "asyncio.exceptions.CancelledError"])
    assert [(f.rule_id, f.failure_class) for f in found] == [
        ("python.exception.asyncio.exceptions.CancelledError", FailureClass.FALLOUT)]


def grades(line: str):
    return {(f.rule_id, f.failure_class, f.action) for f in feed([line])}


def test_transport_retry_exceeded_is_transient_in_every_librarys_framing():
    lines = {
        "rdma.ucx_transport_retry_exceeded":
            "[1687791212.418834] [n17:38821:0]  ib_mlx5_log.c:174  Transport retry count exceeded on mlx5_0:1/IB "
            "(synd 0x15 vend 0x81 hw_synd 0/0)",
        "rdma.verbs_transport_retry_counter_exceeded":
            'poll_cq: completion error: status "transport retry counter exceeded" (12) for wr_id 7',
        "rdma.openmpi_openib_retry_exceeded":
            "[[1,1],7][btl_openib_component.c:3496:handle_wc] from a to: b error polling LP CQ with status "
            "RETRY EXCEEDED ERROR status number 12 for wr_id 29 opcode 1  vendor error 129 qp_idx 1",
    }
    for rule, line in lines.items():
        assert (rule, FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) in grades(line), rule
    assert not any(f.rule_id.startswith("rdma.") for f in feed(
        ['poll_cq: completion error: status "RNR retry counter exceeded" (13) for wr_id 7']))


def test_a_spot_reclaim_notice_and_a_failed_prolog_are_the_sites_not_the_jobs():
    assert ("cloud.spot_termination_notice", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) in grades(
        "2026/12/17 15:09:41 GCP Metadata Service says termination is imminent")
    assert ("slurm.prolog_failure", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) in grades(
        "salloc: Prolog failure on node t004-002")
    assert not grades("salloc: Granted job allocation 235871")


RAY = ["Traceback (most recent call last):",
       "ray.exceptions.RayTaskError(OSError): ray::ReadImage->Map(f)() (pid=257344, ip=10.0.34.58)",
       "    for b_out in map_transformer.apply_transform(iter(blocks), ctx):",
       '  File "/srv/ray/data/datasource/file_based_datasource.py", line 223, in read_files',
       "    with _open_file_with_retry(",
       '  File "pyarrow/error.pxi", line 115, in pyarrow.lib.check_status',
       "OSError: AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached",
       "(RayTrainWorker pid=257190, ip=10.0.34.58) Exception in the training loop, the workers will be shut down."]


def test_a_ray_task_errors_remote_traceback_belongs_to_its_traceback():
    from ftwatch.parsers.multiline import block_end
    assert block_end(RAY, 0) == 6
    assert block_end(RAY[:2], 0) is None          # the header is never the last line: wait for its frames
    assert block_end(RAY[:3], 0) is None
    plain = ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>', "ValueError: x",
             "    indented text of the next log record"]
    assert block_end(plain, 0) == 2               # an ordinary exception line still ends its traceback


def test_the_wrapped_s3_error_decides_not_the_catch_all():
    found = feed(RAY)
    assert [(f.rule_id, f.failure_class) for f in found if f.failure_class is not FailureClass.INFO][:1] == [
        ("s3.arrow_retryable_error", FailureClass.RETRYABLE_INFRA)]


def test_python_etcd_errors_the_rendezvous_store_of_that_moment_and_its_expired_keys():
    refused = CATALOG.grade("etcd.EtcdConnectionFailed: Connection to etcd failed due to "
                            "ReadTimeoutError(\"HTTPConnectionPool(host='etcd', port=2379): Read timed out.\")")
    assert (refused.failure_class, refused.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
    expired = CATALOG.grade("etcd.EtcdKeyNotFound: Key not found : /torch/elastic/rendezvous/job/rdzv/active_version")
    assert expired.failure_class is FailureClass.FALLOUT


def test_a_pod_exit_reported_by_an_event_stream_is_explained_by_the_pods_own_log():
    from ftwatch.policy.rootcause import analyse
    job = "k8s"
    events = Origin("events", None, job, "replay", "events.txt", "replay")
    pod = Origin("rank1", 1, job, "replay", "worker-1.log", "replay")
    report = ENGINE.feed(events, b"33s  Warning  ExitedWithCode  pytorchjob/r50  "
                                 b"Pod: train.r50-worker-0 exited with code 1\n", 1000.0, final=True)
    cause = ENGINE.feed(pod, b"ValueError: host not found: Name or service not known\n", 1001.0, final=True)
    assert [f.rule_id for f in report] == ["container.exit_code"]
    assert analyse(report + cause).root_cause.rule_id == "c10d.host_lookup_failed"
    # with nothing logged anywhere else the reported exit stays the root cause
    assert analyse(report).root_cause.rule_id == "container.exit_code"
    assert analyse(report + ENGINE.feed(pod, b"ValueError: bad shape\n", 1001.0, final=True)).root_cause.rule_id \
        == "python.value_error"


def test_an_older_torchs_failed_store_host_lookup_is_transient():
    assert ("c10d.host_lookup_failed", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) in grades(
        "ValueError: host not found: Name or service not known")


def test_slurmds_own_spooled_script_missing_is_the_nodes_but_a_users_program_missing_is_not():
    assert ("slurm.spooled_batch_script_missing", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) in grades(
        "slurmstepd: error: execve(): /var/spool/slurmd/job10231/slurm_script: No such file or directory")
    user = grades("slurmstepd: error: execve(): ./train.sh: No such file or directory")
    assert user and all(rule != "slurm.spooled_batch_script_missing" for rule, _, _ in user)


def test_vllms_startup_memory_guard_is_the_device_out_of_memory():
    for line in ["ValueError: Free memory on device (17.12/60.96 GiB) on startup is less than desired GPU memory "
                 "utilization (0.9, 54.86 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
                 "ValueError: Free memory on device cuda:0 (12.18/23.56 GiB) on startup is less than desired GPU memory "
                 "utilization (0.92, 21.67 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."]:
        assert ("vllm.free_memory_below_utilization", FailureClass.OOM, Action.FAIL_JOB) in grades(line)


NCCL_ERR = ["Traceback (most recent call last):", '  File "/srv/app/train.py", line 140, in <module>',
            "    dist.barrier()",
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
            ":3356, internal error - please report this issue to the NCCL developers, NCCL version 2.21.5",
            "ncclInternalError: Internal check failed.", "Last error:",
            "ncclSocketInit: connecting to address  with family 59936 is neither AF_INET(2) nor AF_INET6(10)",
            "W0412 06:41:09.332000 3017 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 3102"]


def test_an_address_that_never_was_one_is_the_jobs_network_configuration():
    for line in [NCCL_ERR[6], "node7:1958:1958 [0] misc/socket.cc:484 NCCL WARN ncclSocketInit: connecting to address  "
                 "with family 0 is neither AF_INET(2) nor AF_INET6(10)",
                 "node7:1958:1958 [0] NCCL WARN Net : connecting to address  with family 0 is neither AF_INET(2) nor AF_INET6(10)"]:
        assert ("nccl.socket_address_not_ip", FailureClass.USER_CODE, Action.FAIL_JOB) in grades(line)


def test_a_c10d_socket_not_connected_is_fallout_and_a_mount_not_connected_is_the_mounts():
    """strerror(ENOTCONN) alone as a std::system_error's what() is a socket call of c10d
    (Utils.hpp SYSCHECK) that lost its peer; with a path it is a FUSE mount whose daemon died
    (graded in tests/rules/test_service_mount_device_grades.py)."""
    socket = feed(["terminate called after throwing an instance of 'std::system_error'",
                   "  what():  Transport endpoint is not connected"])
    assert [(f.rule_id, f.failure_class) for f in socket] == [("c10d.socket_not_connected", FailureClass.FALLOUT)]
    assert {f.rule_id for f in feed(["ls: cannot access '/mnt/s3fs/ckpt': Transport endpoint is not connected"])} == {
        "storage.transport_endpoint_not_connected"}
