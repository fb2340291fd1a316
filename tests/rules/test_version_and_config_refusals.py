"""A job's own software refusing to run as launched, in the words of that software: KataGo's
contribute mode (the training server refusing the build's version hash with a 400; a build without
distributed support printing that it was not compiled for it and exiting 0) and jsonargparse /
LightningCLI rejecting a command line or config file (``<prog> [options] <sub>: error: ...``,
``Parser key "<k>"``). Each repeats on every relaunch: user_code, fail_job. Without these rules the
KataGo logs and the CLI's rejection decided nothing (no exit, no other finding)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def findings(*lines: str):
    text = "".join(f"{line}\n" for line in lines)
    return ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), text.encode(), 1.0, final=True)


def graded(rule: str, *lines: str):
    return [(f.failure_class, f.action) for f in findings(*lines) if f.rule_id == rule]


FAIL = (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_the_katago_servers_version_refusal_fails_the_job_in_both_wordings():
    for line in ("2023-01-17 21:40:13+0100: ERROR: task loop loop thread failed: Server returned error 400: This "
                 "version of KataGo is not enabled for distributed. If this is an official version and/or you think "
                 "this is an oversight, please ask server admins to enable the following version hash: 0000abcd",
                 "ERROR: task loop loop thread failed: Server returned error 400: This version of KataGo is not "
                 "usable for distributed because either it's had custom modifications or has been compiled without "
                 "version info."):
        assert graded("katago.server_version_refused", line) == [FAIL], line


def test_a_server_outage_in_the_same_task_loop_is_not_a_version_refusal():
    assert not graded("katago.server_version_refused",
                      "ERROR: task loop loop thread failed: Server returned error 502: Bad Gateway")


def test_a_katago_build_without_distributed_support_fails_the_job():
    assert graded("katago.not_compiled_for_distributed",
                  "This version of KataGo was NOT compiled with support for distributed training.") == [FAIL]


def test_jsonargparse_rejections_fail_the_job():
    for line in ('terratorch [options] fit: error: Parser key "trainer.callbacks":',
                 'main.py [options] fit: error: Configuration check failed :: Key "data.path" is required',
                 'train.py: error: Parser key "model": Problem with given class_path'):
        assert graded("python.jsonargparse_usage_error", line) == [FAIL], line


def test_a_programs_own_error_line_and_the_usage_line_are_no_cli_rejection():
    for line in ("trainer: error: loss is nan at step 120",
                 "usage: terratorch [options] fit [-h] [-c CONFIG] [--print_config[=flags]]"):
        assert not graded("python.jsonargparse_usage_error", line), line
