"""``ftwatch es setup``: the ILM policy, component templates and the composable index template
behind ftwatch's data streams (SPEC E2).

Objects (``P`` = the data stream prefix, ``ftwatch`` by default)::

    _ilm/policy/P                 hot: rollover (max_age, 50gb per primary shard); delete after retention
    _component_template/P-settings   index.lifecycle.name = P
    _component_template/P-mappings   the ECS + ftwatch.* mappings below
    _index_template/P             index_patterns [P-*], data_stream {}, composed of the two, priority 200

The pattern ``P-*`` does not overlap Elasticsearch's built-in ``logs-*-*`` / ``metrics-*-*``
templates (priority 100), so ours applies without having to outrank them. Data streams are created
on the first write: ``P-events``, ``P-findings``, ``P-decisions``, ``P-alerts``, ``P-output``. They take only
``create`` ops and need ``@timestamp`` in every document (Elasticsearch "Data streams" docs).

Mappings: strings default to ``keyword`` (``ignore_above`` 1024); ``message``, ``error.message``,
``ftwatch.line`` and ``ftwatch.text`` are full text; ``ftwatch.epoch`` (the exact time) and
``ftwatch.seconds`` are doubles; the free-form maps (``ftwatch.detail``,
``ftwatch.fields``, ``ftwatch.labels``) are ``flattened`` so their keys never add fields or clash;
``labels`` holds de-dotted keyword labels (``ftwatch.pipeline.sinks.elasticsearch.ecs``).
"""

from __future__ import annotations

from typing import Any

from ftwatch.pipeline.sinks.elasticsearch.ecs import KINDS

TEMPLATE_VERSION = 2      # 2: ftwatch.epoch, event.sequence, the output data stream
PRIORITY = 200


def _kw() -> dict[str, Any]:
    return {"type": "keyword", "ignore_above": 1024}


def _props(names: str, mapping: dict[str, Any]) -> dict[str, Any]:
    return {n: dict(mapping) for n in names.split()}


def mappings() -> dict[str, Any]:
    """The mappings of every ftwatch data stream (one shape for all kinds)."""
    long = {"type": "long"}
    text_kw = {"type": "match_only_text", "fields": {"keyword": _kw()}}
    flattened = {"type": "flattened", "ignore_above": 1024}
    return {
        "dynamic": "false",
        "_meta": {"managed_by": "ftwatch", "version": TEMPLATE_VERSION},
        "dynamic_templates": [{"labels_as_keyword": {
            "path_match": "labels.*", "match_mapping_type": "*", "mapping": _kw()}}],
        "properties": {
            "@timestamp": {"type": "date"},
            "message": {"type": "match_only_text"},
            "event": {"properties": {
                **_props("kind category type action outcome dataset module id reason", _kw()),
                "severity": long, "sequence": long}},
            "host": {"properties": {"name": _kw()}},
            "log": {"properties": {"level": _kw()}},
            "error": {"properties": {"message": {"type": "match_only_text"}, "type": _kw(),
                                     "stack_trace": {"type": "wildcard"}}},
            "rule": {"properties": _props("id category ruleset", _kw())},
            "labels": {"type": "object", "dynamic": "true"},
            "ftwatch": {"properties": {
                **_props("job instance node stream kind rule_id failure_class action severity "
                         "source status decision_id notification_id receiver policy_clause", _kw()),
                **_props("rank attempt seq restarts_used restarts_left findings_count attempts "
                         "lines bytes", long),
                "epoch": {"type": "double"}, "seconds": {"type": "double"},
                "line": text_kw, "text": {"type": "match_only_text"},
                "detail": flattened, "fields": flattened, "labels": flattened,
                "target": {"properties": {**_props("job instance node", _kw()), "rank": long}},
                "root_cause": {"properties": {
                    **_props("rule_id failure_class instance node", _kw()), "rank": long,
                    "line": text_kw}},
            }},
        },
    }


def ilm_policy(rollover_max_age: str = "7d", retention: str = "90d") -> dict[str, Any]:
    """The ILM policy body: roll over at ``rollover_max_age`` or 50 GB per primary shard,
    delete ``retention`` after rollover."""
    return {
        "_meta": {"managed_by": "ftwatch", "version": TEMPLATE_VERSION},
        "phases": {
            "hot": {"actions": {"rollover": {"max_age": rollover_max_age,
                                             "max_primary_shard_size": "50gb"}}},
            "delete": {"min_age": retention, "actions": {"delete": {}}},
        },
    }


