"""The control socket: the training SDK (``ftwatch.sdk``) talks to the running ``ftwatch run`` (SPEC N5, K1, R2, R6).

:class:`ControlServer` listens on a Unix-domain socket (mode 0600) with a random token; the
supervisor hands both to the workers as ``FTWATCH_CONTROL_SOCKET`` and ``FTWATCH_CONTROL_TOKEN``.
The protocol is JSON lines: a request ``{"token": ..., "op": ..., ...}`` is answered by
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``; a connection may carry several.

A thread per connection checks the token (a wrong one is answered at once and never queued) and
puts the request on a queue. Nothing here touches the engine or the tracker: the runner's loop
calls :meth:`ControlServer.drain` with a :class:`ControlHandler` once per iteration, so every
change happens on the runner's thread. A request not taken within ``answer_timeout`` seconds (the
runner is stopping or restarting the workers) is answered ``ok: false`` and dropped.

Ops (:class:`ControlHandler`):

=========================  ===================================================================
``set_retryable_errors``   ``errors``: list of str -> ``engine.add_rules(make_rules(errors))``
``reset_config``           ``config``: {``job_hang_interval``: seconds, -1 = off}; other keys
                           are refused
``hang_detect_push``       ``seconds`` (-1 = off) -> ``{"scope": id}``; the newest open scope's
                           interval is the job's until it is popped
``hang_detect_pop``        ``scope``: an id from a push (an unknown one is fine: a scope of an
                           earlier attempt)
``send_custom_message``    ``content`` -> ``recorder.custom_message`` (console, receivers, store)
``report_step``            ``step`` -> counts as output of the sender (``instance``/``rank``)
``subscribe``              ``events``: [``retry``] -> the connection then receives pushed
                           notices (``ftwatch.pipeline.sources.notices``); answered by the server itself
=========================  ===================================================================

Hang scopes of all ranks share one stack: with every rank inside ``hang_detect(2)`` the interval
stays 2 until the last of them leaves. ``reset_config`` sets the interval outside any scope.
:meth:`ControlHandler.new_attempt` drops the scopes and the reset (a worker killed inside a scope
never pops it); the restarted workers set them again.

The rules ``set_retryable_errors`` added are the job's: they stay across its attempts (the
restarted workers send the same list, which adds nothing), and ``ControlHandler.rule_ids`` names
them, so that the driver removes them from the engine when the job ends (``watch`` forgets a
failed or idle job, whose name may later start fresh: ``Engine.remove_rules``; one engine serves
every watched job, so another job's rules stay).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import os
import queue
import secrets
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ftwatch.pipeline.sources.notices import Subscribers

ENV_SOCKET = "FTWATCH_CONTROL_SOCKET"
ENV_TOKEN = "FTWATCH_CONTROL_TOKEN"
MAX_LINE = 1 << 20            # bytes in one request
ANSWER_TIMEOUT = 4.0          # seconds a request waits for the runner's loop
_SUN_PATH_MAX = 100           # AF_UNIX path limit is 104-108 bytes; keep a margin


@dataclass(eq=False)
class Request:
    """One request waiting for the runner's thread."""

    message: dict[str, Any]
    answer: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    dropped: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


FIRE_AND_FORGET = frozenset({"report_step"})   # answered on receipt; applied at the next drain


