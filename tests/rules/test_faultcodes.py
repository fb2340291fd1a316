"""Fault-code tables (SPEC R3): lookups, grading, and finding codes in text without taking hashes."""

from __future__ import annotations

import functools

import pytest

from ftwatch.events import Action, FailureClass
from ftwatch.rules.faultcodes import FaultTables, normalise_npu
from ftwatch.rules.matcher import Matcher


@functools.lru_cache(maxsize=1)
def tables() -> FaultTables:
    return FaultTables.load()


def _npu_rows() -> list[list[str]]:
    import importlib.resources
    folder = importlib.resources.files("ftwatch.rules").joinpath("packs")
    text = folder.joinpath("npu_fault_codes.tsv").read_text("utf-8")
    return [line.split("\t") for line in text.split("\n")[1:] if line.strip()]


def _code_with_level(prefix: str) -> str:
    return next(row[0] for row in _npu_rows() if row[1].startswith(prefix) and row[7] != "User")


def test_tables_load_every_row():
    t = tables()
    assert len(t) >= 937 - 2 + 173 + 121  # one NPU code is listed twice (A2301001)


# --- Xid ------------------------------------------------------------------------------------------

def test_xid_79_line_isolates_with_pci():
    [hit] = tables().extract("[Sat Nov 21 09:36:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
                             "GPU has fallen off the bus.")
    assert (hit.kind, hit.code) == ("xid", "79")
    assert hit.fields["xid"] == 79 and hit.fields["pci"] == "0000:3b:00" and hit.fields["pid"] == "1234"
    assert hit.fields["message"] == "GPU has fallen off the bus."
    assert hit.entry.action is Action.ISOLATE_NODE
    assert hit.entry.failure_class is FailureClass.HARDWARE_NODE
    assert "xid" in hit.entry.source.lower()


def test_xid_line_with_quoted_pid_and_name():
    [hit] = tables().extract("NVRM: Xid (PCI:0000:b1:00): 13, pid='<unknown>', name=<unknown>, "
                             "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address")
    assert hit.fields["pid"] == "<unknown>" and hit.fields["name"] == "<unknown>"
    assert hit.entry.failure_class is FailureClass.USER_CODE


def test_device_plugin_xid_critical_error_is_graded_by_the_xid_table():
    # NVIDIA k8s-device-plugin marks a GPU unhealthy on every Xid outside its skip list; the Xid it
    # names decides (63, row remap recorded: NVIDIA's catalog says IGNORE; 79: off the bus, isolate).
    [hit] = tables().extract("I1025 02:19:08.048201       1 health.go:186] XidCriticalError: Xid=63 on "
                             "Device=GPU-7c0a91d2-5e3b-4f61-8a27-d90b1e4f6c35, the device will go unhealthy.")
    assert (hit.kind, hit.code, hit.fields["uuid"]) == ("xid", "63", "GPU-7c0a91d2-5e3b-4f61-8a27-d90b1e4f6c35")
    assert hit.entry.action is Action.NONE
    [hit] = tables().extract("2021/03/12 17:40:22 XidCriticalError: Xid=79, All devices will go unhealthy.")
    assert hit.code == "79" and hit.entry.action is Action.ISOLATE_NODE and "uuid" not in hit.fields
    assert tables().extract("Skipping non-nvmlEventTypeXidCriticalError event: {EventType:2 EventData:0}") == []


def test_device_plugin_verdict_alone_notifies():
    # the plugin's "marked unhealthy" grades no fault (its skip list, not NVIDIA's catalog): notify
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.loader import load_rules
    from ftwatch.events import Origin
    found = Engine(load_rules()).feed(Origin("plugin"), b"I0612 03:14:07.118203       1 server.go:245] "
                                      b"'nvidia.com/gpu' device marked unhealthy: GPU-c24840ec\n", 1000.0, final=True)
    assert [(f.rule_id, f.action) for f in found] == [("gpu.device_plugin_unhealthy", Action.NOTIFY)]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_error_xids_are_user_code(xid):
    entry = tables().xid(xid)
    assert entry.failure_class is FailureClass.USER_CODE
    assert entry.action is not Action.ISOLATE_NODE


@pytest.mark.parametrize("xid, action", [(48, Action.ISOLATE_NODE), (79, Action.ISOLATE_NODE),
                                         (94, Action.RESTART_IN_PLACE), (92, Action.NONE)])
def test_xid_actions_follow_the_table(xid, action):
    assert tables().xid(xid).action is action


def test_unknown_xid():
    assert tables().xid(999) is None
    [hit] = tables().extract("NVRM: Xid (PCI:0000:3b:00): 999, pid=1, something new")
    assert hit.entry is None and hit.code == "999"


# --- NPU ------------------------------------------------------------------------------------------

def test_normalise_npu():
    assert normalise_npu("0x80e01801") == "80E01801"
    assert normalise_npu(" 80e01801 ") == "80E01801"
    assert normalise_npu("110001024") == "110001024"
    assert normalise_npu("[0x08520003, na, L2, na]") == "[0x08520003,na,l2,na]"


