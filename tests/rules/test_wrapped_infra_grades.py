"""Infrastructure failures that surface as Python exceptions (issue 12, false fails): the errno a
wrapper carries, the C library's text at the end of a generic message, the errnos of the node's
and the network's state, and the classes of network libraries, graded by their sources
(``python_exceptions.tsv``) instead of the ``RuntimeError`` fallback or the catch-all traceback
rule (user code: fail_job)."""

from __future__ import annotations

import os

import pytest

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.exceptions import ExceptionCatalog
from ftwatch.rules.loader import load_rules

BUILTIN = load_rules()
W1 = Origin("worker-1", 1, "job-7", "node-a", "stderr", "process")
T0 = 1_795_253_763.0


def _traceback(final: str) -> list:
    lines = ["Traceback (most recent call last):", '  File "/srv/train.py", line 88, in <module>',
             "    step()", final]
    return Engine(BUILTIN).feed(W1, "".join(f"{line}\n" for line in lines).encode(), T0, final=True)


@pytest.mark.parametrize("line, name", [
    # an OSError's str() wrapped by another class (urllib.error.URLError's reason)
    ("urllib.error.URLError: <urlopen error [Errno 111] Connection refused>", "ECONNREFUSED"),
    ("RuntimeError: upload failed: [Errno 104] Connection reset by peer", "ECONNRESET"),
    # a class the catalog does not know whose message is an errno's text
    ("zmq.error.ZMQError: Connection refused", "ECONNREFUSED"),
    # c10d puts strerror(errno) last
    ("RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
     "store by key '0', but store->get('0') got error: Connection reset by peer", "ECONNRESET"),
    ("RuntimeError: [enforce fail at ../torch/csrc/distributed/c10d/TCPStore.cpp:223] Connection reset by peer",
     "ECONNRESET"),
])
def test_the_errno_a_generic_or_unknown_class_carries_decides(line, name):
    grade = ExceptionCatalog.load().grade(line)
    assert grade is not None and grade.name == name
    assert (grade.failure_class, grade.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)


@pytest.mark.parametrize("line, name", [
    ("KeyError: 'Connection reset by peer'", "KeyError"),                   # a class that decides by itself
    ("ValueError: bad url [Errno 111]", "ValueError"),
    ("RuntimeError: Connection reset by peer, retrying in 5 s", "RuntimeError"),   # mentioned, not the end
])
def test_a_class_that_decides_or_a_mention_keeps_the_class(line, name):
    grade = ExceptionCatalog.load().grade(line)
    assert grade.name == name and grade.failure_class is FailureClass.USER_CODE


def test_an_unknown_class_without_an_errno_stays_ungraded():
    assert ExceptionCatalog.load().grade("mylib.errors.BadConfig: no such option 'lr'") is None


