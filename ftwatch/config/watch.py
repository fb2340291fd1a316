"""The ``watch`` section of the config: shipped sources, identity and the actuator (issue 3).

Kept apart from ``ftwatch.config.model`` only for size; ``Config.watch`` holds a ``WatchConfig``.

Host logs (issue 12 item 5). A node's kernel and driver lines (``NVRM: Xid ...``, ``mlx5_core``,
EDAC, the OOM killer) name a node but no job. A source whose every line is such a line says
``role: host`` (a file tail of ``/var/log/kern.log``, or a listener that only fluent-bit's
``kmsg`` / ``systemd`` inputs send to); on a listener that also receives pod logs, the host
records are told apart by their tag (``identity.host_tags``, e.g. ``kmsg*``) or by a
``host_log: true`` field a fluent-bit ``record_modifier`` adds. The node of a host line is named
as for any line (``hostname`` / ``host`` field; a file tail's lines need a ``hostname`` or
``identity.default_node``). ``ftwatch watch`` attaches each host finding to every job with
instances on that node (``ftwatch.pipeline.watch``); one for a node with no job is stored and
opens nothing. ``role`` is not ``host`` because a listener's ``host`` is its bind address.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from ftwatch.config.kubernetes import KubernetesConfig

_STRICT = ConfigDict(extra="forbid")


class ListenerLimits(BaseModel):
    """Connection limits of a listening source (Forward, HTTP), issue 17.

    Each connection holds a thread and up to a request's worth of buffer (Forward: 6 MiB,
    HTTP: 16 MiB), so the count is bounded: ``max_connections`` 512 (nginx's default
    ``worker_connections``) serves 256 fluent-bit nodes at out_forward's default of 2 workers
    each, with room for restarts; a bigger fleet raises it or ships to several ftwatch. One more
    connection is closed as soon as it is accepted; fluent-bit retries it.

    ``idle_timeout`` 120 s is four times fluent-bit's ``net.keepalive_idle_timeout`` (30 s):
    fluent-bit closes its own idle keepalive connections first, so ftwatch never closes one that
    fluent-bit is about to reuse (a write into it could be lost), yet a client that opened a
    connection and went silent (or stalls inside a request) frees its slot within two minutes.
    """

    model_config = _STRICT
    max_connections: int = Field(512, gt=0, description="Connections held at once; one more is "
                                 "closed at once (counted in ftwatch_source_connections_total).")
    idle_timeout: float = Field(120.0, gt=0, description="Seconds a connection may send nothing "
                                "(between or inside requests) before it is closed; above fluent-bit's "
                                "30 s keepalive idle timeout.")


class SourceRole(BaseModel):
    """What a source's lines are: a job's output (``job``) or a node's host log (``host``)."""

    role: Literal["job", "host"] = Field("job", description="job: pods' and workers' output; host: "
                                         "every line is a node's kernel / driver log (no job), "
                                         "attached to the jobs on that node.")


class ForwardSourceConfig(ListenerLimits, SourceRole):
    """fluent-bit's out_forward sends here (Forward protocol v1, TCP)."""

    model_config = _STRICT
    type: Literal["forward"] = Field(description="Source kind.")
    name: str = Field("forward", description="Source name (in stats and logs).")
    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 only on purpose (Q2).")
    port: int = Field(24224, ge=0, le=65535, description="TCP port; 24224 is fluent-bit's default.")
    shared_key: str | None = Field(None, repr=False, description="Shared key of the HELO/PING/PONG handshake.")
    shared_key_file: Path | None = Field(None, description="File holding the shared key (a mounted "
                                         "Secret; trailing whitespace dropped); instead of shared_key.")
    tls_cert: Path | None = Field(None, description="PEM certificate: TLS when set (with tls_key).")
    tls_key: Path | None = Field(None, description="PEM private key for tls_cert.")


class HttpSourceConfig(ListenerLimits, SourceRole):
    """fluent-bit's out_http posts here (json or json_lines, gzip)."""

    model_config = _STRICT
    type: Literal["http"] = Field(description="Source kind.")
    name: str = Field("http", description="Source name.")
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(9880, ge=0, le=65535, description="TCP port.")
    path: str = Field("/", description="URL path prefix accepted.")
    token: str | None = Field(None, repr=False, description="Bearer token required when set.")
    tls_cert: Path | None = Field(None, description="PEM certificate: HTTPS when set (with tls_key).")
    tls_key: Path | None = Field(None, description="PEM private key for tls_cert.")


