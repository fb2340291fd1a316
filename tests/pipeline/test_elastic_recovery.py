"""An elastic launcher that recovered by itself (``ftwatch.policy.lifecycle.elastic_recovery``):
Elastic Horovod's driver blacklists the failing host and resets the remaining workers, which
resume from the last commit; a reset after the incident's errors needs nothing from outside,
while the reset every elastic job logs at its start, before any error, changes nothing."""

from __future__ import annotations

from pathlib import Path

from ftwatch.events import Action

JOB = "elastic-test"
START = ["[2026-11-26 02:10:04.512] INFO: reset workers: 12",
         "[0]<stdout>:epoch 17 batch 400/1251 loss 1.6021 (12 workers)",
         "[0]<stdout>:epoch 17 batch 600/1251 loss 1.5972 (12 workers)"]
LOST = ["[3]<stderr>:[/tmp/pip-req-build-hvd/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
        "peer [10.8.2.13]:48207",
        "[5]<stderr>:[/tmp/pip-req-build-hvd/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
        "peer [10.8.2.13]:48207",
        "[2026-11-26 02:41:52.207] INFO: record state: el-h3[0] = FAILURE",
        "[2026-11-26 02:41:52.311] INFO: blacklist failing host: el-h3"]


def decided(run, path: Path, lines: list[str]):
    path.write_text("".join(f"{line}\n" for line in lines))
    return run([path], enable_job_restart=True, max_num_of_job_restart=3).decision


def test_a_reset_after_the_errors_is_the_launchers_own_recovery(run, tmp_path):
    d = decided(run, tmp_path / "horovodrun.log", START + LOST + [
        "[2026-11-26 02:41:55.004] INFO: reset workers: 8",
        "[0]<stdout>:restored state from commit: epoch 17 batch 600",
        "[0]<stdout>:epoch 17 batch 800/1251 loss 1.5930 (8 workers)"])
    assert d.action is Action.NONE and d.root_cause is None, d
    assert "lifecycle.elastic_reset.horovod" in d.policy_clause


def test_without_a_reset_after_them_the_errors_decide(run, tmp_path):
    d = decided(run, tmp_path / "horovodrun.log", START + LOST + [
        "[2026-11-26 02:41:52.400] ERROR: blacklisted slots count == 12 -> stop running"])
    assert d.action is Action.RESTART_JOB, d


def test_the_blacklist_with_no_stop_after_it_is_the_launchers_recovery_too(run, tmp_path):
    """registration.py blacklists the failing hosts, then either logs '-> stop running' at ERROR and
    stops, or resumes: a blacklist line that no error follows is the start of its recovery."""
    d = decided(run, tmp_path / "horovodrun.log", START + LOST + [
        "[0]<stdout>:epoch 17 batch 800/1251 loss 1.5930 (8 workers)"])
    assert d.action is Action.NONE and d.root_cause is None, d
    assert "lifecycle.elastic_reset.horovod_blacklist" in d.policy_clause
