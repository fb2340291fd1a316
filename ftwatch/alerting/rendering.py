"""An alert's text, rendered from Jinja2 templates per receiver kind and language (SPEC N1, Q2).

Templates are rendered in a Jinja2 ``ImmutableSandboxedEnvironment`` with ``StrictUndefined``
and autoescape off (the output is text). Built-in templates live in ``templates/`` as
``<kind>.<language>.j2``, one per receiver kind (console, webhook, dingtalk, feishu, wecom,
slack, email, alertmanager) and language (en, zh). The first line of the output is the title
(the email's Subject, the Alertmanager ``summary``, the chat card's header); the rest is the
body. A template sees only plain values (str, int, None, dicts, lists):

=====================  ===================================================================
``job``                the job id
``action``             wire name (``restart_job``); ``action_text`` the words for it
``severity``           ``critical`` / ``warning`` / ``info``; ``status`` ``firing``/``resolved``
``target``             dict: ``job``, ``instance``, ``rank``, ``node`` (None = whole job)
``root_cause``         dict: ``line``, ``instance``, ``rank``, ``node``, ``time`` (ISO),
                       ``rule_id``, ``failure_class``, ``failure_class_text``, ``severity``,
                       ``source``, ``evidence`` (list of str); or None (a fail_job after
                       the job ended by itself): guard it with ``{% if root_cause %}``
``rule_id``            the root cause's rule, or None; ``failure_class`` / ``failure_class_text``
``policy_clause``      the clause that chose the action
``budgets``            dict: ``restarts_used``, ``restarts_left``
``decision_id``        16 hex digits; ``time`` the decision's ISO time; ``attempt`` (int)
``link``               the ``ftwatch explain`` / ``ftwatch report`` command, or the
                       ``alerting.link_url`` URL
``labels``             the alert's labels; ``annotations`` its annotations; ``summary``
``event_type``         ``job_restart``, ``job_hang``, ``node_isolated``, ``job_failed``,
                       ``custom_message``, ``notice``, ``straggler``, ``new_signature``...
                       (``ftwatch.alerting.alerts.event_type_of``); ``event_text`` the words
                       for it where there are some (``new_signature``), else the wire name
=====================  ===================================================================

None renders as ``-``. Filters besides Jinja2's: ``mrkdwn`` escapes ``& < >`` for Slack
(Slack: "Formatting text for app surfaces", escaping), ``oneline`` folds whitespace runs and
newlines into one space.
"""


from __future__ import annotations

import re
import traceback
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ftwatch.alerting.alerts import (Alert, alert_from_custom_message, alert_from_decision, alert_from_signature,
                                     explain_command, sample_alert)
from ftwatch.errors import Issue, TemplateError
from ftwatch.events import Action, Decision, Target, iso

LANGUAGES = ("en", "zh")
BUILTIN_KINDS = ("console", "webhook", "dingtalk", "feishu", "wecom", "slack", "email",
                 "alertmanager")
GENERIC_KIND = "webhook"
"""Kinds with no template of their own use this kind's text."""

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
        "fallout": "fallout of another failure", "info": "information"},
        "event_type": {"new_signature": "new failure signature"}},
    "zh": {"action": {
        "none": "不处理", "notify": "通知人工确认", "restart_instance": "重启单个实例",
        "restart_in_place": "原地重启进程", "restart_job": "重启整个任务",
        "isolate_node": "隔离节点并在其他节点重启", "fail_job": "终止任务（失败）"},
        "failure_class": {
        "retryable_infra": "可重试的基础设施故障", "hardware_node": "节点硬件故障",
        "user_code": "用户代码错误", "oom": "内存不足（OOM）", "hang": "任务卡死",
        "straggler": "慢节点", "fallout": "由其他故障引发的连带错误", "info": "提示信息"},
        "event_type": {"new_signature": "新的故障特征"}},
}


def template_context(alert: Alert, language: str = "en") -> dict[str, Any]:
    """The plain values a template sees (see the module docstring for the names). An alert made
    from no decision (a custom message) gives the same names, read from its labels and
    annotations."""
    words = _WORDS.get(language, _WORDS["en"])
    d = alert.decision
    root = _root(d.root_cause, words) if d is not None else _root_of_labels(alert, words)
    if d is not None:
        job, action, clause, when, attempt = d.target.job, d.action.label, d.policy_clause, d.time, d.attempt
        target = {"job": d.target.job, "instance": d.target.instance, "rank": d.target.rank,
                  "node": d.target.node}
    else:
        labels = alert.labels
        job, action, clause = labels.get("job", ""), labels.get("action", ""), alert.annotations.get("description", "")
        when, attempt = alert.starts_at, int(alert.budgets.get("attempt", 0))
        target = {"job": job, "instance": labels.get("instance") or None,
                  "rank": _int_or_none(labels.get("rank")), "node": labels.get("node") or None}
    return {
        "job": job, "action": action,
        "action_text": words["action"].get(action, action),
        "severity": alert.labels.get("severity", ""), "status": alert.status,
        "target": target,
        "root_cause": root,
        "rule_id": root["rule_id"] if root else None,
        "failure_class": root["failure_class"] if root else None,
        "failure_class_text": root["failure_class_text"] if root else None,
        "policy_clause": clause, "budgets": dict(alert.budgets),
        "decision_id": alert.decision_id, "time": iso(when), "attempt": attempt,
        "link": alert.annotations.get("explain", ""),
        "labels": dict(alert.labels), "annotations": dict(alert.annotations),
        "summary": alert.annotations.get("summary", ""),
        "event_type": alert.event_type,
        "event_text": words["event_type"].get(alert.event_type, alert.event_type),
    }


