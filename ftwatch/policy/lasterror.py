"""NCCL's last error spells out the result code PyTorch raised (SPEC R7 rule 13, issue 12).

PyTorch raises a failed NCCL call as a ``DistBackendError`` that names only NCCL's generic result
code: ``NCCL error in: .../ProcessGroupNCCL.cpp:N, internal error - please report this issue to the
NCCL developers`` (``unhandled system error``, ``remote process exited or there was a network
error`` ...), then the code's interpretation (``ncclInternalError: Internal check failed.``) and,
where NCCL has one, ``"\\nLast error:\\n" + ncclGetLastError()`` (pytorch
torch/csrc/distributed/c10d/NCCLUtils.cpp ``getNcclErrorDetailStr``). NCCL keeps as its last error
the message of its last WARN, formatted alone (NVIDIA/nccl@0456df2 src/debug.cc ``ncclDebugLogV``:
``vsnprintf(ncclLastError, sizeof(ncclLastError), fmt, vargs)``, without the ``host:pid:tid [dev]
file:line NCCL WARN`` prefix of the printed line): the cause NCCL itself named for the generic
code (``Bootstrap : no socket interface found``, ``Call to ibv_modify_qp failed``, ``Cuda failure
'out of memory'``, ``connecting to address ... is neither AF_INET nor AF_INET6``).

A traceback record ends at the first line of its exception's message
(tests/parsers/test_multiline.py keeps continuation lines apart), so those lines are findings of
their own: the code (``NCCL_RESULT_RULES``), its detail line (``NCCL_RESULT_PREFIX``) and the
last error, graded by the WARN vocabulary (``nccl_vocab.tsv``). :func:`named_by_last_error` reads
the first finding of the instance after the code that is no result code as that failure's
specific reading when it is a real error printed with it (``LAST_ERROR_WINDOW``); a text no rule
knows makes no finding, and the generic code stays.

The same holds for any traceback whose exception no rule or catalog row grades (the catch-all,
``python.uncaught_exception``): CPython prints the exception's whole ``str()`` after its class
(Lib/traceback.py ``TracebackException.format_exception_only``), so a wrapper's multi-line message
(a cloud SDK's ``ActivityFailedException`` quoting the service's JSON error, a remote task's
error text) continues past the record's end, and the real error the next lines carry is the
message the catch-all could not read. :func:`message_named_by_next` makes the catch-all yield to
it on the same terms (the instance's next finding, a real error, within ``LAST_ERROR_WINDOW``).
So does a traceback graded only by the fallback of a generic class whose message decides
(``python_exceptions.tsv`` ``decides: message``: ``RuntimeError``, ``Exception``; the finding
``python.exception.<class>`` means no rule and no errno read its message): torch_npu raises a
failed ACL/CANN call as ``RuntimeError: ACL stream synchronize failed.`` and writes the error CANN
recorded (``EL0004: ... Failed to allocate memory.``, ``EI0006``, ``EJ0001``) as the following
lines of the same message (Ascend/pytorch ``torch_npu/csrc/core/npu/NPUException.h``: the
``ASCEND_LOGE``/``c10_npu_get_error_message()`` text appended to the exception's ``what()``;
MindSpore's ``- Ascend Error Message:`` block, ``mindspore/ccsrc/.../ascend_kernel_runtime.cc``),
and the catalog row says the message decides, the class's own grade only when nothing reads it.

A failed write of ``torch.save`` is spelled out the same way: PyTorch's ``PytorchStreamWriter failed
writing file ...: file write failed`` is miniz's generic ``MZ_ZIP_FILE_WRITE_FAILED`` (pytorch/pytorch
caffe2/serialize/inline_container.cc ``valid()``: the writer function wrote fewer bytes than asked),
which says only that the operating system's write failed, not why. Finishing the archive after it,
while that error is handled (``torch/serialization.py`` ``_open_zipfile_writer.__exit__``:
``write_end_of_file()``), writes to the same file again and fails with the ``OSError`` that names the
errno (``[Errno 28] No space left on device``; CPython prints it as the chained exception, "During
handling of the above exception, another exception occurred", the two lines written at once), and the
errno grades it (``python_exceptions.tsv``: ENOSPC and EDQUOT the job's own volume, EIO and ESTALE the
storage failing). :func:`message_named_by_next` makes the generic write failure (:data:`GENERIC_WRITE_RULES`)
yield to that errno when it is the next finding of its instance, printed with it; with no errno
after it, the write failure keeps its own grade.

One more pair of lines tells one event: a kernel's failed ``assert()`` prints its expression from
the device (``<file>:<line>: <function>: block: [..], thread: [..] Assertion `...` failed.``), and
"any subsequent host-side synchronization calls made for the same device will return
cudaErrorAssert" (CUDA C++ Programming Guide, "Assertion"), which the process raises as ``CUDA
error: device-side assert triggered``. Both carry one grade (user_code); :func:`assert_reported`
makes the device's print yield to the error its process raised, the one the rank died of. A
rank that raised none (it went on into a collective its peers time out in) keeps the print.
"""

