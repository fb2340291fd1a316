"""The import direction of DESIGN.md "Layout", read from the source with ``ast``; every module imports.

    events, errors, clock   import no stage
    parsers                 import only events / errors / clock (and each other); the one exception
                            is ``Pattern`` from ``ftwatch.rules.model`` in ``parsers/multiline.py``
    rules                   may use parsers
    alerting                may use parsers and rules, never pipeline
    pipeline                its sources may use parsers (envelopes); nothing else across stages
    hubs                    ``pipeline/runner.py``, ``pipeline/watcher.py``, ``pipeline/replay.py``, ``pipeline/recorder.py``,
                            ``cli.py``, ``clistorage.py``, ``checks.py``, ``evaluate.py``, ``report/reader.py`` and
                            ``report/esreader.py`` (the report reads the stores of ``pipeline/sinks``) may import every stage; so may
                            ``healthcli.py`` (the ``bootcheck`` / ``nodecheck`` commands: cli.py's part, kept apart
                            for size, writes the fault-tolerance log's events and findings to the store)
    health                  ``ftwatch/health/`` is no stage: it imports only the core and top-level modules

A module that has to see more is a new hub: add it to ``HUBS`` on purpose, not by accident.
Imports inside functions and under ``TYPE_CHECKING`` count too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import ftwatch

PACKAGE = Path(ftwatch.__file__).parent
STAGES = ("pipeline", "parsers", "rules", "alerting")
CORE = frozenset({"ftwatch.events", "ftwatch.errors", "ftwatch.clock"})
HUBS = frozenset({"ftwatch/pipeline/runner.py", "ftwatch/pipeline/watcher.py", "ftwatch/pipeline/replay.py", "ftwatch/pipeline/recorder.py",
                  "ftwatch/clistorage.py",   # the CLI's storage half: config -> pipeline sinks
                  "ftwatch/cli.py", "ftwatch/clisetup.py", "ftwatch/clioffline.py",   # cli.py split for size
                  "ftwatch/checks.py", "ftwatch/healthcli.py",
                  # T4: drives pipeline/replay.py with the rules stage's engine and policy, like cli.cmd_replay
                  "ftwatch/evaluate.py",
                  "ftwatch/report/reader.py",      # ftwatch report reads pipeline/sinks/sqlite.py's store
                  "ftwatch/report/esreader.py"})   # ... or the data streams pipeline/sinks/elasticsearch.py wrote
# (file, module) -> the names it may take from that module, beyond the rules above.
EXCEPTIONS = {("ftwatch/parsers/multiline.py", "ftwatch.rules.model"): frozenset({"Pattern"})}
# A stage -> the other stages a (non-hub) module of it may import; None is a top-level module.
MAY_USE: dict[str | None, frozenset[str]] = {
    None: frozenset(),
    "parsers": frozenset(),
    "rules": frozenset({"parsers"}),
    "alerting": frozenset({"parsers", "rules"}),
    "pipeline": frozenset({"parsers"}),
}


@dataclass(frozen=True)
class Import:
    """One ``ftwatch`` import: the module it reaches, the names taken (empty for ``import x``), its line."""

    module: str
    names: tuple[str, ...]
    line: int


def module_name(rel: str) -> str:
    """``ftwatch/parsers/fields.py`` -> ``ftwatch.parsers.fields``; a package's ``__init__`` is the package."""
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, root: Path = PACKAGE) -> bool:
    """True when ``name`` (``ftwatch.x.y``) is a module or a package under ``root``."""
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(source: str, rel: str, root: Path = PACKAGE) -> list[Import]:
    """Every import of an ``ftwatch`` module in ``source`` (the file ``rel``), relative ones resolved."""
    here = module_name(rel)
    package = here if rel.endswith("__init__.py") else here.rpartition(".")[0]
    out: list[Import] = []
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, ast.Import):
            out += [Import(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if is_module(sub, root):
                    out.append(Import(sub, (), node.lineno))
                else:
                    out.append(Import(base, (alias.name,), node.lineno))
    return [i for i in out if i.module == "ftwatch" or i.module.startswith("ftwatch.")]


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def sources() -> dict[str, list[Import]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = "ftwatch/" + path.relative_to(PACKAGE).as_posix()
        out[rel] = imports_of(path.read_text(encoding="utf-8"), rel)
    return out


SOURCES = sources()


def where(rel: str, imp: Import) -> str:
    return f"{rel}:{imp.line} imports {imp.module}" + (f" ({', '.join(imp.names)})" if imp.names else "")


# --- the checker itself ----------------------------------------------------------------------------

def test_the_checker_sees_every_form_of_import():
    source = '''
import ftwatch.pipeline.runner
from ftwatch.rules import engine
from ftwatch import events
from ftwatch.events import Finding, Origin
from ..alerting import alerts
from . import fields
from .multiline import block_end
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from ftwatch.config import PolicyConfig
def late():
    import ftwatch.cli
'''
    found = {(i.module, i.names) for i in imports_of(source, "ftwatch/parsers/example.py")}
    assert found == {
        ("ftwatch.pipeline.runner", ()), ("ftwatch.rules.engine", ()), ("ftwatch.events", ()),
        ("ftwatch.events", ("Finding",)), ("ftwatch.events", ("Origin",)), ("ftwatch.alerting.alerts", ()),
        ("ftwatch.parsers.fields", ()), ("ftwatch.parsers.multiline", ("block_end",)),
        ("ftwatch.config", ("PolicyConfig",)), ("ftwatch.cli", ()),
    }


def test_every_package_file_is_checked():
    assert {"ftwatch/events.py", "ftwatch/parsers/multiline.py", "ftwatch/rules/engine.py",
            "ftwatch/alerting/alerts.py", "ftwatch/pipeline/replay.py", "ftwatch/cli.py"} <= set(SOURCES)
    assert all(rel in SOURCES for rel in HUBS)


# --- the rules -------------------------------------------------------------------------------------

@pytest.mark.parametrize("rel", ["ftwatch/events.py", "ftwatch/errors.py", "ftwatch/clock.py"])
def test_core_modules_import_no_stage(rel):
    bad = [where(rel, i) for i in SOURCES[rel] if stage_of(i.module) is not None]
    assert bad == []


def test_parsers_import_only_the_core_and_each_other():
    bad = []
    for rel, imps in SOURCES.items():
        if not rel.startswith("ftwatch/parsers/"):
            continue
        for i in imps:
            if i.module in CORE or stage_of(i.module) == "parsers":
                continue
            allowed = EXCEPTIONS.get((rel, i.module))
            if allowed is None or not i.names or not set(i.names) <= allowed:
                bad.append(where(rel, i))
    assert bad == []


def test_the_parsers_exception_is_still_needed_and_exact():
    """multiline.py takes Pattern (the Matcher's input type) from rules.model, and nothing else from rules."""
    taken = {(i.module, i.names) for i in SOURCES["ftwatch/parsers/multiline.py"]
             if stage_of(i.module) == "rules"}
    assert taken == {("ftwatch.rules.model", ("Pattern",))}


def test_alerting_never_imports_pipeline():
    bad = [where(rel, i) for rel, imps in SOURCES.items() if rel.startswith("ftwatch/alerting/")
           for i in imps if stage_of(i.module) == "pipeline"]
    assert bad == []


def test_only_the_hubs_import_across_stages():
    bad = []
    for rel, imps in SOURCES.items():
        if rel in HUBS:
            continue
        own = stage_of(module_name(rel))
        for i in imps:
            other = stage_of(i.module)
            if other is None or other == own or other in MAY_USE[own] or (rel, i.module) in EXCEPTIONS:
                continue
            bad.append(where(rel, i))
    assert bad == []


def test_hubs_are_real_and_do_see_several_stages():
    """Keeps HUBS honest: a hub that no longer exists or needs nothing is dropped from the list."""
    for rel in HUBS:
        assert rel in SOURCES, rel
    assert {stage_of(i.module) for i in SOURCES["ftwatch/pipeline/runner.py"]} >= {"pipeline", "rules"}
    assert {stage_of(i.module) for i in SOURCES["ftwatch/cli.py"]} >= {"pipeline", "rules"}
    assert {stage_of(i.module) for i in SOURCES["ftwatch/clisetup.py"]} >= {"pipeline", "rules", "alerting"}
    assert {stage_of(i.module) for i in SOURCES["ftwatch/clioffline.py"]} >= {"pipeline", "rules", "alerting"}


# --- every module imports, each in a fresh interpreter state -----------------------------------------

_IMPORT_ALL = r"""
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "ftwatch" or m.startswith("ftwatch.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=3)
print(json.dumps(failed))
"""


def test_every_module_imports_cleanly_on_its_own():
    """Each module first, with nothing of ftwatch loaded before it: import cycles show up here."""
    names = [module_name(rel) for rel in SOURCES if not rel.endswith("__main__.py")]
    assert len(names) > 30
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL, *names], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}


def test_the_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "ftwatch", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "replay" in proc.stdout
