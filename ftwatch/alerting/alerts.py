"""Alerts made from decisions, and their text rendered from Jinja2 templates (SPEC N1, Q2).

An :class:`Alert` is Alertmanager-shaped (labels, annotations, status, start/end) and keeps
the :class:`~ftwatch.events.Decision` it was made from. A :class:`Notification` is one alert
rendered for one receiver; its ``id`` is stable (decision id + receiver) and is what the
receivers send as an idempotency key.

Templates are rendered in a Jinja2 ``ImmutableSandboxedEnvironment`` with ``StrictUndefined``
and autoescape off (the output is text). Built-in templates live in ``templates/`` as
``<kind>.<language>.j2``. A template sees only plain values (str, int, None, dicts, lists):

=====================  ===================================================================
``job``                the job id
``action``             wire name (``restart_job``); ``action_text`` the words for it
``severity``           ``critical`` / ``warning`` / ``info``; ``status`` ``firing``/``resolved``
``target``             dict: ``job``, ``instance``, ``rank``, ``node`` (None = whole job)
``root_cause``         dict or None: ``line``, ``instance``, ``rank``, ``node``, ``time`` (ISO),
                       ``rule_id``, ``failure_class``, ``failure_class_text``, ``severity``,
                       ``source``, ``evidence`` (list of str)
``rule_id``            the root cause's rule, or None; ``failure_class`` / ``failure_class_text``
``policy_clause``      the clause that chose the action
``budgets``            dict: ``restarts_used``, ``restarts_left``
``decision_id``        16 hex digits; ``time`` the decision's ISO time; ``attempt`` (int)
``link``               the ``ftwatch explain`` command or a report URL
``labels``             the alert's labels; ``annotations`` its annotations; ``summary``
=====================  ===================================================================

None renders as ``-``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import traceback
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ftwatch.errors import Issue, TemplateError
from ftwatch.events import (Action, Decision, FailureClass, Finding, Origin, Severity, Target,
                            iso)

LANGUAGES = ("en", "zh")
BUILTIN_KINDS = ("console", "webhook")
GENERIC_KIND = "webhook"
"""Kinds with no template of their own (dingtalk, slack ...) use this kind's text."""

_SEVERITY_BY_ACTION = {
    Action.NONE: "info", Action.NOTIFY: "info", Action.RESTART_INSTANCE: "warning",
    Action.RESTART_IN_PLACE: "warning", Action.RESTART_JOB: "warning",
    Action.ISOLATE_NODE: "critical", Action.FAIL_JOB: "critical"}

# language -> "action" | "failure_class" -> wire name -> words
_WORDS: dict[str, dict[str, dict[str, str]]] = {
    "en": {"action": {
        "none": "no action", "notify": "notify a person",
        "restart_instance": "restart one instance",
        "restart_in_place": "restart the processes in place",
        "restart_job": "restart the whole job",
        "isolate_node": "isolate the node and restart elsewhere", "fail_job": "fail the job"},
        "failure_class": {
        "retryable_infra": "retryable infrastructure error",
        "hardware_node": "node hardware fault", "user_code": "user code error",
        "oom": "out of memory", "hang": "hang", "straggler": "straggler",
        "fallout": "fallout of another failure", "info": "information"}},
    "zh": {"action": {
        "none": "不处理", "notify": "通知人工确认", "restart_instance": "重启单个实例",
        "restart_in_place": "原地重启进程", "restart_job": "重启整个任务",
        "isolate_node": "隔离节点并在其他节点重启", "fail_job": "终止任务（失败）"},
        "failure_class": {
        "retryable_infra": "可重试的基础设施故障", "hardware_node": "节点硬件故障",
        "user_code": "用户代码错误", "oom": "内存不足（OOM）", "hang": "任务卡死",
        "straggler": "慢节点", "fallout": "由其他故障引发的连带错误", "info": "提示信息"}},
}


