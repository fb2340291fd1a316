"""R3 complete: every NPU, Xid and DCGM row has its action; unknown NPU codes are graded by severity."""

from __future__ import annotations

import csv
import functools
import importlib.resources

import pytest

from ftwatch.events import Action, FailureClass
from ftwatch.rules.faultcodes import NETWORK_CODES, USER_INPUT_CODES, FaultTables, level_name

# The level -> action table of shared/data/fault-tables/README.md ("Chip levels and our mapping",
# node, UB-switch, public and RDMA levels), written out here as the oracle. PreSeparate* levels are
# "ignore (plus cordon)": ftwatch notifies.
README_LEVELS = {
    "NotHandleFault": Action.NONE, "SubHealthFault": Action.NONE,
    "RestartRequest": Action.RESTART_IN_PLACE, "RestartBusiness": Action.RESTART_IN_PLACE,
    "FreeRestartNPU": Action.RESTART_JOB, "RestartNPU": Action.RESTART_JOB,
    "PreSeparateNPU": Action.NOTIFY, "PreSeparateFault": Action.NOTIFY,
    "SeparateNPU": Action.ISOLATE_NODE, "ManuallySeparateNPU": Action.ISOLATE_NODE,
    "SeparateFault": Action.ISOLATE_NODE, "SeparateDPU": Action.ISOLATE_NODE,
    "RestartRequestFault": Action.ISOLATE_NODE, "ResetFault": Action.ISOLATE_NODE,
}


@functools.lru_cache(maxsize=1)
def tables() -> FaultTables:
    return FaultTables.load()


def rows(name: str) -> list[dict[str, str]]:
    text = importlib.resources.files("ftwatch.rules").joinpath("packs", name).read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))


def test_every_npu_row_has_the_readme_action_for_its_level():
    graded = 0
    for row in rows("npu_fault_codes.tsv"):
        entry = tables().npu(row["code"])
        assert entry is not None, row["code"]
        level = level_name(row["level"])
        if row["code"] == "A2301001":          # listed twice (RestartBusiness and SeparateNPU): the worse wins
            assert entry.action is Action.ISOLATE_NODE
            continue
        if row["code"].upper() in USER_INPUT_CODES:
            assert entry.action is Action.RESTART_IN_PLACE and entry.failure_class is FailureClass.USER_CODE
            continue
        if level in README_LEVELS:
            expected = README_LEVELS[level]
            if row["code"] in NETWORK_CODES and level in ("RestartRequest", "RestartBusiness", "FreeRestartNPU",
                                                           "RestartNPU"):
                expected = Action.NONE
        else:                                   # "(not in faultCode.json)": the table's own action
            expected = Action.parse(row["recommended_action"])
        assert entry.action is expected, (row["code"], row["level"])
        graded += 1
    assert graded >= 930


def test_the_table_levels_are_all_known():
    levels = {level_name(r["level"]) for r in rows("npu_fault_codes.tsv") if not r["level"].startswith("(not in")}
    assert levels - set(README_LEVELS) == set()


def test_user_input_codes_are_exactly_the_two_the_seed_names():
    user = sorted(r["code"] for r in rows("npu_fault_codes.tsv") if r["fault_class"] == "User")
    assert user == sorted(USER_INPUT_CODES) == ["80C98002", "80CB8002"]


@pytest.mark.parametrize("code", ["817F8002", "814F8002"])
def test_bad_input_by_suffix_only_stays_separate(code):
    # Decided from the sources: "bad input" is the table's guess from the ..8002 suffix, no User class,
    # MindCluster grades it SeparateNPU -> the chip is isolated (see ftwatch/rules/faultcodes.py).
    entry = tables().npu(code)
    assert entry.level.startswith("SeparateNPU") and entry.action is Action.ISOLATE_NODE
    assert entry.failure_class is FailureClass.HARDWARE_NODE


@pytest.mark.parametrize("line, action, level", [
    ("[ERROR] DRV: device 3 fault code 0x80FFFF01, severity: minor", Action.NONE, "NotHandleFault"),
    ("[ERROR] DRV: device 3 fault code 0x80FFFF01, severity=0", Action.NONE, "NotHandleFault"),
    ("[ERROR] DRV: device 3 fault code 0x80FFFF01, severity: 提示", Action.NONE, "NotHandleFault"),
    ("[ERROR] DRV: device 3 fault code 0x80FFFF01, severity: major", Action.ISOLATE_NODE, "SeparateNPU"),
    ("[ERROR] DRV: device 3 fault code 0x81FFFF01, severity critical", Action.ISOLATE_NODE, "SeparateNPU"),
    ("[ERROR] DRV: device 3 fault code 0x8CFFFF01", Action.ISOLATE_NODE, "SeparateNPU"),
])
def test_unknown_chip_codes_are_graded_by_severity(line, action, level):
    [hit] = tables().extract(line)
    assert hit.entry is None
    graded = tables().grade_unknown(hit)
    assert graded.action is action and graded.level.startswith(level)


def test_unknown_codes_not_shaped_like_chip_events_are_not_graded():
    [hit] = tables().extract("[ERROR] HCCP error code 0x12345678")
    assert hit.entry is None and tables().grade_unknown(hit) is None


