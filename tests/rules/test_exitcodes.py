"""Exit codes and signals -> findings (R4)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ftwatch.rules
from ftwatch.errors import ConfigError
from ftwatch.events import Action, FailureClass, Origin, ProcessExit, Severity
from ftwatch.rules.exitcodes import ExitCodeTable, decode_exit, exit_finding, signal_name

PACKAGED = Path(ftwatch.rules.__file__).parent / "packs" / "exit_codes.tsv"
RESEARCH = Path("/work/shared/data/fault-tables/error_strings.tsv")
HEADER = "pattern\tpattern_type\tcomponent\tclass\trecommended_action\tsource\tclassified_by\tmeaning\tnotes"


@pytest.fixture(scope="module")
def table() -> ExitCodeTable:
    if PACKAGED.is_file():
        return ExitCodeTable.load()
    if RESEARCH.is_file():
        return ExitCodeTable.load(RESEARCH)
    pytest.skip("no exit-code table yet")


W1 = Origin("worker-1", rank=1, job="j", node="n1")


def ex(returncode=None, signal=None, stopped_by_us=False, origin=W1, time=100.0):
    return ProcessExit(origin, pid=42, returncode=returncode, signal=signal, time=time, stopped_by_us=stopped_by_us)


def test_packaged_table_loads_or_is_empty():
    loaded = ExitCodeTable.load()
    if PACKAGED.is_file():
        assert loaded.get(137) is not None
    else:
        assert loaded.rows == {}


def test_table_rows(table):
    row = table.get(137)
    assert row.failure_class is FailureClass.RETRYABLE_INFRA and row.action is Action.RESTART_JOB
    assert table.get(139).failure_class is FailureClass.USER_CODE
    assert table.get(201).action is Action.ISOLATE_NODE
    assert table.get(247).failure_class is FailureClass.OOM
    assert table.get(0) is None


@pytest.mark.parametrize("kwargs", [{"signal": 9}, {"returncode": -9}, {"returncode": 137}])
def test_sigkill_in_any_form(table, kwargs):
    f = exit_finding(ex(**kwargs), table, seq=7)
    assert f.rule_id == "exit.sigkill" and f.kind == "exit_code"
    assert f.failure_class is FailureClass.RETRYABLE_INFRA and f.action is Action.RESTART_JOB
    assert f.severity is Severity.ERROR
    assert f.line == "worker-1 (rank 1) was killed by signal 9 (SIGKILL)"
    assert f.fields["exitcode"] == 137 and f.fields["signal"] == 9 and f.fields["signal_name"] == "SIGKILL"
    assert f.fields["generic"] is False
    assert f.origin == W1 and f.time == 100.0 and f.seq == 7
    assert "container/process exit status" in f.source and "kubedl" in f.source
    assert f.fingerprint == "exit.sigkill@worker-1"


@pytest.mark.parametrize("kwargs,rule,cls", [
    ({"returncode": -11}, "exit.sigsegv", FailureClass.USER_CODE),
    ({"signal": 15}, "exit.sigterm", FailureClass.RETRYABLE_INFRA),
    ({"returncode": 134}, "exit.sigabrt", FailureClass.USER_CODE),
])
def test_other_signals(table, kwargs, rule, cls):
    f = exit_finding(ex(**kwargs), table)
    assert f.rule_id == rule and f.failure_class is cls and f.fields["signal"] is not None


def test_plain_exit_code(table):
    f = exit_finding(ex(returncode=1), table)
    assert f.rule_id == "exit.1"
    assert f.line == "worker-1 (rank 1) exited with code 1"
    assert f.failure_class is FailureClass.USER_CODE and f.action is Action.FAIL_JOB
    assert f.fields == {"exitcode": 1, "signal": None, "signal_name": None, "returncode": 1,
                        "meaning": "general error", "generic": True}


def test_classified_codes_are_not_generic(table):
    # 201 and 247 are DLRover's private codes: they classify under dlrover-run (issue 12 item 6)
    f = exit_finding(ex(returncode=201), table, launchers={"dlrover"})
    assert f.rule_id == "exit.201" and f.action is Action.ISOLATE_NODE and f.fields["generic"] is False
    assert f.failure_class is FailureClass.HARDWARE_NODE
    oom = exit_finding(ex(returncode=247), table, launchers={"dlrover"})
    assert oom.failure_class is FailureClass.OOM and oom.fields["generic"] is False


def test_unknown_code_is_generic_user_code(table):
    f = exit_finding(ex(returncode=3), table)
    assert f.rule_id == "exit.3" and f.failure_class is FailureClass.USER_CODE
    assert f.action is Action.FAIL_JOB and f.fields["generic"] is True


def test_unknown_signal_is_user_code_but_not_generic(table):
    f = exit_finding(ex(returncode=-7), table)
    assert f.rule_id == "exit.sigbus" and f.fields["exitcode"] == 135
    assert f.failure_class is FailureClass.USER_CODE and f.fields["generic"] is False


def test_clean_exit_and_our_own_stop_are_not_findings(table):
    assert exit_finding(ex(returncode=0), table) is None
    assert exit_finding(ex(returncode=-15, stopped_by_us=True), table) is None
    assert exit_finding(ex(signal=9, stopped_by_us=True), table) is None


def test_no_rank_in_line(table):
    f = exit_finding(ex(returncode=2, origin=Origin("trainer")), table)
    assert f.line == "trainer exited with code 2"


def test_empty_table_still_classifies_generically():
    f = exit_finding(ex(signal=9), ExitCodeTable())
    assert f.rule_id == "exit.sigkill" and f.failure_class is FailureClass.USER_CODE
    assert f.fields["generic"] is False


def test_decode_exit():
    assert decode_exit(ex(returncode=-9)) == (137, 9)
    assert decode_exit(ex(returncode=137)) == (137, 9)
    assert decode_exit(ex(signal=11)) == (139, 11)
    assert decode_exit(ex(returncode=247)) == (247, None)
    assert decode_exit(ex(returncode=128)) == (128, None)
    assert signal_name(9) == "SIGKILL" and signal_name(99) == "SIG99"


def test_parse_skips_other_rows_and_reports_bad_rows():
    text = "\n".join([HEADER,
                      "oops\tliteral\tx\tuser_code\tfail_job\ts\tc\tm\t",
                      "137\texit_code\tprocess\tretryable_infra\trestart_job\ts\tc\tSIGKILL\t",
                      "abc\texit_code\tprocess\tuser_code\tfail_job\ts\tc\tm\t",
                      "9\texit_code\tprocess\tnot_a_class\tfail_job\ts\tc\tm\t",
                      "137\texit_code\tprocess\tuser_code\tfail_job\ts\tc\tm\t"])
    with pytest.raises(ConfigError) as excinfo:
        ExitCodeTable.parse(text, "t.tsv")
    assert [(i.file, i.line) for i in excinfo.value.issues] == [("t.tsv", 4), ("t.tsv", 5), ("t.tsv", 6)]
    ok = ExitCodeTable.parse("\n".join(text.splitlines()[:3]), "t.tsv")
    assert list(ok.rows) == [137] and ok.get(137).meaning == "SIGKILL"


def test_bad_header():
    with pytest.raises(ConfigError):
        ExitCodeTable.parse("code\tclass\n1\tuser_code\n")
    with pytest.raises(ConfigError):
        ExitCodeTable.load("/nonexistent/exit_codes.tsv")


def test_the_packaged_table_is_read_once_per_process_and_is_what_reading_it_gives():
    """Every replay's exit tracker asks for it (each case of an evaluation): read once, shared."""
    from ftwatch.rules import exitcodes
    exitcodes._packaged.cache_clear()
    first = ExitCodeTable.load()
    assert ExitCodeTable.load() is first and exitcodes._packaged.cache_info().misses == 1
    fresh = ExitCodeTable._load(None)
    assert (first.rows, first.location, first.private) == (fresh.rows, fresh.location, fresh.private)
    assert first.rows and ExitCodeTable.load(PACKAGED) is not first       # an explicit path: read then
