"""The ``storage.metrics`` section of the config: the Prometheus endpoint and the output counts.

Kept apart from ``ftwatch.config.model`` only for size; ``StorageConfig.metrics`` holds a
``MetricsConfig``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


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

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value
