"""The MPI error classes (``stacks_vocab.tsv`` rows ``mpi.err.*``): every predefined class that
``MPI_Error_string`` names (Open MPI ``ompi/errhandler/errcode.c``; MPI 4.1 Table 9.1) is read by
one rule, graded by what the class says: an erroneous call is the program's, memory exhaustion is
oom, the MPI-IO file classes are graded as their errnos, an internal/unknown class relaunches
once, and a peer's abort or failure is fallout."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass
from tests.rules.test_stacks_vocab import findings      # the built-in rules over lines of one stream

#: Open MPI errcode.c's predefined classes and their strings (those the catalog grades)
USAGE = ["BUFFER: invalid buffer pointer", "COUNT: invalid count argument", "TYPE: invalid datatype",
         "TAG: invalid tag", "COMM: invalid communicator", "RANK: invalid rank", "REQUEST: invalid request",
         "ROOT: invalid root", "GROUP: invalid group", "OP: invalid reduce operation",
         "TOPOLOGY: invalid communicator topology", "DIMS: invalid topology dimension",
         "ARG: invalid argument of some other kind", "TRUNCATE: message truncated", "KEYVAL: invalid key value",
         "INFO: invalid info object", "NAME: invalid name argument", "SIZE: invalid size",
         "WIN: invalid window", "UNSUPPORTED_OPERATION: operation not supported"]
FILE = ["NO_SUCH_FILE: no such file or directory", "ACCESS: invalid access mode", "READ_ONLY: file is read only",
        "FILE_EXISTS: file exists already", "FILE_IN_USE: file already in use", "BAD_FILE: bad file",
        "FILE: invalid file"]
STORAGE = ["NO_SPACE: no space left on device", "QUOTA: out of quota", "IO: input/output error"]
INTERNAL = ["INTERN: internal error", "UNKNOWN: unknown error", "OTHER: known error not in list"]
PEER = ["PROC_ABORTED: operation failed because a remote peer has aborted", "PROC_FAILED: Process Failure",
        "REVOKED: Communication Object Revoked"]


def fatal_block(cls: str) -> list[str]:
    """Open MPI's MPI_ERRORS_ARE_FATAL report (ompi/errhandler/errhandler_predefined.c), as Horovod jobs print it."""
    return ["[node-3:28492] *** An error occurred in MPI_Allreduce",
            "[node-3:28492] *** reported by process [2351562753,1]",
            "[node-3:28492] *** on communicator MPI_COMM_WORLD",
            f"[node-3:28492] *** MPI_ERR_{cls}",
            "[node-3:28492] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,",
            "[node-3:28492] ***    and potentially your MPI job)"]


@pytest.mark.parametrize("cls, rule, failure_class, action", [
    *[(c, "mpi.err.usage", FailureClass.USER_CODE, Action.FAIL_JOB) for c in USAGE],
    *[(c, "mpi.err.file", FailureClass.USER_CODE, Action.FAIL_JOB) for c in FILE],
    *[(c, "mpi.err.storage", FailureClass.RETRYABLE_INFRA, Action.RESTART_JOB) for c in STORAGE],
    *[(c, "mpi.err.internal", FailureClass.USER_CODE, Action.RESTART_IN_PLACE) for c in INTERNAL],
    ("NO_MEM: out of memory", "mpi.err.no_mem", FailureClass.OOM, Action.FAIL_JOB),
])
def test_each_class_in_open_mpis_fatal_report_is_graded_by_its_meaning(cls, rule, failure_class, action):
    """The class line's finding carries the class's grade; its rule is the class's own, unless a rule
    for the same text outside MPI (the storage-full rule for ``no space left on device``) read it alike."""
    (hit,) = [f for f in findings(*fatal_block(cls)) if "MPI_ERR_" in (f.line or "")]
    assert (hit.failure_class, hit.action) == (failure_class, action)
    assert hit.rule_id == rule or (rule, hit.rule_id) == ("mpi.err.storage", "os.container_storage_full")


@pytest.mark.parametrize("cls", PEER)
def test_a_peers_abort_or_failure_is_fallout(cls):
    (hit,) = [f for f in findings(f"mpi4py.MPI.Exception: MPI_ERR_{cls}") if f.rule_id.startswith("mpi.err.")]
    assert hit.rule_id == "mpi.err.peer_failed" and hit.failure_class is FailureClass.FALLOUT


@pytest.mark.parametrize("line", [
    "    if (rc == MPI_ERR_TRUNCATE) { retry(); }",
    "#define MPI_ERR_INTERN 17",
    "MPI_ERR_PROC_FAILED is returned when a process involved in the operation has failed",
])
def test_a_class_name_in_code_or_prose_is_no_finding(line):
    assert not [f for f in findings(line) if f.rule_id.startswith("mpi.err.")]


@pytest.mark.parametrize("line, rule, failure_class", [
    ("Fatal error in PMPI_Recv: Message truncated, error stack:", "mpi.mpich.usage", FailureClass.USER_CODE),
    ("Fatal error in MPI_Comm_rank: Invalid communicator, error stack:", "mpi.mpich.usage", FailureClass.USER_CODE),
    ("Fatal error in PMPI_Alloc_mem: Unable to allocate memory for MPI_Alloc_mem, error stack:", "mpi.mpich.no_mem",
     FailureClass.OOM),
    ("Fatal error in PMPI_File_open: File does not exist, error stack:", "mpi.mpich.file", FailureClass.USER_CODE),
    ("Fatal error in PMPI_File_write_all: Other I/O error , error stack:", "mpi.mpich.storage",
     FailureClass.RETRYABLE_INFRA),
    ("Abort(806995855) on node 3 (rank 3 in comm 0): Fatal error in internal_Allreduce: Other MPI error, error stack:",
     "mpi.mpich.internal", FailureClass.USER_CODE),
    ("Fatal error in PMPI_Bcast: Internal MPI error!, error stack:", "mpi.mpich.internal", FailureClass.USER_CODE),
    ("Fatal error in PMPI_Allreduce: Process failed, error stack:", "mpi.mpich.peer_failed", FailureClass.FALLOUT),
])
def test_mpichs_fatal_report_is_graded_as_the_same_class_in_open_mpis_words(line, rule, failure_class):
    """MPICH prints the class's generic message after ``Fatal error in <call>: `` (errutil.c); one class,
    one grade, whichever MPI prints it."""
    (hit,) = [f for f in findings(line) if f.rule_id.startswith("mpi.")]
    assert (hit.rule_id, hit.failure_class) == (rule, failure_class)


def test_a_fatal_error_of_a_function_that_is_no_mpi_call_is_no_mpi_finding():
    assert not [f for f in findings("Fatal error in load_config: Invalid argument") if f.rule_id.startswith("mpi.")]
