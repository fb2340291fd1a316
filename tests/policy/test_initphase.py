"""An error before the job made any progress (SPEC R6, ``ftwatch.policy.initphase``): the fact read
once in the incident core, and the grading of ``rules/packs/init_phase.tsv`` that uses it. Each test
fails without its change: a connect that no route to the network or a link-local address kept from
its peer at init is configuration (fail_job), the same line after progress stays retryable, a
refused, timed-out, aborted or no-route-to-host connect at init stays retryable, an unseen start grades nothing, a header line
naming a step count is no progress."""

from __future__ import annotations

from pathlib import Path

from ftwatch.config.model import Config
from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.parsers import fields
from ftwatch.pipeline.replay import replay
from ftwatch.policy.budgets import BudgetStore
from ftwatch.policy.initphase import NONE_YET, UNKNOWN, FirstProgress, at_init, table
from ftwatch.policy.policy import Incident, Policy
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
RULES = load_rules()
ENGINE = Engine(RULES)
JOB = "init"
FLAGS = {"fault_tolerant_policy": "ExitCodeAndErrorMsg", "enable_job_restart": True, "max_num_of_job_restart": 3}
NO_ROUTE = "node-1:4410:4493 [0] misc/socket.cc:484 NCCL WARN socketPollConnect: connect to 10.42.0.7<43261> failed : No route to host"
ABORTED = ("node-1:4410:4493 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.42.0.7<41327> "
           "failed : Software caused connection abort")
UNREACHABLE = ("node-1:4410:4493 [0] include/socket.h:403 NCCL WARN Connect to fe80::4811:8aff:fe89:315f%vethe2e6725<41327> "
               "failed : Network is unreachable")
LINK_LOCAL = ("node-1:4410:4493 [0] misc/socket.cc:484 NCCL WARN socketPollConnect: connect to fe80::4811:8aff:fe89:315f"
              "%vethe2e6725<41327> failed : Connection timed out")
LINK_LOCAL_ABORTED = ("socketStartConnect: Connect to 169.254.0.1<38217> failed : Software caused connection abort")
TIMED_OUT = "node-1:4410:4493 [0] misc/socket.cc:484 NCCL WARN socketPollConnect: connect to 10.42.0.7<43261> failed : Connection timed out"
REFUSED = "node-1:4410:4493 [0] misc/socket.cc:484 NCCL WARN socketPollConnect: connect to 10.42.0.7<43261> failed : Connection refused"
RAISED = "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled system error"


def logged(*lines: str, t: float = T0) -> list[Finding]:
    o = Origin("worker-1", 1, JOB, "node-1", "stderr", "process")
    return ENGINE.feed(o, "".join(f"{x}\n" for x in lines).encode(), t, final=True)


def decided(findings: list[Finding], progress_at: float, tmp_path: Path):
    policy = Policy(Config().with_policy(**FLAGS).policy, BudgetStore(tmp_path / "b.json", JOB), JOB)
    return policy.decide(Incident(findings[-1], tuple(findings), 2, frozenset({"worker-1"}), 0,
                                  progress_at=progress_at), T0 + 100)


def test_every_row_names_a_rule_that_exists():
    ids = {r.id for r in RULES}
    assert table() and set(table()) <= ids


def test_a_connect_that_never_reached_its_peer_before_any_progress_is_configuration(tmp_path):
    for line in (UNREACHABLE, LINK_LOCAL):
        d = decided(logged(line, RAISED), NONE_YET, tmp_path / line[-9:].replace(" ", "_"))
        assert d.action is Action.FAIL_JOB, d.policy_clause
        assert d.root_cause.failure_class is FailureClass.USER_CODE and "R6" in d.policy_clause


def test_an_aborted_connect_to_a_link_local_address_before_any_progress_is_configuration(tmp_path):
    """NCCL reports ECONNABORTED apart (nccl.socket_connect_aborted); the address decides, whatever errno:
    a link-local one reaches no other node (RFC 3927, RFC 4291). Also as torch's 'Last error:' text."""
    found = logged(LINK_LOCAL_ABORTED, RAISED)
    assert found[0].rule_id == "nccl.socket_connect_aborted"
    d = decided(found, NONE_YET, tmp_path / "init")
    assert d.action is Action.FAIL_JOB and "R6" in d.policy_clause, d.policy_clause
    after = decided(logged(LINK_LOCAL_ABORTED, RAISED, t=T0 + 50), T0, tmp_path / "after")
    assert after.action is Action.RESTART_JOB


