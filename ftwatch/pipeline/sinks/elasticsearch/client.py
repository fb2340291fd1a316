"""The Elasticsearch sink's client and how it reads the cluster's answers (SPEC E2): the official
client as the config asks for it, the sink's counters, and which refusals are kept on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KEEP_STATUSES = frozenset({401, 403, 404})   # set-up problems: keep the data, say so


def reason(error: Any) -> str:
    """The ``reason`` of a bulk item's ``error`` object (the error itself when it is no object)."""
    return str(error.get("reason") if isinstance(error, dict) else error)


def no_data_stream(status: int, error: Any) -> bool:
    """A per-item refusal of a ``require_data_stream`` write that setting up fixes: no index
    template makes the data stream (404 ``index_not_found_exception``), or a plain index of that
    name is in the way (``... is not a data stream``)."""
    if not isinstance(error, dict):
        return False
    return (status == 404 or error.get("type") == "index_not_found_exception"
            or "data stream" in str(error.get("reason", "")))


@dataclass
class SinkStats:
    """Counters since the sink was made (documents unless said otherwise)."""

    queued: int = 0
    sent: int = 0
    duplicates: int = 0          # 409 on create: already indexed (a retry after a lost ack)
    dead_lettered: int = 0
    dropped: int = 0             # not journaled: the buffer was full (max_buffer_bytes)
    held: int = 0                # refused because the data stream cannot be made (no template)
    retries: int = 0             # bulk requests sent again after a transient failure
    failed_flushes: int = 0      # flushes that left documents on disk
    last_error: str = ""
    errors: list[str] = field(default_factory=list)   # the last few, newest last

    def note(self, message: str) -> None:
        self.last_error = message
        self.errors = (self.errors + [message])[-20:]


def build_client(cfg: Any) -> Any:
    """An ``elasticsearch.Elasticsearch`` for an ``ElasticsearchConfig`` (no client-side
    retries: the sink retries itself, with backoff)."""
    from elasticsearch import Elasticsearch
    kwargs: dict[str, Any] = {"request_timeout": cfg.request_timeout, "max_retries": 0,
                              "retry_on_timeout": False, "verify_certs": cfg.verify_certs}
    if cfg.api_key:
        kwargs["api_key"] = cfg.api_key
    elif cfg.username is not None:
        kwargs["basic_auth"] = (cfg.username, cfg.password)
    if cfg.ca_certs is not None:
        kwargs["ca_certs"] = str(cfg.ca_certs)
    return Elasticsearch(list(cfg.url), **kwargs)
