"""What an actuator did, kept with its decision: one ``actuator`` event (``ftwatch explain`` and the
report show it) and, for anything but ``done`` or ``skipped`` (a failure, a breaker's hold, a dry
run), a line on the terminal and an alert naming each call. Shared by ``watch`` (every decision)
and ``run`` (the decisions a scheduler's actuator carries out: ``--actuator slurm``)."""

from __future__ import annotations

from typing import Any

from ftwatch.pipeline.actuators.exec import ActResult


def record_outcome(recorder: Any, now: float, job: str, action: str, result: ActResult, *,
                   instance: str | None = None, rank: int | None = None, decision_id: str = "",
                   node: str | None = None) -> None:
    """Store ``result`` as an ``actuator`` event of the decision; say and alert it unless done.

    Args:
        recorder: the run's or watch's ``Recorder`` (event, say, dispatcher, alerts, attempt).
        now: epoch seconds.
        job: the job; ``action``: the decision's action label (``readmit_node`` for a readmission).
        result: what the actuator did.
        instance, rank, decision_id, node: the decision's target and id, carried into the alert.
    """
    recorder.event(now, job, "actuator", instance, rank, action=action, status=result.status,
                   returncode=result.returncode, output=result.output, calls=list(result.calls),
                   decision_id=decision_id)
    if result.status in ("done", "skipped"):
        return
    first = result.output.splitlines()[0] if result.output else ""
    text = f"actuator {result.status} for {action}" + (f" ({decision_id})" if decision_id else "") + \
        (f": {first}" if first else "")
    recorder.say(f"ftwatch: {text}")
    recorder.dispatcher.dispatch(recorder.alerts.for_custom_message(
        job, text + "".join(f"\n  {c}" for c in result.calls), now, instance=instance, rank=rank, node=node,
        attempt=recorder.attempt))