def test_nccls_last_error_text_after_the_code_explains_it_at_init(tmp_path):
    """PyTorch prints NCCL's last WARN after the result code ('Last error:'); it explains the code too."""
    found = logged(RAISED, "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
                   "device error.", "Last error:", LINK_LOCAL_ABORTED)
    assert [f.rule_id for f in found][-1] == "nccl.socket_connect_aborted"
    d = decided(found, NONE_YET, tmp_path / "init")
    assert d.action is Action.FAIL_JOB and "R6" in d.policy_clause, d.policy_clause
    routable = logged(RAISED, "Last error:", ABORTED.split("NCCL WARN ")[1])
    assert decided(routable, NONE_YET, tmp_path / "routable").action is Action.RESTART_JOB


def test_the_same_connect_after_progress_stays_retryable(tmp_path):
    d = decided(logged(UNREACHABLE, RAISED, t=T0 + 50), T0, tmp_path)
    assert d.action is Action.RESTART_JOB and d.root_cause.failure_class is FailureClass.RETRYABLE_INFRA


def test_a_refused_timed_out_or_aborted_connect_or_an_unseen_start_grades_nothing(tmp_path):
    assert at_init(logged(REFUSED)[0], NONE_YET) is None          # the host answered: transient class
    assert at_init(logged(NO_ROUTE)[0], NONE_YET) is None         # NCCL retries it: a link flap (PR #1311)
    assert at_init(logged(TIMED_OUT)[0], NONE_YET) is None        # SYNs dropped under load too (PR #1618)
    aborted = logged(ABORTED, RAISED)                             # a refused connect retried (NCCL #1515)
    assert at_init(aborted[-1], NONE_YET, aborted) is None
    found = logged(UNREACHABLE, RAISED)
    assert at_init(found[-1], UNKNOWN, found) is None              # watch attached mid-run: not known
    d = decided(found, UNKNOWN, tmp_path)
    assert d.action is Action.RESTART_JOB


def test_an_unreachable_network_explains_the_system_error_after_it():
    found = logged(UNREACHABLE, RAISED)
    assert [f.rule_id for f in found][0] == "nccl.socket_connect_net_unreachable"
    grade = at_init(found[-1], NONE_YET, found)
    assert found[-1].rule_id == "nccl.unhandled_system_error" and grade is not None
    assert grade.failure_class is FailureClass.USER_CODE


OWN_IFACES = ("node-1:4410:4490 [0] NCCL INFO NET/Socket : Using [0]bond0:192.168.10.22<0> "
              "[1]br-5f0a3c7e1d28:172.19.0.1<0>")
TO_OWN = ("node-1:4410:4493 [0] misc/socket.cc:523 NCCL WARN Net : Connect to 172.19.0.1<46127> failed : "
          "Connection refused")


def test_a_connect_to_an_address_this_host_itself_uses_before_any_progress_is_configuration(tmp_path):
    """The peer advertised an address that this host's own NET/Socket interfaces hold (a bridge each
    host has alike): not an interface between the hosts, NCCL_SOCKET_IFNAME is the job's to set."""
    found = logged(OWN_IFACES, TO_OWN, RAISED)
    assert [f.rule_id for f in found][:2] == ["nccl.socket_interfaces_in_use", "nccl.socket_connect_failed"]
    d = decided(found, NONE_YET, tmp_path)
    assert d.action is Action.FAIL_JOB and d.root_cause.failure_class is FailureClass.USER_CODE, d.policy_clause
    grade = at_init(found[-1], NONE_YET, found)             # the system error it explains, too
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE


def test_a_refused_connect_to_another_hosts_address_keeps_its_grade():
    other = TO_OWN.replace("172.19.0.1", "192.168.10.21")
    found = logged(OWN_IFACES, other, RAISED)
    assert at_init(found[1], NONE_YET, found) is None
    assert at_init(logged(TO_OWN)[0], NONE_YET) is None     # without the interface line nothing is known


def test_first_progress_is_the_jobs_earliest_step_line_not_a_header_or_a_zero_count():
    p = FirstProgress()
    header = b"# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20\n"
    p.read("a", header, T0, 1.0, 2026)
    p.read("a", b"Epoch 0:   0%|          | 0/2300 [00:00<?, ?it/s]\n", T0, 1.0, 2026)
    assert p.at == NONE_YET                      # a benchmark's parameter line, a bar at 0: no step yet
    p.read("r0", b"2026-11-26 10:00:05 step 1 loss 2.5\n", T0, 0.0, 2026)
    assert p.at == fields.parse_timestamp("2026-11-26 10:00:05 step 1", 2026)
    p.read("r1", b"2026-11-26 09:00:00 step 1\n2026-11-26 09:00:01 step 2\n", T0, 0.0, 2026)
    assert p.at == fields.parse_timestamp("2026-11-26 09:00:00 step 1", 2026)   # read later, earlier in time
    assert not p.wants("r1") and p.wants("a")
    p.reset(known=False)
    assert p.at == UNKNOWN and not p.wants("a")


