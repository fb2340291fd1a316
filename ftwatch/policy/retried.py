"""A fault graded "try again" that the log shows failing again on the same target, in another try.

Some tools try a failed step again by themselves (a reset loop, a launcher wrapper), and the log
ftwatch reads then holds several tries. Two of ftwatch's rules grade their fault as a transient
to retry, on their sources' word, and the line says which target failed and, where the tool
names it, which try:

* ``tt.post_reset_failed``: tt-smi's galaxy reset prints ``Error: POST_RESET failed for device
  N.`` once per failing device and run, then exits 1 (tenstorrent/tt-smi galaxy reset); the
  maintainers read a POST_RESET failure as often transient, to be retried per device, and a chip
  that fails every attempt as wedged (tenstorrent/tt-metal issue 54391, quoted in the rule's
  source). Each such line is one try; the target is the device on its host (the ``[host]``
  prefix a multi-host reset puts before it).
* ``pals.rpc_forward_failed``: PALS names each application it launches or pings by its id,
  ``launch failed on <parent>: Couldn't forward RPC launch(<id>) to child <node>`` (ALCF Aurora
  user guide, known issues: these failures come from node or network instability, and the remedy
  is to run the job again). The try is the id; the target is the child node the parent could not
  reach (the parent only forwarded). The id is the application's (the one PALS names in ``Application
  <id> not found``, ``pals.ping_application_not_found``; read from the lines' shape, not from a PALS
  document): the same id repeated is one application's pings, one try.

When the same fault names the same target in two different tries, the retry its grade asks for
was made and failed the same way: the fault stays with the target, which is the device's (its
node's) fault, not a transient. This is ``escalation.DEVICE_REPEAT``'s reading of a repeat across
ftwatch's own attempts (NVIDIA's GPU debug guidelines: a fault that stays with one device is
that device's; an application's follows the application), applied to tries the log itself
holds. :func:`retried_on_target` regrades the incident's first such fault ``hardware_node`` /
``isolate_node``; a single try, or tries on different targets, keep the rule's grade.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple, Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity


class TryShape(NamedTuple):
    """How one rule's line names its target and its try.

    Attributes:
        target: a regex whose groups together name the target, its first group the target's
            host when the line names one (empty or None otherwise).
        attempt: a regex whose group names the try, or None when each line is a try of its own.
    """

    target: re.Pattern[str]
    attempt: re.Pattern[str] | None


#: The rules whose lines name their target and try (module docstring: the sources).
TRIES: dict[str, TryShape] = {
    "tt.post_reset_failed": TryShape(
        re.compile(r"^(?:\s*\[([^\]\s]+)\])?.*?POST_RESET failed for devices?:? *(\[[^\]]*\]|\d+)"), None),
    "pals.rpc_forward_failed": TryShape(
        re.compile(r"Couldn't forward RPC \w+\([^)]*\) to child ([^\s:]+)"),
        re.compile(r"Couldn't forward RPC \w+\(([^)]+)\)")),
}
_SOURCE = ("tenstorrent/tt-metal issue 54391 (a POST_RESET failure: retry per device; a chip failing every "
           "attempt is wedged); ALCF Aurora known issues (PALS RPC forwarding failures: run again); "
           "escalation.DEVICE_REPEAT (the same fault on the same device after a retry is the device's)")


def _target(f: Finding, shape: TryShape) -> tuple[str, ...] | None:
    m = shape.target.search(f.line)
    return tuple(g or "" for g in m.groups()) if m else None


def _attempt(f: Finding, shape: TryShape) -> str:
    if shape.attempt is None:
        return f"line:{f.seq}:{f.time}"     # the tool prints the line once per try
    m = shape.attempt.search(f.line)
    return m.group(1) if m else f"line:{f.seq}:{f.time}"


def retried_on_target(head: Finding, order: Sequence[Finding]) -> Finding | None:
    """``head`` regraded as its target's fault, when another try in the log failed the same way.

    Args:
        head: the incident's earliest real error.
        order: all the incident's findings.

    Returns:
        A copy of ``head`` graded ``hardware_node`` / ``isolate_node`` (severity critical, fields
        ``tries`` and ``target``; its origin's node the target's host where the line names it: the
        child node PALS could not reach, not the parent that logged it), when ``head``'s rule is one of ``TRIES``, graded below isolation, and the
        incident holds the same rule on the same target in at least two different tries; else None.
    """
    shape = TRIES.get(head.rule_id)
    if shape is None or head.action >= Action.ISOLATE_NODE:
        return None
    target = _target(head, shape)
    if target is None:
        return None
    tries = {_attempt(f, shape) for f in order
             if f.rule_id == head.rule_id and f.origin.job == head.origin.job and _target(f, shape) == target}
    if len(tries) < 2:
        return None
    node = target[0].split(".", 1)[0]       # the host the line names (a child's FQDN: its short name)
    origin = dataclasses.replace(head.origin, node=node) if node else head.origin
    return dataclasses.replace(head, failure_class=FailureClass.HARDWARE_NODE, action=Action.ISOLATE_NODE,
                               severity=max(head.severity, Severity.CRITICAL), origin=origin,
                               fields={**head.fields, "tries": len(tries),
                                       "target": " ".join(t for t in target if t)},
                               source=_SOURCE)
