"""The import direction of docs/architecture.md "Layout", read from the source with ``ast``; every module imports.

The folder list is the flow, and imports go one way, down this list:

    events, errors, clock,    the core: import no stage
    bounded
    config/                   models only: the core
    parsers/                  the core (and each other): plain strings and regexes out, which
                              rules/ wraps into its own types (``rules/engine.py``'s block starts)
    rules/                    detection: config, parsers
    policy/                   deciding: config, parsers, rules
    alerting/                 config, rules, policy; never pipeline
    mining/                   failure signatures (Drain3): policy's state files; fed by the
                              recorder, read by ``ftwatch mine`` (a stage of its own: it is neither
                              detection nor deciding, and the report and CLI read it back)
    pipeline/sources/         what brings events in: config, parsers
    pipeline/actuators/       what carries decisions out: config, policy, and the sources it acts on
                              (the local supervisor, the SDK channel)
    pipeline/sinks/           the core only
    pipeline/cluster/         a multi-node job's agents: config, policy, alerting (the spool's dict
                              form of findings and decisions), health (the node check), pipeline
                              (the incident core they decide through), actuators (the outcome of
                              the scheduler's act, which the leader hands every node)
    report/                   reads the sinks back for a person
    health/                   pre- and post-run checks: config, rules (the step tap)
    top-level modules         (telemetry, sdk): config
    hubs                      ``cli/*`` (one module per subcommand), ``pipeline/build.py`` (Config ->
                              components), the incident core ``pipeline/incidents.py`` (and its
                              ``pipeline/exits.py``: exits read into findings), the drivers
                              ``pipeline/run.py`` (and its ``pipeline/respond.py``: settle, decide,
                              act, restart), ``watch.py``, ``replay.py``,
                              ``pipeline/recorder.py`` and ``testing/`` (doubles of parts of every
                              stage) may import every stage

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
STAGES = ("config", "parsers", "rules", "policy", "alerting", "mining", "pipeline.sources", "pipeline.actuators",
          "pipeline.sinks", "pipeline.cluster", "pipeline", "report", "health", "cli")
# bounded.py (issue 17 item 3): the caps' bounded map and eviction tally, used where state grows in
# rules/, pipeline/ and telemetry alike, so it is core (it imports nothing of ftwatch)
CORE = frozenset({"ftwatch.events", "ftwatch.errors", "ftwatch.clock", "ftwatch.bounded"})
# pipeline/incidents.py: the incident core every driver decides through (engine, policy, recorder);
# pipeline/exits.py: its exits and launcher summaries read into findings, moved out of it as they were
# (rules' exit codes, policy's lifecycle), so a hub for the same reason; pipeline/intake.py (the desk's
# output path: host lines, torchelastic summaries) and pipeline/notices.py (errors the job outlived:
# policy's triggers and lifecycle) likewise, moved out of incidents.py as they were
HUBS = frozenset({"ftwatch/pipeline/build.py", "ftwatch/pipeline/incidents.py", "ftwatch/pipeline/exits.py",
                  "ftwatch/pipeline/intake.py", "ftwatch/pipeline/notices.py",
                  "ftwatch/pipeline/run.py",
                  # pipeline/respond.py: run's acting half (settle, decide, act, end or restart), moved
                  # out of run.py as it was (the local actuator, the policy's plan, the health checks):
                  # a hub for the same reason as run.py
                  "ftwatch/pipeline/respond.py",
                  "ftwatch/pipeline/watch.py",
                  "ftwatch/pipeline/replay.py", "ftwatch/pipeline/recorder.py", "ftwatch/testing/__init__.py",
                  "ftwatch/testing/runloop.py",
                  "ftwatch/__main__.py"}
                 | {"ftwatch/" + p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "cli").glob("*.py")})
# (file, module) -> the names it may take from that module, beyond the rules above (none today:
# keep it that way; an entry here is a layering debt to name and pay).
EXCEPTIONS: dict[tuple[str, str], frozenset[str]] = {}
# A stage -> the other stages a (non-hub) module of it may import; None is a top-level module.
MAY_USE: dict[str | None, frozenset[str]] = {
    None: frozenset({"config"}),
    "config": frozenset(),
    "parsers": frozenset(),
    "rules": frozenset({"config", "parsers"}),
    "policy": frozenset({"config", "parsers", "rules"}),
    "alerting": frozenset({"config", "rules", "policy"}),
    "mining": frozenset({"config", "rules", "policy"}),   # new on purpose (issue 15): statefile, rule ids
    "pipeline.sources": frozenset({"config", "parsers"}),
    "pipeline.actuators": frozenset({"config", "policy", "pipeline.sources"}),
    "pipeline.sinks": frozenset(),
    # issue 14, on purpose: a multi-node job's agents decide through the incident core (pipeline),
    # ship findings and decisions in the spool's dict form (alerting), plan with the policy's
    # Verdict/Plan and run the node check's processes (health); the leader tells the job's
    # scheduler once for every node and hands each node the outcome (pipeline.actuators: ActResult)
    "pipeline.cluster": frozenset({"config", "policy", "alerting", "health", "pipeline", "pipeline.actuators"}),
    "pipeline": frozenset({"parsers"}),     # replay_hang.py: timestamps of replayed lines
    "report": frozenset({"config", "pipeline.sinks"}),
    "health": frozenset({"config", "rules"}),
    "cli": frozenset(),
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
    """``ftwatch.pipeline.sinks.sqlite`` -> ``pipeline.sinks``; ``ftwatch.policy.c4d`` -> ``policy``;
    a top-level module (``ftwatch.telemetry``) or the core -> None."""
    parts = module.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in STAGES:
        return ".".join(parts[1:3])
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
import ftwatch.pipeline.run
from ftwatch.rules import engine
from ftwatch import events
from ftwatch.events import Finding, Origin
from ..alerting import alerts
from . import fields
from .multiline import block_end
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from ftwatch.config.model import PolicyConfig
def late():
    import ftwatch.cli
'''
    found = {(i.module, i.names) for i in imports_of(source, "ftwatch/parsers/example.py")}
    assert found == {
        ("ftwatch.pipeline.run", ()), ("ftwatch.rules.engine", ()), ("ftwatch.events", ()),
        ("ftwatch.events", ("Finding",)), ("ftwatch.events", ("Origin",)), ("ftwatch.alerting.alerts", ()),
        ("ftwatch.parsers.fields", ()), ("ftwatch.parsers.multiline", ("block_end",)),
        ("ftwatch.config.model", ("PolicyConfig",)), ("ftwatch.cli", ()),
    }


def test_every_package_file_is_checked():
    assert {"ftwatch/events.py", "ftwatch/parsers/multiline.py", "ftwatch/rules/engine.py",
            "ftwatch/alerting/alerts.py", "ftwatch/pipeline/replay.py", "ftwatch/cli/run.py"} <= set(SOURCES)
    assert all(rel in SOURCES for rel in HUBS)


# --- the rules -------------------------------------------------------------------------------------

@pytest.mark.parametrize("rel", ["ftwatch/events.py", "ftwatch/errors.py", "ftwatch/clock.py", "ftwatch/bounded.py"])
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


def test_parsers_import_nothing_above_them():
    """Loading every parsers/ module loads no ftwatch module outside the core and parsers/ (at run
    time, so an import hidden from ``ast`` counts too); multiline exports regex strings and
    rules/ wraps them into Patterns, so no exception is left for parsers/."""
    assert not any(rel.startswith("ftwatch/parsers/") for rel, _ in EXCEPTIONS)
    names = [module_name(rel) for rel in SOURCES if rel.startswith("ftwatch/parsers/")]
    code = ("import importlib, json, sys\n"
            "for name in sys.argv[1:]: importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ftwatch.'))))")
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "ftwatch.parsers.multiline" in loaded
    assert [m for m in loaded if m not in CORE and stage_of(m) != "parsers"] == []


def test_alerting_never_imports_pipeline():
    bad = [where(rel, i) for rel, imps in SOURCES.items() if rel.startswith("ftwatch/alerting/")
           for i in imps if (stage_of(i.module) or "").startswith("pipeline")]
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
    # run.py takes its rules through the incident desk and acts through the local actuator
    assert {stage_of(i.module) for i in SOURCES["ftwatch/pipeline/run.py"]} >= {"pipeline.sources",
                                                                                 "pipeline.actuators", "policy"}
    assert {stage_of(i.module) for i in SOURCES["ftwatch/pipeline/respond.py"]} >= {"pipeline.actuators", "policy",
                                                                                     "health"}
    assert {stage_of(i.module) for i in SOURCES["ftwatch/pipeline/build.py"]} >= {"pipeline.sinks", "rules", "alerting"}
    # the CLI takes its engine and policy from pipeline/build.py now; it still reaches policy (budgets)
    assert {stage_of(i.module) for i in SOURCES["ftwatch/cli/replay.py"]} >= {"pipeline", "policy"}
    assert {stage_of(i.module) for i in SOURCES["ftwatch/pipeline/incidents.py"]} >= {"rules", "policy", "parsers"}


def test_the_root_holds_only_the_core_and_the_stage_folders():
    """The folder list reads as the flow: no module is parked at the root for size."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert root == sorted({"__init__.py", "__main__.py", "bounded.py", "clock.py", "errors.py", "events.py", "sdk.py",
                           "telemetry.py"})


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