def test_a_bar_of_loading_or_preparing_is_no_progress():
    p = FirstProgress()
    for bar in (b"(CriticModelRayActor pid=489290) Loading checkpoint shards: 100%|##########| 38/38 [00:33<00:00,  1.15it/s]\n",
                b"Fetching 4 files: 100%|##########| 4/4 [00:00<00:00, 12.1it/s]\n",
                b"Map (num_proc=16): 100%|##########| 2000/2000 [00:01<00:00, 1533.20 examples/s]\n",
                b"Generating train split: 100%|##########| 9846/9846 [00:00<00:00, 61234.50 examples/s]\n"):
        p.read("a", bar, T0, 1.0, 2026)
    assert p.at == NONE_YET
    p.read("a", b"Training:  10%|#         | 30/300 [00:33<05:00,  1.15it/s]\n", T0, 1.0, 2026)
    assert p.at == T0                            # a training bar is a step done


STORE_TIMEOUT = ("[E socket.cpp:922] [c10d] The client socket has timed out after 1800s while trying to connect to "
                 "({addr}, 44737).")


def test_a_store_connect_timed_out_to_a_docker_bridge_or_link_local_address_before_progress_is_configuration(tmp_path):
    for addr in ("172.17.0.2", "169.254.3.1"):
        found = logged(STORE_TIMEOUT.format(addr=addr))
        assert [f.rule_id for f in found] == ["torch.store_client_timeout"]
        grade = at_init(found[0], NONE_YET, found)
        assert grade is not None and grade.action is Action.FAIL_JOB, addr
        assert at_init(found[0], T0 - 10, found) is None        # after progress: the network's, as before
    routable = logged(STORE_TIMEOUT.format(addr="10.42.0.7"))
    assert at_init(routable[0], NONE_YET, routable) is None     # a master that starts late: retryable


def test_replay_reads_the_fact_for_the_policy(tmp_path):
    def run(lines: list[str], name: str):
        path = tmp_path / f"{name}.log"
        path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
        policy = Policy(Config().with_policy(**FLAGS).policy, BudgetStore(tmp_path / f"{name}.json", JOB), JOB)
        return replay([path], Engine(RULES), policy, JOB).decision

    steps = [f"[2026-11-26 10:00:{n:02d}] step {n} loss 2.{n}" for n in range(1, 4)]
    at_init = run(["[2026-11-26 10:00:00] starting", f"[2026-11-26 10:00:09] {UNREACHABLE}", RAISED], "init")
    midrun = run([*steps, f"[2026-11-26 10:00:09] {UNREACHABLE}", RAISED], "midrun")
    assert at_init.action is Action.FAIL_JOB, at_init.policy_clause
    assert midrun.action is Action.RESTART_JOB, midrun.policy_clause


def test_watch_does_not_know_whether_a_job_it_met_running_made_progress(tmp_path):
    import io

    from ftwatch.pipeline.build import build_engine
    from ftwatch.pipeline.recorder import Recorder
    from ftwatch.pipeline.watch import Watcher
    from ftwatch.testing import FakeClock

    config = Config.model_validate({"storage": {"state_dir": str(tmp_path / "state")}})
    watcher = Watcher(config, build_engine(config), Recorder(out=io.StringIO(), resolve_after=None),
                      lambda batch: iter(()), clock=FakeClock(T0))
    desk = watcher._desk("met-running")
    assert desk.progress.at == UNKNOWN              # its start was before ftwatch saw it
    desk.new_attempt(T0 + 10)                       # an attempt watch saw begin
    assert desk.progress.at == NONE_YET


HF_SHARD = ["Traceback (most recent call last):",
            '  File "/opt/conda/lib/python3.11/site-packages/huggingface_hub/hf_file_system.py", line 1127, '
            "in _raise_file_not_found",
            "    raise FileNotFoundError(msg) from err",
            "FileNotFoundError: zstd://train_0413.jsonl::hf://datasets/lab/webtext@7f3e9a2c/train/train_0413.jsonl.zst"]


def test_a_hub_file_that_fails_to_open_mid_run_is_the_hubs_and_restarts(tmp_path):
    d = decided(logged(*HF_SHARD), T0 - 3600, tmp_path)
    assert d.action is Action.RESTART_JOB, d.policy_clause
    assert d.root_cause.rule_id == "hf.filesystem_not_found_midrun"


def test_a_hub_file_missing_before_any_progress_is_the_jobs_path(tmp_path):
    d = decided(logged(*HF_SHARD), NONE_YET, tmp_path)
    assert d.action is Action.FAIL_JOB and d.root_cause.failure_class is FailureClass.USER_CODE, d.policy_clause