from __future__ import annotations

import re
from itertools import islice, repeat
from operator import is_
from typing import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from ftwatch.events import NOT_LOG_LINES, Finding
from ftwatch.rules.exceptions import ExceptionCatalog

#: NCCL result codes as PyTorch raises them (nccl.yaml, nccl_vocab.tsv: the ncclResult_t enum).
NCCL_RESULT_RULES = frozenset({"nccl.unhandled_cuda_error", "nccl.unhandled_system_error", "nccl.internal_error",
                               "nccl.invalid_argument", "nccl.invalid_usage", "nccl.remote_error",
                               "nccl.internal_error_legacy"})
#: The detail lines of the same message (``ncclInternalError: Internal check failed.``).
NCCL_RESULT_PREFIX = "nccl.code."
#: One exception message is written at once (the ``what()`` of the DistBackendError holds the
#: code, its detail and the last error), so its lines carry one time: a second covers a line read
#: with the next chunk; a later error of the rank is its own.
LAST_ERROR_WINDOW = 1.0
#: A check macro's location line, printed after the message that names the failure (stacks_vocab.tsv
#: ``marian.abort_report``: Marian's ABORT, marian-dev src/common/logging.h, writes the message, then
#: ``Error: Aborted from <function> in <file>:<line>``; its CUDA_CHECK/NCCL_CHECK put the library's
#: error text in the message): it names no cause, so it never spells out a result code before it.
LOCATION_ONLY_RULES = frozenset({"marian.abort_report"})
#: The rule of a traceback whose exception nothing grades (python.yaml, priority -10).
CATCH_ALL_RULE = "python.uncaught_exception"
#: A write failure that names no reason (ascend.yaml ``torch_npu.save_write_failed``: torch.save's
#: ``PytorchStreamWriter ... file write failed``, miniz's MZ_ZIP_FILE_WRITE_FAILED).
GENERIC_WRITE_RULES = frozenset({"torch_npu.save_write_failed"})
#: The operating system's reason for a failed write, as an OSError prints it (``[Errno 28] ...``) or
#: its strerror(3) text for the storage errnos (ENOSPC, EDQUOT, EIO, ESTALE).
#: The writer's own check on its next write after a short one (pytorch/pytorch
#: caffe2/serialize/inline_container.cc ``ostream_write_func``: ``CAFFE_THROW("unexpected pos ",
#: current_pos_, " vs ", file_ofs)`` when the bytes it counted and the offset miniz asks for differ,
#: which a failed write leaves behind): finishing the archive after the failed write raises it as
#: a chained exception, fallout of the same write; the errno after it still names the reason.
_WRITER_POSITION = re.compile(r"unexpected pos \d+ vs \d+")
_ERRNO = re.compile(r"\[Errno \d+\]|No space left on device|Disk quota exceeded|Input/output error|Stale file handle")


def nccl_result(f: Finding) -> bool:
    """Says whether ``f`` is an NCCL result code as PyTorch raises it, or its detail line."""
    return f.kind == "keyword" and (f.rule_id in NCCL_RESULT_RULES or f.rule_id.startswith(NCCL_RESULT_PREFIX))


