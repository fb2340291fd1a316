"""``ftwatch check`` (T1): validate the config, rule files, fault tables and templates at once.

Every problem is collected (file:line where known); nothing stops at the first error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from ftwatch.cli.common import ArgumentParser
from ftwatch.errors import ConfigError, Issue


def run_checks(config_path: str | None, rule_files: Sequence[str] = ()) -> tuple[list[Issue], str]:
    """Check everything the config names, plus ``rule_files``.

    Returns:
        (every issue found, a one-line summary of what was checked).
    """
    from ftwatch.config.model import Config, load_config
    issues: list[Issue] = []
    config = Config()
    if config_path:
        try:
            config = load_config(config_path)
        except ConfigError as exc:
            issues.extend(exc.issues)
            rule_files = [*_raw_rule_files(config_path), *rule_files]

    files = list(config.rules.files) + list(rule_files)
    rules: list = []
    for f in files:
        if not Path(f).exists():
            issues.append(Issue(str(f), 0, "rule file not found"))
    try:
        from ftwatch.rules.loader import load_rules
        rules = load_rules([f for f in files if Path(f).exists()], builtin=config.rules.builtin)
    except ConfigError as exc:
        issues.extend(exc.issues)
    if rules:
        from ftwatch.rules.testrules import run_rule_tests
        for failure in run_rule_tests(rules):
            file, _, line = (failure.location or "?:0").rpartition(":")
            issues.append(Issue(file or failure.location, int(line) if line.isdigit() else 0,
                                f"rule {failure.rule_id}: {failure.message}"))

    try:
        from ftwatch.rules.faultcodes import FaultTables
        FaultTables.load()
    except (OSError, ValueError, ConfigError) as exc:
        issues.append(Issue("fault tables", 0, str(exc)))

    issues.extend(step_pattern_issues(config, config_path))

    from ftwatch.alerting.rendering import TemplateRenderer
    try:
        renderer = TemplateRenderer(config.alerting.language,
                                    {k: Path(v) for k, v in config.alerting.templates.items()})
        issues.extend(renderer.check())
    except ConfigError as exc:
        issues.extend(exc.issues)

    summary = (f"ok: config {config_path or '(defaults)'}, {len(rules)} rules "
               f"({len(files)} extra files), fault tables, templates ({config.alerting.language})")
    return issues, summary


def step_pattern_issues(config, config_path: str | Path | None = None) -> list[Issue]:
    """The custom ``health.straggler.patterns`` that the engine's matcher cannot compile (hyperscan /
    RE2: no lookaround, no backreferences...), each an Issue at its config file:line (0 unknown).

    The config layer checks them as Python regexes only (it cannot import the rules stage); the
    engine joins them to its one database, so they are checked here, by the matcher itself."""
    from ftwatch.config.health import STEP_PATTERNS
    custom = [(i, p) for i, p in enumerate(config.health.straggler.patterns) if p not in STEP_PATTERNS]
    if not custom or not config.health.straggler.enabled:
        return []                      # the built-in ones are tested (tests/health/test_stragglers.py)
    from ftwatch.rules.stragglers import scan_form
    from ftwatch.rules.matcher import Matcher
    from ftwatch.rules.model import Pattern
    lines: dict = {}
    file = str(config_path) if config_path else "<config>"
    if config_path:
        from ftwatch.config.yamlsource import line_index, parse_yaml, read_yaml_text
        try:
            data, _ = parse_yaml(read_yaml_text(config_path), file, paths=True, merge_keys=False)
            lines = line_index(data) if data is not None else {}
        except (OSError, UnicodeDecodeError):
            lines = {}
    issues = []
    for i, pattern in custom:
        why = Matcher.check(Pattern(scan_form(pattern), regex=True))
        if why is not None:
            line = lines.get(("health", "straggler", "patterns", i), lines.get(("health", "straggler", "patterns"), 0))
            issues.append(Issue(file, line, f"health.straggler.patterns[{i}]: {pattern!r} does not compile in the "
                                f"engine's matcher: {why}"))
    return issues


def check_step_patterns(config, config_path: str | Path | None = None) -> None:
    """Raise ConfigError (file:line) when a custom step pattern cannot join the engine's database
    (:func:`step_pattern_issues`); for the commands that build an engine (run, watch, replay)."""
    issues = step_pattern_issues(config, config_path)
    if issues:
        raise ConfigError(issues)


def _raw_rule_files(config_path: str) -> list[str]:
    """``rules.files`` read straight from a config that failed validation, so they get checked too."""
    from ftwatch.config.yamlsource import parse_yaml, read_yaml_text
    try:            # bounded like every config read (issue 17); a bad document gives no files
        raw = parse_yaml(read_yaml_text(config_path), str(config_path))[0] or {}
        files = (raw.get("rules") or {}).get("files") or []
        base = Path(config_path).parent
        return [str(f if Path(f).is_absolute() else base / f) for f in files if isinstance(f, str)]
    except (OSError, UnicodeDecodeError, AttributeError, TypeError):
        return []


def explain_route(config_path: str | None, event_file: str, at: float | None = None) -> str:
    """``ftwatch check --route``: where a sample event would go, and why (SPEC N3).

    Args:
        config_path: the config (None: the defaults).
        event_file: JSON of one event ``{"event_type", "severity", "labels": {...}}``, or a list
            of them: the earlier ones fired first (they may inhibit), the last one is routed.
        at: the time to judge mute windows and inhibition at (epoch seconds; None: now).

    Returns:
        A few lines: each matched route (the path of routes passed), receivers, group key and
        timing, rate limits, and whether the event is muted or inhibited.

    Raises:
        ConfigError: a bad config, or an unreadable or invalid event file (file:0).
    """
    import json
    import time
    from datetime import datetime, timezone

    from ftwatch.alerting.alerts import severity_of
    from ftwatch.alerting.ratelimit import RateLimiter
    from ftwatch.alerting.routing import EventView, Inhibitor, MuteWindows, Router
    from ftwatch.config.model import Config, load_config
    from ftwatch.config.routes import EVENT_TYPES, SEVERITIES
    config = load_config(config_path) if config_path else Config()
    try:
        raw = json.loads(Path(event_file).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(Issue(event_file, 0, f"cannot read the event: {exc}")) from None
    events = []
    for i, item in enumerate(raw if isinstance(raw, list) else [raw]):
        if not isinstance(item, dict):
            raise ConfigError(Issue(event_file, 0, f"event {i}: must be an object, got {item!r}"))
        if item.get("event_type") not in EVENT_TYPES:
            got = f"unknown event_type {item['event_type']!r}" if "event_type" in item else "no event_type"
            raise ConfigError(Issue(event_file, 0, f"event {i}: {got}; known: {', '.join(EVENT_TYPES)}"))
        labels = {str(k): str(v) for k, v in (item.get("labels") or {}).items()}
        # a missing severity is the one a real alert of that event type gets
        severity = str(item.get("severity") or labels.get("severity") or severity_of(item["event_type"]))
        if severity not in SEVERITIES:
            raise ConfigError(Issue(event_file, 0, f"event {i}: unknown severity {severity!r}; "
                                                   f"known: {', '.join(SEVERITIES)}"))
        events.append(EventView(item["event_type"], severity, labels))
    at = time.time() if at is None else at
    alerting = config.alerting
    names = [r.name for r in alerting.receivers]
    inhibitor = Inhibitor(alerting.inhibit_rules)
    for i, source in enumerate(events[:-1]):
        inhibitor.observe(f"#{i}", source, at)
    event = events[-1]
    when = datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="seconds")
    labels = " ".join(f"{k}={v}" for k, v in sorted(event.labels.items()))
    out = [f"event: {event.event_type} severity={event.severity} {labels}".rstrip(), f"at: {when}"]
    matches = Router(alerting.route, names).route(event)
    if not matches:
        out.append("route: none (the root route does not match): not sent")
        return "\n".join(out)
    why = inhibitor.inhibited(event, at, f"#{len(events) - 1}")
    limiter = RateLimiter.from_config(alerting.rate_limits, {r.name: r.type for r in alerting.receivers}, at)
    mutes = MuteWindows(alerting.mute_time_intervals)
    for m in matches:
        t = m.timing
        out.append("route: " + " > ".join(m.trail))
        out.append(f"  receivers: {', '.join(m.receivers) or '(none)'}")
        out.append(f"  group key: {m.group_key}")
        out.append(f"  grouping: wait {t.group_wait:g}s, interval {t.group_interval:g}s, "
                   f"repeat {f'{t.repeat_interval:g}s' if t.repeat_interval else 'never'}")
        muted = mutes.active(m.mute_windows, at)
        out.append(f"  muted: yes ({', '.join(muted)})" if muted else
                   f"  muted: no{f' (windows {chr(44).join(m.mute_windows)} not active)' if m.mute_windows else ''}")
        out.append(f"  inhibited: yes, {why}" if why else "  inhibited: no")
        for r in m.receivers:
            window = limiter.windows.get(r)
            if window is not None:
                out.append(f"  rate limit: {r}: {window.messages} messages per {window.per_seconds:g}s")
    verdict = "not sent (inhibited)" if why else "sent" if any(
        not mutes.active(m.mute_windows, at) for m in matches) else "not sent now (muted; in the digest)"
    out.append(f"verdict: {verdict}")
    return "\n".join(out)


def cmd_check(argv: list[str]) -> int:
    p = ArgumentParser(prog="ftwatch check", description="Validate config, rule files, tables and templates.")
    p.add_argument("config", nargs="?")
    p.add_argument("--rules", nargs="*", default=[], help="extra rule files to check")
    p.add_argument("--config", dest="config_opt", help="the config (same as the positional CONFIG)")
    p.add_argument("--route", metavar="EVENT.json",
                   help="show where a sample event would go: matched routes, receivers, group key, "
                   "muted, inhibited (a list of events: the earlier ones fired first)")
    p.add_argument("--at", help="with --route: the time to judge mute windows at (ISO 8601 or epoch "
                   "seconds; default now)")
    args = p.parse_args(argv)
    config = args.config or args.config_opt
    if args.route:
        print(explain_route(config, args.route, _parse_at(p, args.at)))
        return 0
    args.config = config
    issues, summary = run_checks(args.config, args.rules)
    for issue in issues:
        print(issue)
    print(summary if not issues else f"{len(issues)} problem(s) found")
    return 1 if issues else 0


def _parse_at(p: argparse.ArgumentParser, text: str | None) -> float | None:
    """``--at``: epoch seconds or ISO 8601 (no zone: local time)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import datetime
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        p.error(f"--at {text!r}: not ISO 8601 (2026-11-21T09:30+08:00) or epoch seconds")
    return None
