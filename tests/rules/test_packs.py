"""The built-in packs: every example hits, every counterexample misses, every table row is there
with its source, the generated YAML is reproducible, and priorities pick the right rule."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest
import yaml

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.faultcodes import FaultTables
from ftwatch.rules.loader import builtin_pack_files, load_rules
from ftwatch.rules.matcher import Matcher
from ftwatch.rules.model import Pattern, Rule
from ftwatch.rules.testrules import format_report, run_rule_tests

REPO = Path(__file__).resolve().parents[2]
TSV = REPO.parent / "shared" / "data" / "fault-tables" / "error_strings.tsv"
PACKS = REPO / "ftwatch" / "rules" / "packs"
needs_tsv = pytest.mark.skipif(not TSV.is_file(), reason="shared/data/fault-tables not checked out")

BUILTIN = load_rules()
BY_ID = {rule.id: rule for rule in BUILTIN}


@functools.lru_cache(maxsize=1)
def _failures() -> dict[str, list]:
    out: dict[str, list] = {}
    for failure in run_rule_tests(BUILTIN):
        out.setdefault(failure.rule_id, []).append(failure)
    return out


@functools.lru_cache(maxsize=1)
def _matcher() -> tuple[Matcher, list[int]]:
    patterns, owner = [], []
    for index, rule in enumerate(BUILTIN):
        patterns.extend(rule.patterns)
        owner.extend([index] * len(rule.patterns))
    return Matcher(patterns), owner


def _winner(record: str) -> Rule:
    """The rule the engine would pick for a record: highest priority, then most drastic action,
    of the rules that read one of its lines (a pattern hits it and the rule's ``when:`` holds there)."""
    matcher, owner = _matcher()
    origin = Origin("test")
    hit = {owner[i] for line in record.split("\n") for i in matcher.match_text(line)
           if BUILTIN[owner[i]].predicate is None or BUILTIN[owner[i]].predicate(line.encode(), origin)}
    assert hit, f"no rule hits {record!r}"
    return max((BUILTIN[i] for i in hit), key=lambda r: (r.priority, int(r.action)))


def _load_tool():
    spec = importlib.util.spec_from_file_location("build_packs", REPO / "tools" / "build_packs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tsv_rows() -> list[dict[str, str]]:
    lines = TSV.read_text(encoding="utf-8").split("\n")
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:] if line.strip()]


def _raw_rules() -> list[dict]:
    out = []
    for f in builtin_pack_files():
        out.extend(yaml.safe_load(f.read_text(encoding="utf-8"))["rules"])
    return out


# --- every rule's own examples --------------------------------------------------------------------

@pytest.mark.parametrize("rule_id", sorted(BY_ID))
def test_rule_examples_and_counterexamples(rule_id):
    rule = BY_ID[rule_id]
    assert rule.examples, f"{rule.location}: {rule_id} has no example"
    assert rule.counterexamples, f"{rule.location}: {rule_id} has no counterexample"
    assert rule.source, f"{rule.location}: {rule_id} names no source"
    failures = _failures().get(rule_id, [])
    assert not failures, format_report(failures, 1)


def test_rule_examples_on_the_re2_fallback_backend():
    # Hosts without hyperscan scan with re2.Set: the packs must behave the same there.
    assert format_report(run_rule_tests(BUILTIN, backend="re2"), len(BUILTIN)).endswith(": ok")


def test_examples_are_lines_not_pattern_text():
    # An example equal to its own regex would test nothing.
    lazy = [r.id for r in BUILTIN for p in r.patterns if p.regex and p.text in r.examples]
    assert lazy == []


def test_pack_sizes():
    per_file: dict[str, int] = {}
    for rule in BUILTIN:
        name = Path(rule.location.rsplit(":", 1)[0]).name
        per_file[name] = per_file.get(name, 0) + 1
    assert set(per_file) == {"nccl.yaml", "torch.yaml", "cuda.yaml", "ascend.yaml", "infra.yaml",
                             "python.yaml", "gloo.yaml", "c4d.yaml",
                             "cuda_runtime.yaml", "nccl_vocab.yaml", "dist_vocab.yaml", "kernel_vocab.yaml",
                             "npu_codes.yaml", "scheduler.yaml", "lifecycle.yaml",
                             "net_vocab.yaml",   # libcurl and AWS SDK network errors (issue 12)
                             "env_vocab.yaml",   # configuration/environment vs transient (issue 12)
                             "kill_vocab.yaml",  # SIGKILL reports and memory enforcers (issue 12)
                             "cudalib_vocab.yaml",  # cuBLAS / cuDNN status codes (issue 12)
                             "stacks_vocab.yaml",  # XLA/JAX status codes, Ray, vLLM (issue 12)
                             "rocm_vocab.yaml",  # HIP errors, the HSA runtime's faults and statuses (issue 12)
                             "platform_vocab.yaml",  # Apple MPS/Metal, Windows crashes, zsh (issue 12)
                             "waits.yaml"}  # a framework naming the program's wait (issue 12, policy/namedwait.py)
    assert len(BUILTIN) >= 330


