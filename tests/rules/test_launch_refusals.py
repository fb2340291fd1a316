"""Launch errors reported by the shell or by mpirun itself, not by the program (issue 12, failures
that no rule read at all): a shell's "command not found" in each shell's wording (bash
``execute_cmd.c``, dash ``exec.c``, zsh; exit 127, POSIX 2.8.2) and Open MPI's launch refusals
(``help-orte-rmaps-base.txt`` [alloc-error], ``help-orterun.txt`` [exe-not-found] /
[exe-not-accessible] / [wdir-not-found]) are the job's own, graded user_code / fail_job; an IPython
traceback is read as CPython's."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass
from tests.parsers.test_multiline import IPYTHON
from tests.rules.test_stacks_vocab import findings      # the built-in rules over lines of one stream


@pytest.mark.parametrize("line", [
    "train.sh: 1: srun: not found",                                          # dash, a script
    "/bin/sh: 1: nvcc: not found",                                           # dash as /bin/sh
    "/var/spool/slurmd/job4471/slurm_script: line 9: srun: command not found",  # bash, a batch script
    "/bin/bash: line 1: scontrol: command not found",                         # bash -c
    "bash: torchrun: command not found",                                     # bash, interactive
    "zsh: command not found: deepspeed",                                     # zsh
])
def test_a_shell_that_cannot_find_a_command_is_a_launch_error_of_the_job(line):
    found = findings(line)
    assert [(f.rule_id, f.failure_class, f.action) for f in found] == [
        ("shell.command_not_found", FailureClass.USER_CODE, Action.FAIL_JOB)]


@pytest.mark.parametrize("line", ["HTTPError: 404: model: not found", "nvidia-smi: line 3 not found",
                                  "the command srun was not found on this node, falling back to torchrun"])
def test_other_not_found_lines_are_no_shell_report(line):
    assert all(f.rule_id != "shell.command_not_found" for f in findings(line))


@pytest.mark.parametrize("lines, rule", [
    (["There are not enough slots available in the system to satisfy the 8",
      "slots that were requested by the application:", "  python"], "mpi.ompi.not_enough_slots"),
    (["mpirun was unable to find the specified executable file, and therefore",
      "did not launch the job.  This error was first reported for process"], "mpi.ompi.executable_not_found"),
    (["mpirun was unable to launch the specified application as it could not access",
      "or execute an executable:"], "mpi.ompi.launch_access_failed"),
    (["prterun was unable to launch the specified application as it could not change to the specified "
      "working directory:"], "mpi.ompi.launch_access_failed"),
])
def test_mpirun_refusing_the_launch_is_the_jobs_own_launch_error(lines, rule):
    found = [f for f in findings(*lines) if f.rule_id == rule]
    assert found and all((f.failure_class, f.action) == (FailureClass.USER_CODE, Action.FAIL_JOB) for f in found)


def test_an_ipython_traceback_is_graded_by_its_final_exception_as_any_traceback():
    found = findings(*IPYTHON)
    assert [(f.rule_id, f.failure_class) for f in found][:1] == [("python.exception.RuntimeError",
                                                                  FailureClass.USER_CODE)]
