"""The one config model (SPEC M4) and the AIMaster flag dialect (SPEC M1).

A config file is YAML; every section is a pydantic model with ``extra="forbid"``, so an unknown
key is an error. ``load_config`` reports every problem at once, each with the ``file:line`` of the
offending key, as one ``ConfigError``. The ``policy`` section and ``parse_aimaster_flags`` (the
PAI-DLC AIMaster flags verbatim, seed ``000``, "全量参数说明") live in ``ftwatch.config.policy``
and are re-exported here.

Paths the config refers to (``rules.files``, ``alerting.templates``) are relative to the config
file's folder; ``storage`` paths are relative to the working directory, like ``--state-dir``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ftwatch.config.receivers import (CHATBOT_RECEIVERS, OTHER_RECEIVERS, AlertmanagerReceiver, DingTalkReceiver,
                                    EmailReceiver, FeishuReceiver, SlackReceiver, WeComReceiver)
from ftwatch.config.metrics import MetricsConfig
from ftwatch.config.recovery import ModelArtsConfig, RecoveryConfig
from ftwatch.config.mindcluster import MindClusterConfig
from ftwatch.config.policy import AIMASTER_FLAGS, PolicyConfig, parse_aimaster_flags
from ftwatch.config.reference import flat_args, model_reference
from ftwatch.config.storage import ElasticsearchConfig
from ftwatch.config.routes import CROSS_REFERENCE, Duration, EventCenterFields, reference_problems
from ftwatch.config.slurm import SlurmConfig
from ftwatch.config.supervisor import SupervisorConfig
from ftwatch.config.health import HealthConfig
from ftwatch.config.phases import PhasesConfig
from ftwatch.config.limits import LimitsConfig
from ftwatch.config.watch import WatchConfig
from ftwatch.errors import ConfigError, Issue
from ftwatch.config.yamlsource import Loc, line_index, parse_yaml, read_yaml_text
from ftwatch.config.yamlsource import dotted as _dotted

__all__ = ["AIMASTER_FLAGS", "AlertingConfig", "Config", "ConsoleReceiver", "JobConfig", "PolicyConfig",
           "MiningConfig", "RulesConfig", "StorageConfig", "SupervisorConfig", "WebhookReceiver", "config_reference",
           "load_config", "parse_aimaster_flags"]

_STRICT = ConfigDict(extra="forbid")
_AIMASTER = "AIMaster doc (seeds/000), 全量参数说明"


class JobConfig(BaseModel):
    """Which job this is."""

    model_config = _STRICT
    id: str | None = Field(None, description="The job id; null: the caller derives one (e.g. from the command).")


class RulesConfig(BaseModel):
    """Which rules run."""

    model_config = _STRICT
    builtin: bool = Field(True, description="Load the built-in rule packs.")
    files: list[Path] = Field(default_factory=list, description="Extra rule YAML files.")
    retryable_errors: list[str] = Field(
        default_factory=list, description="Extra retryable keywords (AIMaster set_retryable_errors).")


class ConsoleReceiver(BaseModel):
    """Alerts printed to the console."""

    model_config = _STRICT
    type: Literal["console"] = Field(description="Receiver kind.")
    name: str = Field(description="Unique receiver name.")


class WebhookReceiver(BaseModel):
    """Alerts POSTed as JSON to a URL (the URL and headers may hold secrets: never printed)."""

    model_config = _STRICT
    type: Literal["webhook"] = Field(description="Receiver kind.")
    name: str = Field(description="Unique receiver name.")
    url: str = Field(repr=False, pattern=r"^https?://", description="http(s) URL to POST to.")
    headers: dict[str, str] = Field(default_factory=dict, repr=False, description="Extra HTTP headers.")
    timeout: float = Field(5.0, gt=0, description="Seconds per request.")
    max_retries: int = Field(3, ge=0, description="Retries before the alert is spooled.")


Receiver = Annotated[Union[ConsoleReceiver, WebhookReceiver, DingTalkReceiver, FeishuReceiver, WeComReceiver,
                           SlackReceiver, EmailReceiver, AlertmanagerReceiver], Field(discriminator="type")]
RECEIVER_MODELS: dict[str, type[BaseModel]] = {
    "console": ConsoleReceiver, "webhook": WebhookReceiver, **CHATBOT_RECEIVERS, **OTHER_RECEIVERS}
RECEIVER_TYPES = tuple(RECEIVER_MODELS)


class AlertingConfig(EventCenterFields):
    """Where alerts go and how they read; the event center's keys (route, mute windows, inhibit
    rules, rate limits, digest) come from ``ftwatch.config.routes.EventCenterFields``."""

    model_config = _STRICT
    language: Literal["en", "zh"] = Field("en", description="Alert language.")
    receivers: list[Receiver] = Field(
        default_factory=lambda: [ConsoleReceiver(type="console", name="console")],
        description="Receivers (a `type:` each); default: one console receiver.")
    templates: dict[str, Path] = Field(
        default_factory=dict, description="`<receiver type>` or `<receiver type>.<en|zh>` -> template file "
        "that overrides the built-in one (the bare type: for `language`).")
    link_url: str | None = Field(
        None, description="URL template for each alert's link, e.g. `https://reports/{job}/{decision_id}` "
        "(also {instance} {rank} {node} {event_type}); null: the `ftwatch explain`/`report` command.")

    @field_validator("link_url")
    @classmethod
    def _link_fields(cls, value: str | None) -> str | None:
        import string

        from ftwatch.config.routes import LINK_FIELDS
        if value is None:
            return value
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
        except ValueError as exc:
            raise ValueError(f"bad link_url template: {exc}") from None
        unknown = sorted(names - set(LINK_FIELDS))
        if unknown:
            raise ValueError(f"link_url: unknown placeholder(s) {unknown}; known: {', '.join(LINK_FIELDS)}")
        return value

    @field_validator("templates")
    @classmethod
    def _template_types(cls, value: dict[str, Path]) -> dict[str, Path]:
        unknown = sorted(k for k in value
                         if k.partition(".")[0] not in RECEIVER_TYPES or k.partition(".")[2] not in ("", "en", "zh"))
        if unknown:
            raise ValueError(f"templates for unknown receiver types {unknown}; expected <type> or <type>.<en|zh>, "
                             f"types: {list(RECEIVER_TYPES)}")
        return value


class MiningConfig(BaseModel):
    """Failure-signature mining (SPEC T5, ``ftwatch.mining``): the evidence of catch-all decisions
    grouped into templates under ``<state_dir>/mining/``."""

    model_config = _STRICT
    enabled: bool = Field(True, description="Mine the evidence of catch-all decisions (ftwatch mine reads it).")
    new_signature_jobs: int = Field(3, ge=1, description="A signature seen in this many jobs sends a "
                                                         "new_signature event.")


class StorageConfig(BaseModel):
    """Where state and events are kept."""

    model_config = _STRICT
    state_dir: Path = Field(Path(".ftwatch-state"), description="Budgets, spool and offsets live here.")
    sqlite: Path | None = Field(None, description="SQLite event store; null: <state_dir>/ftwatch.db.")
    sqlite_retention: Duration | None = Field(
        90 * 86400.0, gt=0, description="Delete a job from the SQLite store once the store has not written "
        "it for this long (e.g. 90d; by the clock, so a replayed old log counts as new), and a run of a job "
        "(not its newest) the same way; null: keep every job and run. The default matches "
        "storage.elasticsearch.retention.")
    elasticsearch: ElasticsearchConfig | None = Field(None, description="Also write to Elasticsearch; null: SQLite only.")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig,
                                   description="Prometheus endpoint and output counts (ftwatch.config.metrics).")
    mining: MiningConfig = Field(default_factory=MiningConfig,
                                 description="Failure-signature mining of catch-all decisions (ftwatch mine).")

    @property
    def sqlite_path(self) -> Path:
        """The SQLite file: ``sqlite`` or ``<state_dir>/ftwatch.db``."""
        return self.sqlite if self.sqlite is not None else self.state_dir / "ftwatch.db"


class Config(BaseModel):
    """The whole config file."""

    model_config = _STRICT
    job: JobConfig = Field(default_factory=JobConfig, description="The job.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="AIMaster policy flags.")
    supervisor: SupervisorConfig = Field(default_factory=SupervisorConfig, description="Local workers.")
    rules: RulesConfig = Field(default_factory=RulesConfig, description="Rules.")
    alerting: AlertingConfig = Field(default_factory=AlertingConfig, description="Alerting.")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Storage.")
    watch: WatchConfig = Field(default_factory=WatchConfig, description="ftwatch watch: sources, identity, actuator.")
    modelarts: ModelArtsConfig = Field(default_factory=ModelArtsConfig, description="ModelArts recovery (D4).")
    recovery: RecoveryConfig = Field(default_factory=RecoveryConfig, description="Escalation and node blame.")
    mindcluster: MindClusterConfig = Field(default_factory=MindClusterConfig,
                                           description="MindCluster recover-strategy (seed 004).")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Health checks (H1-H3).")
    phases: PhasesConfig = Field(default_factory=PhasesConfig, description="Phases from log lines (R6): hang intervals.")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="The Slurm actuator (run --actuator "
                               "slurm, watch.actuator.type slurm).")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Caps on kept state (issue 17).")

    def with_policy(self, **overrides: Any) -> "Config":
        """A validated copy with some ``policy`` fields replaced (e.g. from ``parse_aimaster_flags``).

        Raises:
            ConfigError: an override is unknown or invalid (file ``<overrides>``).
        """
        data = self.policy.model_dump() | overrides
        try:
            policy = PolicyConfig.model_validate(data)
        except ValidationError as exc:
            raise ConfigError([Issue("<overrides>", 0, f"policy.{_dotted(e['loc'])}: {e['msg']}")
                               for e in exc.errors()]) from None
        return self.model_copy(update={"policy": policy})


# --------------------------------------------------------------------------- loading (the YAML itself: ftwatch.config.yamlsource)

def _locate(loc: Loc, lines: dict[Loc, int]) -> tuple[Loc, int]:
    """Map a pydantic error location to (data path, line), skipping union tags."""
    path: Loc = ()
    for part in loc:
        if path + (part,) in lines:
            path = path + (part,)
    return path, lines.get(path, 0)


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class a pydantic location points into (for "did you mean")."""
    model: Any = Config
    for part in loc:
        if isinstance(part, int):
            continue
        if part in RECEIVER_MODELS and model in RECEIVER_MODELS.values():
            model = RECEIVER_MODELS[part]
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()} if isinstance(model, type) else {}
        field = fields.get(part)
        if field is None:
            return None
        model = next((a for a in flat_args(field.annotation)
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return model if isinstance(model, type) else None


def _message(err: dict[str, Any], path: Loc) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        model = _model_at(loc[:-1])
        key = str(loc[-1])
        allowed = [f.alias or n for n, f in model.model_fields.items()] if model else []
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; allowed: {', '.join(allowed)}" if allowed else "")
        return f"{_dotted(path)}: unknown key{hint}"
    if err["type"] == "missing":
        return f"{_dotted(path + loc[-1:])}: required key is missing"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{_dotted(path)}: {msg}"


def load_config(path: str | Path) -> Config:
    """Load and validate a YAML config file.

    Args:
        path: the file. An empty file (or one holding only comments) gives the defaults.

    Returns:
        The validated ``Config``; relative ``rules.files`` and ``alerting.templates`` are resolved
        against the file's folder.

    Raises:
        ConfigError: every problem found (YAML syntax, duplicate keys, unknown keys, bad values,
            missing referenced files), each as an ``Issue(file, line, message)``.
    """
    path = Path(path)
    file = str(path)
    try:
        text = read_yaml_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(Issue(file, 0, f"cannot read: {exc}")) from None
    data, issues = parse_yaml(text, file, paths=True, merge_keys=False)
    if data is None and issues:        # it does not parse
        raise ConfigError(issues)
    lines = line_index(data)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(issues + [Issue(file, 1, "the top level must be a mapping of sections")])
    issues += _check_files(data, path.parent, lines, file)
    issues += _check_references(data, lines, file)
    config = None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == CROSS_REFERENCE:     # the second pass has them, each at its line
                continue
            where, line = _locate(tuple(err["loc"]), lines)
            issues.append(Issue(file, line, _message(err, where)))
    if issues:
        raise ConfigError(sorted(issues, key=lambda i: i.line))
    assert config is not None
    return config.model_copy(update={
        "rules": config.rules.model_copy(update={"files": [_under(path.parent, p) for p in config.rules.files]}),
        "alerting": config.alerting.model_copy(update={
            "templates": {k: _under(path.parent, p) for k, p in config.alerting.templates.items()}}),
    })


def _under(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else base / p


def _check_files(data: dict[str, Any], base: Path, lines: dict[Loc, int], file: str) -> list[Issue]:
    """Second pass, on the raw data so it runs even when validation fails: referenced files exist."""
    refs: list[tuple[Loc, Any]] = []
    rules, alerting = data.get("rules"), data.get("alerting")
    if isinstance(rules, dict) and isinstance(rules.get("files"), list):
        refs += [(("rules", "files", i), p) for i, p in enumerate(rules["files"])]
    if isinstance(alerting, dict) and isinstance(alerting.get("templates"), dict):
        refs += [(("alerting", "templates", k), p) for k, p in alerting["templates"].items()]
    return [Issue(file, lines.get(loc, 0), f"{_dotted(loc)}: no such file: {_under(base, Path(p))}")
            for loc, p in refs if isinstance(p, str) and not _under(base, Path(p)).is_file()]


def _check_references(data: dict[str, Any], lines: dict[Loc, int], file: str) -> list[Issue]:
    """Second pass, on the raw data so it runs even when validation fails: the alerting
    cross-references (``ftwatch.config.routes.reference_problems``), each at the line of the key
    or item that refers."""
    issues = []
    for loc, message in reference_problems(data.get("alerting")):
        full = ("alerting",) + loc
        issues.append(Issue(file, _locate(full, lines)[1], f"{_dotted(full)}: {message}"))
    return issues


# --------------------------------------------------------------------------- reference table

def config_reference() -> str:
    """A Markdown table of every config key: key, type (with bounds), default and description.

    Generated from the models' ``Field(description=...)`` (see ``ftwatch.config.reference``), so the
    README never drifts.
    """
    return model_reference(Config, f"Policy defaults and meanings: {_AIMASTER}.")
