"""The ``storage.elasticsearch`` section of the config: the Elasticsearch sink (SPEC E2).

Kept apart from ``ftwatch.config.model`` for size; ``StorageConfig.elasticsearch`` holds an
``ElasticsearchConfig`` (null: no Elasticsearch, SQLite only). Secrets are never printed
(``repr=False``).
"""

from __future__ import annotations

from pathlib import Path

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_STRICT = ConfigDict(extra="forbid")
_URL = r"^https?://"
_DURATION = r"^[1-9][0-9]*(d|h|m|s)$"


class ElasticsearchConfig(BaseModel):
    """Where and how events, findings, decisions and alerts are also written to Elasticsearch."""

    model_config = _STRICT
    url: list[str] = Field(min_length=1, description="Node URLs (http(s)://host:9200); one string or a list.")
    api_key: str | None = Field(None, repr=False, description="API key (the encoded form); or username/password.")
    username: str | None = Field(None, description="Basic-auth user (with password).")
    password: str | None = Field(None, repr=False, description="Basic-auth password.")
    ca_certs: Path | None = Field(None, description="PEM file of the CA that signed the cluster's certificate.")
    verify_certs: bool = Field(True, description="Check the server certificate; false only for a test cluster.")
    data_stream_prefix: str = Field("ftwatch", pattern=r"^[a-z0-9][a-z0-9_.]*$",
                                    description="Data streams are <prefix>-events, -findings, -decisions, -alerts, -output.")
    buffer_dir: Path | None = Field(None, description="On-disk buffer and dead-letter file; null: <state_dir>/es-buffer.")
    batch_size: int = Field(500, ge=1, le=10000, description="Documents per bulk request.")
    flush_interval: float = Field(5.0, gt=0, description="Seconds between background flushes.")
    request_timeout: float = Field(10.0, gt=0, description="Seconds per request.")
    max_retries: int = Field(3, ge=0, description="Retries of a bulk request on 429, 5xx or no connection, per flush.")
    backoff: list[float] = Field([0.5, 2.0, 5.0], min_length=1,
                                 description="Seconds before retry 1, 2, 3 ... (the last repeats).")
    max_buffer_bytes: int = Field(1 << 30, ge=0,
                                  description="Cap of the on-disk buffer in bytes (0: none); when full, new "
                                              "documents are dropped, counted and logged (README).")
    rollover_max_age: str = Field("7d", pattern=_DURATION, description="ILM: roll a backing index over at this age.")
    retention: str = Field("90d", pattern=_DURATION, description="ILM: delete backing indices this long after rollover.")
    labels: dict[str, str] = Field(default_factory=dict,
                                   description="Labels added to every document (dotted keys are fine: see README).")

    @model_validator(mode="before")
    @classmethod
    def _one_url(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("url"), str):
            return {**data, "url": [data["url"]]}
        return data

    @field_validator("url")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        bad = [u for u in urls if not re.match(_URL, u)]
        if bad:
            raise ValueError(f"url must start with http:// or https://: {', '.join(bad)}")
        return urls

    @model_validator(mode="after")
    def _check(self) -> "ElasticsearchConfig":
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if self.api_key is not None and self.username is not None:
            raise ValueError("give api_key or username/password, not both")
        return self
