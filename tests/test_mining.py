"""Failure-signature mining (issue 15, SPEC T5): the miner, its state, the recorder's hook, ``ftwatch
mine`` and its drafts, on the evaluation corpus's tuning cases (never the held-out ones)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ftwatch.events import Action, FailureClass
from ftwatch.mining.draft import draft_rule
from ftwatch.mining.miner import Miner, catch_all_ids, is_catch_all, strip_prefix
from ftwatch.pipeline.recorder import Recorder
from ftwatch.rules.loader import load_rules
from ftwatch.testing import T0, CaptureAlerts, CaptureSink, decision, finding

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"
FTWATCH = [sys.executable, "-m", "ftwatch"]


def tuning_logs() -> list[Path]:
    """The logs of every corpus case without ``held_out:`` (case.yaml is read for the mark only)."""
    out = []
    for case in sorted(CORPUS.iterdir()):
        meta = case / "case.yaml"
        if meta.is_file() and not any(line.startswith("held_out:") for line in meta.read_text().splitlines()):
            out += sorted(p for p in case.iterdir() if p.name != "case.yaml" and p.is_file())
    return out


def ftwatch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*FTWATCH, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=240)


TRACE = ("Traceback (most recent call last):", '  File "train.py", line 12, in <module>',
         "    main()", "{p}RuntimeError: shard {n} of /data/run{n}/x.bin is corrupt at 0x{n}f3a")


def uncaught(job: str, rank: int, n: int, node: str = "node-a"):
    lines = [t.format(p=f"[rank{rank}]: ", n=n) for t in TRACE]
    rc = finding("python.uncaught_exception", line=lines[0], evidence=lines, job=job, rank=rank, node=node,
                 action=Action.FAIL_JOB, failure_class=FailureClass.USER_CODE, time=T0 + n)
    return decision(Action.FAIL_JOB, rc)


def test_prefixes_and_masks_group_ranks_and_parameters():
    m = Miner()
    a = m.add("[default2]:[rank2]:[E0423 10:12:23.000000106 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught "
              "collective operation timeout: WorkNCCL(SeqNum=1741, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
              "Timeout(ms)=600000) ran for 600044 milliseconds before timing out.", T0, "a", "n1")
    b = m.add("[rank0]:[E0217 07:22:34.380000991 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective "
              "operation timeout: WorkNCCL(SeqNum=54120, OpType=ALLGATHER, NumelIn=497465344, NumelOut=497465344, "
              "Timeout(ms)=600000) ran for 600087 milliseconds before timing out.", T0 + 5, "b", "n2")
    assert a is b and a.jobs == ["a", "b"] and a.nodes == ["n1", "n2"] and a.count == 2
    assert (a.first_seen, a.last_seen) == (T0, T0 + 5)
    assert "<RANK>" in a.template and "SeqNum=<NUM>" in a.template and "600044" not in a.template
    c = m.add("connect to 10.0.0.7:29500 failed at 0x7f3a12c4b740 reading /data/shard-3/x.bin (4.5 GiB)", T0, "a")
    assert c.template == "connect to <IP> failed at <HEX> reading <PATH> (<SIZE>)"
    assert strip_prefix("[default1]:[rank1]: KeyError: 'x'") == "KeyError: 'x'"
    assert m.add('  File "train.py", line 3, in <module>', T0, "a") is None      # frames say nothing


def test_catch_all_is_a_rule_tag_an_unlisted_exit_or_no_rule():
    ids = catch_all_ids(load_rules([], builtin=True))
    assert "python.uncaught_exception" in ids and "python.key_error" not in ids
    assert is_catch_all(uncaught("j", 0, 1), ids)
    assert not is_catch_all(decision(Action.RESTART_JOB), ids)                # a specific rule
    assert is_catch_all(decision(Action.FAIL_JOB, finding("exit.1", fields={"generic": True})), ids)
    assert is_catch_all(decision(Action.FAIL_JOB, None), ids)
    generic = finding("python.exception.RuntimeError", fields={"exception": "RuntimeError"})
    specific = finding("python.exception.ZeroDivisionError", fields={"exception": "ZeroDivisionError"})
    assert is_catch_all(decision(Action.FAIL_JOB, generic), ids)            # the message should decide
    assert not is_catch_all(decision(Action.FAIL_JOB, specific), ids)       # the class says it all


def test_state_survives_a_restart_and_news_is_said_once(tmp_path):
    m = Miner.in_state_dir(tmp_path, catch_all={"python.uncaught_exception"}, new_jobs=3)
    assert m.decision(uncaught("j1", 0, 1)) == [] and m.decision(uncaught("j2", 3, 2)) == []
    assert m.decision(decision(Action.RESTART_JOB)) == []                    # not a catch-all: not mined
    path = tmp_path / "mining" / "signatures.json"
    assert json.loads(path.read_text())["format"] == "ftwatch-mining"
    again = Miner.in_state_dir(tmp_path, catch_all={"python.uncaught_exception"}, new_jobs=3)
    new = again.decision(uncaught("j3", 5, 3, node="node-b"))
    assert [s.template for s in new] == ["RuntimeError: shard <NUM> of <PATH> is corrupt at <HEX>"]
    sig = new[0]
    assert sig.jobs == ["j1", "j2", "j3"] and sig.nodes == ["node-a", "node-b"]
    assert sig.rules == {"python.uncaught_exception": 3} and sig.actions == {"fail_job": 3}
    assert again.decision(uncaught("j4", 1, 4)) == []                        # said once
    assert again.ranked()[0] is sig


def test_recorder_sends_a_new_signature_event(tmp_path):
    capture, sink = CaptureAlerts(), CaptureSink()
    rec = Recorder(sink, dispatcher=capture, out=io.StringIO(), resolve_after=None, state_dir=tmp_path)
    rec.miner = Miner(catch_all={"python.uncaught_exception"}, new_jobs=2)
    rec.decision(uncaught("j1", 0, 1))
    rec.decision(uncaught("j2", 1, 2, node="node-b"))
    kinds = [a.event_type for a in capture.alerts]
    assert kinds == ["job_failed", "job_failed", "new_signature"]
    alert = capture.alerts[-1]
    assert alert.labels["severity"] == "info" and alert.labels["job"] == "j2"
    assert "ftwatch mine" in alert.annotations["explain"]
    assert "new failure signature in 2 jobs" in rec.out.getvalue()
    [event] = [e for e in sink.events if e.kind == "new_signature"]
    assert event.job == "j2" and event.detail["jobs"] == 2
    assert event.detail["template"] == "RuntimeError: shard <NUM> of <PATH> is corrupt at <HEX>"


def test_the_new_signature_event_is_aggregatable_in_elasticsearch():
    from ftwatch.pipeline.sinks.elasticsearch.ecs import event_doc
    doc = event_doc(T0, "j2", "new_signature", detail={"template": "RuntimeError: shard <NUM>", "jobs": 3})
    assert doc.source["event"]["reason"] == "RuntimeError: shard <NUM>"
    assert doc.source["event"]["action"] == "new_signature"
    assert "RuntimeError: shard <NUM>" in doc.source["message"]


def test_report_has_a_failure_signatures_section(tmp_path):
    from ftwatch.cli.report import _signatures
    from ftwatch.report.render import render_html
    m = Miner.in_state_dir(tmp_path, catch_all={"python.uncaught_exception"})
    m.decision(uncaught("j1", 0, 1))
    m.decision(uncaught("j2", 1, 2))
    rows = _signatures(tmp_path)
    assert rows[0]["jobs"] == 2 and rows[0]["rule"] == "python.uncaught_exception"
    html = render_html({"source": "test", "jobs": []}, signatures=rows)
    assert "Failure signatures" in html and "RuntimeError: shard &lt;NUM&gt; of &lt;PATH&gt;" in html
    assert "No failure signatures" in render_html({"source": "test", "jobs": []})
    assert _signatures(tmp_path / "none") == []


def test_new_signature_alert_renders_in_both_languages():
    from ftwatch.alerting.alerts import alert_from_signature
    from ftwatch.alerting.rendering import TemplateRenderer
    m = Miner(new_jobs=1)
    sig = m.add("RuntimeError: shard 3 is corrupt", T0, "j1")
    alert = alert_from_signature(sig, T0, "ftwatch mine", job="j1")
    words = {"en": "Event:          new failure signature: new failure signature in 1 jobs (j1)",
             "zh": "事件：        新的故障特征（特征 1，见 ftwatch mine）"}
    for lang in ("en", "zh"):
        text = TemplateRenderer(lang).render("console", alert)
        assert "RuntimeError: shard 3 is corrupt" in text and words[lang] in text, text
        for kind in ("webhook", "email", "feishu", "alertmanager"):      # every kind renders it
            assert "RuntimeError: shard 3 is corrupt" in TemplateRenderer(lang).render(kind, alert)


def test_corpus_with_rules_off_groups_the_same_failure_across_frameworks_and_ranks(tmp_path):
    logs = tuning_logs()
    out = ftwatch("mine", "--all-lines", "--no-builtin", "--top", "0", "--json", *map(str, logs))
    assert out.returncode == 0, out.stderr
    sigs = [json.loads(line) for line in out.stdout.splitlines()]
    watchdog = [s for s in sigs if s["template"].startswith("[<RANK>] Watchdog caught collective operation timeout")]
    # torch's three formats of the line, newest first: WorkNCCL(SeqNum=..., ..., NumelIn=...),
    # WorkNCCL(SeqNum=..., OpType=..., Timeout(ms)=...) and the oldest, WorkNCCL(OpType=..., Timeout(ms)=...)
    # drain splits on spaces: the oldest format's work is one token ("WorkNCCL(OpType=X,"), the others' two or more
    oldest = [s for s in watchdog
              if len(s["template"].split("timeout: ", 1)[1].split(" Timeout(ms)=", 1)[0].split()) == 1]
    new, old = ([s for s in watchdog if s not in oldest and ("NumelIn" in s["template"]) == numel]
                for numel in (True, False))
    assert len(new) == 1 and len(old) == 1 and len(oldest) <= 1   # every rank, every case: one template per format
    assert len(old[0]["jobs"]) >= 3
    assert len(new[0]["jobs"]) >= 10
    assert {"basicsr-watchdog-allreduce", "deepspeed-zero2-fixed-step-hang", "llamafactory-watchdog-allreduce-midrun",
            "gb200-init-allreduce-timeout-flaky-relaunch", "watchdog-allreduce-after-checkpoint-save"} <= set(new[0]["jobs"])
    assert len(sigs) < sum(1 for f in logs for _ in f.open(errors="replace")) / 5   # templates, not lines
    jobs = [len(s["jobs"]) for s in sigs]
    assert jobs == sorted(jobs, reverse=True)                  # ranked by jobs hit


CASE = "swift-npu-ddp-backend-nccl-not-built"   # a tuning case that ends in a catch-all (a bare RuntimeError)


def test_a_drafted_rule_turns_a_catch_all_decision_into_the_right_one(tmp_path):
    case = CORPUS / CASE
    meta = yaml.safe_load((case / "case.yaml").read_text())
    assert "held_out" not in meta
    log = str(case / "combined.log")
    before = json.loads(ftwatch("replay", "--json", log).stdout)
    assert before["root_cause"]["rule_id"] == "python.exception.RuntimeError"   # graded by the class alone
    clean = tmp_path / "clean.log"
    clean.write_text("RuntimeError: Distributed package is ready\nINFO backend nccl built in 2.3s\n")
    drafts = tmp_path / "drafts"
    out = ftwatch("mine", log, "--draft", str(drafts), "--clean", str(clean))
    assert out.returncode == 0, out.stderr
    files = sorted(drafts.glob("*.yaml"))
    assert files
    assert ftwatch("test-rules", *map(str, files)).returncode == 0
    check = ftwatch("check", "--rules", *map(str, files))
    assert check.returncode == 0, check.stdout + check.stderr
    [rule] = [r for f in files for r in yaml.safe_load(f.read_text())["rules"]
              if "NCCL built in" in json.dumps(r)]
    assert rule.get("counterexamples")                          # from the clean run
    config = tmp_path / "ftwatch.yaml"
    config.write_text(yaml.safe_dump({"rules": {"files": [str(f) for f in files]}}))
    after = json.loads(ftwatch("replay", "--json", "--config", str(config), log).stdout)
    assert after["root_cause"]["rule_id"] == rule["id"]
    assert after["action"] == meta["expected"]["action"]
    assert after["root_cause"]["failure_class"] == meta["expected"]["failure_class"]


def test_draft_falls_back_to_a_regex_when_no_literal_run_is_safe():
    m = Miner()
    sig = m.add("ab 12 cd 13 ef", T0, "j")
    rule = draft_rule(sig)
    assert "regex" in rule and rule["examples"] == ["ab 12 cd 13 ef"]


def readme_commands() -> list[str]:
    """The commands of README "Unknown failures" (its fenced blocks), in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Unknown failures\n", 1)[1]
    text = text.split("\n## ", 1)[0]
    blocks = text.split("```")[1::2]
    return [line for block in blocks for line in block.splitlines() if line.startswith("ftwatch ")]


