"""Rule conditions (SPEC P4): fields, fault-table predicates, the prefilter/predicate split, the
loader's file:line errors, test-rules, and the engine on both matcher backends."""

from __future__ import annotations

import textwrap

import pytest

from ftwatch.errors import RuleError
from ftwatch.events import Origin
from ftwatch.rules import matcher as matcher_mod
from ftwatch.rules.conditions import ConditionError, compile_condition
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules
from ftwatch.rules.model import Pattern
from ftwatch.rules.testrules import run_rule_tests

BACKENDS = ["hyperscan", "re2"] if matcher_mod._hs is not None else ["re2"]
ORIGIN = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")
NO_RANK = Origin("combined", None, "job-7", "node-b", "/logs/combined.log", "replay")
T0 = 1_764_000_000.0

DLERROR = ("gpu-node-3:2111:2111 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: libnccl-net.so: "
           "cannot open shared object file: No such file or directory")
USER_ENOENT = "[rank0]: FileNotFoundError: [Errno 2] No such file or directory: '/data/train/shard-00017.bin'"
XID79 = "[Sat Nov 21 09:36:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
XID13 = "[Sat Nov 21 09:36:03 2026] NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, Graphics Exception: ESR 0x5"
NPU_SEPARATE = "dsmi fault event: fault code 0x80E18402, severity major"   # SeparateNPU (L6)
NPU_USER = "dsmi fault event: fault code 0x80C98002, severity major"
WATCHDOG = ("[rank1]:[E1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=600000) ran for 600010 milliseconds before timing out.")
SUMMARY = "  exitcode  : -9 (pid: 41)"


def holds(condition: str, line: str, origin: Origin = ORIGIN) -> bool:
    return compile_condition(condition).predicate(line.encode(), origin)


# -- each field kind -----------------------------------------------------------------------------

@pytest.mark.parametrize("condition, line, expected", [
    ("level == INFO", DLERROR, True),
    ("level == INFO", USER_ENOENT, False),                       # no level word: no level
    ("level >= WARNING", "node:1:2 [0] NCCL WARN Call to connect returned Connection refused", True),
    ("level >= WARN", "I1121 09:36:03.735 140 x.cc:1] fine", False),
    ("level in [ERROR, CRITICAL]", "E1121 09:36:03.735 140 x.cc:1] bad", True),
    ("rank == 0", USER_ENOENT, True),                            # the line's own prefix
    ("rank == 1", "plain line", True),                           # else the origin's rank
    ("rank >= 2", "plain line", False),
    ("node == node-a", "plain line", True),
    ('node in ["node-x", "node-a"]', "plain line", True),
    ("exit_code == -9", SUMMARY, True),
    ("exit_code < 0", "srun: error: node1: task 0: Exited with exit code 1", False),
    ("exit_code == 137", "    Last State: Terminated, Exit Code: 137", True),
    ("signal == SIGKILL", SUMMARY, True),                        # torchelastic: -9 is signal 9
    ("signal == 15", "Signal 15 (SIGTERM) received by PID 41", True),
    ("signal in [KILL, SIGTERM]", "Signal 15 (SIGTERM) received by PID 41", True),
    ("signal == SIGKILL", "Signal 15 (SIGTERM) received by PID 41", False),
    ("nccl_op == allreduce", WATCHDOG, True),
    ("nccl_op in [ALL_GATHER, BROADCAST]", WATCHDOG, False),
    ("nccl_op == AllGather", "h:1:1 [0] NCCL INFO AllGather: opCount 2a sendbuff 0x7f", True),
    ("xid == 79", XID79, True),
    ("xid >= 48", XID13, False),
    ("xid in [13, 31]", XID13, True),
    ("xid in fatal", XID79, True),                               # gpu_xid.tsv nvsentinel_severity
    ("xid in app_error", XID13, True),                           # k8s-device-plugin's list
    ("xid in app_error", XID79, False),
    ("xid.action >= isolate_node", XID79, True),
    ("xid.class == user_code", XID13, True),
    ("xid.level == RESET_GPU", XID79, False),
    ("fault_code == 0x80e18402", NPU_SEPARATE, True),
    ("fault_code.level < SeparateNPU", "dsmi fault event: fault code 0x80E01801", True),   # L3,
    ("fault_code.level >= SeparateNPU", NPU_SEPARATE, True),
    ("fault_code.level >= L6", NPU_USER, False),
    ("fault_code in user_input", NPU_USER, True),
    ("fault_code.class == user_code", NPU_USER, True),
    ("fault_code.action == isolate_node", NPU_SEPARATE, True),
    ("dcgm == DCGM_FR_VOLATILE_DBE_DETECTED", "health: DCGM_FR_VOLATILE_DBE_DETECTED on GPU 3", True),
])
def test_each_field_kind(condition, line, expected):
    assert holds(condition, line) is expected


