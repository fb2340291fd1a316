"""One Kubernetes API call at a time, through the official ``kubernetes`` client: retried with
backoff, logged, refused in dry run, and explained when the API says no (issue 13).

Every call the ``kubernetes`` actuator makes is a :class:`Call`: the RBAC verb and resource it
needs, the object, the request line (method, path, patch type, body) and, once made, its
outcome. The lines of a decision's calls are stored with it (``ftwatch explain``).

Outcomes:
    ok               the API answered 2xx.
    gone (404)       a delete whose object is already gone: nothing left to do.
    dry run          a write (delete, patch) in dry run: logged, not sent. Reads are sent.
    failed: ...      a final error. A 403 names the RBAC verb and resource ftwatch's account
                     lacks; 429, 5xx and connection errors are retried ``retries`` times,
                     ``backoff`` s doubling (a 429's Retry-After wins, capped at 30 s).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ftwatch.errors import ConfigError

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_PATCH_NAMES = {STRATEGIC: "strategic merge", MERGE: "merge", JSON_PATCH: "JSON patch"}
WRITE_VERBS = frozenset({"delete", "patch", "update", "create"})
MAX_RETRY_AFTER = 30.0


class KubeError(Exception):
    """A call failed for good (its :class:`Call` says how)."""


class Conflict(KubeError):
    """409: the object changed since it was read (read it again and retry)."""


@dataclass
class Call:
    """One API call: what it needs, what it sends, and how it went.

    Attributes:
        verb: the RBAC verb (``get``, ``list``, ``patch``, ``delete``).
        resource: the RBAC resource (``pods``, ``nodes``, ``pytorchjobs.kubeflow.org``).
        name: the object (None for a list).
        namespace: its namespace (None for cluster-scoped objects).
        what: why, in a word: ``cordon``, ``taint``, ``annotate``, ``delete pod`` ...
        content_type: the patch type of a patch.
        body: the patch body sent.
        outcome: ``ok``, ``gone (404)``, ``dry run`` or ``failed: ...`` once made.
    """

    verb: str
    resource: str
    name: str | None = None
    namespace: str | None = None
    what: str = ""
    content_type: str | None = None
    body: Any = None
    outcome: str = ""
    tries: int = field(default=0, compare=False)

    def line(self) -> str:
        """``patch nodes/gpu-3 (cordon, strategic merge {"spec": ...}): ok``."""
        where = f"{self.namespace}/" if self.namespace else ""
        obj = f"{self.resource}/{where}{self.name}" if self.name else f"{self.resource} in {self.namespace or 'cluster'}"
        detail = [self.what] if self.what else []
        if self.content_type:
            detail.append(f"{_PATCH_NAMES.get(self.content_type, self.content_type)} "
                          f"{json.dumps(self.body, sort_keys=True)}")
        tries = f" after {self.tries} tries" if self.tries > 1 else ""
        return f"{self.verb} {obj} ({', '.join(detail)}): {self.outcome or 'not made'}{tries}"


def load_api_client(kubeconfig: str | os.PathLike | None = None, context: str | None = None):
    """A ``kubernetes.client.ApiClient``: in-cluster (the pod's ServiceAccount) when no kubeconfig
    is named and ``KUBERNETES_SERVICE_HOST`` is set, else the kubeconfig (``$KUBECONFIG`` or
    ``~/.kube/config`` when None).

    Raises:
        ConfigError: no cluster configuration was found or it could not be read.
    """
    from kubernetes import client, config as kube_config
    configuration = client.Configuration()
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            kube_config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, context=context,
                                         client_configuration=configuration)
        # urllib3 would retry a 429 / 503 itself, sleeping its Retry-After unseen: Kube.send retries
        configuration.retries = False
        return client.ApiClient(configuration)
    except (kube_config.ConfigException, OSError, TypeError, ValueError) as exc:
        raise ConfigError(f"kubernetes actuator: no usable cluster configuration "
                          f"({kubeconfig or 'in-cluster, $KUBECONFIG or ~/.kube/config'}): {exc}") from exc


class Kube:
    """Sends :class:`Call` s through the official client.

    Args:
        api_client: a ``kubernetes.client.ApiClient`` (:func:`load_api_client`).
        dry_run: writes are logged and not sent.
        retries: retries of a 429 / 5xx / connection error.
        backoff: seconds before the first retry, doubled each time.
        timeout: seconds per request.
        field_manager: the ``fieldManager`` query parameter of every patch.
        sleep: waits between retries (tests pass one that records).
        log: where each finished call's line goes.
    """

    def __init__(self, api_client, *, dry_run: bool = False, retries: int = 3, backoff: float = 1.0,
                 timeout: float = 30.0, field_manager: str = "ftwatch",
                 sleep: Callable[[float], None] = time.sleep, log: Callable[[str], None] | None = None):
        from kubernetes import client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.dry_run = dry_run
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.field_manager = field_manager
        self.sleep = sleep
        self.log = log or (lambda line: None)
        self.calls: list[Call] = []

    def take_calls(self) -> list[Call]:
        """The calls made since the last take (for one decision's record)."""
        calls, self.calls = self.calls, []
        return calls

    def send(self, call: Call, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Makes ``call`` as ``fn(*args, **kwargs)`` (a client method), patches with the call's
        content type and the field manager. Returns the API's answer (None in dry run and
        for a delete of a gone object).

        Raises:
            Conflict: 409 (the caller reads again and retries).
            KubeError: any other final failure; ``call.outcome`` says which.
        """
        self.calls.append(call)
        if call.content_type:
            kwargs.update(_content_type=call.content_type, field_manager=self.field_manager)
        if call.verb in WRITE_VERBS:
            if self.dry_run:
                return self._done(call, "dry run (not sent)")
            kwargs["_preload_content"] = False       # the answer of a write is not needed (nor parsed)
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError
        wait = self.backoff
        while True:
            call.tries += 1
            try:
                answer = fn(*args, _request_timeout=self.timeout, **kwargs)
                if kwargs.get("_preload_content") is False:   # a raw response: read it, free its connection
                    answer.read()
                    answer.release_conn()
                    answer = None
                self._done(call, "ok")
                return answer
            except ApiException as exc:
                status = exc.status or 0
                if status == 404 and call.verb == "delete":
                    return self._done(call, "gone (404)")
                text = f"{status} {_message(exc)}"
                if status == 403:
                    self._done(call, f"failed: 403 forbidden: ftwatch's account lacks the RBAC verb "
                                     f"{call.verb!r} on {call.resource!r} ({_message(exc)})")
                    raise KubeError(call.outcome) from exc
                if status == 409:
                    self._done(call, f"failed: 409 conflict: {_message(exc)}")
                    raise Conflict(call.outcome) from exc
                retry_after = _retry_after(exc) if status == 429 else None
                retryable = status == 429 or status >= 500
            except (HTTPError, OSError) as exc:
                text, retry_after, retryable = f"connection error: {exc}", None, True
            except Exception as exc:                   # an answer the client could not read
                self._done(call, f"failed: unreadable answer: {type(exc).__name__}: {exc}"[:500])
                raise KubeError(call.outcome) from exc
            if not retryable or call.tries > self.retries:
                self._done(call, f"failed: {text}")
                raise KubeError(call.outcome)
            delay = min(retry_after, MAX_RETRY_AFTER) if retry_after is not None else wait
            self.sleep(delay)
            wait *= 2

    def _done(self, call: Call, outcome: str) -> None:
        call.outcome = outcome
        self.log(call.line())
        return None


def _message(exc) -> str:
    """The ``message`` of the Status body the API answered with, else the HTTP reason."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(exc.reason or "")


def _retry_after(exc) -> float | None:
    """A 429's ``Retry-After`` (seconds), when it has one."""
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
