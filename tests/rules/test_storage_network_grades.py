"""Transient storage and network failures that printed no ``[Errno N]`` (issue 12 item 2): a short
checkpoint write, an errno's C-library text as a bare ``RuntimeError``, libcurl's transfer errors."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.exceptions import ExceptionCatalog
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
W1 = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")
T0 = 1_795_253_763.0


def _feed(*lines: str) -> list:
    return Engine(BUILTIN).feed(W1, "".join(f"{line}\n" for line in lines).encode(), T0, final=True)


def test_a_short_checkpoint_write_is_a_storage_failure_not_the_program():
    """miniz's MZ_ZIP_FILE_WRITE_FAILED through PytorchStreamWriter: the OS refused the write."""
    [finding] = _feed("RuntimeError: [enforce fail at inline_container.cc:857] . PytorchStreamWriter "
                      "failed writing file data/322: file write failed")
    assert finding.rule_id == "torch_npu.save_write_failed"
    assert (finding.failure_class, finding.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


@pytest.mark.parametrize("line, name, failure_class", [
    ("RuntimeError: Connection reset by peer", "ECONNRESET", FailureClass.RETRYABLE_INFRA),
    ("RuntimeError: Connection timed out", "ETIMEDOUT", FailureClass.RETRYABLE_INFRA),
    ("RuntimeError: No such file or directory", "ENOENT", FailureClass.USER_CODE),
])
def test_a_generic_exception_whose_message_is_an_errnos_text_takes_the_errnos_grade(line, name, failure_class):
    grade = ExceptionCatalog.load().grade(line)
    assert (grade.name, grade.failure_class) == (name, failure_class)


@pytest.mark.parametrize("line, name", [
    ("RuntimeError: Connection reset by peer, retrying in 5 s", "RuntimeError"),   # not the whole message
    ("ValueError: Connection reset by peer", "ValueError"),                         # the class decides
    ("RuntimeError: expected scalar type Float but found Half", "RuntimeError"),
])
def test_only_a_whole_strerror_message_of_a_generic_class_counts(line, name):
    grade = ExceptionCatalog.load().grade(line)
    assert grade.name == name and grade.failure_class is FailureClass.USER_CODE