@pytest.mark.parametrize("condition", ["xid != 79", "xid == 79", "exit_code != 0", "level != INFO",
                                       "fault_code.level < SeparateNPU", "nccl_op != ALLREDUCE"])
def test_a_field_the_line_lacks_compares_false_whatever_the_operator(condition):
    assert holds(condition, "[rank0]: plain text with nothing in it", NO_RANK) is False
    assert holds(f"not {condition}", "[rank0]: plain text with nothing in it", NO_RANK) is True


def test_keyword_and_regex_terms_match_the_raw_line_and_follow_caseless():
    assert holds('keyword "[rank0]:"', USER_ENOENT)             # the rank prefix is still there
    assert holds(r'regex "Errno \d+"', USER_ENOENT)
    assert not holds('keyword "errno"', USER_ENOENT)
    assert compile_condition('keyword "errno"', caseless=True).predicate(USER_ENOENT.encode(), ORIGIN)


def test_precedence_reaches_the_predicate():
    # not > and > or: "a or b and not c" is "a or (b and (not c))"
    line = "alpha beta gamma"
    assert holds('"zzz" or "beta" and not "gamma"', line) is False
    assert holds('("zzz" or "beta") and not "zzz"', line) is True
    assert holds('not "alpha" or "beta"', line) is True
    assert holds('not ("alpha" or "beta")', line) is False


# -- the prefilter -------------------------------------------------------------------------------

def _prefilter(condition: str):
    found = compile_condition(condition).prefilter
    return None if found is None else [p.text for p in found]


@pytest.mark.parametrize("condition, expected", [
    ('"a"', ["a"]),
    ('"a" and not "b"', ["a"]),
    ('level == INFO and "a"', ["a"]),
    ('"a" and "b"', ["a"]),                                      # one side suffices; b is checked per hit
    ('"a" or regex "b+"', ["a", "b+"]),
    ('"a" or level == INFO', None),                              # the right side needs no text
    ('not "a"', None),                                           # not terms never enter the prefilter
    ('not (not "a" or level == INFO)', ["a"]),                   # = "a" and not level == INFO
    ('not (not "a" and not "b")', ["a", "b"]),                   # = "a" or "b"
    ("xid in fatal", None),
])
def test_the_prefilter_is_the_positive_text_terms(condition, expected):
    assert _prefilter(condition) == expected


@pytest.mark.parametrize("condition, fragment", [
    ("frobs == 1", "unknown field 'frobs'"),
    ("level == LOUD", "'LOUD' is not a level"),
    ("node < a", "needs an ordered field"),
    ("xid in fatl", "unknown group 'fatl'"),
    ("rank == one", "'one' is not an integer"),
    ("signal == SIGFOO", "not a signal"),
    ("fault_code.level >= Separate", "not a MindCluster level"),
    ("xid.action >= explode", "unknown action"),
    ('regex "(?=x)y"', "regex"),                                 # lookaround: not in the shared subset
    ('keyword ""', "empty pattern"),
    ("level ==", "column 9"),
])
def test_compile_errors_say_what_is_wrong(condition, fragment):
    with pytest.raises(ConditionError) as info:
        compile_condition(condition)
    assert fragment in str(info.value)


# -- the loader ----------------------------------------------------------------------------------

def _write(tmp_path, body: str):
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n" + textwrap.indent(textwrap.dedent(body), "  "), encoding="utf-8")
    return path


def _issues(path):
    with pytest.raises(RuleError) as info:
        load_rules([path], builtin=False)
    return [(i.line, i.message) for i in info.value.issues]


