"""Errors a job outlives, out of its :class:`~ftwatch.pipeline.incidents.IncidentDesk`'s incident.

Issue 12 item 3, ``ftwatch.policy.progress``: where the source reports no exits (``watch``,
``replay``), an error that a process may catch, log and go on from
(``ftwatch.policy.triggers.may_survive``, :func:`survivable`) opens a *held* incident (the desk's
``add``). In every driver, when the instance that printed such an error prints ``progress.MARKS``
progress lines after it within ``progress.SURVIVE_SECONDS`` (``ftwatch.pipeline.intake.take``), or
the program finished after it, or an exit 0 or a launcher's "exited 0" line says the traceback
ended no program (:func:`survived`), or Python ignored the exception, or a library handler
that logs any exception and goes on caught it (``ftwatch.policy.catchsite.going_on``), or Open MPI's
MPI_ABORT report ends in errorcode 0 (``progress.abort_zero``), the error is a notice
(:func:`notice`: ``IncidentDesk.notices``, a ``notice`` event): it leaves the evidence, and an
incident it alone held is dropped. Two readings make fatal findings notices: a scheduler's verdict
followed by the program's finish line (the job was requeued and finished, :func:`ended`), and a
boot of the node that the job's own output went on after (:func:`booted_before`, at close).
Split from ``ftwatch.pipeline.incidents`` (this module's one job: notices); :func:`notice` edits
the desk's open incident (its openers, opener and held flag).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftwatch.events import Finding
from ftwatch.pipeline.sources.hostlog import is_host
from ftwatch.policy import lifecycle
from ftwatch.policy.catchsite import going_on
from ftwatch.policy.progress import ABORT_REPORT
from ftwatch.policy.triggers import may_survive

if TYPE_CHECKING:
    from ftwatch.pipeline.incidents import IncidentDesk


def survivable(desk: IncidentDesk, f: Finding) -> bool:
    """An error its instance may outlive (``triggers.may_survive``; host lines never)."""
    return desk.survival.window > 0 and not is_host(f.origin) and may_survive(f, desk._sticky)


def survived(desk: IncidentDesk, found: list[Finding], at: float, why: str) -> None:
    """``found``, tracebacks, ended no program (an exit 0 after them): notices."""
    for f in desk.survival.exited_ok(found):
        notice(desk, f, at, why)


def notice(desk: IncidentDesk, f: Finding, at: float, why: str) -> None:
    """``f`` became a notice: out of the incident, and a ``notice`` event.

    The openers are held by id, so taking ``f`` out is one dict operation: a replay with many
    survivable errors beside errors that stay calls this per notice, and a search of the openers
    list each time made it O(notices x openers) (issue 16: 25,000 notices beside 20,000 openers, ~15 s).
    """
    if desk._openers.pop(id(f), None) is not None and desk.open is f:
        desk.open = min(desk._openers.values(), key=lambda x: (x.time, x.seq), default=None)
        desk._held = desk.open is not None and desk._held
    desk.recorder.event(at, desk.job, "notice", f.origin.instance, f.rank, rule=f.rule_id,
                        why=why)


#: host findings that say the node booted (``kernel_vocab.tsv`` ``os.kernel_boot``)
BOOT_RULES = frozenset({"os.kernel_boot"})
#: seconds of the job's output after a boot that say the job ran on after it (clock skew between a
#: node's syslog and the job's own stamps stays well inside a minute on a synchronised cluster)
BOOT_MARGIN = 60.0


def booted_before(desk: IncidentDesk, at: float) -> None:
    """A boot of the node that the job's own output outlived (an instance wrote output more than
    ``BOOT_MARGIN`` s after the boot's banner) is no reset under the job: a notice. A node that
    resets takes the job's processes with it, so their output stops at the reset; a kernel log
    shipped whole (since its rotation) carries the boots before the job started as well."""
    last = desk.tracker.last_output()
    if last is None:
        return
    for g in [g for g in desk._openers.values()
              if g.rule_id in BOOT_RULES and is_host(g.origin) and last > g.time + BOOT_MARGIN]:
        desk.survival.note(g)
        notice(desk, g, at, "the job's own output went on after this boot: the node booted before the job ran")


def ignored(desk: IncidentDesk, findings: list[Finding]) -> None:
    """The errors of ``findings`` that ended no program: those Python ignored ("Exception ignored
    in"), those a library's log-and-continue handler caught, and MPI_Abort reports with errorcode 0:
    notices (``Survival.ignored``)."""
    for f in desk.survival.ignored(findings):
        handler = going_on(f)
        if f.rule_id == ABORT_REPORT:
            why = "MPI_Abort with errorcode 0: the program stopped the job with a success status"
        elif handler is not None:
            why = f"caught and logged by {handler}, whose code goes on after any exception"
        else:
            why = "Python ignored the exception (Exception ignored in ...)"
        notice(desk, f, f.time, why)


def ended(desk: IncidentDesk, f: Finding) -> None:
    """``f`` says the program finished, or a launcher saw its worker exit 0: the errors it ended
    (a Sync job's: every rank's) are notices. A scheduler's verdict before a finish line
    (``triggers.outside_rules``: fatal, never held) is one too: the job the scheduler stopped ran
    again and finished (a requeued Slurm job, ``scontrol requeue``: "Requeue a running, suspended
    or finished Slurm batch job into pending state", whose next run appends to the same output
    with ``--open-mode=append``; Lightning's auto-requeue)."""
    if lifecycle.finished_by_program(f):       # Sync (D1): every rank took part in each step
        who = None if desk.policy.policy.job_execution_mode == "Sync" else f.origin.instance
        for g in desk.survival.finished(who, f.time, f.seq):
            notice(desk, g, f.time, f"training finished after it ({f.rule_id} on {f.origin.instance})")
        for g in [g for g in desk._openers.values() if g.rule_id in desk._outside and (g.time, g.seq) < (f.time, f.seq)
                  and who in (None, g.origin.instance)]:
            desk.survival.note(g)
            notice(desk, g, f.time, f"the scheduler stopped the job, which ran again and finished after it "
                                    f"(requeued; {f.rule_id} on {f.origin.instance})")
    elif lifecycle.is_exited_ok(f):             # the launcher read its workers' exit status 0
        survived(desk, desk._exits.launcher_ok(f), f.time, f"{f.rule_id} on {f.origin.instance}: the "
                 "launcher saw its worker exit 0 after it, so the traceback ended no program")
