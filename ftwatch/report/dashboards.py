"""Kibana saved objects kept readable in git (SPEC E3).

``dashboards/src/*.json`` holds one pretty-printed object per file with Kibana's JSON-in-a-string
attributes (``visState``, ``uiStateJSON``, ``panelsJSON``, ``optionsJSON``,
``kibanaSavedObjectMeta.searchSourceJSON``, and the dashboard's controls,
``controlGroupInput.panelsJSON`` / ``ignoreParentSettingsJSON``) written as real JSON, so a review shows real diffs.
``tools/build_dashboards.py`` encodes them into ``dashboards/ftwatch.ndjson`` (what Kibana's
import API takes: one object a line, sorted by type and id, keys sorted) and splits an export back
into sources (dropping ``updated_at``, ``version``, ``created_at``, ``namespaces``; keeping
``coreMigrationVersion`` / ``typeMigrationVersion``, which Kibana's docs say to preserve).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

ENCODED = ("visState", "uiStateJSON", "panelsJSON", "optionsJSON")
CONTROL_ENCODED = ("panelsJSON", "ignoreParentSettingsJSON")     # inside controlGroupInput
VOLATILE = ("updated_at", "created_at", "version", "namespaces", "originId", "managed_by")
TYPE_ORDER = ("index-pattern", "search", "visualization", "lens", "dashboard")


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def encode(obj: dict[str, Any]) -> dict[str, Any]:
    """A source object -> the saved object Kibana takes (JSON-in-string attributes encoded)."""
    out = json.loads(json.dumps(obj))
    attrs = out.get("attributes", {})
    for key in ENCODED:
        if key in attrs and not isinstance(attrs[key], str):
            attrs[key] = _dump(attrs[key])
    meta = attrs.get("kibanaSavedObjectMeta")
    if isinstance(meta, dict) and "searchSourceJSON" in meta and not isinstance(meta["searchSourceJSON"], str):
        meta["searchSourceJSON"] = _dump(meta["searchSourceJSON"])
    controls = attrs.get("controlGroupInput")
    for key in CONTROL_ENCODED if isinstance(controls, dict) else ():
        if key in controls and not isinstance(controls[key], str):
            controls[key] = _dump(controls[key])
    return out


def decode(obj: dict[str, Any]) -> dict[str, Any]:
    """A saved object (as exported) -> its readable source (volatile fields dropped)."""
    out = {k: v for k, v in json.loads(json.dumps(obj)).items() if k not in VOLATILE}
    attrs = out.get("attributes", {})
    for key in ENCODED:
        if isinstance(attrs.get(key), str):
            attrs[key] = json.loads(attrs[key])
    meta = attrs.get("kibanaSavedObjectMeta")
    if isinstance(meta, dict) and isinstance(meta.get("searchSourceJSON"), str):
        meta["searchSourceJSON"] = json.loads(meta["searchSourceJSON"])
    controls = attrs.get("controlGroupInput")
    for key in CONTROL_ENCODED if isinstance(controls, dict) else ():
        if isinstance(controls.get(key), str):
            controls[key] = json.loads(controls[key])
    return out


def _order(obj: dict[str, Any]) -> tuple[int, str]:
    kind = obj.get("type", "")
    return (TYPE_ORDER.index(kind) if kind in TYPE_ORDER else len(TYPE_ORDER), obj.get("id", ""))


def to_ndjson(objects: Iterable[dict[str, Any]]) -> str:
    """Saved objects (sources or encoded) -> NDJSON text, stable: sorted by type then id."""
    return "".join(_dump(encode(o)) + "\n" for o in sorted(objects, key=_order))


def parse_ndjson(text: str, name: str = "<ndjson>") -> list[dict[str, Any]]:
    """NDJSON -> saved objects; an export's summary line (``exportedCount``) is skipped.

    Raises:
        ValueError: a line is not a JSON object (message names ``name:line``).
    """
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{name}:{n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{name}:{n}: not a JSON object")
        if "exportedCount" in obj and "type" not in obj:
            continue
        out.append(obj)
    return out


def load_sources(directory: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` source object under ``directory`` (sorted by file name)."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(directory).glob("*.json"))]


def source_name(obj: dict[str, Any]) -> str:
    """The file name of an object's source: ``<type>--<id>.json``."""
    return f"{obj['type']}--{obj['id']}.json"


def write_sources(objects: Iterable[dict[str, Any]], directory: Path) -> list[Path]:
    """Write each object's readable source (pretty, keys sorted) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for obj in objects:
        path = directory / source_name(obj)
        path.write_text(json.dumps(decode(obj), ensure_ascii=False, indent=2, sort_keys=True) + "\n",
                        encoding="utf-8")
        paths.append(path)
    return paths


def dangling_references(objects: Iterable[dict[str, Any]]) -> list[str]:
    """References that point at no object of the set, dashboard panels whose
    ``panelRefName`` names no reference, and dashboard controls without their data view
    reference (``controlGroup_<id>:optionsListDataView``); empty when all resolve."""
    objects = list(objects)
    have = {(o.get("type"), o.get("id")) for o in objects}
    bad = []
    for o in objects:
        names = set()
        for ref in o.get("references", []):
            names.add(ref.get("name"))
            if (ref.get("type"), ref.get("id")) not in have:
                bad.append(f"{o.get('type')}/{o.get('id')}: {ref.get('name')} -> "
                           f"{ref.get('type')}/{ref.get('id')} is missing")
        attrs = decode(o).get("attributes", {})
        for panel in attrs.get("panelsJSON", []) or []:
            if panel.get("panelRefName") not in names:
                bad.append(f"{o.get('type')}/{o.get('id')}: panel {panel.get('panelIndex')} names "
                           f"{panel.get('panelRefName')!r}, which is no reference")
        controls = (attrs.get("controlGroupInput") or {}).get("panelsJSON") or {}
        for cid, control in controls.items():
            if f"controlGroup_{cid}:{control.get('type', '')[:-len('Control')]}DataView" not in names:
                bad.append(f"{o.get('type')}/{o.get('id')}: control {cid} ({control.get('type')}) has no "
                           "data view reference")
        search = (attrs.get("kibanaSavedObjectMeta") or {}).get("searchSourceJSON") or {}
        if "indexRefName" in search and search["indexRefName"] not in names:
            bad.append(f"{o.get('type')}/{o.get('id')}: indexRefName {search['indexRefName']!r} "
                       "is no reference")
    return bad


def with_prefix(objects: Iterable[dict[str, Any]], prefix: str, default: str = "ftwatch") -> list[dict[str, Any]]:
    """The objects with data view titles moved from ``<default>-*`` to ``<prefix>-*`` (for a
    ``storage.elasticsearch.data_stream_prefix`` other than the default)."""
    out = []
    for o in objects:
        o = json.loads(json.dumps(o))
        if o.get("type") == "index-pattern" and prefix != default:
            title = o["attributes"]["title"]
            o["attributes"]["title"] = ",".join(
                prefix + part[len(default):] if part.startswith(default + "-") else part
                for part in title.split(","))
        out.append(o)
    return out
