"""``ftwatch check`` (T1): validate the config, rule files, fault tables and templates at once.

Every problem is collected (file:line where known); nothing stops at the first error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ftwatch.errors import ConfigError, Issue


def run_checks(config_path: str | None, rule_files: Sequence[str] = ()) -> tuple[list[Issue], str]:
    """Check everything the config names, plus ``rule_files``.

    Returns:
        (every issue found, a one-line summary of what was checked).
    """
    from ftwatch.config import Config, load_config
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


def _raw_rule_files(config_path: str) -> list[str]:
    """``rules.files`` read straight from a config that failed validation, so they get checked too."""
    import yaml
    try:
        raw = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
        files = (raw.get("rules") or {}).get("files") or []
        base = Path(config_path).parent
        return [str(f if Path(f).is_absolute() else base / f) for f in files if isinstance(f, str)]
    except (OSError, yaml.YAMLError, AttributeError):
        return []
