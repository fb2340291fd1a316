"""The ``kubernetes`` actuator of ``ftwatch watch``: decisions carried out through the Kubernetes
API with the official client (issue 13, README "Running on Kubernetes").

What each decision does (``job`` is ``namespace/name`` as ``watch``'s identity names it,
``ftwatch.pipeline.sources.identity.split_job``; the pods of a job are those whose
``selectors[kind]`` label is the job's name):

    restart_job         delete the job's pods; its controller (training-operator, JobSet,
                        Volcano, a Job) recreates them.
    restart_instance,   delete the decision's pod (its instance); the controller recreates it.
    restart_in_place    No instance: as restart_job.
    isolate_node        the circuit breaker first (``breaker.NodeBreaker``: beyond it the decision
                        is held, status ``held``); then cordon the node (strategic merge
                        ``spec.unschedulable``), taint it (``taint.key=value:effect``, value the
                        decision id by default; the node is read and patched with its
                        resourceVersion, a 409 reads again), annotate it (merge patch:
                        ``ftwatch.io/decision-id``, ``ftwatch.io/reason``, ``ftwatch.io/isolated-at``),
                        then restart the job as above.
    fail_job            ``fail: suspend``: patch the job object's suspend field (PyTorchJob
                        ``spec.runPolicy.suspend``, TrainJob / JobSet / batch Job ``spec.suspend``;
                        Volcano jobs have none: use ``fail: delete``); ``fail: delete``: delete it
                        (propagation Background). ``kind: pods``: delete the pods.
    notify, none        nothing.

:meth:`KubernetesActuator.readmit` undoes an isolation (one JSON patch, guarded by a ``test`` of the
resourceVersion): uncordon, remove the taint and the annotations; :meth:`tick` readmits the nodes
isolated longer than ``readmit_after`` ago, when that is set. Every call's line is in the
:class:`ActResult` (``calls``) that ``watch`` stores with the decision.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Callable

from ftwatch.clock import SystemClock
from ftwatch.config.kubernetes import KubernetesConfig
from ftwatch.events import Action, Decision, iso
from ftwatch.pipeline.actuators.breaker import NodeBreaker
from ftwatch.pipeline.actuators.exec import ActResult
from ftwatch.pipeline.actuators.kubeapi import (JSON_PATCH, MERGE, STRATEGIC, Call, Conflict, Kube, KubeError,
                                                load_api_client)
from ftwatch.pipeline.sources.identity import split_job

ANNOTATION_DECISION = "ftwatch.io/decision-id"
ANNOTATION_REASON = "ftwatch.io/reason"
ANNOTATION_AT = "ftwatch.io/isolated-at"
ANNOTATIONS = (ANNOTATION_DECISION, ANNOTATION_REASON, ANNOTATION_AT)
READMIT_CHECK_SECONDS = 60.0

# kind -> (API group, version, plural, path of the suspend field in spec); None: a core object.
JOB_OBJECTS: dict[str, tuple[str, str, str, tuple[str, ...]] | None] = {
    "pytorchjob": ("kubeflow.org", "v1", "pytorchjobs", ("runPolicy", "suspend")),
    "trainjob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs", ("suspend",)),
    "jobset": ("jobset.x-k8s.io", "v1alpha2", "jobsets", ("suspend",)),
    "volcano": ("batch.volcano.sh", "v1alpha1", "jobs", ()),
    "job": None,
    "pods": None,
}


class KubernetesActuator:
    """Acts on ``watch`` decisions through the Kubernetes API (module doc).

    Args:
        config: the ``watch.actuator.kubernetes`` section.
        api_client: a ``kubernetes.client.ApiClient``; None: loaded from the config
            (:func:`ftwatch.pipeline.actuators.kubeapi.load_api_client`).
        clock: time of annotations, the breaker's window and readmission.
        sleep: waits between retries.
        log: one line per call made (``watch`` prints them).

    Raises:
        ConfigError: no cluster configuration could be loaded.
    """

    def __init__(self, config: KubernetesConfig, api_client=None, clock=None,
                 sleep: Callable[[float], None] | None = None, log: Callable[[str], None] | None = None):
        self.config = config
        self.clock = clock or SystemClock()
        if api_client is None:
            api_client = load_api_client(config.kubeconfig, config.context)
        extra = {"sleep": sleep} if sleep is not None else {}
        self.kube = Kube(api_client, dry_run=config.dry_run, retries=config.retries, backoff=config.backoff,
                         timeout=config.timeout, field_manager=config.field_manager, log=log, **extra)
        b = config.breaker
        self.breaker = NodeBreaker(b.max_share, b.max_nodes, b.window)
        self._next_readmit_check = float("-inf")

    # -- the actuator protocol ------------------------------------------------------------------

    def act(self, decision: Decision) -> ActResult:
        """Carries the decision out; never raises (a failure is ``failed`` with the calls' lines)."""
        self.kube.take_calls()
        action = decision.action
        namespace, name = split_job(decision.target.job, self.config.default_namespace)
        try:
            if action is Action.ISOLATE_NODE:
                held = self._isolate(decision, namespace, name)
                if held:
                    return self._result("held", held)
            elif action in (Action.RESTART_INSTANCE, Action.RESTART_IN_PLACE) and decision.target.instance:
                self._delete_pod(namespace, decision.target.instance, "restart instance")
            elif action in (Action.RESTART_JOB, Action.RESTART_INSTANCE, Action.RESTART_IN_PLACE):
                self._restart_job(namespace, name)
            elif action is Action.FAIL_JOB:
                self._fail_job(namespace, name)
            else:
                return ActResult("skipped")
        except KubeError as exc:
            return self._result("failed", str(exc))
        return self._result("dry_run" if self.config.dry_run else "done")

    def tick(self, now: float) -> list[tuple[str, ActResult]]:
        """Readmits the nodes isolated more than ``readmit_after`` s ago (checked once a minute).

        Returns:
            (node, result) per node readmitted or tried.
        """
        after = self.config.readmit_after
        if after is None or now < self._next_readmit_check:
            return []
        self._next_readmit_check = now + READMIT_CHECK_SECONDS
        try:
            nodes = self.isolated_nodes()
        except KubeError:
            self.kube.take_calls()
            return []
        self.kube.take_calls()
        return [(n["name"], self.readmit(n["name"])) for n in nodes
                if n["isolated_at"] is not None and now - n["isolated_at"] >= after]

    # -- nodes (``ftwatch nodes``) ---------------------------------------------------------------

    def isolated_nodes(self) -> list[dict[str, Any]]:
        """The nodes ftwatch isolated: name, unschedulable, taint, decision id, reason, isolated_at
        (epoch seconds or None), sorted by name.

        Raises:
            KubeError: the nodes could not be listed.
        """
        out = []
        for node in self._list_nodes().items:
            ann = node.metadata.annotations or {}
            taint = self._our_taint(node)
            if taint is None and ANNOTATION_DECISION not in ann:
                continue
            out.append({"name": node.metadata.name, "unschedulable": bool(node.spec.unschedulable),
                        "taint": f"{taint.key}={taint.value or ''}:{taint.effect}" if taint else None,
                        "decision_id": ann.get(ANNOTATION_DECISION), "reason": ann.get(ANNOTATION_REASON),
                        "isolated_at": _epoch(ann.get(ANNOTATION_AT))})
        return sorted(out, key=lambda n: n["name"])

    def readmit(self, node: str) -> ActResult:
        """Uncordons ``node`` and removes ftwatch's taint and annotations (one JSON patch guarded by
        the node's resourceVersion; a conflict reads again). Never raises."""
        self.kube.take_calls()

        def patch(current) -> tuple[str, list[dict[str, Any]]]:
            ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                          "value": current.metadata.resource_version}]
            taints = current.spec.taints or []
            kept = [_taint_dict(t) for t in taints if t.key != self.config.taint.key]
            if len(kept) != len(taints):
                ops.append({"op": "replace", "path": "/spec/taints", "value": kept})
            ops.append({"op": "add", "path": "/spec/unschedulable", "value": False})
            ann = current.metadata.annotations or {}
            return JSON_PATCH, ops + [{"op": "remove", "path": "/metadata/annotations/" + _pointer(k)}
                                      for k in ANNOTATIONS if k in ann]

        try:
            self._patch_node_read(node, "readmit", patch)
        except KubeError as exc:
            return self._result("failed", str(exc))
        self.breaker.recent.pop(node, None)
        return self._result("dry_run" if self.config.dry_run else "done")

    # -- internals -------------------------------------------------------------------------------

    def _result(self, status: str, why: str = "") -> ActResult:
        lines = tuple(c.line() for c in self.kube.take_calls())
        output = "\n".join(([why] if why else []) + list(lines))
        return ActResult(status, None, output, lines)

    def _list_nodes(self):
        return self.kube.send(Call("list", "nodes", what="count and find isolated nodes"), self.kube.core.list_node)

    def _isolate(self, decision: Decision, namespace: str, name: str) -> str | None:
        """Breaker, cordon, taint, annotate, restart; the breaker's reason when it holds."""
        node = decision.target.node
        if node:
            now = self.clock.time()
            nodes = self._list_nodes().items
            marked = {n.metadata.name: _epoch((n.metadata.annotations or {}).get(ANNOTATION_AT)) for n in nodes}
            held = self.breaker.check(node, now, len(nodes), {n: t for n, t in marked.items() if t is not None})
            if held:
                return held
            self.kube.send(Call("patch", "nodes", node, what="cordon", content_type=STRATEGIC,
                                body={"spec": {"unschedulable": True}}),
                           self.kube.core.patch_node, node, {"spec": {"unschedulable": True}})
            self._taint(node, decision.decision_id)
            reason = self._reason(decision)
            body = {"metadata": {"annotations": {ANNOTATION_DECISION: decision.decision_id,
                                                 ANNOTATION_REASON: reason, ANNOTATION_AT: iso(now)}}}
            self.kube.send(Call("patch", "nodes", node, what="annotate", content_type=MERGE, body=body),
                           self.kube.core.patch_node, node, body)
            self.breaker.record(node, now)
        self._restart_job(namespace, name)
        return None

    def _taint(self, node: str, decision_id: str) -> None:
        t = self.config.taint
        ours = {"key": t.key, "value": t.value if t.value is not None else decision_id, "effect": t.effect}

        def patch(current) -> tuple[str, dict[str, Any]]:
            taints = [_taint_dict(x) for x in (current.spec.taints if current else None) or [] if x.key != t.key]
            rv = current.metadata.resource_version if current else None
            return STRATEGIC, {"metadata": {"resourceVersion": rv}, "spec": {"taints": taints + [ours]}}

        self._patch_node_read(node, "taint", patch)

    def _patch_node_read(self, node: str, what: str, patch: Callable[[Any], tuple[str, Any]]) -> None:
        """Reads the node, patches it with ``patch(node) -> (content type, body)`` (a body guarded by
        the read resourceVersion); a 409 conflict reads again, ``retries`` times.

        Raises:
            KubeError: a call failed, or the node kept changing.
        """
        for _ in range(self.config.retries + 1):
            current = self.kube.send(Call("get", "nodes", node, what=f"read for {what}"),
                                     self.kube.core.read_node, node)
            content_type, body = patch(current)
            try:
                self.kube.send(Call("patch", "nodes", node, what=what, content_type=content_type, body=body),
                               self.kube.core.patch_node, node, body)
                return
            except Conflict:
                continue
        raise KubeError(f"{what} {node}: the node kept changing ({self.config.retries + 1} conflicts)")

    def _restart_job(self, namespace: str, name: str) -> None:
        selector = f"{self.config.selector()}={name}"
        pods = self.kube.send(Call("list", "pods", namespace=namespace, what=f"pods of {selector}"),
                              self.kube.core.list_namespaced_pod, namespace, label_selector=selector)
        for pod in pods.items:
            self._delete_pod(namespace, pod.metadata.name, "restart job")

    def _delete_pod(self, namespace: str, pod: str, why: str) -> None:
        self.kube.send(Call("delete", "pods", pod, namespace, what=why),
                       self.kube.core.delete_namespaced_pod, pod, namespace)

    def _fail_job(self, namespace: str, name: str) -> None:
        kind, mode = self.config.kind, self.config.fail
        if kind == "pods":
            self._restart_job(namespace, name)          # no controller: deleting the pods ends the job
            return
        obj = JOB_OBJECTS[kind]
        if obj is None:                                 # batch/v1 Job
            if mode == "delete":
                self.kube.send(Call("delete", "jobs.batch", name, namespace, what="fail job"),
                               self.kube.batch.delete_namespaced_job, name, namespace,
                               propagation_policy="Background")
            else:
                body = {"spec": {"suspend": True}}
                self.kube.send(Call("patch", "jobs.batch", name, namespace, what="suspend", content_type=MERGE,
                                    body=body), self.kube.batch.patch_namespaced_job, name, namespace, body)
            return
        group, version, plural, path = obj
        resource = f"{plural}.{group}"
        if mode == "delete":
            self.kube.send(Call("delete", resource, name, namespace, what="fail job"),
                           self.kube.custom.delete_namespaced_custom_object, group, version, namespace, plural,
                           name, propagation_policy="Background")
            return
        if not path:
            raise KubeError(f"fail_job: {kind} jobs have no suspend field; set fail: delete")
        body: dict[str, Any] = True                     # type: ignore[assignment]
        for key in reversed(("spec",) + path):
            body = {key: body}
        self.kube.send(Call("patch", resource, name, namespace, what="suspend", content_type=MERGE, body=body),
                       self.kube.custom.patch_namespaced_custom_object, group, version, namespace, plural,
                       name, body)

    def _our_taint(self, node):
        return next((t for t in (node.spec.taints or []) if t.key == self.config.taint.key), None)

    @staticmethod
    def _reason(decision: Decision) -> str:
        rc = decision.root_cause
        text = f"{rc.rule_id}: {rc.line}" if rc is not None else decision.policy_clause
        return text[:250]


def _taint_dict(taint) -> dict[str, Any]:
    """A V1Taint as the API's JSON (``timeAdded`` kept)."""
    out = {"key": taint.key, "effect": taint.effect}
    if taint.value is not None:
        out["value"] = taint.value
    if getattr(taint, "time_added", None) is not None:
        out["timeAdded"] = taint.time_added.isoformat() if hasattr(taint.time_added, "isoformat") else taint.time_added
    return out


def _pointer(key: str) -> str:
    """A JSON pointer token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return key.replace("~", "~0").replace("/", "~1")


def _epoch(text: str | None) -> float | None:
    """An ISO 8601 time (``2026-11-26T01:02:03.000Z``) as epoch seconds, None when unreadable."""
    if not text:
        return None
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