class FileSourceConfig(SourceRole):
    """Tail files (globs), surviving rotation and restarts."""

    model_config = _STRICT
    type: Literal["file"] = Field(description="Source kind.")
    name: str = Field("file", description="Source name; also names its offsets file.")
    paths: list[str] = Field(description="Glob patterns of the files to follow.")
    envelope: Literal["cri", "docker"] | None = Field(None, description="Container runtime log format, if any.")
    read_from_head: bool = Field(False, description="Read files found at start from their beginning.")


class StdinSourceConfig(SourceRole):
    """Read lines from standard input."""

    model_config = _STRICT
    type: Literal["stdin"] = Field(description="Source kind.")
    name: str = Field("stdin", description="Source name.")
    envelope: Literal["cri", "docker"] | None = Field(None, description="Container runtime log format, if any.")


SourceConfig = Annotated[Union[ForwardSourceConfig, HttpSourceConfig, FileSourceConfig, StdinSourceConfig],
                         Field(discriminator="type")]


class IdentityConfig(BaseModel):
    """How a shipped line's metadata names its job, node, instance and rank."""

    model_config = _STRICT
    job_label: str = Field("training.kubeflow.org/job-name", description="Pod label that names the job.")
    default_job: str = Field("default", description="Job of lines with no job label.")
    default_node: str = Field("localhost", description="Node of lines that name none (a role: host "
                              "file tail of one node's kern.log names its node here).")
    host_tags: list[str] = Field(default_factory=list, description="Globs of record tags that are a "
                                 "node's host log (fluent-bit's kmsg / systemd input tag, e.g. kmsg*).")
    device_field: str = Field("pci_bus_ids", description="Record (or env) field with the PCI bus ids of "
                              "an instance's devices; a host line naming a device joins only them.")


class ActuatorConfig(BaseModel):
    """What acts on a decision in ``watch`` mode."""

    model_config = _STRICT
    type: Literal["none", "exec", "kubernetes", "slurm"] = Field(
        "none", description="none: observe only; exec: run `command`; kubernetes: act through the "
        "Kubernetes API (README \"Running on Kubernetes\"); slurm: through scontrol and scancel (the "
        "top-level `slurm` section, README \"Slurm\").")
    command: list[str] = Field(default_factory=list,
                               description="exec: argv run with the decision JSON on stdin.")
    timeout: float = Field(60.0, gt=0, description="exec: seconds before the command is killed.")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig,
                                         description="kubernetes: cluster access and what each decision does.")


class MonitorConfig(BaseModel):
    """The SDK's HTTP endpoint under ``watch`` (issue 13 item 3): a job's ``ftwatch.sdk.Monitor``
    reaches ``watch`` at ``FTWATCH_MONITOR_URL`` with its job's token (``FTWATCH_MONITOR_TOKEN``,
    printed by ``ftwatch watch --config FILE --monitor-token NAMESPACE/JOB``: an HMAC of the job
    under ``secret_file``), so one job's token acts on that job only."""

    model_config = _STRICT
    enabled: bool = Field(False, description="Serve the SDK endpoint (POST /v1/control).")
    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 in a pod (Q2).")
    port: int = Field(8790, ge=0, le=65535, description="TCP port (0: any free one, printed at start).")
    secret_file: Path | None = Field(None, description="File holding the secret the per-job tokens are "
                                     "derived from (a mounted Secret); required when enabled.")
    tls_cert: Path | None = Field(None, description="PEM certificate: HTTPS when set (with tls_key); the SDK "
                                  "verifies it with the CA in FTWATCH_MONITOR_CA.")
    tls_key: Path | None = Field(None, description="PEM private key for tls_cert.")


class WatchConfig(BaseModel):
    """``ftwatch watch``: jobs ftwatch did not launch."""

    model_config = _STRICT
    sources: list[SourceConfig] = Field(default_factory=list, description="Where lines come from.")
    identity: IdentityConfig = Field(default_factory=IdentityConfig, description="Job/node/instance from metadata.")
    actuator: ActuatorConfig = Field(default_factory=ActuatorConfig, description="What acts on decisions.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="The SDK over HTTP for watched jobs.")
    settle: float = Field(5.0, ge=0, description="Seconds the other instances may show errors before deciding.")
    cooldown: float = Field(60.0, ge=0, description="Seconds after acting during which a job's new errors wait.")
    queue_batches: int = Field(256, gt=0, description="Bound of the queue between sources and the engine.")
