"""Exit reports of the launchers that run a whole job or step (``kill_vocab.tsv``, tag ``exit_report``):
Ray Jobs' supervisor, the GitHub Actions runner, Taskcluster's generic-worker. Each line is read as the
exit it reports and graded by ``exit_codes.tsv``, so a failure that printed nothing any rule knows is
no longer read as a job that succeeded; a generic exit 1 still yields to the error the job logged."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass
from ftwatch.policy.rootcause import analyse
from tests.rules.test_kill_vocab import findings      # the built-in rules over one stream, at time t


@pytest.mark.parametrize("line, rule, code, failure_class, action", [
    ("2024-04-10 08:37:14,903\tINFO cli.py:83 -- Status message: Job entrypoint command failed with exit code 1, "
     "last available logs (truncated to 20,000 chars):", "ray.job_entrypoint_exit", 1, FailureClass.USER_CODE,
     Action.FAIL_JOB),
    ("2026-08-04T11:55:40Z ##[error]Process completed with exit code 2.", "ci.github_actions_exit", 2,
     FailureClass.USER_CODE, Action.FAIL_JOB),
    ("[taskcluster 2026-03-02T10:41:05.000Z] Unsuccessful task run with exit code: 137 completed in 2465.118 "
     "seconds", "taskcluster.task_exit", 137, FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
])
def test_a_launchers_exit_report_is_the_exit_it_reports(line, rule, code, failure_class, action):
    [f] = findings(line)
    assert (f.rule_id, f.kind, f.fields["exitcode"]) == (rule, "exit_code", code)
    assert (f.failure_class, f.action) == (failure_class, action)        # exit_codes.tsv's row for the code


def test_a_generic_exit_report_yields_to_the_error_the_job_logged():
    error = findings("RuntimeError: CUDA error: an illegal memory access was encountered", 1.0)
    report = findings("##[error]Process completed with exit code 1.", 2.0)
    assert report[0].fields["generic"] and analyse(error + report).root_cause is error[0]


@pytest.mark.parametrize("line", [
    "Status message: Job finished successfully.",
    "[taskcluster 2022-05-09T18:26:35.351Z] === Task Finished ===",
    "##[error]Process completed with exit code 0.",
])
def test_a_success_or_a_framing_line_is_no_finding(line):
    assert not findings(line)