def drain_requests(requests: "queue.SimpleQueue[Request]", handle: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """Answers every queued request with ``handle(message)`` on the caller's thread (a request
    whose asker gave up is skipped); an exception in ``handle`` becomes ``ok: false``. Returns how
    many were answered. The socket's and the HTTP endpoint's (``monitor.py``) drain."""
    n = 0
    while True:
        try:
            req = requests.get_nowait()
        except queue.Empty:
            return n
        with req.lock:
            if req.dropped:
                continue
            try:
                answer = handle(req.message)
            except Exception as exc:  # noqa: BLE001 - a bad request never ends the run
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            req.answer = answer
            req.done.set()
            n += 1


class ControlServer:
    """The Unix-socket server. ``start`` it, give :meth:`env` to the workers, ``drain`` it from the
    runner's loop, ``stop`` it at the end.

    Args:
        directory: where the socket goes (the state dir); made absolute first, so a worker that
            changes its working directory still reaches it; a private temporary directory is used
            when the absolute path would be too long for ``AF_UNIX``.
        answer_timeout: seconds a request may wait for :meth:`drain`.
    """

    def __init__(self, directory: Path | str, answer_timeout: float = ANSWER_TIMEOUT):
        self.token = secrets.token_hex(16)
        self.answer_timeout = answer_timeout
        name = f"control-{os.getpid()}-{secrets.token_hex(4)}.sock"
        directory = Path(directory).resolve()
        self._tmpdir: str | None = None
        if len(os.fsencode(str(directory / name))) > _SUN_PATH_MAX:
            self._tmpdir = tempfile.mkdtemp(prefix="ftwatch-")
            directory = Path(self._tmpdir)
        self.path = directory / name
        self._queue: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self._sock: socket.socket | None = None
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.subscribers = Subscribers()    # connections that receive pushed notices (retry)
        self.wake: Callable[[], None] = lambda: None   # called after each queued request (the loop's poll)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> "ControlServer":
        """Bind (mode 0600) and accept in a background thread."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        sock.settimeout(0.2)
        self._sock = sock
        t = threading.Thread(target=self._accept, name="ftwatch-control", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def env(self) -> dict[str, str]:
        """The workers' environment variables that point the SDK here."""
        return {ENV_SOCKET: str(self.path), ENV_TOKEN: self.token}

    def stop(self) -> None:
        """Close the socket, answer what is still queued ``ok: false``, remove the file."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self.drain(lambda message: {"ok": False, "error": "ftwatch is stopping"})
        for t in self._threads:
            t.join(2)
        with contextlib.suppress(OSError):
            self.path.unlink()
        if self._tmpdir is not None:
            with contextlib.suppress(OSError):
                os.rmdir(self._tmpdir)

    def __enter__(self) -> "ControlServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the runner's side ----------------------------------------------------------------------

    def drain(self, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
        """Answer every queued request with ``handle(message)`` (on the caller's thread).

        ``handle`` returns the answer; an exception in it becomes ``ok: false``. Returns how
        many requests were answered.
        """
        return drain_requests(self._queue, handle)

    # -- the connection threads -----------------------------------------------------------------

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                self._conns.add(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name="ftwatch-control-conn", daemon=True)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rb") as rfile:
                while not self._stopped.is_set():
                    line = rfile.readline(MAX_LINE + 1)
                    if not line:
                        return
                    answer = self._answer(line, conn)
                    conn.sendall((json.dumps(answer, ensure_ascii=False) + "\n").encode())
        except OSError:
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            self.subscribers.drop(conn)

    def _answer(self, line: bytes, conn: socket.socket | None = None) -> dict[str, Any]:
        if len(line) > MAX_LINE:
            return {"ok": False, "error": "request too long"}
        try:
            message = json.loads(line)
        except ValueError as exc:
            return {"ok": False, "error": f"not JSON: {exc}"}
        if not isinstance(message, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        token = message.pop("token", None)
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.token.encode()):
            return {"ok": False, "error": "bad token"}
        if not isinstance(message.get("op"), str):
            return {"ok": False, "error": "missing op"}
        if self._stopped.is_set():
            return {"ok": False, "error": "ftwatch is stopping"}
        if message["op"] == "subscribe" and conn is not None:
            return self.subscribers.add(conn, message)
        if message["op"] == "report_step" and (type(message.get("step")) is not int):
            return {"ok": False, "error": "report_step: step must be an integer"}
        req = Request(message)
        self._queue.put(req)
        self.wake()
        if message["op"] in FIRE_AND_FORGET:   # a heartbeat must not slow a training step down
            return {"ok": True, "queued": True}
        if req.done.wait(self.answer_timeout):
            return req.answer or {"ok": False, "error": "no answer"}
        with req.lock:
            if req.done.is_set():
                return req.answer or {"ok": False, "error": "no answer"}
            req.dropped = True
        return {"ok": False, "error": f"ftwatch did not take the request within {self.answer_timeout:g} s "
                                      "(workers stopping or restarting)"}


def for_job(make_rules: Callable[[Sequence[str]], list], job: str) -> Callable[[Sequence[str]], list]:
    """``make_rules`` whose rules hit only lines of ``job`` (their origin's job): ``watch``
    shares one engine among every job, so one job's ``set_retryable_errors`` must not change
    another's decisions. Each rule's id gets ``@job`` (one job's keyword never shadows
    another's) and its condition says ``job == ...``.

    Args:
        make_rules: keywords -> rules (frozen dataclasses with ``id``, ``when``, ``predicate``).
        job: the job (``namespace/name``).
    """
    def predicate(raw: bytes, origin: Any) -> bool:
        return origin.job == job

    def make(errors: Sequence[str]) -> list:
        return [dataclasses.replace(rule, id=f"{rule.id}@{job}", when=f"job == {job!r}", predicate=predicate)
                for rule in make_rules(errors)]
    return make


class ControlHandler:
    """Carries out control requests on the runner's thread.

    Args:
        engine: has ``add_rules(rules) -> ids added`` (kept in ``rule_ids``).
        tracker: has ``set_job_hang_interval(seconds | None, time)`` and ``output(instance, time)``.
        recorder: has ``custom_message(time, job, content, instance=, rank=, node=, budgets=)``.
        job: the job id.
        make_rules: keywords -> rules (``ftwatch.rules.loader.rules_from_keywords``).
        hang_interval: the configured job-hang interval (None = off).
        hang_supported: False when job-hang detection is off (flag, or Async mode): the hang ops
            are refused then.
        budgets: () -> (restarts_used, restarts_left), for the custom-message alert.
        node: this machine, for the custom message's origin.
        clock: () -> epoch seconds.
    """

    def __init__(self, engine: Any, tracker: Any, recorder: Any, job: str,
                 make_rules: Callable[[Sequence[str]], list], hang_interval: float | None,
                 hang_supported: bool = True, budgets: Callable[[], tuple[int, int]] | None = None,
                 node: str | None = None, clock: Callable[[], float] = time.time):
        self.engine, self.tracker, self.recorder, self.job = engine, tracker, recorder, job
        self.make_rules = make_rules
        self.configured = hang_interval
        self.hang_supported = hang_supported
        self.budgets = budgets
        self.node = node
        self.clock = clock
        self.base = hang_interval
        self.scopes: list[tuple[str, float | None]] = []
        self.retryable: list[str] = []
        self.rule_ids: list[str] = []          # rules it added to the engine: the job's, removed when it ends
        self.last_step: dict[str, int] = {}

    def new_attempt(self) -> None:
        """A new attempt: open scopes and ``reset_config`` are forgotten; the configured interval is back."""
        self.scopes.clear()
        self.base = self.configured
        self._apply()

    @property
    def interval(self) -> float | None:
        """The job-hang interval in force (None = off)."""
        value = self.scopes[-1][1] if self.scopes else self.base
        return None if value is None or value <= 0 else value

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        method = getattr(self, f"_op_{op}", None) if isinstance(op, str) else None
        if method is None:
            return {"ok": False, "error": f"unknown op {op!r}"}
        return method(message)

    # -- ops --------------------------------------------------------------------------------------

    def _op_set_retryable_errors(self, m: dict[str, Any]) -> dict[str, Any]:
        errors = m.get("errors")
        if not isinstance(errors, list) or not errors:
            return {"ok": False, "error": "errors must be a non-empty list of strings"}
        try:
            rules = self.make_rules(errors)
        except Exception as exc:  # noqa: BLE001 - RuleError names the bad keyword
            return {"ok": False, "error": str(exc)}
        new = [e for e in errors if e not in self.retryable]
        if new:                     # every rank sends the same list: compile the added rules once
            self.rule_ids += self.engine.add_rules(rules)    # only those new to the engine
        self.retryable += new
        self._event("retryable_errors", m, errors=errors)
        return {"ok": True, "rules": [r.id for r in rules]}

    def _op_reset_config(self, m: dict[str, Any]) -> dict[str, Any]:
        config = m.get("config")
        if not isinstance(config, dict) or not config:
            return {"ok": False, "error": "config must be a non-empty object"}
        unknown = sorted(set(config) - {"job_hang_interval"})
        if unknown:
            return {"ok": False, "error": f"unsupported config key(s): {', '.join(unknown)}; "
                                          "only job_hang_interval can be changed at run time"}
        seconds, error = self._seconds(config["job_hang_interval"])
        if error:
            return {"ok": False, "error": error}
        self.base = seconds
        self._apply()
        self._event("hang_interval", m, job_hang_interval=seconds, in_force=self.interval)
        return {"ok": True, "job_hang_interval": self.interval}

    def _op_hang_detect_push(self, m: dict[str, Any]) -> dict[str, Any]:
        seconds, error = self._seconds(m.get("seconds"))
        if error:
            return {"ok": False, "error": error}
        scope = f"{m.get('instance') or m.get('rank')}/{len(self.scopes)}/{os.urandom(4).hex()}"
        self.scopes.append((scope, seconds))
        self._apply()
        return {"ok": True, "scope": scope, "job_hang_interval": self.interval}

    def _op_hang_detect_pop(self, m: dict[str, Any]) -> dict[str, Any]:
        scope = m.get("scope")
        self.scopes = [s for s in self.scopes if s[0] != scope]
        self._apply()
        return {"ok": True, "job_hang_interval": self.interval}

    def _op_send_custom_message(self, m: dict[str, Any]) -> dict[str, Any]:
        content = m.get("content")
        if not isinstance(content, str) or not content.strip():
            return {"ok": False, "error": "content must be a non-empty string"}
        instance, rank = self._sender(m)
        self.recorder.custom_message(self.clock(), self.job, content, instance=instance, rank=rank,
                                     node=self.node, budgets=self.budgets() if self.budgets else None)
        return {"ok": True}

    def _op_report_step(self, m: dict[str, Any]) -> dict[str, Any]:
        step = m.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            return {"ok": False, "error": "step must be an integer"}
        instance, _ = self._sender(m)
        if instance is None:
            return {"ok": False, "error": "no instance or rank given"}
        self.tracker.output(instance, self.clock())
        self.last_step[instance] = step
        return {"ok": True}

    # -- helpers ----------------------------------------------------------------------------------

    def _apply(self) -> None:
        if self.hang_supported:
            self.tracker.set_job_hang_interval(self.interval, self.clock())

    def _seconds(self, value: Any) -> tuple[float | None, str]:
        if not self.hang_supported:
            return None, ("job hang detection is off for this job (--enable-job-hang-detection=False "
                          "or job_execution_mode Async)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            return None, f"job_hang_interval must be a number of seconds (-1 = off), got {value!r}"
        return (None if value <= 0 else float(value)), ""

    @staticmethod
    def _sender(m: dict[str, Any]) -> tuple[str | None, int | None]:
        rank = m.get("rank")
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
        instance = m.get("instance")
        if not isinstance(instance, str) or not instance:
            instance = f"worker-{rank}" if rank is not None else None
        return instance, rank

    def _event(self, kind: str, m: dict[str, Any], **detail: Any) -> None:
        instance, rank = self._sender(m)
        self.recorder.event(self.clock(), self.job, kind, instance, rank, **detail)