@pytest.mark.parametrize("line, name, failure_class, action", [
    ("OSError: [Errno 23] Too many open files in system", "ENFILE", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    ("OSError: [Errno 37] No locks available", "ENOLCK", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB),
    ("OSError: [Errno 105] No buffer space available", "ENOBUFS", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    ("OSError: [Errno 71] Protocol error: '/mnt/fuse/ckpt/latest.pt'", "EPROTO", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    ("OSError: [Errno 117] Structure needs cleaning: '/data/shard-07'", "EUCLEAN", FailureClass.RETRYABLE_INFRA,
     Action.RESTART_JOB),
    # the process's own limit (RLIMIT_NOFILE) stays the program's
    ("OSError: [Errno 24] Too many open files", "EMFILE", FailureClass.USER_CODE, Action.FAIL_JOB),
])
def test_errnos_of_the_node_and_the_network_are_not_the_programs(line, name, failure_class, action):
    grade = ExceptionCatalog.load().grade(line)
    assert (grade.name, grade.failure_class, grade.action) == (name, failure_class, action)


@pytest.mark.parametrize("final, rule_id, failure_class", [
    ("urllib.error.URLError: <urlopen error [Errno 111] Connection refused>", "python.exception.ECONNREFUSED",
     FailureClass.RETRYABLE_INFRA),
    ("aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected",
     "python.exception.aiohttp.client_exceptions.ServerDisconnectedError", FailureClass.RETRYABLE_INFRA),
    ("aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host s3.example.com:443 ssl:default "
     "[Connection reset by peer]", "python.exception.aiohttp.client_exceptions.ClientConnectorError",
     FailureClass.RETRYABLE_INFRA),
    ("fsspec.exceptions.FSTimeoutError", "python.exception.fsspec.exceptions.FSTimeoutError",
     FailureClass.RETRYABLE_INFRA),
    ("ssl.SSLEOFError: EOF occurred in violation of protocol (_ssl.c:2426)", "python.exception.ssl.SSLEOFError",
     FailureClass.RETRYABLE_INFRA),
    ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
     "python.exception.ray.exceptions.RayActorError", FailureClass.FALLOUT),
    ("EOFError", "python.exception.EOFError", FailureClass.FALLOUT),
    ("google.api_core.exceptions.ServiceUnavailable: 503 GET https://storage.googleapis.com/storage/v1/b/ckpt/o: "
     "We encountered an internal error. Please try again.",
     "python.exception.google.api_core.exceptions.ServiceUnavailable", FailureClass.RETRYABLE_INFRA),
    ('botocore.exceptions.ConnectionClosedError: Connection was closed before we received a valid response from '
     'endpoint URL: "https://s3.us-east-1.amazonaws.com/ckpt/step-4000/model.safetensors".',
     "python.exception.botocore.exceptions.ConnectionClosedError", FailureClass.RETRYABLE_INFRA),
])
def test_a_traceback_ending_in_an_infrastructure_class_is_not_the_catch_all(final, rule_id, failure_class):
    """Before: python.uncaught_exception (or EOFError's class): user code, fail_job."""
    [finding] = _traceback(final)
    assert finding.rule_id == rule_id and finding.failure_class is failure_class
    assert finding.action is Action.RESTART_JOB


@pytest.mark.parametrize("final", ["EOFError: Ran out of input", "EOFError: EOF when reading a line"])
def test_an_eof_with_pickles_or_inputs_message_is_the_programs(final):
    """pickle.load on an empty file, input() with no terminal: a restart repeats them."""
    [finding] = _traceback(final)
    assert finding.rule_id == "python.eof_input"
    assert (finding.failure_class, finding.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


HF_CONNECTION = ("ValueError: Connection error, and we cannot find the requested files in the cached path. "
                 "Please try again or make sure your Internet connection is on.")


def test_a_class_that_decides_yields_to_the_vocabulary_of_its_message():
    """transformers (file_utils.get_from_cache) raised a ValueError when the Hub did not answer:
    the message's vocabulary (hf.connection_error_no_cache, transient) decides, not ValueError's
    "a bad value of the program" (before: python.value_error, fail_job, by the more drastic action)."""
    [finding] = _traceback(HF_CONNECTION)
    assert finding.rule_id == "hf.connection_error_no_cache"
    assert (finding.failure_class, finding.action) == (FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB)
    [bare] = Engine(BUILTIN).feed(W1, f"[rank0]: {HF_CONNECTION}\n".encode(), T0, final=True)
    assert bare.rule_id == "hf.connection_error_no_cache"


def test_vocabulary_in_a_frame_does_not_outrank_the_final_class():
    lines = ["Traceback (most recent call last):", '  File "/srv/fetch.py", line 12, in get',
             "    raise OSError(\"We couldn't connect to 'https://huggingface.co' to load this file\")",
             '  File "/srv/train.py", line 88, in <module>', "KeyError: 'tokenizer'"]
    [finding] = Engine(BUILTIN).feed(W1, "".join(f"{line}\n" for line in lines).encode(), T0, final=True)
    assert finding.rule_id == "python.key_error" and finding.action is Action.FAIL_JOB


def test_the_dataloaders_own_timeout_is_a_stall_not_the_program():
    """torch's _try_get_data: no batch within DataLoader(timeout=...); before, the RuntimeError
    fallback (user code, fail_job)."""
    [finding] = _traceback("RuntimeError: DataLoader timed out after 1800 seconds")
    assert finding.rule_id == "torch.dataloader_timeout"
    assert (finding.failure_class, finding.action) == (FailureClass.HANG, Action.RESTART_JOB)


def test_a_broken_process_pool_is_the_symptom_of_a_dead_worker():
    [finding] = _traceback("concurrent.futures.process.BrokenProcessPool: A process in the process pool was "
                           "terminated abruptly while the future was running or pending.")
    assert finding.failure_class is FailureClass.FALLOUT and finding.action is Action.RESTART_JOB


def test_strerror_grade_by_index_equals_the_table_walk():
    """``_strerror_grade`` looks the message (and its last clause) up by text: the same grade as
    walking the errno table in order and taking the first whose strerror is either."""
    catalog = ExceptionCatalog.load()

    def walk(message):
        text = message.strip().rstrip(".")
        if not text:
            return None
        tail = max(text.rfind(": "), text.rfind("] "))
        last = text[tail + 2:] if tail >= 0 else None
        return next((g for n, g in catalog._errno.items() if os.strerror(n) in (text, last)), None)
    texts = [os.strerror(n) for n in catalog._errno] + ["", "x", "No such file or directory, retrying"]
    messages = texts + [f"{a}: {b}" for a in texts[:12] for b in texts[:12]] + [f"[x] {t}." for t in texts]
    for message in messages:
        assert catalog._strerror_grade(message) == walk(message), message