def test_a_local_file_not_found_mid_run_stays_the_programs(tmp_path):
    d = decided(logged("FileNotFoundError: [Errno 2] No such file or directory: '/data/train/shard-00017.bin'"),
                T0 - 3600, tmp_path)
    assert d.action is Action.FAIL_JOB


GID_ENODEV = "node-1:4410:4493 [0] misc/ibvwrap.cc:284 NCCL WARN Call to ibv_modify_qp failed with error No such device"


def test_a_queue_pair_that_finds_no_gid_before_any_progress_is_the_gid_index_setting(tmp_path):
    """ENODEV from ibv_modify_qp: the RoCE GID index names no GID on this port (NVIDIA/nccl#718);
    before any progress the setting, after it the call keeps its retryable grade, and another errno
    (a timed-out QP transition) grades nothing."""
    found = logged(GID_ENODEV, RAISED)
    assert [f.rule_id for f in found] == ["nccl.ibv_call_failed", "nccl.unhandled_system_error"]
    grade = at_init(found[-1], NONE_YET, found)
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE and "#718" in grade.source
    assert decided(found, NONE_YET, tmp_path).action is Action.FAIL_JOB
    later = logged(GID_ENODEV, RAISED, t=T0 + 50)
    assert at_init(later[-1], T0, later) is None
    timed_out = logged(GID_ENODEV.replace("No such device", "Connection timed out"), RAISED)
    assert at_init(timed_out[-1], NONE_YET, timed_out) is None


def test_a_queue_pair_whose_attributes_the_verbs_layer_refuses_before_progress_is_the_setting(tmp_path):
    """EINVAL from ibv_modify_qp: the attributes NCCL built are invalid for the port (kernel verbs.c
    ib_modify_qp_is_ok; NVIDIA/nccl#302, IB and RoCE ports mixed); after progress it keeps its grade."""
    einval = GID_ENODEV.replace("No such device", "Invalid argument")
    found = logged(einval, RAISED)
    grade = at_init(found[-1], NONE_YET, found)
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE and "#302" in grade.source
    assert decided(found, NONE_YET, tmp_path).action is Action.FAIL_JOB
    later = logged(einval, RAISED, t=T0 + 50)
    assert at_init(later[-1], T0, later) is None


def test_a_build_without_the_gpus_architecture_explains_nccls_unhandled_cuda_error_at_start():
    warned = ("UserWarning: NVIDIA A100-SXM4-40GB with CUDA capability sm_80 is not compatible with the current "
              "PyTorch installation.")
    raised = ("RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:38, unhandled cuda error, "
              "NCCL version 2.7.8")
    found = logged(warned, raised)
    f = next(g for g in found if g.rule_id == "nccl.unhandled_cuda_error")
    grade = at_init(f, NONE_YET, found)
    assert grade is not None and grade.failure_class is FailureClass.USER_CODE and grade.action is Action.FAIL_JOB
    assert at_init(f, NONE_YET, logged(raised)) is None          # the code alone keeps its reading
    assert at_init(f, T0 - 1.0, found) is None                   # after progress: not the start-up's build


NVLS_FORCED = "node-2:4410:4410 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 1."
NVLS_AUTO = "node-2:4410:4410 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 2."
NVLS_FAILED = ("node-2:4410:4490 [0] transport/nvls.cc:155 NCCL WARN Cuda failure 401 'the operation cannot be "
               "performed in the present state'")


def test_an_nvls_failure_after_the_job_forced_nvls_on_is_the_setting_before_progress(tmp_path):
    """NCCL_NVLS_ENABLE=1 makes NCCL skip its check that the device supports multicast (nvls.cc
    ncclNvlsInit; the default 2 asks the device and leaves NVLS off where it says no): an NVLS
    set-up failure after it is the configuration's. Left to its default, or after progress, the
    failure keeps its hardware reading (NCCL's maintainers: the Fabric Manager / NVSwitch state)."""
    found = logged(NVLS_FORCED, NVLS_FAILED)
    assert [f.rule_id for f in found] == ["nccl.nvls_forced_on", "gpu.nvls_cuda_failure"]
    d = decided(found, NONE_YET, tmp_path / "forced")
    assert d.action is Action.FAIL_JOB and "R6" in d.policy_clause, d.policy_clause
    auto = logged(NVLS_AUTO, NVLS_FAILED)
    assert [f.rule_id for f in auto] == ["gpu.nvls_cuda_failure"]
    assert decided(auto, NONE_YET, tmp_path / "auto").action is Action.ISOLATE_NODE
    assert at_init(found[-1], T0 - 1.0, found) is None              # after progress: not the start-up's setting
