"""The ``storage.metrics`` section of the config: the Prometheus endpoint and the output counts.

Kept apart from ``ftwatch.config.model`` only for size; ``StorageConfig.metrics`` holds a
``MetricsConfig``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def parse_listen(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` -> ``("127.0.0.1", 9464)``; ``"[::1]:0"`` -> ``("::1", 0)``.

    Raises:
        ValueError: no ``host:port``, or the port is not 0..65535.
    """
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port with a port 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


class MetricsConfig(BaseModel):
    """Observability of ftwatch itself (SPEC E4, E5)."""

    model_config = ConfigDict(extra="forbid")
    listen: str | None = Field(
        None, description="host:port of the Prometheus /metrics endpoint of `run` and `watch` "
        "(e.g. 127.0.0.1:9464; port 0 picks a free one); null: off. `--metrics-port` overrides "
        "the port (on 127.0.0.1 when this is null).")
    output_bucket: float = Field(
        5.0, gt=0, description="Seconds per bucket of the per-instance output counts kept in the "
        "store (the output timeline of `ftwatch report`).")
    output_full_window: float | None = Field(
        86400.0, gt=0, description="Seconds of each job's newest output counts that the SQLite store "
        "keeps per output_bucket; older counts are merged into output_coarse_bucket buckets, so that a "
        "long watch does not grow the file by a row per instance every output_bucket (null: never merge).")
    output_coarse_bucket: float | None = Field(
        None, gt=0, description="Seconds per bucket of the output counts older than "
        "output_full_window; a whole multiple (2 or more) of output_bucket. null: 60 output_buckets "
        "(300 at the default 5).")

    @property
    def coarse_bucket(self) -> float:
        """``output_coarse_bucket``, or 60 ``output_bucket`` when it is null (seconds)."""
        return self.output_coarse_bucket if self.output_coarse_bucket is not None else 60 * self.output_bucket

    @model_validator(mode="after")
    def _coarse(self) -> "MetricsConfig":
        ratio = self.coarse_bucket / self.output_bucket
        if ratio < 2 or abs(ratio - round(ratio)) > 1e-9 * ratio:
            raise ValueError(f"output_coarse_bucket ({self.coarse_bucket:g} s) must be a whole "
                             f"multiple (2 or more) of output_bucket ({self.output_bucket:g} s)")
        return self

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value
