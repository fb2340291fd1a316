"""The one place a Config becomes components: the rules, the store (SQLite, plus
Elasticsearch when configured), the recorder with its event center and receivers.
A hub: it wires every stage together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftwatch.errors import ConfigError


def build_rules(config):
    """The built-in packs (unless ``rules.builtin`` is off), the rule files, and the retryable
    keywords as rules. Raises RuleError naming file:line."""
    from ftwatch.rules.loader import load_rules, rules_from_keywords
    rules = load_rules(config.rules.files, builtin=config.rules.builtin)
    if config.rules.retryable_errors:
        rules += rules_from_keywords(list(config.rules.retryable_errors))
    return rules

def build_store(config: Any, state_dir: Path) -> Any:
    """The store the recorder writes to: the SQLite store, fanned out to Elasticsearch when
    ``storage.elasticsearch`` is set (its background flusher started).

    Raises:
        ConfigError: the Elasticsearch buffer directory cannot be used (e.g. another ftwatch
            holds it).
    """
    from ftwatch.pipeline.sinks.sqlite import SqliteStore
    sqlite = SqliteStore(Path(config.storage.sqlite) if config.storage.sqlite else state_dir / "ftwatch.db")
    es_cfg = config.storage.elasticsearch
    if es_cfg is None:
        return sqlite
    from ftwatch.pipeline.sinks.elasticsearch.sink import ElasticsearchSink
    from ftwatch.pipeline.sinks.fanout import FanOut
    from ftwatch.errors import SinkError
    try:
        sink = ElasticsearchSink.from_config(es_cfg, state_dir)
    except SinkError as exc:
        sqlite.close()
        raise ConfigError(f"storage.elasticsearch: {exc}") from None
    sink.start(es_cfg.flush_interval)
    return FanOut(sqlite, [sink])

def build_recorder(config, state_dir: Path, decisions_file: Path | None, out=None):
    """The Recorder of a run or watch: the store (SQLite, plus Elasticsearch when configured),
    the decisions file, and the alert path: the event center (``alerting.dispatch``) in front of
    the sender (``alerting.notify``: receivers, rate limits, spool, one delivery thread per
    receiver). Alerts an earlier run spooled or left waiting in a group are sent now."""
    from ftwatch.alerting.dispatch import EventCenter
    from ftwatch.alerting.notifiers import build_notifiers
    from ftwatch.alerting.notify import Sender
    from ftwatch.alerting.ratelimit import RateLimiter
    from ftwatch.alerting.rendering import TemplateRenderer
    from ftwatch.alerting.spool import Spool
    from ftwatch.clock import SystemClock
    from ftwatch.pipeline.recorder import Recorder
    state_dir.mkdir(parents=True, exist_ok=True)
    store = build_store(config, state_dir)
    alerting = config.alerting
    now = SystemClock().time
    notifiers = build_notifiers(alerting.receivers, out=out)
    limiter = RateLimiter.from_config(alerting.rate_limits, {n.name: n.kind for n in notifiers}, now(),
                                      state_dir / "ratelimit.json")
    renderer = TemplateRenderer(alerting.language, {k: Path(v) for k, v in alerting.templates.items()})
    sender = Sender(notifiers, renderer, Spool(state_dir / "spool"), limiter=limiter,
                    background=True, language=alerting.language)   # deciding and acting never wait on a receiver (N4)
    center = EventCenter(alerting, sender, now, state_dir)
    recorder = Recorder(store, decisions_file, center, out=out, state_dir=state_dir,
                        resolve_after=resolve_after_of(config),
                        output_bucket=config.storage.metrics.output_bucket,
                        link_url=alerting.link_url)
    sender.resend_pending()                  # alerts spooled by an earlier run, to the workers
    center.recover()                         # alerts an earlier run left waiting in a group
    recorder.collect()
    return recorder

def resolve_after_of(config) -> float:
    """Seconds without a new incident before open alerts resolve: the smallest ``resolve_after``
    of the Alertmanager receivers, else the recorder's default (300)."""
    from ftwatch.pipeline.recorder import RESOLVE_AFTER
    values = [r.resolve_after for r in config.alerting.receivers if r.type == "alertmanager"]
    return min(values, default=RESOLVE_AFTER)
