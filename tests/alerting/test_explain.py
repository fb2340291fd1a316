"""D6: ``ftwatch explain`` prints the root cause, the evidence of each instance, budgets, clause."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftwatch.alerting.explain import explain
from ftwatch.events import (Action, Decision, FailureClass, Finding, Origin, Severity, Target,
                            iso)
from ftwatch.pipeline.sinks.sqlite import SqliteStore
from ftwatch.pipeline.sinks.base import FindingBatch

T0 = 1_795_250_000.0
JOB = "train-7"


def f(instance, rank, t, rule, cls, line, evidence=(), job=JOB, source="") -> Finding:
    return Finding(rule, "keyword", cls, Action.RESTART_JOB, Severity.ERROR,
                   Origin(instance, rank, job, f"host-{rank}", "stderr"), line, t, 0,
                   tuple(evidence), source=source)


ROOT = f("worker-2", 2, T0, "nccl.unhandled_system_error", FailureClass.RETRYABLE_INFRA,
         "torch.distributed.DistBackendError: NCCL error: unhandled system error",
         ("Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
          "torch.distributed.DistBackendError: NCCL error: unhandled system error"),
         source="https://github.com/NVIDIA/nccl/blob/v2.21.5-1/src/misc/socket.cc")
FALLOUT_0 = f("worker-0", 0, T0 + 2, "nccl.watchdog_timeout", FailureClass.FALLOUT,
              "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=52)")
FALLOUT_1 = f("worker-1", 1, T0 + 3, "torchelastic.sigterm", FailureClass.FALLOUT,
              "Received Signals.SIGTERM death signal, shutting down workers")
EARLIER_ATTEMPT = f("worker-0", 0, T0 - 500, "cuda.oom", FailureClass.OOM,
                    "torch.OutOfMemoryError: CUDA out of memory (attempt 0)")
OTHER_JOB = f("worker-0", 0, T0 + 1, "cuda.oom", FailureClass.OOM,
              "torch.OutOfMemoryError: other job", job="other")


def decision(t=T0 + 5, root=ROOT, findings=(FALLOUT_0, FALLOUT_1), action=Action.RESTART_JOB,
             target=Target(JOB)) -> Decision:
    return Decision(t, action, target, root,
                    "ExitCodeAndErrorMsg: root cause retryable_infra -> restart_job (Sync mode)",
                    restarts_used=1, restarts_left=2, findings=findings, attempt=1)


@pytest.fixture
def store(tmp_path: Path):
    s = SqliteStore(tmp_path / "ftwatch.db")
    s.write([FindingBatch([EARLIER_ATTEMPT], attempt=0)])
    s.write([FindingBatch([FALLOUT_1, ROOT, FALLOUT_0], attempt=1)])
    s.write([FindingBatch([OTHER_JOB], attempt=1)])
    yield s
    s.close()


def test_explains_the_last_decision(store: SqliteStore):
    d = decision()
    store.write([d])
    text = explain(store, None)
    assert text.startswith(f"Decision {d.decision_id}: restart_job\n")
    assert iso(d.time) in text and "the whole job" in text and "attempt 1" in text
    # The root cause, its rule, class and the rule's source.
    root_section = text.split("Root cause\n")[1].split("\n\n")[0]
    assert ROOT.line in root_section
    assert "nccl.unhandled_system_error" in root_section
    assert "retryable_infra" in root_section
    assert ROOT.source in root_section
    assert "instance worker-2, rank 2, node host-2" in root_section and iso(T0) in root_section
    # The evidence from each instance, in rank order, fallout marked.
    evidence = text.split("Evidence by instance")[1].split("\nBudgets")[0]
    order = [evidence.index(f"  worker-{i}  rank {i}") for i in range(3)]
    assert order == sorted(order)
    w0 = evidence.split("  worker-0")[1].split("  worker-1")[0]
    assert "[fallout]" in w0 and "fallout only" in w0 and FALLOUT_0.line in w0
    w2 = evidence.split("  worker-2")[1]
    assert "[root cause]" in w2 and "root cause here" in w2
    assert '|   File "train.py", line 9, in <module>' in w2
    assert "[fallout]" in evidence.split("  worker-1")[1].split("  worker-2")[0]
    # Other attempts and other jobs are not mixed in.
    assert "attempt 0" not in text and "other job" not in text
    # Budgets and the clause.
    assert "restarts used  1" in text and "restarts left  2" in text
    assert text.rstrip().endswith(
        "ExitCodeAndErrorMsg: root cause retryable_infra -> restart_job (Sync mode)")


def test_by_id_prefix_and_target_instance(store: SqliteStore):
    old = decision(t=T0 + 5)
    new = decision(t=T0 + 9, action=Action.RESTART_INSTANCE,
                   target=Target(JOB, "worker-2", 2, "host-2"))
    store.write([old])
    store.write([new])
    text = explain(store, old.decision_id[:8])
    assert text.startswith(f"Decision {old.decision_id}: restart_job")
    text = explain(store, None)
    assert "restart_instance" in text and "instance worker-2, rank 2, node host-2" in text


def test_decision_findings_show_even_when_not_stored_separately(tmp_path: Path):
    with SqliteStore(tmp_path / "x.db") as s:
        s.write([decision()])
        text = explain(s)
        assert text.count("[root cause]") == 1 and text.count("[fallout]") == 2
        assert "worker-0" in text and "worker-1" in text


def test_decision_without_root_cause(tmp_path: Path):
    with SqliteStore(tmp_path / "x.db") as s:
        s.write([Decision(T0, Action.RESTART_JOB, Target("quiet"), None,
                                "R5 job hang: every instance silent > 60 s", 0, 3)])
        text = explain(s)
        assert "none recorded" in text and "no findings recorded" in text
        assert "R5 job hang" in text and "restarts left  3" in text


def test_unknown_or_missing_decision(store: SqliteStore):
    with pytest.raises(LookupError):
        explain(store, None)
    store.write([decision()])
    with pytest.raises(LookupError):
        explain(store, "not-an-id")


def test_survivor_exit_after_only_fallout_is_marked_fallout(tmp_path: Path):
    """A survivor's generic exit 1 after only fallout in its log is fallout, as the policy counts it (R7)."""
    s = SqliteStore(tmp_path / "ftwatch.db")
    killed = Finding("exit.sigkill", "exit_code", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB,
                     Severity.ERROR, Origin("worker-1", 1, JOB), "worker-1 (rank 1) was killed by signal 9 (SIGKILL)",
                     T0, 0, fields={"exitcode": 137, "signal": 9, "generic": False})
    peer_log = f("worker-0", 0, T0 + 0.1, "gloo.pair_io_error", FailureClass.FALLOUT,
                 "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    peer_exit = Finding("exit.1", "exit_code", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                        Origin("worker-0", 0, JOB), "worker-0 (rank 0) exited with code 1", T0 + 0.4, 0,
                        fields={"exitcode": 1, "signal": None, "generic": True})
    s.write([FindingBatch([killed, peer_log, peer_exit], attempt=1)])
    d = decision(root=killed, findings=(peer_log, peer_exit))
    s.write([d])
    text = explain(s, d.decision_id)
    assert "[fallout] " + iso(T0 + 0.4) in text
    assert "worker-0  rank 0" in text and "fallout only" in text
    s.close()