def test_engine_grades_unknown_chip_code_lines():
    from ftwatch.events import Origin
    from ftwatch.rules.engine import Engine
    eng = Engine([])
    o = Origin("worker-0", 0)
    found = eng.feed(o, b"[ERROR] DRV: device 0 fault code 0x80FFFF01, severity: major\n", 1.0) + eng.flush(o, 1.0)
    assert [(f.rule_id, f.action) for f in found] == [("npu.80FFFF01", Action.ISOLATE_NODE)]
    assert found[0].fields["severity"] == "major"


def test_every_xid_and_dcgm_row_has_an_action():
    xids = rows("gpu_xid.tsv")
    assert len(xids) == 173
    for r in xids:
        entry = tables().xid(int(r["xid"]))
        assert entry.action is Action.parse(r["recommended_action"])
    dcgm = rows("dcgm_health.tsv")
    assert len(dcgm) == 121
    for r in dcgm:
        assert tables().dcgm(r["dcgm_code"]).action is Action.parse(r["recommended_action"])


@pytest.mark.parametrize("xid, action", [
    (13, Action.RESTART_IN_PLACE), (31, Action.RESTART_IN_PLACE), (43, Action.NONE), (45, Action.NONE),
    (48, Action.ISOLATE_NODE), (63, Action.NONE), (64, Action.ISOLATE_NODE), (74, Action.ISOLATE_NODE),
    (79, Action.ISOLATE_NODE), (92, Action.NONE), (94, Action.RESTART_IN_PLACE), (95, Action.ISOLATE_NODE),
    (119, Action.ISOLATE_NODE), (120, Action.ISOLATE_NODE),
])
def test_key_xid_rows_of_the_readme(xid, action):
    assert tables().xid(xid).action is action


def test_fault_assertion_is_read():
    [down] = tables().extract("device fault, event id: 0x81078603, assertion: 1")
    [up] = tables().extract("device fault, event id: 0x81078603, assertion: 0")
    [word] = tables().extract("fault code 81078603 recovered")
    assert (down.fields["assertion"], up.fields["assertion"], word.fields["assertion"]) == (
        "occur", "recover", "recover")


@pytest.mark.parametrize("text", [
    "ERROR: CoCreateInstance failed, error code 0x80004005",
    "E39999: Inner Error! error code is 80100001",
    "[ERROR] RUNTIME(1234): rtKernelLaunch failed, error code: 0x80FF0001",
])
def test_engine_leaves_generic_error_numbers_ungraded(text):
    """An unknown code shaped like a chip event but in an application's message (no dsmi /
    device-plugin wording, no "fault code" / "event id", no severity) isolates nothing: it is
    notified as an unknown code (class info: no incident), not graded SeparateNPU."""
    from ftwatch.events import Origin
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.loader import load_rules
    eng = Engine(load_rules())
    o = Origin("worker-0", 0)
    found = eng.feed(o, text.encode() + b"\n", 1.0) + eng.flush(o, 1.0)
    assert not [f for f in found if f.action >= Action.RESTART_IN_PLACE], found


@pytest.mark.parametrize("text, rule", [
    ("libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer execution "
     "failed: Caused GPU Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)", "cpp.uncaught_exception_what"),
])
def test_an_ungraded_number_does_not_outrank_a_rule_reading_the_line(text, rule):
    """A number the fault tables lack and do not grade (not a chip event on a driver line: an error
    number of something else, here macOS IOGPU's command-buffer status) says nothing of its own: the
    rule that reads the line's words decides, not an info "unknown code" notice."""
    from ftwatch.events import Origin
    from ftwatch.rules.engine import Engine
    from ftwatch.rules.loader import load_rules
    eng = Engine(load_rules())
    o = Origin("worker-0", 0)
    found = eng.feed(o, text.encode() + b"\n", 1.0) + eng.flush(o, 1.0)
    assert [f.rule_id for f in found] == [rule], found


@pytest.mark.parametrize("text", [
    "dsmi_get_device_errorcode: device 2 errorcode 0x80FFFF02",
    "[device-plugin] npu 3 fault event: event id 0x80FFFF03 assertion 1",
    "[ERROR] DRV: device 1 error code 0x80FFFF04, severity: major",
])
def test_engine_still_grades_unknown_codes_on_driver_lines(text):
    from ftwatch.events import Origin
    from ftwatch.rules.engine import Engine
    eng = Engine([])
    o = Origin("worker-0", 0)
    found = eng.feed(o, text.encode() + b"\n", 1.0) + eng.flush(o, 1.0)
    assert [f.action for f in found] == [Action.ISOLATE_NODE], found


def test_a_preseparate_chip_code_alone_notifies_and_restarts_nothing(tmp_path):
    """PreSeparateNPU (110001024): leave the running job, place no new work there → notify, even
    when the finding itself opens the incident (no failure): no restart, no budget spent."""
    from recovery_helpers import incident, line, policy
    from ftwatch.clock import FakeClock
    clock = FakeClock()
    f = line("[ERROR] DRV device 0 fault code 110001024", clock)
    p = policy(tmp_path)
    d = p.decide(incident(f, attempt=0, failed=set()), clock.time())
    assert d.action is Action.NOTIFY and "PreSeparateNPU" in d.policy_clause, d.policy_clause
    assert p.budgets.restarts_used == 0
