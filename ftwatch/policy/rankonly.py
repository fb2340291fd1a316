"""A job hang that began in work the program runs on one rank alone (SPEC R5 / R7, issue 12 item 3).

Every rank of a process group must issue the same collectives in the same order (PyTorch DDP
notes; JAX's multi-process guide: "all processes must run the same computations in the same
order"). Work a program gates to one rank breaks that as soon as it touches the group: an
evaluation through the DDP-wrapped model on rank 0 alone runs DDP's own collectives on that rank
only (pytorch/pytorch#54059: evaluate with ``ddp_model.module``), a metrics gather under
``if accelerator.is_main_process`` is a collective only the main process enters (accelerate's
troubleshooting guide, "Hanging code and timeout errors": code that only some processes run
hangs), Lightning's ``rank_zero_only`` is for side-effect-free work such as logging alone. The
ranks then wait in different places until a timeout, or forever when there is none: a job hang.

What tells that apart from a node that wedged during the same evaluation is whether the work was
one rank's *alone*, and a log shows that only where several instances write their own lines:

1. every real error of the incident is a job hang (``hang.job``), and the latest finding before
   it is a line of :data:`RANK_WORK_RULES` (a rank says it evaluates: ``lifecycle.own_work.evaluation``),
   printed no earlier than :data:`SLACK_SECONDS` before the job's last output, with no error after it;
2. its instance printed progress lines of its own this attempt, and so did at least one other
   instance (``Incident.progressed``: the program logs its training on several ranks, each its own);
3. no other instance printed a line of that rule in the whole attempt.

Then the program logs on every rank but only that one says it evaluates: it evaluates alone, and
the silence began there. The root cause is ``hang.rank_only_work`` (user_code, fail_job): a
restart replays the same control flow to the same place. A program that logs on one rank only
(Megatron's last rank, the HF Trainer's main process) says nothing of who does the work. A file
write and the main process's own preparation (``lifecycle.left_path.main_process_only``) are left
out: a checkpoint saved, a dataset downloaded or pre-processed on rank 0 alone while the others
wait is the documented, legitimate pattern (transformers ``main_process_first``), and a hang inside
it is most often its own I/O's, no peer's leaving (``ftwatch.policy.leftpath``). Those keep the
hang reading.
"""

from __future__ import annotations

from typing import AbstractSet, Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity
from ftwatch.policy.leftpath import line_before_hang

#: Lines in which a rank says it runs work that, gated to one rank, leaves its peers' path.
RANK_WORK_RULES = frozenset({"lifecycle.own_work.evaluation"})
#: How long before the job's last output the work line may be (seconds).
SLACK_SECONDS = 300.0
SOURCE = ("pytorch/pytorch#54059 (evaluation through the DDP model on a subset of ranks hangs); "
          "huggingface.co/docs/accelerate/basic_tutorials/troubleshooting (code run on some processes only "
          "hangs); Lightning rank_zero_only (side-effect-free work only); docs.jax.dev multi_process "
          "(all processes run the same computations in the same order)")


def rank_only_before_hang(findings: Sequence[Finding], real: Sequence[Finding],
                          progressed: AbstractSet[str]) -> Finding | None:
    """``hang.rank_only_work`` (the module docstring), or None.

    Args:
        findings: the incident's findings, any order.
        real: its real errors: only job hangs (kind ``hang``) qualify.
        progressed: the instances that printed progress lines this attempt.

    Returns:
        A Finding on the work line's origin, at the first hang's (time, seq), or None.
    """
    order = sorted(findings, key=lambda f: (f.time, f.seq))
    found = line_before_hang(order, real, RANK_WORK_RULES, SLACK_SECONDS)
    if found is None:
        return None
    hang, work, _ = found
    alone = work.origin.instance
    if alone not in progressed or not (set(progressed) - {alone}):
        return None
    if any(f.rule_id == work.rule_id and f.origin.instance != alone for f in order):
        return None
    others = sorted(set(progressed) - {alone})
    line = (f"the job went silent ({hang.rule_id}) right after {alone} said it runs work of its own "
            f"({work.rule_id}: {work.line.strip()[:160]}), work no other instance ever reported although "
            f"{', '.join(others[:4])}{' ...' if len(others) > 4 else ''} log their training too: the program "
            "ran it on one rank alone, and a collective inside it (a DDP forward, a gather) waits for peers "
            "that never enter it; a restart replays the same control flow")
    return Finding("hang.rank_only_work", "hang", FailureClass.USER_CODE, Action.FAIL_JOB, Severity.ERROR,
                   work.origin, line, hang.time, hang.seq, (work.line, hang.line),
                   {"rank_only": alone, "work": work.rule_id, "hang": hang.rule_id}, SOURCE)
