"""Identity: job, node, instance and rank from fluent-bit Kubernetes metadata and CRI paths (SPEC S5)."""

from __future__ import annotations

import pytest

from ftwatch.events import Origin
from ftwatch.pipeline.sources.identity import Identity, parse_log_path, pod_name_rule
from ftwatch.pipeline.sources.base import Shipped

JOB = "training.kubeflow.org/job-name"


def kube(pod, ns="team-a", host="gpu-node-7", labels=None, stream="stderr", **extra):
    """A record's meta as fluent-bit's kubernetes filter leaves it."""
    return {"stream": stream, "kubernetes": {
        "pod_name": pod, "namespace_name": ns, "host": host, "container_name": "pytorch",
        "labels": labels or {}, "docker_id": "ab" * 32}, **extra}


def pytorchjob_labels(job, rtype, index):
    """The labels training-operator v1 puts on a PyTorchJob's pods."""
    return {JOB: job, "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": rtype, "training.kubeflow.org/replica-index": str(index)}


def test_pytorchjob_pods_with_labels():
    ident = Identity()
    master = ident.origin(kube("mnist-master-0", labels=pytorchjob_labels("mnist", "master", 0)))
    worker = ident.origin(kube("mnist-worker-2", host="gpu-node-9", labels=pytorchjob_labels("mnist", "worker", 2)))
    assert master == Origin("mnist-master-0", 0, "team-a/mnist", "gpu-node-7", "stderr", "shipped")
    # training-operator: a worker's RANK is its index + 1 when the job has a Master
    assert worker == Origin("mnist-worker-2", 3, "team-a/mnist", "gpu-node-9", "stderr", "shipped")


def test_pytorchjob_pods_by_name_only():
    ident = Identity()
    assert ident.origin(kube("llama-70b-worker-15")).rank == 16
    assert ident.origin(kube("llama-70b-worker-15")).job == "team-a/llama-70b"
    assert ident.origin(kube("llama-70b-master-0")).rank == 0
    assert Identity(worker_rank_offset=0).origin(kube("elastic-worker-3")).rank == 3


def test_rank_env_wins_over_labels_and_name():
    ident = Identity()
    meta = kube("mnist-worker-2", labels=pytorchjob_labels("mnist", "worker", 2), RANK="7")
    assert ident.origin(meta).rank == 7
    assert ident.origin(kube("mnist-worker-2", env={"RANK": 5})).rank == 5


@pytest.mark.parametrize("pod, expected", [
    ("mnist-worker-3", ("mnist", 4, "worker")),
    ("a-b-master-0", ("a-b", 0, "master")),
    ("tf-ps-1", ("tf", None, "ps")),
    ("bert-3-x7kq2", ("bert", 3, None)),        # Indexed Job
    ("trainer-12", ("trainer", 12, None)),       # StatefulSet
    ("pretrain-b9zkq", ("pretrain", None, None)),  # plain Job (generated suffix has no vowels)
    ("pretrain-train", ("pretrain-train", None, None)),
    ("single", ("single", None, None)),
])
def test_pod_name_rule(pod, expected):
    assert pod_name_rule(pod) == expected


def test_pods_of_two_jobs_never_share_a_job():
    ident = Identity()
    a = [ident.origin(kube(f"mnist-worker-{i}", labels=pytorchjob_labels("mnist", "worker", i))) for i in range(4)]
    b = [ident.origin(kube(f"resnet-worker-{i}")) for i in range(4)]
    c = [ident.origin(kube(f"mnist-worker-{i}", ns="team-b")) for i in range(4)]   # same name, other namespace
    d = ident.origin(kube("lonely"))
    jobs = [{o.job for o in group} for group in (a, b, c, [d])]
    assert all(len(j) == 1 for j in jobs)
    assert len(set().union(*jobs)) == 4
    assert len({o.key for o in a + b + c + [d]}) == 13


def test_job_label_wins_over_the_name():
    ident = Identity(job_label="app.kubernetes.io/instance")
    o = ident.origin(kube("weird-name-x", labels={"app.kubernetes.io/instance": "run-42"}))
    assert o.job == "team-a/run-42" and o.instance == "weird-name-x"
    assert Identity(namespaced=False).origin(kube("mnist-worker-0")).job == "mnist"


@pytest.mark.parametrize("path, expected", [
    ("/var/log/pods/team-a_mnist-worker-1_0b6c7d2e-1111-2222-3333-444455556666/pytorch/0.log",
     ("mnist-worker-1", "team-a", "pytorch")),
    ("/var/log/pods/team-a_mnist-worker-1_0b6c7d2e/pytorch/3.log.20261121-093603",
     ("mnist-worker-1", "team-a", "pytorch")),
    ("/var/log/containers/mnist-worker-1_team-a_pytorch-" + "0123456789abcdef" * 4 + ".log",
     ("mnist-worker-1", "team-a", "pytorch")),
    ("kube.var.log.containers.my.pod-0_default_main-" + "f" * 64 + ".log", ("my.pod-0", "default", "main")),
    ("/var/log/syslog", None),
    ("/logs/worker-3.log", None),
])
def test_parse_log_path(path, expected):
    assert parse_log_path(path) == expected