@dataclass(frozen=True)
class Alert:
    """An alert about one decision, shaped like a Prometheus Alertmanager alert.

    Attributes:
        labels: str -> str: ``alertname`` (``ftwatch_<action>``), ``job``, ``instance``,
            ``rank``, ``node``, ``action``, ``severity``, ``failure_class``, ``rule_id``
            (``""`` where unknown, e.g. the instance of a job-wide restart).
        annotations: str -> str: ``summary``, ``description``, ``root_cause_line``,
            ``root_cause_instance``, ``root_cause_rank``, ``root_cause_time``, ``explain``.
        status: ``firing`` or ``resolved``.
        starts_at: epoch seconds (the decision's time).
        ends_at: epoch seconds when resolved, else None.
        decision: the decision it was made from.
        budgets: ``restarts_used`` and ``restarts_left``.
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    status: str
    starts_at: float
    ends_at: float | None
    decision: Decision
    budgets: Mapping[str, int] = field(default_factory=dict)

    @property
    def decision_id(self) -> str:
        return self.decision.decision_id

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
    """The shell command that explains a decision: ``ftwatch explain --state-dir DIR ID``."""
    return f"ftwatch explain --state-dir {shlex.quote(str(state_dir))} {decision_id}"


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
    labels = {
        "alertname": f"ftwatch_{action}", "job": t.job, "instance": t.instance or "",
        "rank": "" if t.rank is None else str(t.rank), "node": t.node or "", "action": action,
        "severity": _SEVERITY_BY_ACTION[decision.action],
        "failure_class": rc.failure_class.value if rc else "", "rule_id": rc.rule_id if rc else ""}
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

    Labels add ``event: custom_message`` and ``alertname: ftwatch_custom_message``.
    """
    origin = Origin(instance or "job", rank, job, node, "sdk", "sdk")
    finding = Finding("custom_message", "custom_message", FailureClass.INFO, Action.NOTIFY,
                      Severity.WARNING, origin, content, time,
                      source="ftwatch.sdk Monitor.send_custom_message")
    decision = Decision(time, Action.NOTIFY, Target(job, instance, rank, node), finding,
                        "custom message from the training code (send_custom_message)",
                        restarts_used, restarts_left, attempt=attempt)
    alert = alert_from_decision(decision, link)
    assert alert is not None
    who = f"rank {rank}" if rank is not None else (instance or "the job")
    labels = {**alert.labels, "alertname": "ftwatch_custom_message", "event": "custom_message",
              "rule_id": "custom_message"}
    annotations = {**alert.annotations, "summary": f"custom message from {who} of job {job}: {content}"}
    return replace(alert, labels=labels, annotations=annotations)


def template_context(alert: Alert, language: str = "en") -> dict[str, Any]:
    """The plain values a template sees (see the module docstring for the names)."""
    words = _WORDS.get(language, _WORDS["en"])
    d = alert.decision
    rc = d.root_cause
    root = None
    if rc is not None:
        root = {
            "line": rc.line, "instance": rc.origin.instance, "rank": rc.rank,
            "node": rc.origin.node, "time": iso(rc.time), "rule_id": rc.rule_id,
            "failure_class": rc.failure_class.value,
            "failure_class_text": words["failure_class"].get(rc.failure_class.value,
                                                             rc.failure_class.value),
            "severity": rc.severity.name.lower(), "source": rc.source,
            "evidence": list(rc.evidence),
        }
    return {
        "job": d.target.job, "action": d.action.label,
        "action_text": words["action"].get(d.action.label, d.action.label),
        "severity": alert.labels.get("severity", ""), "status": alert.status,
        "target": {"job": d.target.job, "instance": d.target.instance,
                   "rank": d.target.rank, "node": d.target.node},
        "root_cause": root,
        "rule_id": root["rule_id"] if root else None,
        "failure_class": root["failure_class"] if root else None,
        "failure_class_text": root["failure_class_text"] if root else None,
        "policy_clause": d.policy_clause, "budgets": dict(alert.budgets),
        "decision_id": d.decision_id, "time": iso(d.time), "attempt": d.attempt,
        "link": alert.annotations.get("explain", ""),
        "labels": dict(alert.labels), "annotations": dict(alert.annotations),
        "summary": alert.annotations.get("summary", ""),
    }


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


class _Loader(jinja2.BaseLoader):
    """Serves ``builtin/<file>`` from the package and ``override/<key>`` from the user's files."""

    def __init__(self, overrides: Mapping[str, Path]):
        self._overrides = overrides

    def get_source(self, environment: jinja2.Environment, template: str):
        origin, _, key = template.partition("/")
        if origin == "builtin":
            res = resources.files("ftwatch.alerting").joinpath("templates", key)
            try:
                source = res.read_text(encoding="utf-8")
            except (FileNotFoundError, OSError):
                raise jinja2.TemplateNotFound(template) from None
            return source, str(res), lambda: True
        path = self._overrides.get(key)
        if origin != "override" or path is None:
            raise jinja2.TemplateNotFound(template)
        try:
            mtime = path.stat().st_mtime
            source = path.read_text(encoding="utf-8")
        except OSError:
            raise jinja2.TemplateNotFound(str(path)) from None

        def uptodate() -> bool:
            try:
                return path.stat().st_mtime == mtime
            except OSError:
                return False
        return source, str(path), uptodate