def test_a_malformed_condition_is_reported_at_its_file_and_line(tmp_path):
    path = _write(tmp_path, """\
        - id: t.good
          keywords: ["x"]
          class: user_code
          action: fail_job
        - id: t.bad
          keywords: ["y"]
          class: user_code
          action: fail_job
          when: 'level == INFO and (keyword "z"'
        - id: t.field
          keywords: ["y"]
          when: 'colour == red'
          class: user_code
          action: fail_job
        """)
    issues = _issues(path)
    assert [line for line, _ in issues] == [10, 13]
    assert "t.bad" in issues[0][1] and "Expected ')'" in issues[0][1] and "column" in issues[0][1]
    assert "unknown field 'colour'" in issues[1][1]
    with pytest.raises(RuleError) as info:
        load_rules([path], builtin=False)
    assert f"{path}:10:" in str(info.value) and f"{path}:13:" in str(info.value)


def test_a_rule_whose_condition_has_no_positive_term_is_rejected(tmp_path):
    path = _write(tmp_path, """\
        - id: t.not_only
          when: 'not level == INFO'
          class: user_code
          action: fail_job
        """)
    [(line, message)] = _issues(path)
    assert line == 3 and "no positive keyword or regex term" in message and "every line" in message


def test_a_condition_beside_keywords_may_be_negative_only_and_a_when_only_rule_takes_its_terms(tmp_path):
    path = _write(tmp_path, """\
        - id: t.beside
          keywords: ["No such file or directory"]
          when: 'not level == INFO'
          class: user_code
          action: fail_job
        - id: t.alone
          when: '(keyword "alpha" or regex "beta+") and not keyword "gamma"'
          caseless: true
          class: user_code
          action: fail_job
        """)
    beside, alone = load_rules([path], builtin=False)
    assert [p.text for p in beside.patterns] == ["No such file or directory"]
    assert beside.when == "not level == INFO" and beside.predicate is not None
    assert alone.patterns == (Pattern("alpha", caseless=True), Pattern("beta+", regex=True, caseless=True))


@pytest.mark.skipif(matcher_mod._hs is None, reason="needs hyperscan")
def test_a_prefilter_term_hyperscan_rejects_is_reported_at_its_when_line_and_a_predicate_only_term_is_not(tmp_path):
    """A condition's terms are checked on RE2 (the predicate runs there); a term that joins the
    engine's database (a rule with only ``when:``) is checked on Hyperscan with the file's
    patterns, at the ``when`` line. ``(?U)`` (ungreedy) is RE2's and not Hyperscan's."""
    beside = """\
        - id: t.beside
          keywords: ["alpha"]
          when: 'regex "(?U)al+pha"'
          class: user_code
          action: fail_job
        """
    [rule] = load_rules([_write(tmp_path, beside)], builtin=False)
    assert rule.predicate(b"x allpha y", Origin("w")) and not rule.predicate(b"x apha y", Origin("w"))
    alone = """\
        - id: t.alone
          when: 'regex "(?U)be+ta"'
          class: user_code
          action: fail_job
        """
    [(line, message)] = _issues(_write(tmp_path, beside.rstrip(" ") + alone))
    assert line == 8 and "t.alone" in message and "Hyperscan" in message


def test_when_must_be_a_string(tmp_path):
    path = _write(tmp_path, """\
        - id: t.list
          keywords: ["x"]
          when: [a, b]
          class: user_code
          action: fail_job
        """)
    [(line, message)] = _issues(path)
    assert line == 4 and "'when' must be a string" in message


# -- test-rules ------------------------------------------------------------------------------

def test_test_rules_applies_the_condition_to_examples_and_counterexamples(tmp_path):
    path = _write(tmp_path, f"""\
        - id: t.enoent
          keywords: ["No such file or directory"]
          when: 'not (level == INFO and keyword "NCCL INFO")'
          class: user_code
          action: fail_job
          examples: ["{USER_ENOENT}"]
          counterexamples: ["{DLERROR}"]
        - id: t.wrong
          keywords: ["No such file or directory"]
          when: 'level == INFO'
          class: user_code
          action: fail_job
          examples: ["{USER_ENOENT}"]
        """)
    for backend in BACKENDS:
        failures = run_rule_tests(load_rules([path], builtin=False), backend)
        assert [(f.rule_id, f.expected) for f in failures] == [("t.wrong", "hit")]


def test_the_builtin_storage_rule_carries_the_nccl_info_condition():
    rule = next(r for r in load_rules() if r.id == "storage.no_such_file")
    assert "NCCL INFO" in rule.when and DLERROR in rule.counterexamples