def test_readme_unknown_failures_commands_work_as_written(tmp_path):
    commands = readme_commands()
    assert len(commands) == 6
    outputs = []
    for command in commands:
        shell = command.replace("/tmp/ftwatch-drafts", str(tmp_path / "drafts"))
        shell = shell.replace("ftwatch ", f"{sys.executable} -m ftwatch ", 1)
        out = subprocess.run(shell, shell=True, capture_output=True, text=True, cwd=ROOT, timeout=240,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, (command, out.stdout, out.stderr)
        outputs.append(out.stdout)
    assert "root cause: [user_code] python.exception.RuntimeError" in outputs[0]
    assert "Distributed package doesn't have NCCL built in" in outputs[1]
    assert "root cause: [user_code] mined." in outputs[4]
    assert "3 jobs" in outputs[5] and "Watchdog caught collective operation timeout" in outputs[5]


def test_build_recorder_attaches_the_miner_unless_mining_is_off(tmp_path):
    from ftwatch.config.model import Config
    from ftwatch.pipeline.build import build_engine, build_recorder, mine_catch_alls
    on = build_recorder(Config(), tmp_path / "on", None, out=io.StringIO())
    assert on.miner.catch_all == frozenset() and on.miner.new_jobs == 3
    engine = build_engine(Config())
    assert mine_catch_alls(on, engine) is engine                  # the engine's rules, not a second load
    assert "python.uncaught_exception" in on.miner.catch_all
    assert on.miner.path == tmp_path / "on" / "mining" / "signatures.json"
    on.close()
    off = build_recorder(Config.model_validate({"storage": {"mining": {"enabled": False}}}), tmp_path / "off",
                         None, out=io.StringIO())
    assert off.miner is None and mine_catch_alls(off, engine) is engine
    off.close()


def test_ftwatch_run_mines_its_catch_all_failures_into_the_state_dir(tmp_path):
    """End to end: two jobs that die of the same unexplained RuntimeError; the second sends the
    new_signature event (threshold 2 in the config) and ftwatch mine lists the signature."""
    config = tmp_path / "ftwatch.yaml"
    config.write_text(yaml.safe_dump({"storage": {"state_dir": str(tmp_path / "state"),
                                                  "mining": {"new_signature_jobs": 2}}}))
    said = []
    for job, shard in (("job-a", 12), ("job-b", 47)):
        out = ftwatch("run", "--config", str(config), "--nproc-per-node", "1", "--job-id", job, "--",
                      sys.executable, "-c", f"raise RuntimeError('shard {shard} of /data/s{shard}.bin is corrupt')")
        said.append(out.stdout + out.stderr)
    assert "new failure signature" not in said[0]
    assert "new failure signature in 2 jobs: RuntimeError: shard <NUM> of <PATH> is corrupt" in said[1]
    listed = ftwatch("mine", "--config", str(config), "--json")
    [sig] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sig["jobs"] == ["job-a", "job-b"] and sig["rules"] == {"python.exception.RuntimeError": 2}
    again = ftwatch("mine", "--config", str(config), "--json", "--from-store")     # from SQLite's decisions
    [from_store] = [json.loads(line) for line in again.stdout.splitlines()]
    assert {k: from_store[k] for k in ("template", "jobs", "rules", "count")} == \
        {k: sig[k] for k in ("template", "jobs", "rules", "count")}


def test_templates_with_little_literal_text_are_not_drafted(tmp_path):
    from ftwatch.mining.draft import draftable, write_drafts
    m = Miner()
    noise = [m.add(line, T0, "j") for line in ("[12]:", "=" * 60, "step 12 of 40")]
    real = m.add("RuntimeError: shard 3 is corrupt", T0, "j")
    assert not any(draftable(s) for s in noise) and draftable(real)
    assert [p.name for p in write_drafts([*noise, real], tmp_path)] == [f"mined.runtimeerror_shard_is_corrupt_{real.id}.yaml"]