def test_file_tail_meta():
    ident = Identity(default_node="node-a")
    o = ident.origin({"path": "/var/log/pods/team-a_mnist-worker-1_uid/pytorch/0.log", "stream": "stdout"})
    assert o == Origin("mnist-worker-1", 2, "team-a/mnist", "node-a", "stdout", "shipped")
    plain = ident.origin({"path": "/logs/worker-3.log"})
    assert (plain.instance, plain.job, plain.stream, plain.rank) == ("worker-3", "default", "/logs/worker-3.log", None)


def test_tag_and_stdin_meta():
    ident = Identity(source="forward")
    tag = "kube.var.log.containers.mnist-worker-0_team-a_pytorch-" + "a" * 64 + ".log"
    o = ident.origin({"tag": tag, "stream": "stderr"})
    assert (o.instance, o.job, o.rank, o.source) == ("mnist-worker-0", "team-a/mnist", 1, "forward")
    s = Identity(source="stdin").origin({"instance": "launcher", "job": "mnist", "host": "h1"})
    assert s == Origin("launcher", None, "mnist", "h1", "stdout", "stdin")
    assert Identity(source="stdin").origin({}) == Origin("stdin", None, "default", "localhost", "stdout", "stdin")


def test_odd_values_are_ignored():
    ident = Identity()
    o = ident.origin({"kubernetes": {"pod_name": "p-worker-1", "labels": ["not", "a", "map"], "host": 3},
                      "stream": ["x"], "RANK": "-1"})
    assert (o.instance, o.rank, o.node, o.stream) == ("p-worker-1", 2, "localhost", "stdout")
    assert ident.origin({"kubernetes": "nope"}).instance == "shipped"


def test_cache_returns_the_same_origin_and_tracks_stream():
    ident = Identity()
    a = ident.origin(kube("mnist-worker-0", stream="stdout"))
    assert ident.origin(kube("mnist-worker-0", stream="stdout")) is a
    assert ident.origin(kube("mnist-worker-0", stream="stderr")).stream == "stderr"


def test_resolve_names_each_record_as_origin_does_whichever_path_it_takes():
    """``resolve`` names a fluent-bit record whose key the cache holds inline (issue 16): for
    records of every shape (rank fields at the top or in ``env``, labels that are no dict, odd
    values, host evidence, seen before or not) it yields the very objects ``origin`` gives, and
    the same origins (labels included) as a fresh Identity naming them one by one."""
    metas = [kube("mnist-worker-0", labels=pytorchjob_labels("mnist", "Worker", 0)),
             kube("mnist-worker-1", labels=pytorchjob_labels("mnist", "Worker", 1)),
             kube("mnist-worker-1", labels=pytorchjob_labels("mnist", "Worker", 1), RANK="7"),
             kube("mnist-worker-1", labels=pytorchjob_labels("mnist", "Worker", 1), env={"RANK": "5"}),
             kube("mnist-worker-1", labels=pytorchjob_labels("mnist", "Worker", 1), env="odd"),
             kube("mnist-worker-2", labels=None), kube("mnist-worker-3", stream="stdout", tag="kube.x"),
             {"kubernetes": {"pod_name": "p-worker-1", "labels": ["not", "a", "map"]}, "stream": "stderr"},
             {"kubernetes": {"pod_name": ["odd"], "labels": {}}, "stream": "stderr"},
             kube("node-agent", host_log=True), {"instance": "w-3", "job": "j", "host": "h"},
             {"kubernetes": "nope"}]
    batch = [Shipped(float(k), f"line {k}".encode(), m) for k, m in enumerate(metas * 2)]
    ident = Identity()
    first = list(ident.resolve(batch))
    again = list(ident.resolve(batch))
    assert [o for o, _, _ in again] == [o for o, _, _ in first]
    cached = [m for m in metas if ident.origin(m) is ident.origin(m)]    # all but the unhashable key
    assert len(cached) == len(metas) - 1
    assert all(a is ident.origin(m) for (a, _, _), m in zip(again, metas * 2) if m in cached)
    fresh = Identity()
    expected = [fresh.origin(m) for m in metas * 2]
    assert [(o, o.labels) for o, _, _ in first] == [(o, o.labels) for o in expected]
    assert [(line, t) for _, line, t in first] == [(s.line, s.time) for s in batch]


def test_resolve_unwraps_and_names():
    ident = Identity()
    path = "/var/log/pods/team-a_mnist-worker-0_uid/pytorch/0.log"
    meta = {"path": path, "envelope": "cri"}
    batch = [Shipped(1.0, b"2026-11-21T09:36:03Z stderr P Traceback (most ", meta),
             Shipped(1.0, b"2026-11-21T09:36:03Z stderr F recent call last):", meta),
             Shipped(2.0, b"not cri at all", meta)]
    out = list(ident.resolve(batch))
    assert [(o.instance, o.stream, line) for o, line, _ in out] == [
        ("mnist-worker-0", "stderr", b"Traceback (most recent call last):"),
        ("mnist-worker-0", path, b"not cri at all")]
    assert ident.joiners.malformed == {"cri": 1}