# -- the engine, on both backends ------------------------------------------------------------

@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv(matcher_mod.ENV_VAR, request.param)
    return request.param


@pytest.fixture(scope="module")
def builtin_rules():
    return load_rules()


def test_the_nccl_info_dlerror_line_gives_no_finding_but_user_enoent_still_does(backend, builtin_rules):
    engine = Engine(builtin_rules)
    assert engine.matcher.backend == backend
    assert engine.feed(ORIGIN, (DLERROR + "\n").encode(), T0) == []
    [finding] = engine.feed(ORIGIN, (USER_ENOENT + "\n").encode(), T0)
    assert finding.rule_id in ("storage.no_such_file", "python.file_not_found")
    assert finding.failure_class.value == "user_code"
    # the storage rule alone (no specific Python rule to win) fires on the user line only
    storage = [r for r in builtin_rules if r.id == "storage.no_such_file"]
    alone = Engine(storage)
    assert alone.feed(ORIGIN, (DLERROR + "\n" + USER_ENOENT + "\n").encode(), T0)[0].line == \
        USER_ENOENT.split(": ", 1)[1]


def _counting_rules(tmp_path, when: str):
    path = _write(tmp_path, f"""\
        - id: t.counted
          keywords: ["No such file or directory"]
          when: '{when}'
          class: user_code
          action: fail_job
        """)
    [rule] = load_rules([path], builtin=False)
    calls: list[bytes] = []
    inner = rule.predicate

    def counted(raw: bytes, origin: Origin) -> bool:
        calls.append(raw)
        return inner(raw, origin)

    from dataclasses import replace
    return [replace(rule, predicate=counted)], calls


def test_a_line_hitting_the_prefilter_but_failing_the_predicate_gives_no_finding(backend, tmp_path):
    # A plain INFO line (not an NCCL INFO one, which the engine sets aside before any predicate).
    line = "2026-11-21 10:00:00 INFO loader: optional cache /data/cache.bin: No such file or directory"
    rules, calls = _counting_rules(tmp_path, 'not level == INFO')
    engine = Engine(rules)
    assert engine.feed(ORIGIN, (line + "\n").encode(), T0) == []
    assert calls == [line.encode()]


def test_an_nccl_info_line_makes_no_finding_even_without_a_condition(backend, tmp_path):
    """NCCL INFO lines never open an incident (issue 12): set aside before any predicate runs."""
    rules, calls = _counting_rules(tmp_path, 'not keyword "never on this line"')
    engine = Engine(rules)
    assert engine.feed(ORIGIN, (DLERROR + "\n").encode(), T0) == []
    assert calls == []


def test_the_predicate_runs_only_on_lines_the_prefilter_hit(backend, tmp_path):
    """No per-line Python for lines that hit nothing: 10,000 lines, 3 hits, 3 predicate calls."""
    rules, calls = _counting_rules(tmp_path, "not level == INFO")
    filler = [f"step {i} loss 1.{i % 97:02d} lr 3e-4 NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P"
              for i in range(10_000)]
    for k, at in enumerate((17, 5_000, 9_999)):
        filler[at] = f"[rank0]: FileNotFoundError: [Errno 2] No such file or directory: '/x/{k}'"
    engine = Engine(rules)
    findings = engine.feed(ORIGIN, ("\n".join(filler) + "\n").encode(), T0)
    assert len(findings) == 3 and len(calls) == 3
    assert engine.stats.lines == 10_000


def test_a_condition_in_a_traceback_looks_at_the_lines_that_hit(backend, tmp_path):
    path = _write(tmp_path, """\
        - id: t.rank0_enoent
          keywords: ["No such file or directory"]
          when: 'keyword "FileNotFoundError" and rank == 0'
          class: user_code
          action: fail_job
        """)
    engine = Engine(load_rules([path], builtin=False))
    tb = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
          "    open(path)", "FileNotFoundError: [Errno 2] No such file or directory: '/x'"]
    data = "".join(f"[rank{r}]: {line}\n" for r in (1, 0) for line in tb).encode()
    [finding] = engine.feed(NO_RANK, data, T0)
    assert finding.origin.rank == 0 and finding.line.startswith("FileNotFoundError")