def test_a_long_attempt_is_read_once_and_its_newest_findings_read_for_fallout(tmp_path: Path, monkeypatch):
    """An attempt whose store holds more findings than the incident desk keeps: every one is
    counted, the first ones of each instance are shown, a finding stored twice counts once, and
    what was fallout is read from the newest ``MAX_ANALYSED`` (said in the text), so a long
    attempt's explain stays small; the decision's own findings join where they fall."""
    from ftwatch.alerting import explain as explain_module
    monkeypatch.setattr(explain_module, "MAX_ANALYSED", 6)
    s = SqliteStore(tmp_path / "ftwatch.db")
    warnings = [f("worker-0", 0, T0 + k, "nccl.ib_retry", FailureClass.RETRYABLE_INFRA, f"NCCL WARN retry {k}")
                for k in range(20)]
    s.write([FindingBatch(warnings[:10], attempt=1)])
    s.write([FindingBatch(warnings[9:], attempt=1)])             # warning 9 stored twice
    s.write([FindingBatch([FALLOUT_1], attempt=1)])               # T0 + 3, worker-1
    late = f("worker-1", 1, T0 + 30, "nccl.watchdog_timeout", FailureClass.FALLOUT, "[Rank 1] Watchdog timeout")
    s.write([FindingBatch([late], attempt=1)])
    d = decision(t=T0 + 40, root=ROOT, findings=(late,))          # ROOT (T0, worker-2) is not stored
    s.write([d])
    text = explain(s, d.decision_id)
    assert "(fallout read from the newest 6 of 23 findings, as many as the incident desk keeps)" in text
    assert "worker-0  rank 0  node host-0  (20 findings; errors, not fallout)" in text
    assert text.count("NCCL WARN retry") == 10 and "... 10 more findings" in text
    assert "worker-1  rank 1  node host-1  (2 findings; errors, not fallout)" in text   # FALLOUT_1: too old to read
    assert "[fallout] " + iso(T0 + 30) in text and "[finding] " + iso(T0 + 3) in text
    assert "worker-2  rank 2  node host-2  (1 finding; root cause here)" in text
    s.close()