# --- the research table is all there ----------------------------------------------------------------

@needs_tsv
def test_every_tsv_row_is_a_rule_with_its_source():
    raw = _raw_rules()
    by_pattern = {}
    for rule in raw:
        for text in rule.get("keywords", []) + rule.get("regex", []):
            by_pattern.setdefault(text, []).append(rule)
        if "source_regex" in rule:
            by_pattern.setdefault(rule["source_regex"], []).append(rule)
    missing = []
    for row in _tsv_rows():
        if row["pattern_type"] == "exit_code":
            continue
        rules = [r for r in by_pattern.get(row["pattern"], []) if r["source"] == row["source"]]
        if len(rules) != 1:
            missing.append(row["pattern"])
            continue
        rule = rules[0]
        assert rule["classified_by"] == row["classified_by"]
        assert rule["description"] == row["meaning"]
        assert row["class"] in (rule["class"], rule.get("source_class")), rule["id"]
        if rule["class"] != row["class"]:
            assert rule["source_class"] == row["class"] and rule.get("notes"), rule["id"]
    assert missing == []


@needs_tsv
def test_exit_code_rows_copied_verbatim():
    rows = [r for r in _tsv_rows() if r["pattern_type"] == "exit_code"]
    text = (PACKS / "exit_codes.tsv").read_text(encoding="utf-8")
    lines = text.rstrip("\n").split("\n")
    assert lines[0].split("\t")[0] == "pattern"
    parsed = [dict(zip(lines[0].split("\t"), ln.split("\t"))) for ln in lines[1:]]
    assert parsed[:len(rows)] == rows
    # then the codes the table does not list, from the overlay, each with its own source
    extra = yaml.safe_load((REPO / "tools" / "pack_overlay.yaml").read_text(encoding="utf-8")).get("exit_codes") or []
    assert [r["pattern"] for r in parsed[len(rows):]] == [str(e["pattern"]) for e in extra]
    assert all(r["source"] and r["classified_by"] for r in parsed[len(rows):])


@needs_tsv
def test_build_packs_regenerates_committed_files_byte_identically():
    tool = _load_tool()
    files = tool.build(TSV, REPO / "tools" / "pack_overlay.yaml")
    assert set(files) == {"nccl.yaml", "torch.yaml", "cuda.yaml", "ascend.yaml", "infra.yaml",
                          "exit_codes.tsv",
                          "cuda_runtime.yaml", "nccl_vocab.yaml", "dist_vocab.yaml", "kernel_vocab.yaml",
                          "net_vocab.yaml", "env_vocab.yaml", "kill_vocab.yaml", "cudalib_vocab.yaml",
                          "stacks_vocab.yaml", "rocm_vocab.yaml", "platform_vocab.yaml"}
    for name, text in files.items():
        assert (PACKS / name).read_bytes() == text.encode("utf-8"), f"{name} is stale: run tools/build_packs.py"


@needs_tsv
def test_build_packs_check_mode(tmp_path):
    tool = _load_tool()
    assert tool.main([str(TSV), "--check"]) == 0
    assert tool.main([str(TSV), "--check", "--out", str(tmp_path)]) == 1


def test_fallout_rules_keep_the_source_class_and_say_why():
    raw = {r["id"]: r for r in _raw_rules()}
    fallout = [r for r in raw.values() if r["class"] == "fallout"]
    assert len(fallout) >= 25
    for rule in fallout:
        # 20, or 0 for a wrapper type whose message a more specific rule reads (DistBackendError)
        assert rule["priority"] in (20, 0), rule["id"]
        assert rule.get("notes"), rule["id"]
    for rule_id in ("nccl.remote_error", "torch.nccl_watchdog_timeout", "torch.nccl_operations_failed",
                    "torch.nccl_watchdog_stuck", "torch.dist_backend_error", "torch_elastic.exitcode_sigabrt",
                    "hccl.ei0002_notify_wait_timeout"):
        assert raw[rule_id]["class"] == "fallout" and raw[rule_id]["source_class"], rule_id


# --- 80C98002 / 80CB8002 are user input -------------------------------------------------------------