@pytest.mark.parametrize("line", [
    "[ERROR] DRV(4121,python):2026-11-21-09:36:03.735.123 device 3 error_code=80E01801",
    "[ERROR] device-plugin: npu 3 has fault code 0x80e01801",
    "device 3 fault [0x80E01801]",
    "hccn: errorcode:80E01801",
    "Event ID: 80E01801, device 3, severity major",
])
def test_80e01801_uce_restarts_in_place(line):
    hits = tables().extract(line)
    assert [(h.kind, h.code) for h in hits] == [("npu", "80E01801")]
    entry = hits[0].entry
    assert entry.action is Action.RESTART_IN_PLACE
    assert entry.failure_class is FailureClass.HARDWARE_NODE
    assert entry.level.startswith("RestartBusiness")
    severity = {"severity": "major"} if "severity" in line else {}
    assert hits[0].fields == {"fault_code": "80E01801", **severity}


def test_level_grading():
    t = tables()
    assert t.npu(_code_with_level("NotHandleFault")).action is Action.NONE
    assert t.npu(_code_with_level("NotHandleFault")).failure_class is FailureClass.INFO
    assert t.npu(_code_with_level("SubHealthFault")).action is Action.NONE
    assert t.npu(_code_with_level("RestartRequest")).action is Action.RESTART_IN_PLACE
    assert t.npu(_code_with_level("FreeRestartNPU")).action is Action.RESTART_JOB
    assert t.npu(_code_with_level("RestartNPU")).action is Action.RESTART_JOB
    assert t.npu(_code_with_level("PreSeparateNPU")).action is Action.NOTIFY
    assert t.npu(_code_with_level("SeparateNPU")).action is Action.ISOLATE_NODE
    assert t.npu(_code_with_level("SeparateNPU")).failure_class is FailureClass.HARDWARE_NODE
    assert t.npu(_code_with_level("SeparateFault")).action is Action.ISOLATE_NODE


def test_code_listed_twice_takes_the_more_serious_level():
    assert tables().npu("A2301001").action is Action.ISOLATE_NODE


def test_no_user_coded_npu_row_isolates():
    user = [row[0] for row in _npu_rows() if row[7] == "User"]
    assert sorted(user) == ["80C98002", "80CB8002"]
    for code in user:
        entry = tables().npu(code)
        assert entry.failure_class is FailureClass.USER_CODE and entry.action < Action.ISOLATE_NODE


def test_unknown_npu_code_is_returned_without_entry():
    assert tables().npu("80FFFF01") is None
    [hit] = tables().extract("[ERROR] DRV: device 3 reported fault code 0x80FFFF01")
    assert (hit.kind, hit.code, hit.entry) == ("npu", "80FFFF01", None)


def test_list_of_codes_and_decimal_codes():
    hits = tables().extract("device 3 fault codes: [0x80E18005, 0x80C98009]; alarm id 110001024")
    assert [h.code for h in hits] == ["80E18005", "80C98009", "110001024"]
    assert all(h.entry is not None for h in hits)


@pytest.mark.parametrize("line", [
    "loading checkpoint sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b error-free",
    "error in commit 3f2a9c1b while pushing",
    "request_id=80E01801 served in 12ms",
    "saved /mnt/ckpt/step-80c98002.pt",
    "error: address 0x7f3a12c4b740 is not mapped",
    "the default 12345678 was used",
    "ERROR deadbeef: bad magic",
    "fault at 0x80e01801ff (kernel address)",
    "error code 507035",
])
def test_hashes_and_addresses_are_not_codes(line):
    assert [h for h in tables().extract(line) if h.kind == "npu"] == []


# --- DCGM -----------------------------------------------------------------------------------------

def test_dcgm_name():
    [hit] = tables().extract("dcgmi health: GPU 3: DCGM_FR_VOLATILE_DBE_DETECTED volatile double-bit ECC")
    assert hit.kind == "dcgm" and hit.fields == {"dcgm": "DCGM_FR_VOLATILE_DBE_DETECTED"}
    assert hit.entry.action is Action.ISOLATE_NODE
    assert tables().dcgm("dcgm_fr_unknown").action is Action.NONE


# --- candidate patterns ---------------------------------------------------------------------------

def test_patterns_find_candidate_lines_in_a_chunk():
    matcher = Matcher(FaultTables.PATTERNS)
    lines = [
        b"step 100 loss 2.31",
        b"[Sat Nov 21 09:36:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        b"commit 3f2a9c1b",
        b"[ERROR] device 3 fault code 0x80C98002",
        b"GPU 3: DCGM_FR_VOLATILE_DBE_DETECTED",
        b"Event ID: 81078603",
    ]
    data = b"\n".join(lines) + b"\n"
    starts = sorted({start for start, _ in matcher.scan(data)})
    hit_lines = [data[s:data.index(b"\n", s)] for s in starts]
    assert hit_lines == [lines[1], lines[3], lines[4], lines[5]]
    codes = [h.code for line in hit_lines for h in tables().extract(line.decode())]
    assert codes == ["79", "80C98002", "DCGM_FR_VOLATILE_DBE_DETECTED", "81078603"]


def test_patterns_are_valid_on_both_engines():
    assert [Matcher.check(p) for p in FaultTables.PATTERNS] == [None] * len(FaultTables.PATTERNS)


def test_extract_dedups_within_a_record():
    text = "fault code 0x80E01801\nretry: fault code 80e01801\nNVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE"
    assert [(h.kind, h.code) for h in tables().extract(text)] == [("npu", "80E01801"), ("xid", "48")]