def named_by_last_error(f: Finding, order: Sequence[Finding], errors: Collection[Finding], start: int = 0) -> bool:
    """Says whether the NCCL result code ``f`` is spelled out by NCCL's last-error text: the first
    finding of its instance after it that is no result code is one of ``errors`` (a real error),
    printed less than ``LAST_ERROR_WINDOW`` seconds after it.

    Args:
        f: a candidate root cause.
        order: every finding of the incident, by (time, seq) (or only those of ``f``'s instance: no other is read).
        errors: the real errors (the root-cause candidates; an :class:`Errors` answers each ask in O(1)).
        start: where in ``order`` to look from: an index no finding after ``f`` stands before
            (``f``'s own place + 1 in a list sorted by (time, seq); 0: from the start).

    Returns:
        True when ``f`` yields to that error; False for any other finding.
    """
    if not nccl_result(f):
        return False
    return _next_is_error(f, order, errors, skip=_before_last_error, start=start)


def _before_last_error(g: Finding) -> bool:
    """``g`` is passed over on the way from a result code to NCCL's last-error text: another
    result code or its detail line, or a report that names only a location."""
    return nccl_result(g) or g.rule_id in LOCATION_ONLY_RULES


def last_error_starts(own: Sequence[Finding]) -> list[int]:
    """For each place ``k`` (0 to ``len(own)``) of one instance's findings sorted by (time, seq), the
    first place from ``k`` on whose finding :func:`named_by_last_error` does not pass over
    (``len(own)``: none): the ``start`` that reads a candidate's next finding at once. A job that
    prints its NCCL result code again on each retry has a long run of them; each read to the run's
    end made root cause O(n^2) in the run (10,000 result codes of one job: ~11 s a decision)."""
    starts = [len(own)] * (len(own) + 1)
    for k in range(len(own) - 1, -1, -1):
        starts[k] = starts[k + 1] if _before_last_error(own[k]) else k
    return starts


def message_named_by_next(f: Finding, order: Sequence[Finding], errors: Collection[Finding], start: int = 0) -> bool:
    """Says whether the catch-all traceback ``f`` (``CATCH_ALL_RULE``), or one graded only by its
    generic class's fallback (:func:`generic_fallback`), is spelled out by the rest
    of its exception's message (a generic write failure, :data:`GENERIC_WRITE_RULES`, by the errno
    the next finding names): the first finding of its instance after it is one of ``errors``,
    printed less than ``LAST_ERROR_WINDOW`` seconds after it. Arguments and result as
    :func:`named_by_last_error`'s (``f`` a candidate, ``order`` the incident's findings by
    (time, seq), ``errors`` the real errors, ``start`` where to look from; True when ``f`` yields).
    """
    if f.kind == "keyword" and f.rule_id in GENERIC_WRITE_RULES:
        nxt = _next(f, order, lambda g: bool(_WRITER_POSITION.search(g.line)), start)
        return nxt is not None and bool(_ERRNO.search(nxt.line)) and _among(nxt, errors)
    if f.kind != "keyword" or not (f.rule_id == CATCH_ALL_RULE or generic_fallback(f)):
        return False
    return _next_is_error(f, order, errors, skip=lambda g: False, start=start)


def generic_fallback(f: Finding) -> bool:
    """Says whether ``f`` is a traceback graded only by its generic class's fallback: the
    finding ``python.exception.<class>`` of a class whose catalog row says ``decides: message``
    (no message rule nor errno read its message; an errno's finding names the errno instead)."""
    name = f.fields.get("exception") if f.fields else None
    if not name or f.rule_id != f"python.exception.{name}":
        return False
    grade = ExceptionCatalog.load().lookup(str(name))
    return grade is not None and not grade.decides_by_class


def last_error_text(f: Finding, order: Sequence[Finding]) -> Finding | None:
    """The finding of NCCL's last-error text after the result code ``f`` (the first logged finding
    of its instance after it that is no result code, within ``LAST_ERROR_WINDOW`` seconds), whatever
    its class; None when ``f`` is no NCCL result code or nothing follows so. ``order``: the
    incident's findings by (time, seq)."""
    return _next(f, order, nccl_result) if nccl_result(f) else None