@pytest.mark.parametrize("code", ["80C98002", "80CB8002", "0x80c98002", "0x80CB8002"])
def test_user_input_npu_codes_never_isolate(code):
    entry = FaultTables.load().npu(code)
    assert entry is not None
    assert entry.failure_class is FailureClass.USER_CODE
    assert entry.action is not Action.ISOLATE_NODE
    assert entry.action < Action.ISOLATE_NODE


def test_user_input_npu_codes_never_isolate_when_extracted():
    hits = FaultTables.load().extract("[ERROR] DRV: device 3 fault code 0x80C98002; errorcode:80CB8002")
    assert {h.code for h in hits} == {"80C98002", "80CB8002"}
    assert all(h.entry.action is not Action.ISOLATE_NODE for h in hits)
    keyword_isolates = [r.id for r in BUILTIN for text in ("80C98002", "80CB8002")
                        if r.action is Action.ISOLATE_NODE and any(text in p.text.upper() for p in r.patterns)]
    assert keyword_isolates == []


# --- priorities: which rule a joined record ends up with --------------------------------------------

def test_gloo_peer_closed_traceback_is_fallout_not_user_code():
    record = "\n".join([
        "Traceback (most recent call last):",
        '  File "/work/train.py", line 19, in <module>',
        "    dist.all_reduce(t)",
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [127.0.0.1]:24292. This is typically caused by a remote worker crashing.",
    ])
    winner = _winner(record)
    assert winner.id == "gloo.connection_closed_by_peer"
    assert winner.failure_class is FailureClass.FALLOUT


def test_user_key_error_traceback_is_user_code():
    record = "\n".join([
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/tmp/crash.py", line 13, in <module>',
        '[rank1]:     {}["missing_key"]',
        "[rank1]: KeyError: 'missing_key'",
    ])
    winner = _winner(record)
    assert winner.id == "python.key_error"
    assert (winner.failure_class, winner.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_unexplained_traceback_falls_to_the_catch_all():
    record = "Traceback (most recent call last):\n  File \"x.py\", line 1\nmy_pkg.BadThing: boom"
    assert _winner(record).id == "python.uncaught_exception"


def test_cuda_error_beats_the_advice_line():
    record = ("RuntimeError: CUDA error: an illegal memory access was encountered\n"
              "CUDA kernel errors might be asynchronously reported at some other API call, so the "
              "stacktrace below might be incorrect.")
    assert _winner(record).id == "cuda.illegal_memory_access"


def test_oom_traceback_beats_generic_rules():
    record = ("Traceback (most recent call last):\n"
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    winner = _winner(record)
    assert winner.failure_class is FailureClass.OOM


def test_npu_uce_is_hardware_not_the_generic_prefix():
    record = ("[rank5]: RuntimeError: npuSynchronizeDevice:torch_npu/csrc/core/npu/NPUFunctions.cpp:389 "
              "NPU function error: UCE ERROR, error code is 507053")
    assert _winner(record).failure_class is FailureClass.HARDWARE_NODE


# --- run_rule_tests / format_report on broken rules --------------------------------------------------

def _rule(**kw) -> Rule:
    base = dict(id="t.rule", patterns=(Pattern("needle"),), failure_class=FailureClass.INFO,
                action=Action.NOTIFY, location="t.yaml:3")
    base.update(kw)
    return Rule(**base)


def test_run_rule_tests_reports_missed_example_and_hit_counterexample():
    rules = [
        _rule(examples=("a needle here", "no match here"), counterexamples=("haystack", "needle again")),
        _rule(id="t.other", patterns=(Pattern("again"),), examples=("again",)),
    ]
    failures = run_rule_tests(rules)
    assert [(f.rule_id, f.line, f.expected) for f in failures] == [
        ("t.rule", "no match here", "hit"), ("t.rule", "needle again", "no hit")]
    assert failures[1].also_hit == ("t.other",)
    assert failures[0].location == "t.yaml:3"
    report = format_report(failures, len(rules))
    assert "t.yaml:3" in report and "'no match here'" in report and "other rules hitting it: t.other" in report
    assert report.endswith("2 rules tested: 2 failures")
    assert format_report([], 5) == "5 rules tested: ok"


def test_run_rule_tests_isolates_a_rule_that_does_not_compile():
    rules = [_rule(examples=("needle",)),
             _rule(id="t.bad", patterns=(Pattern(r"(a)\1", regex=True),), examples=("aa",))]
    failures = run_rule_tests(rules)
    assert [(f.rule_id, f.expected) for f in failures] == [("t.bad", "compile")]