def _root(rc: Any, words: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``root_cause`` a template sees, from a decision's root-cause Finding (or None)."""
    if rc is None:
        return None
    return {
        "line": rc.line, "instance": rc.origin.instance, "rank": rc.rank,
        "node": rc.origin.node, "time": iso(rc.time), "rule_id": rc.rule_id,
        "failure_class": rc.failure_class.value,
        "failure_class_text": words["failure_class"].get(rc.failure_class.value, rc.failure_class.value),
        "severity": rc.severity.name.lower(), "source": rc.source,
        "evidence": list(rc.evidence),
    }


def _root_of_labels(alert: Alert, words: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``root_cause`` of an alert made from no decision: its ``root_cause_*`` annotations and
    its labels (None without a ``root_cause_line``)."""
    a, labels = alert.annotations, alert.labels
    if not a.get("root_cause_line"):
        return None
    klass = labels.get("failure_class", "")
    return {
        "line": a["root_cause_line"], "instance": a.get("root_cause_instance", ""),
        "rank": _int_or_none(a.get("root_cause_rank")), "node": labels.get("node") or None,
        "time": a.get("root_cause_time", ""), "rule_id": labels.get("rule_id", ""),
        "failure_class": klass, "failure_class_text": words["failure_class"].get(klass, klass),
        "severity": a.get("root_cause_severity", ""), "source": a.get("root_cause_source", ""),
        "evidence": [],
    }


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text else None


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


def _mrkdwn(value: Any) -> str:
    """Escape ``& < >`` for Slack mrkdwn (None -> ``-``)."""
    text = "-" if value is None else str(value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _oneline(value: Any) -> str:
    """Fold whitespace runs (newlines included) into single spaces (None -> ``-``)."""
    return "-" if value is None else " ".join(str(value).split())


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
        self._env.filters.update(mrkdwn=_mrkdwn, oneline=_oneline)

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
        """Render every built-in template (every kind, both languages) and every override
        against the sample alerts (:func:`sample_alerts`: firing, resolved, a custom message, a
        ``fail_job`` without a root cause);
        return the problems found (empty when all is well; one issue per template at most)."""
        issues: list[Issue] = []
        names = [(f"builtin/{k}.{lang}.j2", lang) for k in BUILTIN_KINDS for lang in LANGUAGES]
        for key in self.overrides:
            _, _, lang = key.partition(".")
            names.append((f"override/{key}", lang or self.language))
        for name, lang in names:
            for alert in sample_alerts():
                try:
                    self._render(name, alert, lang)
                except TemplateError as exc:
                    issues.extend(exc.issues)
                    break
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


def sample_alerts() -> list[Alert]:
    """The alerts ``check`` renders: :func:`sample_alert` firing and resolved, a custom message
    from the training code, and a ``fail_job`` without a root cause (``root_cause`` is None: the
    job ended by itself with a failure, ``ftwatch.policy.policy.Policy.finished``), so a template
    that uses ``root_cause.line`` unguarded fails at ``check`` time, not at 3 a.m.; and a
    ``new_signature`` alert (``ftwatch.mining``), also made from no decision."""
    alert = sample_alert()
    custom = alert_from_custom_message("demo-job", "loss is NaN at step 1200", alert.starts_at,
                                       alert.annotations["explain"], instance="worker-0",
                                       rank=0, node="node-a", restarts_used=1, restarts_left=2)
    ended = Decision(alert.starts_at + 600.0, Action.FAIL_JOB, Target("demo-job"), None,
                     "the job ended by itself with a failure → fail_job", 3, 0, attempt=3)
    failed = alert_from_decision(ended, explain_command(".ftwatch-state", ended.decision_id))
    assert failed is not None
    signature = SimpleNamespace(id=7, template="RuntimeError: shard <NUM> of <PATH> is corrupt", count=9,
                                jobs=["job-1", "job-2", "job-3"], nodes=["node-a"],
                                examples=["[rank3]: RuntimeError: shard 12 of /data/s12 is corrupt"],
                                top=lambda what: {"rules": "python.uncaught_exception", "actions": "fail_job"}[what])
    new = alert_from_signature(signature, alert.starts_at + 900.0, "ftwatch mine", job="job-3", node="node-a")
    return [alert, alert.resolve(alert.starts_at + 300.0), custom, failed, new]


def _template_line(exc: BaseException, filename: str) -> int:
    """The template line of a render-time error (Jinja2 rewrites the traceback to it)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == filename and frame.lineno:
            return frame.lineno
    return 0