def data_streams(prefix: str) -> list[str]:
    """The data stream names for a prefix, in :data:`ftwatch.pipeline.sinks.elasticsearch.ecs.KINDS` order."""
    return [f"{prefix}-{kind}" for kind in KINDS]


def install(client: Any, prefix: str = "ftwatch", rollover_max_age: str = "7d",
            retention: str = "90d") -> list[str]:
    """Create or replace the policy and templates (idempotent). Returns what was put, as
    ``"PUT <path>"`` lines.

    Args:
        client: an ``elasticsearch.Elasticsearch``.

    Raises:
        elasticsearch.ApiError / elastic_transport.TransportError: as the client raises them
            (bad credentials, no connection ...).
    """
    meta = {"managed_by": "ftwatch", "version": TEMPLATE_VERSION}
    client.ilm.put_lifecycle(name=prefix, policy=ilm_policy(rollover_max_age, retention))
    client.cluster.put_component_template(
        name=f"{prefix}-settings", template={"settings": {"index.lifecycle.name": prefix}}, meta=meta)
    client.cluster.put_component_template(name=f"{prefix}-mappings", template={"mappings": mappings()},
                                          meta=meta)
    client.indices.put_index_template(
        name=prefix, index_patterns=[f"{prefix}-*"], data_stream={}, priority=PRIORITY,
        composed_of=[f"{prefix}-settings", f"{prefix}-mappings"], meta=meta)
    return [f"PUT _ilm/policy/{prefix}", f"PUT _component_template/{prefix}-settings",
            f"PUT _component_template/{prefix}-mappings", f"PUT _index_template/{prefix}",
            *update_streams(client, prefix)]


def update_streams(client: Any, prefix: str = "ftwatch") -> list[str]:
    """Give the existing data streams of the template ``prefix`` the current mappings now,
    not at their next rollover (after an upgrade). A stream whose backing indices cannot take
    them (a field changed type) is rolled over lazily instead: its next write starts a backing
    index with the new template. Returns what was done, one line each.

    A user who may not list data streams gets one line saying so (the templates are in place;
    the streams take the new mappings at their next rollover).

    Raises:
        elastic_transport.TransportError: the cluster cannot be reached.
    """
    from elasticsearch import ApiError
    try:
        found = client.indices.get_data_stream(name=f"{prefix}-*", expand_wildcards="all")
    except ApiError as exc:
        return [f"existing data streams not updated (listing them was refused: {exc.message}); "
                "they take the new mappings at their next rollover"]
    m = mappings()
    done = []
    for stream in found.body.get("data_streams", []):
        name = stream.get("name", "")
        if stream.get("template") != prefix:
            continue                       # somebody else's stream that matches the pattern
        try:
            client.indices.put_mapping(index=name, dynamic=m["dynamic"], meta=m["_meta"],
                                       dynamic_templates=m["dynamic_templates"], properties=m["properties"])
            done.append(f"PUT {name}/_mapping")
        except ApiError as exc:
            client.indices.rollover(alias=name, lazy=True)
            done.append(f"POST {name}/_rollover?lazy (mapping refused: {exc.message})")
    return done


def ensure_template(client: Any, prefix: str = "ftwatch", rollover_max_age: str = "7d",
                    retention: str = "90d") -> tuple[str, str | None]:
    """Check that the index template ``prefix`` exists and :func:`install` everything when it
    does not (the sink does this before its first bulk request).

    Returns:
        (``"present"``, None), (``"installed"``, None), (``"unknown"``, why: the check itself
        failed) or (``"missing"``, why: not there and not installable, e.g. no privilege).
        Never raises for a refused or failed request.
    """
    from elastic_transport import TransportError
    from elasticsearch import ApiError
    try:
        if client.indices.exists_index_template(name=prefix):
            return "present", None
    except (ApiError, TransportError) as exc:
        return "unknown", str(exc)
    try:
        install(client, prefix, rollover_max_age, retention)
    except (ApiError, TransportError) as exc:
        return "missing", str(exc)
    return "installed", None
