"""Names the job, node, instance and rank of a shipped line from its metadata (SPEC S5, issue 3).

Where the names come from, first match wins:

    instance  the pod (fluent-bit's Kubernetes filter ``kubernetes.pod_name``; else the pod in
              a CRI log path or a ``kube.var.log.containers.*`` tag); else ``meta["instance"]``;
              else the file's name without ``.log``; else the tag; else the source's name.
    node      ``kubernetes.host``; else ``meta["host"]`` / ``meta["hostname"]``; else
              ``default_node``.
    labels    a pod's labels, all of them (``Origin.labels``: they reach the Elasticsearch
              documents of its findings and output).
    job       the pod's ``job_label`` label; else the pod-name rule below; for lines of no pod,
              ``meta["job"]``, else ``default_job``. A pod's job is prefixed with its namespace
              (``team-a/mnist``) when the namespace is known, so same-named jobs in two
              namespaces never share state.
    rank      a field named like ``rank_env`` (``RANK``) at the top of the record or in a
              ``meta["env"]`` map (the process's own rank, taken as is); else a ``rank_labels``
              label, else the pod name's index; both plus ``worker_rank_offset`` for a
              ``worker`` replica. Else None: the engine learns it from ``[rankN]:`` prefixes.
    stream    ``meta["stream"]``; else the file path; else the tag; else ``stdout``.
    host      a line is host evidence (a node's kernel / driver log, no job: issue 12 item 5,
              ``ftwatch.pipeline.sources.hostlog``) when its record's ``host_log`` field is true
              (a ``host: true`` source sets it on every line) or its tag matches one of
              ``host_tags`` (fnmatch globs, e.g. ``kmsg*``); its origin is ``host_origin(node)``:
              the node as above, no job, no rank, and no pod rule applies.
    devices   the PCI bus ids of an instance's devices, from a ``device_field`` (``pci_bus_ids``,
              a list or a comma-separated string) at the top of the record or in its ``env``
              map; kept in :attr:`Identity.devices` per (job, instance) so a host line naming one
              device joins only the instances on it.

The pod-name rule (for pods without the job label):

    ``<job>-<role>-<N>`` with role ``master|worker|chief|ps|evaluator|launcher`` (the
        names Kubeflow's training-operator gives replicas: job, lower-case replica type,
        index): job ``<job>``; rank ``N`` for ``master``, ``N + worker_rank_offset`` for
        ``worker``, none for the other roles.
    ``<job>-<N>-<xxxxx>`` (an Indexed Job's pod: index, then 5 random characters from
        Kubernetes' name generator, which has no vowels): job ``<job>``, rank ``N``.
    ``<job>-<N>`` (a StatefulSet's pod): job ``<job>``, rank ``N``.
    ``<job>-<xxxxx>`` (a plain Job's pod): job ``<job>``, no rank.
    anything else: the pod is a job of its own (job = pod name), no rank.

Rank of a Kubeflow PyTorchJob worker: with a Master replica, training-operator sets
``RANK = replica-index + 1`` for workers and the index for the master (``setPodEnv`` in
``pkg/controller.v1/pytorch/envvar.go``); hence ``worker_rank_offset=1``. Elastic jobs without
a master have no per-pod rank (torchrun assigns them): use ``worker_rank_offset=0`` there and
let the ``[rankN]:`` prefixes correct it.

CRI log paths (kubelet): ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<N>.log`` and
the symlinks ``/var/log/containers/<pod>_<namespace>_<container>-<64 hex id>.log``.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any, Iterable, Iterator, Mapping

from ftwatch.bounded import BoundedDict
from ftwatch.config.limits import MAX_TRACKED_INSTANCES
from ftwatch.events import Origin
from ftwatch.parsers.joiners import Joiners, unwrap
from ftwatch.pipeline.sources.hostlog import HOST_KEY, host_origin, is_host_meta, pci_bus_id

__all__ = ["Identity", "parse_log_path", "pod_name_rule", "split_job"]

_ROLE = re.compile(r"(.+)-(master|worker|chief|ps|evaluator|launcher)-(\d+)")
_RAND = r"[bcdfghjklmnpqrstvwxz2456789]{5}"   # Kubernetes' generated-name alphabet (no vowels)
_INDEXED = re.compile(rf"(.+)-(\d+)-{_RAND}")
_ORDINAL = re.compile(r"(.+)-(\d+)")
_GENERATED = re.compile(rf"(.+)-{_RAND}")
_PODS_PATH = re.compile(r"(?:.*/)?pods/([^/_]+)_([^/_]+)_([^/]+)/([^/]+)/[^/]*\.log(?:\.[^/]*)?")
_CONTAINERS_FILE = re.compile(r"([^/_]+)_([^/_]+)_(.+)-([0-9a-f]{64})\.log")
_TAG_PREFIX = "kube.var.log.containers."
_CACHE_MAX = 65536


def pod_name_rule(pod: str, worker_rank_offset: int = 1) -> tuple[str, int | None, str | None]:
    """Applies the pod-name rule of this module's docstring.

    Args:
        pod: a pod name, e.g. ``mnist-worker-3``.
        worker_rank_offset: added to a ``worker`` replica's index.

    Returns:
        (job, rank or None, role or None); e.g. ``("mnist", 4, "worker")`` for ``mnist-worker-3``.
    """
    m = _ROLE.fullmatch(pod)
    if m is not None:
        job, role, index = m.group(1), m.group(2), int(m.group(3))
        if role == "master":
            return job, index, role
        if role == "worker":
            return job, index + worker_rank_offset, role
        return job, None, role
    for pattern in (_INDEXED, _ORDINAL):
        m = pattern.fullmatch(pod)
        if m is not None:
            return m.group(1), int(m.group(2)), None
    m = _GENERATED.fullmatch(pod)
    if m is not None:
        return m.group(1), None, None
    return pod, None, None


def split_job(job: str, default_namespace: str = "default") -> tuple[str, str]:
    """Takes a job (as :class:`Identity` names it) apart into (namespace, job name).

    Args:
        job: ``team-a/mnist`` (a pod's job, namespaced) or ``mnist`` (no namespace known).
        default_namespace: the namespace of a job that names none.

    Returns:
        ``("team-a", "mnist")``; ``(default_namespace, "mnist")``. Neither a namespace nor a
        Kubernetes object name can hold ``/``, so the first ``/`` is the split.
    """
    namespace, sep, name = job.partition("/")
    return (namespace, name) if sep and namespace and name else (default_namespace, job)


def parse_log_path(path: str) -> tuple[str, str, str] | None:
    """Finds (pod, namespace, container) in a kubelet CRI log path, or in a ``kube.*`` tail tag.

    Args:
        path: ``/var/log/pods/<ns>_<pod>_<uid>/<container>/0.log`` (rotated ``0.log.<date>``
            too), ``/var/log/containers/<pod>_<ns>_<container>-<id>.log``, or fluent-bit's tag
            for the latter, ``kube.var.log.containers.<pod>_<ns>_<container>-<id>.log``.

    Returns:
        (pod, namespace, container), or None for any other path.
    """
    m = _PODS_PATH.fullmatch(path)
    if m is not None:
        return m.group(2), m.group(1), m.group(4)
    name = path[len(_TAG_PREFIX):] if path.startswith(_TAG_PREFIX) else path.rpartition("/")[2]
    m = _CONTAINERS_FILE.fullmatch(name)
    if m is not None:
        return m.group(1), m.group(2), m.group(3)
    return None


def _int(value: Any) -> int | None:
    """``value`` as a non-negative int (from an int or a decimal string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isdigit() and len(value) < 10:
        return int(value)
    return None


class Identity:
    """Turns a shipped line's metadata into an :class:`~ftwatch.events.Origin` (rules: module doc).

    Results are cached; a full cache (65,536 entries) is cleared. A line of a pod is keyed by
    (pod, namespace, host, job label, rank field, stream, tag): its other labels (replica type
    and index) are read only when the key is first seen, since they are set when the pod is
    created and do not change while it lives, and a pod of the same name in the same job is
    the same replica. Other lines are keyed by every field they are named from.

    Args:
        job_label: the pod label that names the job.
        rank_labels: pod labels holding the replica index, the first present wins.
        rank_env: record fields holding the process's rank, the first present wins.
        default_job: the job of lines that name none and come from no pod.
        replica_type_labels: pod labels holding the replica type (``master``/``worker``).
        worker_rank_offset: added to a worker's replica index (1: PyTorchJob with a Master).
        default_node: the node of lines that name none.
        namespaced: prefix a pod's job with ``<namespace>/``.
        source: ``Origin.source`` of what ``origin`` returns.
        joiners: the envelope joiners ``resolve`` unwraps with (a new set when None).
        host_tags: globs of the tags whose records are host evidence.
        device_field: the record (or ``env``) field with an instance's PCI bus ids.
        max_devices: the most instances whose devices are kept (``limits.max_tracked_instances``);
            one more forgets the earliest named (counted as ``device``).

    Attributes:
        devices: (job, instance) -> the PCI bus ids (``dddd:bb:dd``) its records named.
    """

    def __init__(self, job_label: str = "training.kubeflow.org/job-name",
                 rank_labels: tuple[str, ...] = ("training.kubeflow.org/replica-index",
                                                 "pytorch-replica-index"),
                 rank_env: tuple[str, ...] = ("RANK",), default_job: str = "default", *,
                 replica_type_labels: tuple[str, ...] = ("training.kubeflow.org/replica-type",
                                                         "pytorch-replica-type"),
                 worker_rank_offset: int = 1, default_node: str = "localhost",
                 namespaced: bool = True, source: str = "shipped",
                 joiners: Joiners | None = None, host_tags: tuple[str, ...] = (),
                 device_field: str = "pci_bus_ids", max_devices: int = MAX_TRACKED_INSTANCES):
        self.job_label = job_label
        self.rank_labels = tuple(rank_labels)
        self.rank_env = tuple(rank_env)
        self.default_job = default_job
        self.replica_type_labels = tuple(replica_type_labels)
        self.worker_rank_offset = worker_rank_offset
        self.default_node = default_node
        self.namespaced = namespaced
        self.source = source
        self.joiners = joiners if joiners is not None else Joiners()
        self.host_tags = tuple(host_tags)
        self.device_field = device_field
        self.devices: dict[tuple[str, str], frozenset[str]] = BoundedDict(max_devices, "device")
        self._cache: dict[tuple, Origin] = {}
        self._not_inline = frozenset((*self.rank_env, "env", "envelope"))   # fields resolve() leaves to origin()

    def origin(self, meta: Mapping[str, Any]) -> Origin:
        """The Origin of one shipped line.

        Args:
            meta: a Shipped's ``meta``: fluent-bit record fields (``kubernetes`` {``pod_name``,
                ``namespace_name``, ``host``, ``labels``, ``container_name``}, ``stream``,
                ``tag``), a file tail's ``path``, or the ``instance``/``job``/``host`` a stdin
                or HTTP sender gave. Malformed values are ignored, never raised.

        Returns:
            The Origin (``source`` is this Identity's ``source``).
        """
        kube = meta.get("kubernetes")
        if type(kube) is dict:     # fluent-bit's Kubernetes filter (see the class doc)
            labels = kube.get("labels")
            key = (kube.get("pod_name"), kube.get("namespace_name"), kube.get("host"),
                   labels.get(self.job_label) if type(labels) is dict else _label(labels, self.job_label),
                   self._rank_field(meta), meta.get("stream"), meta.get("tag"), meta.get(HOST_KEY))
        elif kube is not None and _is_map(kube):
            key = None             # a Mapping that is not a dict: rare, never cached
        else:
            kube = None
            key = (None, meta.get("path"), meta.get("host"), meta.get("hostname"), meta.get("job"),
                   meta.get("instance"), self._rank_field(meta), meta.get("stream"), meta.get("tag"),
                   meta.get(HOST_KEY))
        try:
            cached = self._cache.get(key)
        except TypeError:          # a list or map where a name belongs: ignore the odd field
            key = cached = None
        if cached is not None:
            return cached
        origin = self._compute(meta, kube)
        if key is not None:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = origin
        return origin

    def resolve(self, batch: Iterable[Any]) -> Iterator[tuple[Origin, bytes, float]]:
        """Unwraps envelopes and names each line: the ``resolve`` callable ``Watcher`` takes.

        A fluent-bit record (``meta``, its ``kubernetes`` and their ``labels`` dicts, no rank
        field, no envelope) whose key the cache holds is named here, its key made inline as
        :meth:`origin` makes it (issue 16: ~30 % of this path's time for 1,000 pods); every
        other line goes through :meth:`origin`. Both give the same origin object.

        Args:
            batch: Shipped lines (``ftwatch.pipeline.sources.base.Shipped``).

        Yields:
            ``(origin, line, time)`` per unwrapped line (split lines once complete).
        """
        origin, joiners, cached, job_label = self.origin, self.joiners, self._cache.get, self.job_label
        inline = self._not_inline.isdisjoint
        for shipped in batch:
            meta = shipped.meta
            if type(meta) is dict:
                kube = meta.get("kubernetes")
                if type(kube) is dict and inline(meta):              # no rank field, no envelope
                    labels = kube.get("labels")
                    if type(labels) is dict:
                        try:                        # origin()'s key (the rank field None)
                            found = cached((kube.get("pod_name"), kube.get("namespace_name"), kube.get("host"),
                                            labels.get(job_label), None, meta.get("stream"), meta.get("tag"),
                                            meta.get(HOST_KEY)))
                        except TypeError:           # a list or map where a name belongs: origin() says
                            found = None
                        if found is not None:
                            yield found, shipped.line, shipped.time
                            continue
            if "envelope" not in meta:          # no envelope: unwrap would hand it back as is
                yield origin(meta), shipped.line, shipped.time
                continue
            for s in unwrap(shipped, joiners):
                yield origin(s.meta), s.line, s.time

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _first(labels: Mapping[str, Any], names: tuple[str, ...]) -> Any:
        for name in names:
            value = labels.get(name)
            if value is not None:
                return value
        return None

    def _rank_field(self, meta: Mapping[str, Any]) -> Any:
        for name in self.rank_env:
            value = meta.get(name)
            if value is not None:
                return value
        env = meta.get("env")
        if env is not None and _is_map(env):
            return self._first(env, self.rank_env)
        return None

    def _compute(self, meta: Mapping[str, Any], kube: Mapping[str, Any] | None) -> Origin:
        stream = _text(meta.get("stream")) or _text(meta.get("path")) or _text(meta.get("tag")) or "stdout"
        rank = _int(self._rank_field(meta))
        pod = namespace = None
        labels: Mapping[str, Any] = {}
        node = _text(meta.get("host")) or _text(meta.get("hostname"))
        if kube is not None:
            pod = _text(kube.get("pod_name"))
            namespace = _text(kube.get("namespace_name"))
            node = _text(kube.get("host")) or node
            labels = kube.get("labels") if isinstance(kube.get("labels"), Mapping) else {}
        if pod is None:
            for where in (meta.get("path"), meta.get("tag")):
                found = parse_log_path(where) if isinstance(where, str) else None
                if found is not None:
                    pod, namespace = found[0], namespace or found[1]
                    break
        node = node or self.default_node
        if self._is_host(meta):
            return host_origin(node, "", stream)
        origin = self._instance(meta, stream, rank, pod, namespace, node, labels)
        devices = self._devices(meta)
        if devices:
            self.devices[origin.key] = devices
        return origin

    def _is_host(self, meta: Mapping[str, Any]) -> bool:
        """The record is host evidence (module doc)."""
        if is_host_meta(meta):
            return True
        tag = meta.get("tag")
        return isinstance(tag, str) and any(fnmatchcase(tag, glob) for glob in self.host_tags)

    def _devices(self, meta: Mapping[str, Any]) -> frozenset[str]:
        """The PCI bus ids the record's ``device_field`` names (top level, else ``env``)."""
        value = meta.get(self.device_field)
        env = meta.get("env")
        if value is None and env is not None and _is_map(env):
            value = env.get(self.device_field)
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, (list, tuple)):
            return frozenset()
        return frozenset(d for d in (pci_bus_id(v) for v in value if isinstance(v, str)) if d is not None)

    def _instance(self, meta: Mapping[str, Any], stream: str, rank: int | None, pod: str | None,
                  namespace: str | None, node: str, labels: Mapping[str, Any]) -> Origin:
        """The origin of a job's line (the instance, job and rank rules of the module doc)."""
        if pod is None:
            instance = (_text(meta.get("instance")) or _file_stem(meta.get("path"))
                        or _text(meta.get("tag")) or self.source)
            job = _text(meta.get("job")) or self.default_job
            return Origin(instance, rank, job, node, stream, self.source)
        name_job, name_rank, role = pod_name_rule(pod, self.worker_rank_offset)
        job = _text(labels.get(self.job_label)) or name_job
        if rank is None:
            index = _int(self._first(labels, self.rank_labels))
            if index is not None:
                kind = _text(self._first(labels, self.replica_type_labels)) or role
                rank = index + self.worker_rank_offset if (kind or "").lower() == "worker" else index
            else:
                rank = name_rank
        if self.namespaced and namespace:
            job = f"{namespace}/{job}"
        pairs = tuple(sorted((str(k), v if isinstance(v, str) else str(v))
                             for k, v in labels.items() if v is not None))
        return Origin(pod, rank, job, node, stream, self.source, pairs)


def _label(labels: Any, name: str) -> Any:
    """``labels[name]`` of a labels map that is not a dict (None when it is no map at all)."""
    return labels.get(name) if labels is not None and _is_map(labels) else None


def _is_map(value: Any) -> bool:
    """isinstance(value, Mapping), fast for the common dict."""
    return type(value) is dict or isinstance(value, Mapping)


def _text(value: Any) -> str | None:
    """A non-empty str value, else None."""
    return value if isinstance(value, str) and value else None


def _file_stem(path: Any) -> str | None:
    """``/logs/worker-3.log`` -> ``worker-3``; None for no path."""
    if not isinstance(path, str) or not path:
        return None
    name = path.rpartition("/")[2]
    return name[:-4] if name.endswith(".log") and len(name) > 4 else name or None
