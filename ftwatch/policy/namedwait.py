"""A job hang whose framework named the program's cause just before it (SPEC R5 / R7, issue 12 item 3).

A job hang (``hang.job``: no output from any instance for the hang interval) says only that the
job stopped writing; a node that wedged and a program that waits for something it never gets
look alike in it. Sometimes the framework has already said which: it warns while it waits and
names, as its own diagnosis, a cause that only the program or its launch can remove. The lines
that do (``rules/packs/waits.yaml``, tag ``names_wait``, each with the code that prints it):
JAX's TPU backend that has not initialised after its timer, "Did you run your code on all TPU
hosts?" (a multi-host slice's runtime waits for every host of the slice; JAX's multi-process
docs: the same program must run on all hosts).
Lightning's "Initializing distributed: GLOBAL_RANK: r, MEMBER: k/n" with no "All distributed processes
registered" after it: every process waits in ``init_process_group`` for the whole world to join, and
Lightning's troubleshooting guides name what keeps it there as the launch's configuration (no
``srun``, node or task counts that do not match the declared ones, a network interface or port range
the nodes cannot reach each other on: Fabric's SLURM and bare-bones multi-node guides, the Trainer's
cluster guide, "My program is stuck initializing at startup").
PyTorch's JIT extension build reaching its build lock ("Using <dir> as PyTorch extensions root...")
with no process saying after it that it builds or loaded the extension (tag ``ends_wait``): every
process polls a lock file that a killed build left (``torch/utils/file_baton.py``), and it stays on
disk for the next start.

:func:`named_wait_before_hang` reads it: every real error of the incident is a job hang, and the
latest finding before it is such a line, printed no earlier than :data:`SLACK_SECONDS` before
the job's last output (the silence began with that wait), with no error between (errors after the
hang, such as the launcher's death signal when the silent job is stopped by hand, are not read). The root cause
is then ``hang.named_wait`` (user_code, fail_job) on the line's origin, at the hang's (time,
seq): a restart launched the same way waits in the same place. A line of this pack long before
the silence (the backend initialised after all, and training went on) says nothing of the hang.

The same wait on one rank while its peers wait for it in a collective ends in their watchdogs, not
in a job hang: Megatron builds its fused kernels on rank 0 first ("> compiling and loading fused
kernels ...", ``torch.utils.cpp_extension.load`` under a lock in its build directory) while every
other rank is already in ``torch.distributed.barrier()`` (megatron/training/initialize.py
``_compile_dependencies``), and fairseq, which runs the same pattern, logs with the line "If this
hangs here, your megatron fused kernels may be corrupted. This can happen if a previous job is
interrupted during a build. In that case, delete the megatron build directory and relaunch". So
:func:`named_wait_rank` reads, with the busy-rank reading's start (``ftwatch.policy.busy.waits``:
every error is a wait, no instance died on its own): a rank that reported no wait (or a line with
no rank prefix when the waiting ranks are named) whose latest finding up to the first timeout is
a names_wait line, printed no earlier than the wait began (the first timeout less the wait's
timeout, less ``leftpath.SLACK_SECONDS``), with no ends_wait line from anyone after it and no error of
its own: ``hang.named_wait`` on that line. A slow build that finishes prints its end line and keeps
the hang readings.
"""

from __future__ import annotations

from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity
from ftwatch.policy.busy import Waits
from ftwatch.policy.leftpath import last_words, line_before_hang

#: The rules whose line names the program's cause of a wait (waits.yaml's tag ``names_wait``;
#: tests/policy/test_namedwait.py keeps the two in step).
NAMED_WAIT_RULES = frozenset({"wait.jax_tpu_backend_not_on_all_hosts", "wait.torch_extensions_build_lock",
                              "wait.megatron_fused_kernels_build", "wait.lightning_init_process_group"})
#: The rules whose line ends such a wait (tag ``ends_wait``): the latest of both before the hang must be a wait.
WAIT_END_RULES = frozenset({"wait.torch_extensions_lock_passed", "wait.megatron_fused_kernels_done",
                            "wait.lightning_processes_registered"})
#: How long before the job's last output the line may be (seconds): the wait it names began then.
SLACK_SECONDS = 300.0


def named_wait_before_hang(order: Sequence[Finding], real: Sequence[Finding]) -> Finding | None:
    """``hang.named_wait`` for a job hang right after a line naming the program's wait (the module
    docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        real: its real errors: only job hangs (kind ``hang``) qualify; one after the first hang (a
            launcher's death signal when someone stopped the silent job) came after the silence and
            is not read.

    Returns:
        A Finding on the line's origin, at the first hang's (time, seq), carrying the line's rule
        and source; None when an error is no job hang, the hang states no silence, or no such
        line comes right before it.
    """
    hangs = [f for f in real if f.kind == "hang"]
    if hangs:       # an error printed after the job was silent for the whole interval did not make the silence
        first = min(hangs, key=lambda f: (f.time, f.seq))
        real = [f for f in real if (f.time, f.seq) <= (first.time, first.seq)]
    found = line_before_hang(order, real, NAMED_WAIT_RULES | WAIT_END_RULES, SLACK_SECONDS)
    if found is None or found[1].rule_id not in NAMED_WAIT_RULES:
        return None
    hang, named, _ = found
    line = (f"the job went silent ({hang.rule_id}) right after its framework named why it waits "
            f"({named.rule_id}: {named.line.strip()[:200]}): a cause only the program or its launch removes, "
            "which a restart launched the same way meets again")
    return Finding("hang.named_wait", "hang", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                   named.origin, line, hang.time, hang.seq, (named.line, hang.line),
                   {"wait": named.rule_id, "hang": hang.rule_id}, named.source)


def named_wait_rank(order: Sequence[Finding], w: Waits | None) -> Finding | None:
    """``hang.named_wait`` on the rank whose named wait its peers' collective timed out on (the
    module docstring), or None.

    Args:
        order: the incident's findings by (time, seq).
        w: ``ftwatch.policy.busy.waits`` of ``order`` and the errors to explain (the real ones,
            or the fallout when there is none); None: they are not all waits.

    Returns:
        A Finding on the named-wait line's origin, at the first timeout's (time, seq), or None.
    """
    named = None if w is None else next(
        ((who, last) for who, last in last_words(w) if last.rule_id in NAMED_WAIT_RULES and not any(
            f.rule_id in WAIT_END_RULES and (f.time, f.seq) > (last.time, last.seq) for f in order)), None)
    if w is None or named is None:      # (a wait line followed by its end line: the wait it named ended)
        return None
    who, wait = named
    line = (f"{who} last said its framework waits on a cause only the program or its launch removes "
            f"({wait.rule_id}: {wait.line.strip()[:160]}) and reported no wait, while rank(s) {w.waiting} "
            f"timed out waiting for it in a collective ({w.first.rule_id}, timeout {w.window:.0f} s): a restart "
            "launched the same way meets the same wait")
    return Finding("hang.named_wait", "hang", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR, wait.origin,
                   line, w.first.time, w.first.seq, (wait.line, w.first.line),
                   {"wait": wait.rule_id, "waiting": w.waiting, "timeout_s": w.window}, wait.source)
