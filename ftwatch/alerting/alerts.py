"""Alerts made from decisions (SPEC N1).

An :class:`Alert` is Alertmanager-shaped (labels, annotations, status, start/end) and keeps
the :class:`~ftwatch.events.Decision` it was made from, when it was made from one: a custom
message from the training code and a daily digest are alerts of their own, with their own id. A :class:`Notification` is one alert
rendered for one receiver; its ``id`` is stable (decision id + receiver) and is what the
receivers send as an idempotency key.

Their text is rendered by ``ftwatch.alerting.rendering``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping


from ftwatch.events import Action, Decision, FailureClass, Finding, Origin, Severity, Target, iso

SEVERITY_BY_EVENT_TYPE: dict[str, str] = {
    "node_isolated": "critical", "job_failed": "critical",
    "job_restart": "warning", "instance_restart": "warning", "job_hang": "warning",
    "straggler": "info", "c4d_diagnosis": "info", "custom_message": "info", "notice": "info",
    "new_signature": "info",
    "job_finished": "info", "digest": "info"}
"""The severity of each event type (:data:`ftwatch.config.routes.EVENT_TYPES`): ``critical`` when
the job loses a node or ends failed, ``warning`` for restarts (hangs included), ``info`` for
notices."""


def severity_of(event_type: str) -> str:
    """The severity an alert of ``event_type`` gets (:data:`SEVERITY_BY_EVENT_TYPE`): the one
    place real alerts and ``ftwatch check --route`` take it from.

    Raises:
        KeyError: not an event type.
    """
    return SEVERITY_BY_EVENT_TYPE[event_type]


def is_c4d(decision: Decision) -> bool:
    """True when the decision was triggered by a C4D diagnosis (root cause rule id ``c4d*``)."""
    rc = decision.root_cause
    return rc is not None and rc.rule_id.lower().startswith("c4d")


def event_type_of(decision: Decision) -> str:
    """The event type (a key of :data:`ftwatch.config.routes.EVENT_TYPES`) of a decision.

    The action decides first, so a C4D diagnosis that isolates a node is ``node_isolated`` (it
    matches the on-call routes, inhibits its fallout and resolves like any isolation; its alert
    carries the label ``c4d: "true"`` for routes that want C4D apart). Then the trigger: a hang
    that restarts is ``job_hang``; a notify-only decision is ``straggler``, ``c4d_diagnosis``
    (rule id ``c4d*``) or ``notice``; an SDK message is ``custom_message``.
    """
    rc = decision.root_cause
    rule = rc.rule_id if rc else ""
    hang = rc is not None and rc.failure_class is FailureClass.HANG
    action = decision.action
    if rule == "custom_message":
        return "custom_message"
    if action is Action.FAIL_JOB:
        return "job_failed"
    if action is Action.ISOLATE_NODE:
        return "node_isolated"
    if action >= Action.RESTART_INSTANCE and hang:
        return "job_hang"
    if action is Action.RESTART_JOB:
        return "job_restart"
    if action in (Action.RESTART_INSTANCE, Action.RESTART_IN_PLACE):
        return "instance_restart"
    if is_c4d(decision):
        return "c4d_diagnosis"
    if action is Action.NOTIFY:
        return "straggler" if rc is not None and rc.failure_class is FailureClass.STRAGGLER else "notice"
    return "job_finished"


RESOLVABLE = frozenset({"job_restart", "instance_restart", "job_hang", "node_isolated"})
"""Event types about an incident the job can get over (it runs on); these alerts resolve
(see ``ftwatch.pipeline.recorder.Recorder.resolve_open``). ``job_failed`` and the
notifications never resolve by themselves."""


@dataclass(frozen=True)
class Alert:
    """An alert about one decision, shaped like a Prometheus Alertmanager alert.

    Attributes:
        labels: str -> str: ``alertname`` (``ftwatch_<action>``), ``event_type`` (a key of
            :data:`ftwatch.config.routes.EVENT_TYPES`), ``job``, ``instance``, ``rank``,
            ``node``, ``action``,
            ``severity``, ``failure_class``, ``rule`` and ``rule_id`` (the same: the root
            cause's rule) (``""`` where unknown, e.g. the instance of a job-wide restart); and
            ``c4d: "true"`` on alerts triggered by a C4D diagnosis.
        annotations: str -> str: ``summary``, ``description``, ``root_cause_line``,
            ``root_cause_instance``, ``root_cause_rank``, ``root_cause_time``, ``explain``.
        status: ``firing`` or ``resolved``.
        starts_at: epoch seconds (the decision's time).
        ends_at: epoch seconds when resolved, else None.
        decision: the decision it was made from; None for a custom message or a digest.
        budgets: ``restarts_used`` and ``restarts_left`` (and ``attempt`` when there is no
            decision to read it from).
        id: the alert's own id when it has no decision (16 hex digits for a custom message,
            ``digest<epoch s>`` for a digest); "" otherwise.
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    status: str
    starts_at: float
    ends_at: float | None
    decision: Decision | None = None
    budgets: Mapping[str, int] = field(default_factory=dict)
    id: str = ""

    @property
    def decision_id(self) -> str:
        """The decision's id, or the alert's own :attr:`id` when it has no decision (notification
        ids, links and the store's ``alerts`` rows are keyed by it)."""
        return self.decision.decision_id if self.decision is not None else self.id

    @property
    def key(self) -> str:
        """The alert's identity: :attr:`decision_id`, plus ``~<status>`` unless firing (a
        decision's firing and resolved alerts are two alerts)."""
        return self.decision_id if self.status == "firing" else f"{self.decision_id}~{self.status}"

    @property
    def event_type(self) -> str:
        """The event type (label ``event_type``; derived from the decision for alerts made
        before the label existed, e.g. read back from an old spool)."""
        if self.labels.get("event_type") or self.decision is None:
            return self.labels.get("event_type", "")
        return event_type_of(self.decision)

    @property
    def severity(self) -> str:
        """``info``, ``warning`` or ``critical`` (label ``severity``)."""
        return self.labels.get("severity", "info")

    def resolve(self, at: float) -> "Alert":
        """A copy with status ``resolved`` ending at ``at`` (epoch seconds)."""
        return replace(self, status="resolved", ends_at=at)


@dataclass(frozen=True)
class Notification:
    """One alert rendered for one receiver.

    Attributes:
        receiver: the receiver's name (from the config).
        alert: the alert.
        title: the first line of the rendered text.
        body: the whole rendered text.
        id: stable and unique per (decision, receiver, status); see :func:`notification_id`.
            The decision id is the part before the first ``-``.
    """

    receiver: str
    alert: Alert
    title: str
    body: str
    id: str


def notification_id(decision_id: str, receiver: str, status: str = "firing") -> str:
    """The idempotency id of a notification: ``<decision_id>-<receiver>[~<status>]``.

    The status is added for anything but ``firing`` (``~resolved``). Characters other than
    ``[A-Za-z0-9_.-]`` in the receiver name become ``_`` (the id is a file name in the
    spool); when that changed the name, 8 hex digits of its hash are added so two receivers
    never share an id.
    """
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", receiver)[:64] or "_"
    if slug != receiver:
        slug += "_" + hashlib.sha1(receiver.encode()).hexdigest()[:8]
    suffix = "" if status == "firing" else f"~{re.sub(r'[^a-z]', '_', status)}"
    return f"{decision_id}-{slug}{suffix}"


def explain_command(state_dir: str | Path, decision_id: str) -> str:
    """The shell command that explains a decision: ``ftwatch explain --state-dir DIR ID`` (DIR
    shell-quoted)."""
    return f"ftwatch explain --state-dir {shlex.quote(str(state_dir))} {decision_id}"


def alert_link(alert: "Alert", state_dir: str | Path | None, url_template: str | None = None) -> str:
    """How to see more about ``alert`` (SPEC N1: every alert carries a link).

    Args:
        alert: the alert (a decision's or a custom message's).
        state_dir: the state dir the commands name (made absolute, shell-quoted); None: not named.
        url_template: ``alerting.link_url``, e.g. ``https://reports/{job}/{decision_id}``
            (placeholders ``ftwatch.config.routes.LINK_FIELDS``, URL-quoted); None: a command.

    Returns:
        The URL; else ``ftwatch explain [--state-dir DIR] ID`` for a decision, or ``ftwatch report
        [--state-dir DIR] --job JOB`` for a custom message (it is not a stored decision).
    """
    from urllib.parse import quote

    from ftwatch.config.routes import LINK_FIELDS
    if url_template:
        values = {k: alert.decision_id if k == "decision_id" else alert.labels.get(k, "") for k in LINK_FIELDS}
        return url_template.format(**{k: quote(str(v), safe="") for k, v in values.items()})
    state = f" --state-dir {shlex.quote(str(Path(state_dir).resolve()))}" if state_dir is not None else ""
    if alert.event_type == "custom_message":
        return f"ftwatch report{state} --job {shlex.quote(alert.labels.get('job', ''))}"
    if alert.event_type == "new_signature":
        return f"ftwatch mine{state}"
    return f"ftwatch explain{state} {alert.decision_id}"


def alert_from_decision(decision: Decision, link: str, include_none: bool = False) -> Alert | None:
    """Make the alert for a decision.

    Args:
        decision: the policy's decision.
        link: how to see more: the ``ftwatch explain`` command (:func:`explain_command`) or
            a report URL; put in the ``explain`` annotation.
        include_none: also make an alert for action ``none`` (default: return None for it).

    Returns:
        A firing Alert starting at the decision's time, or None for action ``none``.
    """
    if decision.action == Action.NONE and not include_none:
        return None
    rc = decision.root_cause
    t = decision.target
    action = decision.action.label
    event_type = event_type_of(decision)
    labels = {
        "alertname": f"ftwatch_{action}", "event_type": event_type, "job": t.job, "instance": t.instance or "",
        "rank": "" if t.rank is None else str(t.rank), "node": t.node or "", "action": action,
        "severity": severity_of(event_type),
        "failure_class": rc.failure_class.value if rc else "", "rule": rc.rule_id if rc else "",
        "rule_id": rc.rule_id if rc else ""}
    if is_c4d(decision):
        labels["c4d"] = "true"
    where = ""
    if rc is not None:
        where = f": {rc.rule_id} on {rc.origin.instance}"
        if rc.rank is not None:
            where += f" (rank {rc.rank})"
    annotations = {
        "summary": f"{action} for job {t.job}{where}",
        "description": decision.policy_clause,
        "root_cause_line": rc.line if rc else "",
        "root_cause_instance": rc.origin.instance if rc else "",
        "root_cause_rank": "" if rc is None or rc.rank is None else str(rc.rank),
        "root_cause_time": iso(rc.time) if rc else "",
        "explain": link,
    }
    budgets = {"restarts_used": decision.restarts_used, "restarts_left": decision.restarts_left}
    return Alert(labels, annotations, "firing", decision.time, None, decision, budgets)


def alert_from_custom_message(job: str, content: str, time: float, link: str = "", *,
                              instance: str | None = None, rank: int | None = None,
                              node: str | None = None, restarts_used: int = 0,
                              restarts_left: int = 0, attempt: int = 0) -> Alert:
    """The alert for a message the training code sent (SDK ``send_custom_message``, N3 event
    ``custom_message``): action ``notify``, the message as the root-cause line, class ``info``.
    It is made from no decision; its :attr:`Alert.id` is a hash of time, job, sender and text.

    Labels: ``event_type: custom_message`` and ``alertname: ftwatch_custom_message``.
    """
    who = f"rank {rank}" if rank is not None else (instance or "the job")
    raw = f"{time:.6f}|custom_message|{job}|{instance}|{rank}|{node}|{content}"
    labels = {"alertname": "ftwatch_custom_message", "event_type": "custom_message", "job": job,
              "instance": instance or "", "rank": "" if rank is None else str(rank), "node": node or "",
              "action": Action.NOTIFY.label, "severity": severity_of("custom_message"),
              "failure_class": FailureClass.INFO.value, "rule": "custom_message",
              "rule_id": "custom_message"}
    annotations = {
        "summary": f"custom message from {who} of job {job}: {content}",
        "description": "custom message from the training code (send_custom_message)",
        "root_cause_line": content, "root_cause_instance": instance or "job",
        "root_cause_rank": "" if rank is None else str(rank), "root_cause_time": iso(time),
        "root_cause_source": "ftwatch.sdk Monitor.send_custom_message", "explain": link}
    budgets = {"restarts_used": restarts_used, "restarts_left": restarts_left, "attempt": attempt}
    return Alert(labels, annotations, "firing", time, None, budgets=budgets,
                 id=hashlib.sha1(raw.encode()).hexdigest()[:16])


def alert_from_signature(signature: Any, time: float, link: str = "", *, job: str = "",
                         node: str = "") -> Alert:
    """The alert for a new failure signature (SPEC T5, event ``new_signature``): a template that
    catch-all decisions printed reached the configured number of jobs (``mining.new_signature_jobs``).
    Action ``notify``, the template as the root-cause line, class ``info``; made from no decision,
    its :attr:`Alert.id` is a hash of the signature id and template.

    Args:
        signature: a ``ftwatch.mining.miner.Signature`` (``id``, ``template``, ``jobs``, ``nodes``,
            ``count``, ``examples``, ``top(what)``).
        time: epoch seconds (the decision that made it new).
        link: how to see more (``ftwatch mine``).
        job, node: the job and node whose decision made it new (labels for routing).
    """
    jobs = list(signature.jobs)
    raw = f"new_signature|{signature.id}|{signature.template}"
    labels = {"alertname": "ftwatch_new_signature", "event_type": "new_signature", "job": job,
              "instance": "", "rank": "", "node": node, "action": Action.NOTIFY.label,
              "severity": severity_of("new_signature"), "failure_class": FailureClass.INFO.value,
              "rule": "new_signature", "rule_id": "new_signature", "signature": str(signature.id)}
    annotations = {
        "summary": f"new failure signature in {len(jobs)} jobs ({', '.join(jobs[:5])}): {signature.template}",
        "description": (f"{signature.count} lines explained only by {signature.top('rules') or 'no rule'}; "
                        f"actions taken: {signature.top('actions') or 'none'}; draft a rule with ftwatch mine --draft"),
        "root_cause_line": signature.examples[0] if signature.examples else signature.template,
        "root_cause_instance": "", "root_cause_rank": "", "root_cause_time": iso(time),
        "root_cause_source": "ftwatch.mining", "explain": link}
    return Alert(labels, annotations, "firing", time, None, budgets={"restarts_used": 0, "restarts_left": 0},
                 id=hashlib.sha1(raw.encode()).hexdigest()[:16])


@dataclass(frozen=True)
class AlertMaker:
    """Makes an alert and its link (SPEC N1: every alert carries one) in one call.

    Args:
        state_dir: the state dir the link's command names (:func:`alert_link`); None: not named.
        link_url: ``alerting.link_url``, a URL template used instead of a command; None: a command.
    """

    state_dir: str | Path | None = None
    link_url: str | None = None

    def for_decision(self, decision: Decision, include_none: bool = False) -> Alert | None:
        """:func:`alert_from_decision` with its link; None for action ``none`` unless
        ``include_none``."""
        alert = alert_from_decision(decision, "", include_none=include_none)
        return None if alert is None else self._linked(alert)

    def for_custom_message(self, job: str, content: str, time: float, **kw: Any) -> Alert:
        """:func:`alert_from_custom_message` (same keyword arguments) with its link."""
        return self._linked(alert_from_custom_message(job, content, time, "", **kw))

    def for_signature(self, signature: Any, time: float, **kw: Any) -> Alert:
        """:func:`alert_from_signature` (same keyword arguments) with its link."""
        return self._linked(alert_from_signature(signature, time, "", **kw))

    def _linked(self, alert: Alert) -> Alert:
        link = alert_link(alert, self.state_dir, self.link_url)
        return replace(alert, annotations={**alert.annotations, "explain": link})


def sample_alert() -> Alert:
    """A realistic alert (a job restart after an NCCL error on rank 1) for template checks."""
    t0 = 1_795_250_163.735
    root = Finding(
        "nccl.unhandled_system_error", "keyword", FailureClass.RETRYABLE_INFRA,
        Action.RESTART_JOB, Severity.ERROR,
        Origin("worker-1", 1, "demo-job", "node-a", "stderr"),
        "torch.distributed.DistBackendError: NCCL error: unhandled system error", t0, 7,
        ("Traceback (most recent call last):",
         "torch.distributed.DistBackendError: NCCL error: unhandled system error"),
        source="https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html")
    fallout = Finding(
        "gloo.peer_closed", "keyword", FailureClass.FALLOUT, Action.RESTART_JOB,
        Severity.ERROR, Origin("worker-0", 0, "demo-job", "node-a", "stderr"),
        "RuntimeError: Connection closed by peer [10.0.0.2]:29500", t0 + 1.5, 9)
    decision = Decision(t0 + 2.0, Action.RESTART_JOB, Target("demo-job"), root,
                        "ExitCodeAndErrorMsg: retryable_infra root cause -> restart_job",
                        1, 2, (fallout,), attempt=1)
    alert = alert_from_decision(decision, explain_command(".ftwatch-state", decision.decision_id))
    assert alert is not None
    return alert