def _finalize(value: Any) -> Any:
    return "-" if value is None else value


class TemplateRenderer:
    """Renders an alert's text per receiver kind in one language.

    Args:
        language: ``en`` or ``zh``.
        overrides: user template files, keyed ``<kind>`` (used for this renderer's language)
            or ``<kind>.<language>``; they win over the built-ins. A kind with no template
            of its own uses the ``webhook`` text.

    Raises:
        TemplateError: for an unknown language or a malformed override key.
    """

    def __init__(self, language: str = "en", overrides: Mapping[str, Path] | None = None):
        if language not in LANGUAGES:
            raise TemplateError(Issue("<config>", 0, f"unknown alert language {language!r}; "
                                                     f"expected one of {', '.join(LANGUAGES)}"))
        self.language = language
        self.overrides = {k: Path(v) for k, v in (overrides or {}).items()}
        bad = [k for k in self.overrides
               if not re.fullmatch(r"[a-z][a-z0-9_]*(\.(%s))?" % "|".join(LANGUAGES), k)]
        if bad:
            raise TemplateError([Issue(str(self.overrides[k]), 0, f"bad template key {k!r}: "
                                       "expected <kind> or <kind>.<language>") for k in bad])
        self._env = ImmutableSandboxedEnvironment(
            loader=_Loader(self.overrides), undefined=jinja2.StrictUndefined, autoescape=False,
            finalize=_finalize, trim_blocks=True, lstrip_blocks=True)

    def template_name(self, kind: str, language: str | None = None,
                      builtin_only: bool = False) -> str:
        """The loader name of the template used for ``kind`` (``override/..`` or ``builtin/..``)."""
        lang = language or self.language
        if not builtin_only:
            for key in (f"{kind}.{lang}", kind if lang == self.language else None):
                if key and key in self.overrides:
                    return f"override/{key}"
        if kind not in BUILTIN_KINDS:
            kind = GENERIC_KIND
        return f"builtin/{kind}.{lang}.j2"

    def render(self, kind: str, alert: Alert, *, builtin_only: bool = False) -> str:
        """Render the text of ``alert`` for a receiver of ``kind``.

        Args:
            kind: the receiver kind (``console``, ``webhook``, ``dingtalk`` ...).
            alert: the alert.
            builtin_only: ignore overrides (the fallback when an override is broken).

        Returns:
            The text, without leading or trailing blank lines.

        Raises:
            TemplateError: a syntax error, an undefined variable, an access the sandbox
                blocks, or a missing file; the issue carries the file and line.
        """
        return self._render(self.template_name(kind, builtin_only=builtin_only), alert,
                            self.language)

    def check(self) -> list[Issue]:
        """Render every built-in template (both languages) and every override against
        :func:`sample_alert`; return the problems found (empty when all is well)."""
        issues: list[Issue] = []
        alert = sample_alert()
        names = [(f"builtin/{k}.{lang}.j2", lang) for k in BUILTIN_KINDS for lang in LANGUAGES]
        for key in self.overrides:
            _, _, lang = key.partition(".")
            names.append((f"override/{key}", lang or self.language))
        for name, lang in names:
            try:
                self._render(name, alert, lang)
            except TemplateError as exc:
                issues.extend(exc.issues)
        return issues

    def _render(self, name: str, alert: Alert, language: str) -> str:
        filename = name
        try:
            template = self._env.get_template(name)
            filename = template.filename or name
            text = template.render(template_context(alert, language))
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(Issue(exc.filename or filename, exc.lineno or 0,
                                      f"template syntax error: {exc.message}")) from None
        except jinja2.TemplateNotFound as exc:
            path = str(self.overrides.get(name.partition("/")[2], exc.name))
            raise TemplateError(Issue(path, 0, "template file not found or unreadable")) from None
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(Issue(filename, _template_line(exc, filename),
                                      f"blocked by the template sandbox: {exc}")) from None
        except jinja2.UndefinedError as exc:
            raise TemplateError(Issue(filename, _template_line(exc, filename),
                                      f"undefined variable: {exc.message}")) from None
        except Exception as exc:  # noqa: BLE001 - any template bug becomes a TemplateError
            raise TemplateError(Issue(filename, _template_line(exc, filename),
                                      f"{type(exc).__name__}: {exc}")) from None
        return text.strip("\n")


def _template_line(exc: BaseException, filename: str) -> int:
    """The template line of a render-time error (Jinja2 rewrites the traceback to it)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == filename and frame.lineno:
            return frame.lineno
    return 0