def _next(f: Finding, order: Sequence[Finding], skip: Callable[[Finding], bool], start: int = 0) -> Finding | None:
    """The first finding of ``f``'s instance after ``f`` that ``skip`` does not pass over, when it is
    a logged line printed within ``LAST_ERROR_WINDOW`` seconds of ``f``; else None. ``order[start:]``
    only is read: root cause hands each candidate its place in its instance's sorted findings, so
    that a candidate costs the findings after it, not the whole list again (O(candidates x
    findings) per incident: ~0.02 s of a bench replay's decision, issue 16)."""
    nxt = next((g for g in (islice(order, start, None) if start else order) if g.origin.instance == f.origin.instance
                and (f.time, f.seq) < (g.time, g.seq) and not skip(g)), None)
    if nxt is None or nxt.kind in NOT_LOG_LINES or nxt.time - f.time >= LAST_ERROR_WINDOW:
        return None
    return nxt


def _next_is_error(f: Finding, order: Sequence[Finding], errors: Collection[Finding],
                   skip: Callable[[Finding], bool], start: int = 0) -> bool:
    """The first finding of ``f``'s instance after ``f`` that ``skip`` does not pass over is a logged
    real error (one of ``errors``) printed within ``LAST_ERROR_WINDOW`` seconds of ``f``."""
    nxt = _next(f, order, skip, start)
    return nxt is not None and _among(nxt, errors)


class Errors:
    """The real errors as the functions here take them (``errors``), asked whether a finding is one
    of them by identity in O(1): root cause asks once per candidate over every candidate, and a
    list walked for each made that O(candidates^2) (a bench replay's decision: 510 asks over ~300
    errors, 6 ms of its 33; thousands of ranks' catch-all tracebacks, each before its own error,
    grow it with the square).

    Args:
        findings: the errors; kept, so that their ids stay theirs while this lives.
    """

    __slots__ = ("findings", "_ids")

    def __init__(self, findings: Iterable[Finding]):
        self.findings = tuple(findings)
        self._ids = frozenset(map(id, self.findings))

    def __contains__(self, f: object) -> bool:
        return id(f) in self._ids

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)


def _among(f: Finding, errors: Collection[Finding]) -> bool:
    """``f`` is one of ``errors`` (the object itself, not an equal one): by :class:`Errors`' ids,
    else the collection walked in C."""
    if type(errors) is Errors:
        return f in errors
    return any(map(is_, repeat(f), errors))


#: A kernel's failed device-side assert() as the CUDA runtime prints it (cudalib_vocab.tsv).
KERNEL_ASSERT_RULE = "cuda.kernel_assert_failed"
#: cudaErrorAssert (710) as the process raises it: PyTorch's ``CUDA error: device-side assert
#: triggered`` (cuda.yaml) and the enum's other forms (cuda_runtime.yaml, cuda_errors.tsv).
ASSERT_REPORT_RULES = frozenset({"cuda.device_side_assert", "cuda.rt.assert"})


def assert_reports(errors: Iterable[Finding]) -> dict[str, tuple[float, int]]:
    """Per instance, the (time, seq) of its latest cudaErrorAssert report among ``errors`` (the real
    errors): what :func:`assert_reported` compares with, made once for all of an incident's prints
    (the kernel prints its assert once per failing thread: thousands of lines, each of which read
    every error made root cause O(n^2), 20,000 prints ~14 s)."""
    latest: dict[str, tuple[float, int]] = {}
    for e in errors:
        if e.rule_id in ASSERT_REPORT_RULES:
            at = (e.time, e.seq)
            if at > latest.get(e.origin.instance, (float("-inf"), 0)):
                latest[e.origin.instance] = at
    return latest


def assert_reported(f: Finding, reports: Mapping[str, tuple[float, int]]) -> bool:
    """Says whether the kernel-assert print ``f`` is reported later by its own process as
    cudaErrorAssert (a report of ``f``'s instance after it, ``reports`` = :func:`assert_reports` of
    the real errors): then that report is the root cause and the print its detail (the module
    docstring)."""
    if f.rule_id != KERNEL_ASSERT_RULE:
        return False
    latest = reports.get(f.origin.instance)
    return latest is not None and (f.time, f.seq) < latest
