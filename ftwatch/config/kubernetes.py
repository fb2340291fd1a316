"""The ``watch.actuator.kubernetes`` section: how the ``kubernetes`` actuator reaches the cluster
and what each decision does to which object (issue 13, README "Running on Kubernetes").

Kept apart from ``ftwatch.config.watch`` only for size. Every default works for a Kubeflow
PyTorchJob on a cluster where ftwatch runs in a pod with the shipped RBAC
(``deploy/ftwatch/ftwatch.yaml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid")

JobKind = Literal["pytorchjob", "trainjob", "jobset", "volcano", "job", "pods"]

# The pod label that names a job's pods, per kind (what each controller puts on its pods).
DEFAULT_SELECTORS: dict[str, str] = {
    "pytorchjob": "training.kubeflow.org/job-name",
    "trainjob": "training.kubeflow.org/job-name",
    "jobset": "jobset.sigs.k8s.io/jobset-name",
    "volcano": "volcano.sh/job-name",
    "job": "batch.kubernetes.io/job-name",
    "pods": "ftwatch.io/job",
}


class TaintConfig(BaseModel):
    """The taint ``isolate_node`` puts on a node (``kubectl taint`` spelling: key=value:effect)."""

    model_config = _STRICT
    key: str = Field("ftwatch.io/isolated", description="Taint key; also marks the nodes ftwatch isolated.")
    value: str | None = Field(None, description="Taint value; None: the decision id.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "NoSchedule", description="NoSchedule keeps new pods off; NoExecute also evicts running ones.")


class BreakerConfig(BaseModel):
    """The circuit breaker on ``isolate_node``: at most ``max_share`` of the cluster's nodes (and at
    most ``max_nodes``, when set) isolated within ``window`` seconds; beyond it the decision is
    notified, not executed. 50 % in 5 minutes is NVIDIA NVSentinel's default."""

    model_config = _STRICT
    max_share: float = Field(0.5, gt=0, le=1, description="Share of all nodes that may be isolated in a window.")
    max_nodes: int | None = Field(None, ge=0, description="Absolute cap per window (None: share only).")
    window: float = Field(300.0, gt=0, description="Seconds of the sliding window.")


class KubernetesConfig(BaseModel):
    """The ``kubernetes`` actuator (``watch.actuator.type: kubernetes``)."""

    model_config = _STRICT
    kubeconfig: Path | None = Field(None, description="kubeconfig file; None: in-cluster (a pod's "
                                    "ServiceAccount) when KUBERNETES_SERVICE_HOST is set, else $KUBECONFIG "
                                    "or ~/.kube/config.")
    context: str | None = Field(None, description="kubeconfig context (None: its current one).")
    kind: JobKind = Field("pytorchjob", description="What the watched jobs are: which selector finds "
                          "their pods and which object fail_job suspends or deletes.")
    selectors: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_SELECTORS),
                                      description="kind -> the pod label whose value is the job name.")
    default_namespace: str = Field("default", description="Namespace of jobs whose name carries none.")
    fail: Literal["suspend", "delete"] = Field("suspend", description="fail_job: suspend the job "
                                               "object (kept, pods gone) or delete it.")
    taint: TaintConfig = Field(default_factory=TaintConfig, description="isolate_node's taint.")
    breaker: BreakerConfig = Field(default_factory=BreakerConfig, description="Isolation circuit breaker.")
    readmit_after: float | None = Field(None, gt=0, description="Seconds after which a node ftwatch "
                                        "isolated is readmitted (uncordoned, taint and annotations "
                                        "removed); None: only `ftwatch nodes readmit`.")
    dry_run: bool = Field(False, description="Log, store and alert every write the actuator would "
                          "make, send none (reads are sent).")
    field_manager: str = Field("ftwatch", description="fieldManager of every patch.")
    retries: int = Field(3, ge=0, description="Retries of a call that failed with 429, 5xx or a "
                         "connection error (409 on a node: read again and retry).")
    backoff: float = Field(1.0, gt=0, description="Seconds before the first retry, doubled each time "
                           "(a 429's Retry-After wins, capped at 30 s).")
    timeout: float = Field(30.0, gt=0, description="Seconds one API request may take.")

    def selector(self) -> str:
        """The label key that names a job's pods for ``kind``."""
        return self.selectors.get(self.kind) or DEFAULT_SELECTORS[self.kind]
