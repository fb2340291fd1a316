"""The graded catalogs (issue 12 item 2, GPU side): every catalog loads, every row is a rule graded
as its source says (table-driven), the older rules a row names carry the same grade, NCCL INFO
lines open nothing, and the CUDA "unknown error" is a device-suspect finding."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.parsers import collective
from ftwatch.policy.c4d import C4DSettings
from ftwatch.policy.triggers import opens_incident
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.rules.testrules import run_rule_tests

REPO = Path(__file__).resolve().parents[2]
PACKS = REPO / "ftwatch" / "rules" / "packs"
sys.path.insert(0, str(REPO / "tools"))
_spec = importlib.util.spec_from_file_location("catalogs", REPO / "tools" / "catalogs.py")
catalogs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(catalogs)

BUILTIN = load_rules()
BY_ID = {rule.id: rule for rule in BUILTIN}
CUDA_ROWS = catalogs.read_tsv(PACKS / "cuda_errors.tsv", catalogs.CUDA_COLUMNS)
VOCAB = {name: catalogs.read_tsv(PACKS / name, catalogs.VOCAB_COLUMNS)
         for name in catalogs.CATALOGS if name != "cuda_errors.tsv"}
VOCAB_ROWS = [(name, row) for name, rows in VOCAB.items() for row in rows]
W1 = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")
T0 = 1_795_253_763.0


def _feed(*lines: str) -> list:
    return Engine(BUILTIN).feed(W1, "".join(f"{line}\n" for line in lines).encode(), T0, final=True)


# --- each catalog loads and its pack is loaded and passes test-rules -------------------------------

@pytest.mark.parametrize("catalog", sorted(catalogs.CATALOGS))
def test_catalog_loads_and_its_pack_passes_test_rules(catalog):
    pack, _ = catalogs.CATALOGS[catalog]
    rules = [r for r in BUILTIN if Path(r.location.rsplit(":", 1)[0]).name == pack]
    assert rules, f"{pack} loaded no rules"
    assert all(r.source for r in rules)
    assert run_rule_tests(rules) == []


def test_every_catalog_row_has_a_source():
    for row in CUDA_ROWS:
        assert row["source"].startswith("CUDA Runtime API"), row["enum"]
    for name, row in VOCAB_ROWS:
        assert row["source"], f"{name}: {row['id']}"


# --- CUDA runtime errors: graded by the grade the source gives -------------------------------------

@pytest.mark.parametrize("row", CUDA_ROWS, ids=[r["enum"] for r in CUDA_ROWS])
def test_cuda_row_is_a_rule_with_its_grade(row):
    failure_class, action, priority, _ = catalogs.GRADES[row["grade"]]
    rule = BY_ID[f"cuda.rt.{catalogs.snake(row['enum'])}"]
    assert (rule.failure_class.value, rule.action.label, rule.priority) == (failure_class, action, priority)
    if row["covered_by"]:
        older = BY_ID[row["covered_by"]]
        assert (older.failure_class.value, older.action.label) == (failure_class, action), \
            f"{older.id} grades {row['enum']} unlike cuda_errors.tsv"


@pytest.mark.parametrize("enum, grade", [
    ("cudaErrorUnknown", "device"),               # issue 12: "CUDA error: unknown error" matched nothing
    ("cudaErrorECCUncorrectable", "device"),
    ("cudaErrorNvlinkUncorrectable", "device"),
    ("cudaErrorContained", "device"),             # docs: GPU error containment; NVLink or hardware
    ("cudaErrorDevicesUnavailable", "device"),
    ("cudaErrorNoDevice", "device"),
    ("cudaErrorIllegalAddress", "sticky_program"),
    ("cudaErrorAssert", "sticky_program"),
    ("cudaErrorHardwareStackError", "sticky_program"),   # the docs: stack corruption or size limit
    ("cudaErrorLaunchFailure", "sticky_ambiguous"),
    ("cudaErrorMemoryAllocation", "oom"),
    ("cudaErrorInvalidValue", "usage"),
    ("cudaErrorInvalidDeviceFunction", "usage"),
    ("cudaErrorNoKernelImageForDevice", "usage"),
    ("cudaErrorNotReady", "status"),
])
def test_cuda_grades_follow_the_documentation(enum, grade):
    [row] = [r for r in CUDA_ROWS if r["enum"] == enum]
    assert row["grade"] == grade


def test_sticky_errors_are_never_plain_usage_or_status():
    """The docs' "the process must be terminated and relaunched" errors need a new process.

    ``device`` (isolate the node: the process is relaunched elsewhere) is allowed for a sticky
    error the docs blame on the hardware (cudaErrorContained: the GPU's error containment)."""
    for row in CUDA_ROWS:
        if row["sticky"] == "yes":
            assert row["grade"] in ("sticky_program", "sticky_ambiguous", "hang", "device"), row["enum"]
            if row["grade"] == "device":
                assert "hardware" in row["meaning"], row["enum"]


@pytest.mark.parametrize("line", [
    "[rank3]: RuntimeError: CUDA error: unknown error",
    "gpu47:5233:5371 [1] transport/nvls.cc:223 NCCL WARN Cuda failure 999 'unknown error'",
    "RuntimeError: cuda failure: cudaErrorUnknown: unknown error",
    "luajit: cuda runtime error (30) : unknown error at /tmp/cutorch/lib/THC/THCStorage.c:113",
])
def test_cuda_unknown_error_is_a_device_suspect_finding(line):
    [finding] = _feed(line)
    assert finding.failure_class is FailureClass.HARDWARE_NODE
    assert finding.action is Action.ISOLATE_NODE
    assert finding.rule_id == "cuda.rt.unknown"


@pytest.mark.parametrize("line", [
    "task-162 rank 1: jax.errors.JaxRuntimeError: INTERNAL: CUDA error: : CUDA_ERROR_CONTAINED: "
    "Invalid access of peer GPU memory over nvlink or a hardware error",
    "E0905 17:34:36.549112 gpu_cudamallocasync_allocator.cc:414] CUDA_ERROR_CONTAINED: Invalid access",
])
def test_driver_api_name_of_a_contained_error_isolates_the_node(line):
    """The Driver API's CUresult name (driver_enum) is matched like the runtime's enum name."""
    [finding] = _feed(line)
    assert finding.rule_id == "cuda.rt.contained"
    assert (finding.failure_class, finding.action) == (FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE)


def test_a_driver_name_only_counts_as_a_whole_word():
    assert _feed("CUDA_ERROR_CONTAINED_X is not a CUresult") == []


def test_nccl_cuda_failure_is_graded_by_the_quoted_cuda_error():
    [finding] = _feed("node-1:2111:2190 [1] enqueue.cc:1556 NCCL WARN Cuda failure 2 'out of memory'")
    assert (finding.failure_class, finding.action) == (FailureClass.OOM, Action.FAIL_JOB)


# --- the vocabularies: a new rule per row, or the grade of the older rule it names -----------------

@pytest.mark.parametrize("name, row", VOCAB_ROWS, ids=[f"{n}:{r['id']}" for n, r in VOCAB_ROWS])
def test_vocab_row_is_graded_as_the_catalog_says(name, row):
    rule = BY_ID[row["id"]]
    assert (rule.failure_class.value, rule.action.label) == (row["class"], row["action"])
    if row["regex"] == catalogs.EXISTING:
        assert not Path(rule.location.rsplit(":", 1)[0]).name == catalogs.CATALOGS[name][0]
    else:
        assert rule.priority == int(row["priority"])
        assert rule.source.startswith(row["source"])
        assert rule.examples == (row["example"],) and rule.counterexamples == (row["counterexample"],)


@pytest.mark.parametrize("line, rule_id, failure_class, action", [
    ("pj-gpu-48:41102:41173 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : port error",
     "nccl.ib_async_port_error", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("node-16:2266681:2304899 [3] transport/net_ib.cc:92 NCCL WARN NET/IB : Got async event : local catastrophic error",
     "nccl.ib_async_device_fatal", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("[81234.118203] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0)",
     "os.edac_uncorrected", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
    ("[81234.118203] EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0)",
     "os.edac_corrected", FailureClass.HARDWARE_NODE, Action.NONE),
    ("[2481.662043] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=job_318,task=python3,pid=20417,uid=1000",
     "os.oom_kill_summary", FailureClass.OOM, Action.FAIL_JOB),
    ("[1031.442132] nvidia-nvswitch3: SXid (PCI:0000:c9:00.0): 24007, Fatal, Link 38 sourcetrack TCEN0 crumbstore ECC DBE Error",
     "gpu.sxid_fatal", FailureClass.HARDWARE_NODE, Action.ISOLATE_NODE),
])
def test_engine_grades_kernel_and_nccl_lines(line, rule_id, failure_class, action):
    [finding] = _feed(line)
    assert (finding.rule_id, finding.failure_class, finding.action) == (rule_id, failure_class, action)


def test_store_retry_warnings_are_info_not_a_closed_peer():
    findings = _feed(
        "[W912 08:17:31.118204553 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=5, "
        "addr=[node-1]:51890, remote=[node-0]:29500): Connection reset by peer",
        "[W912 08:17:31.118530917 TCPStore.cpp:347] [c10d] TCP client failed to connect/validate to host "
        "node-0:29500 - retrying (try=0, timeout=1800000ms, delay=1187ms): Connection reset by peer")
    assert findings and all(f.failure_class is FailureClass.INFO for f in findings)
    assert not any(opens_incident(f, C4DSettings(), errors=True) for f in findings)


# --- NCCL INFO lines never open an incident -------------------------------------------------------

@pytest.mark.parametrize("line", [
    "node-a:4120:4120 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: "
    "No such file or directory No plugin found (libnccl-net.so), using internal implementation",
    "worker0-8fk2p:17:88 [3] NCCL INFO Call to recv failed : Connection reset by peer",
    "node-a:4120:4190 [0] NCCL INFO Call to connect returned Connection refused, retrying",
    "node-a:4120:4120 [0] NCCL INFO cudaDriverVersion 12040 ... Cuda failure 'unknown error' seen in a test",
])
def test_nccl_info_lines_make_no_finding(line):
    assert _feed(line) == []


def test_the_same_text_at_warn_level_is_judged():
    [finding] = _feed("node-a:4120:4120 [0] misc/utils.cc:90 NCCL WARN open: No such file or directory")
    assert finding.rule_id == "storage.no_such_file"


def test_an_info_line_inside_a_traceback_does_not_hide_its_error():
    findings = _feed("Traceback (most recent call last):",
                     '  File "train.py", line 3, in <module>',
                     "node-a:4120:4120 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: No such file or directory",
                     "FileNotFoundError: [Errno 2] No such file or directory: 'data/train.jsonl'")
    assert findings and all(f.failure_class is FailureClass.USER_CODE for f in findings)
    assert not any("NCCL INFO" in f.line for f in findings)
    assert any(f.line.startswith("FileNotFoundError") for f in findings)


# --- a dynamic loader's probe is no missing path; its fatal forms still fail the job ---------------

@pytest.mark.parametrize("line", [
    # rdma-core libibverbs/dynamic_driver.c: one warning per provider it has no library for, then on
    "[default0]:libibverbs: Warning: couldn't load driver 'libipathverbs-rdmav25.so': libipathverbs-rdmav25.so: "
    "cannot open shared object file: No such file or directory",
    # TensorFlow's dso_loader probes CUDA libraries at WARNING level and goes on without them
    "2021-03-04 12:00:00.123456: W tensorflow/stream_executor/platform/default/dso_loader.cc:60] Could not load "
    "dynamic library 'libcudart.so.11.0'; dlerror: libcudart.so.11.0: cannot open shared object file: "
    "No such file or directory",
])
def test_a_loader_probe_warning_makes_no_finding(line):
    assert _feed(line) == []


@pytest.mark.parametrize("lines, rule_id", [
    (["/usr/local/bin/all_reduce_perf: error while loading shared libraries: libnccl.so.2: cannot open shared "
      "object file: No such file or directory"], "loader.shared_library_missing"),
    (["Traceback (most recent call last):", '  File "train.py", line 1, in <module>',
      "ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory"], None),
])
def test_a_library_missing_for_good_fails_the_job(lines, rule_id):
    findings = _feed(*lines)
    assert findings and all(f.action is Action.FAIL_JOB for f in findings)
    assert rule_id is None or findings[0].rule_id == rule_id


# --- P3: the watchdog's collective fields ---------------------------------------------------------

def test_watchdog_finding_carries_op_seq_and_timeout():
    [finding] = _feed(
        "[rank0]:[E0409 07:25:13.000000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=611, OpType=ALLREDUCE, NumelIn=11689512, NumelOut=11689512, Timeout(ms)=600000) "
        "ran for 600064 milliseconds before timing out.")
    assert finding.rule_id == "torch.nccl_watchdog_timeout"
    assert finding.fields == {"seq": 611, "op": "ALLREDUCE", "numel_in": 11689512, "numel_out": 11689512,
                              "timeout_ms": 600000, "ran_ms": 600064}


@pytest.mark.parametrize("text, expected", [
    ("[Rank 3] Timeout at NCCL work: 4213, last enqueued NCCL work: 4213, last completed NCCL work: 4212.",
     {"seq": 4213, "last_enqueued": 4213, "last_completed": 4212}),
    ("Exception (either an error or timeout) detected by watchdog at work: 7, last enqueued NCCL work: 9, "
     "last completed NCCL work: -1.", {"seq": 7, "last_enqueued": 9, "last_completed": -1}),
    ("WorkHCCL(SeqNum=12, OpType=BROADCAST, Timeout(ms)=1800000)", {"seq": 12, "op": "BROADCAST",
                                                                   "timeout_ms": 1800000}),
    ("RuntimeError: CUDA error: unknown error", {}),
])
def test_collective_fields(text, expected):
    assert collective.fields(text) == expected


# --- wandb.init's time-out reaching its service is transient (W&B: retry) --------------------------

@pytest.mark.parametrize("line", [
    "wandb.errors.error.Error: Couldn't communicate with backend after 15 seconds",
    "wandb.errors.errors.CommError: Run initialization has timed out after 90.0 sec. Please try increasing the "
    "timeout with the `init_timeout` setting: `wandb.init(settings=wandb.Settings(init_timeout=120))`.",
])
def test_a_wandb_init_timeout_restarts(line):
    findings = _feed("Traceback (most recent call last):", '  File "train.py", line 9, in <module>', line)
    assert [(f.rule_id, f.action) for f in findings] == [("wandb.init_timeout", Action.RESTART_JOB)]


# --- the allocator's 1 EB size guard is a corrupt size, not a memory shortage ---------------------

@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory.",
    "RuntimeError: NPU out of memory. Tried to allocate more than 1EB memory",
])
def test_an_allocation_past_1eb_is_the_programs(line):
    [finding] = _feed(line)
    assert (finding.rule_id, finding.failure_class) == ("alloc.size_past_1eb", FailureClass.USER_CODE)


def test_a_real_allocation_failure_stays_oom():
    [finding] = _feed("RuntimeError: NPU out of memory. Tried to allocate 30.00 MiB (NPU 3; 60.96 GiB total capacity)")
    assert finding.failure_class is FailureClass.OOM


@pytest.mark.parametrize("line, rule, failure_class", [
    ("[13d08h12m43s][HUGECTR][ERROR]: Runtime error: an illegal memory access was encountered "
     "/hugectr/HugeCTR/src/data_readers/parquet_data_reader_worker.cu:212 ", "cuda.rt.illegal_address",
     FailureClass.USER_CODE),
    ("[24d09h41m31s][HUGECTR][ERROR]: Runtime error: out of memory /mnt/HugeCTR/HugeCTR/include/general_buffer.hpp:64 ",
     "cuda.rt.memory_allocation", FailureClass.OOM),
])
def test_hugectrs_check_macro_prints_the_cuda_runtimes_text_with_its_location(line, rule, failure_class):
    """HugeCTR's CK_CUDA_THROW_ throws ``Runtime error: <cudaGetErrorString> <file>:<line>``."""
    found = [f for f in _feed(line) if f.rule_id == rule]
    assert found and found[0].failure_class is failure_class


def test_runtime_error_words_without_a_source_location_are_no_cuda_error():
    assert not [f for f in _feed("Runtime error: out of memory while parsing the config")
                if f.rule_id.startswith("cuda.rt.")]
