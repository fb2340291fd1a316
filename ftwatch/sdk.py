"""The training-side SDK: talk to the ``ftwatch run`` that supervises this process (SPEC N5, K1).

AIMaster's ``job_monitor`` in spirit (seed 000)::

    from ftwatch.sdk import Monitor

    monitor = Monitor()
    monitor.set_retryable_errors(["connect timeout", "my flaky storage error"])
    monitor.reset_config(job_hang_interval=1800)      # -1 switches job-hang detection off

    @monitor.hang_detect(180)          # 3 minutes of silence is a hang, inside train() only
    def train(epoch): ...

    with monitor.hang_detect(-1):      # no hang detection while evaluating
        evaluate()

    st = monitor.send_custom_message("loss is NaN")
    if not st.ok():
        print("failed to send message:", st.to_string())

    monitor.report_step(step)          # a heartbeat: counts as output for hang detection

    monitor.on_retry(lambda notice: repair())      # MindCluster retry: recover in place (D5)
    monitor.on_dump(lambda: save_checkpoint())     # MindCluster dump: last words on the dump signal

Under ``ftwatch watch`` (a job ftwatch did not launch, issue 13) the same calls go over HTTP
when ``FTWATCH_MONITOR_URL`` is set (and no control socket is): POST ``<url>/v1/control`` with
``FTWATCH_MONITOR_TOKEN`` as the bearer token, for the job ``FTWATCH_JOB`` (``namespace/name``)
and this process's instance (``FTWATCH_INSTANCE``, else ``HOSTNAME``: the pod's name) and
``RANK``. Every call acts on that job only: ``set_retryable_errors`` adds rules that hit the
job's lines (any of its ranks) until the job ends (a job of the same name later starts without
them), ``reset_config`` and ``hang_detect`` set the job's interval.
``on_retry`` and ``on_dump`` are ``run``-only. An ``https://`` URL is verified with the CA
bundle in ``FTWATCH_MONITOR_CA`` (a PEM file; else the system's CAs).

Every call returns a :class:`Status` and never raises into training code. Without a monitor
(``FTWATCH_CONTROL_SOCKET`` unset, or nothing listening there) each call does nothing, returns a
not-ok Status, and the first such call warns once (``warnings.warn``). Changes take effect in the
monitor at once (R2, R6). ``hang_detect`` scopes nest: the innermost open scope's interval is in
force, the previous one comes back when it closes.

This module imports only the standard library (it is installed into training environments).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import sys
import threading
import warnings
from typing import Any, Callable, Iterable, Mapping

__all__ = ["Monitor", "Status", "Config", "PyTorchConfig", "TFConfig", "MonitorUnavailableWarning"]

ENV_SOCKET = "FTWATCH_CONTROL_SOCKET"
ENV_TOKEN = "FTWATCH_CONTROL_TOKEN"
ENV_TIMEOUT = "FTWATCH_CONTROL_TIMEOUT"
ENV_DUMP_SIGNAL = "FTWATCH_DUMP_SIGNAL"      # set by ftwatch run when recover_strategy has dump
ENV_URL = "FTWATCH_MONITOR_URL"              # ftwatch watch's SDK endpoint (a watched job's pods)
ENV_URL_TOKEN = "FTWATCH_MONITOR_TOKEN"      # the job's token for it (ftwatch watch --monitor-token)
ENV_JOB = "FTWATCH_JOB"                      # namespace/name, as watch names the job
ENV_CA = "FTWATCH_MONITOR_CA"                # PEM CA bundle that verifies an https:// monitor URL
DEFAULT_TIMEOUT = 6.0        # seconds; the monitor answers within its own 4 s limit

_warned = False
_warn_lock = threading.Lock()


class MonitorUnavailableWarning(UserWarning):
    """No ftwatch monitor to talk to: the SDK calls do nothing."""


class Status:
    """The outcome of one call, like AIMaster's: ``ok()`` and ``to_string()``."""

    __slots__ = ("_ok", "message", "data")

    def __init__(self, ok: bool, message: str = "", data: Mapping[str, Any] | None = None):
        self._ok = bool(ok)
        self.message = message
        self.data = dict(data or {})

    def ok(self) -> bool:
        return self._ok

    def to_string(self) -> str:
        if self._ok:
            return "OK" if not self.message else f"OK: {self.message}"
        return f"error: {self.message}" if self.message else "error"

    def __bool__(self) -> bool:
        return self._ok

    def __repr__(self) -> str:
        return f"Status({self.to_string()!r})"


class Config:
    """Monitor settings, AIMaster style (``jm.PyTorchConfig(job_hang_interval=1800)``): every
    keyword given is sent with ``reset_config`` when the Monitor is made."""

    def __init__(self, **params: Any):
        self.params = dict(params)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"


class PyTorchConfig(Config):
    """AIMaster's name for the PyTorch job config."""


class TFConfig(Config):
    """AIMaster's name for the TensorFlow job config."""


class _HangScope:
    """``hang_detect(seconds)``: a context manager and a decorator (each call of the decorated
    function opens its own scope, so recursion and threads nest correctly)."""

    def __init__(self, monitor: "Monitor", seconds: float):
        self.monitor = monitor
        self.seconds = seconds
        self._local = threading.local()
        self.status: Status | None = None

    def __enter__(self) -> Status:
        st = self.monitor._call("hang_detect_push", seconds=self.seconds)
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(st.data.get("scope") if st.ok() else None)
        self.status = st
        return st

    def __exit__(self, *exc: Any) -> None:
        stack = getattr(self._local, "stack", None)
        scope = stack.pop() if stack else None
        if scope is not None:
            self.monitor._call("hang_detect_pop", scope=scope)
        return None

    def __call__(self, func: Callable) -> Callable:
        monitor, seconds = self.monitor, self.seconds

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _HangScope(monitor, seconds):
                return func(*args, **kwargs)

        return wrapper


class Monitor:
    """A client of the supervising ftwatch.

    Args:
        config: a :class:`Config` (or a mapping) whose settings are applied at once with
            :meth:`reset_config`; None for none.
        socket_path, token: override ``FTWATCH_CONTROL_SOCKET`` / ``FTWATCH_CONTROL_TOKEN``.
        timeout: seconds to wait for an answer (``FTWATCH_CONTROL_TIMEOUT``, default 6).
    """

    def __init__(self, config: Config | Mapping[str, Any] | None = None, *, socket_path: str | None = None,
                 token: str | None = None, timeout: float | None = None):
        self.socket_path = socket_path if socket_path is not None else os.environ.get(ENV_SOCKET, "")
        self.token = token if token is not None else os.environ.get(ENV_TOKEN, "")
        if timeout is None:
            try:
                timeout = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT))
            except ValueError:
                timeout = DEFAULT_TIMEOUT
        self.timeout = timeout
        rank = os.environ.get("RANK", "")
        self.rank = int(rank) if rank.lstrip("-").isdigit() else None
        self.instance = os.environ.get("FTWATCH_INSTANCE") or None
        self.url = "" if self.socket_path else os.environ.get(ENV_URL, "")
        if self.url:                   # ftwatch watch over HTTP: the pod names itself
            self.token = token if token is not None else os.environ.get(ENV_URL_TOKEN, "")
            self.job = os.environ.get(ENV_JOB, "")
            self.instance = self.instance or os.environ.get("HOSTNAME") or None
        self.config = config
        self._retry_callbacks: list[Callable[[dict], Any]] = []
        self._retry_sock: socket.socket | None = None
        params = config.params if isinstance(config, Config) else dict(config or {})
        if params:
            self.reset_config(**params)

    @property
    def available(self) -> bool:
        """Whether a monitor was named in the environment (it may still be unreachable)."""
        return bool(self.socket_path or self.url)

    # -- the API ------------------------------------------------------------------------------

    def set_retryable_errors(self, errors: Iterable[str]) -> Status:
        """Log lines containing any of these strings are retryable: the job is restarted (R2)."""
        try:
            errors = [errors] if isinstance(errors, str) else list(errors)
        except TypeError:
            return Status(False, "errors must be a list of strings")
        return self._call("set_retryable_errors", errors=errors)

    def reset_config(self, config: Mapping[str, Any] | None = None, **params: Any) -> Status:
        """Change the monitor's settings now; only ``job_hang_interval`` (seconds, -1 = off) (R6)."""
        merged = {**dict(config or {}), **params}
        if not merged:
            return Status(False, "nothing to change")
        return self._call("reset_config", config=merged)

    def hang_detect(self, seconds: float) -> _HangScope:
        """A job-hang interval for one scope: ``with monitor.hang_detect(2): ...`` or
        ``@monitor.hang_detect(180)``; ``-1`` switches detection off inside it."""
        return _HangScope(self, seconds)

    def send_custom_message(self, content: str) -> Status:
        """Send a message to the monitor's receivers (console, webhooks, chat bots)."""
        return self._call("send_custom_message", content=str(content))

    def report_step(self, step: int) -> Status:
        """A heartbeat: this process is alive at ``step`` (counts as output for hang detection).

        Answered as soon as ftwatch received it (applied at its next loop turn), so calling it
        every training step costs one local socket round trip, not a wait for the monitor.
        """
        try:
            step = int(step)
        except (TypeError, ValueError):
            return Status(False, f"step must be an integer, got {step!r}")
        return self._call("report_step", step=step)

    def on_retry(self, callback: Callable[[dict], Any]) -> Status:
        """MindCluster ``retry`` (seed 004, 进程级在线恢复; SPEC D5): recover in place when asked.

        ``callback(notice)`` runs in a background thread of this process when ftwatch sees a
        recoverable fault while the job runs (``notice``: ``id``, ``rule``, ``line``, ``instance``,
        ``rank``). It returns when the process has repaired itself (reloaded the step, rebuilt a
        communicator ...); returning False or raising tells ftwatch the retry failed, and ftwatch
        goes on with the next strategy. ftwatch then waits for a :meth:`report_step` from this
        process: training has resumed. Registering opens one connection that ftwatch pushes to.
        """
        self._retry_callbacks.append(callback)
        if self._retry_sock is not None:
            return Status(True, "already subscribed")
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
            sock.sendall((json.dumps({"token": self.token, "op": "subscribe", "events": ["retry"],
                                      "rank": self.rank, "instance": self.instance}) + "\n").encode())
            rfile = sock.makefile("rb")
            answer = json.loads(rfile.readline() or b"{}")
        except Exception as exc:  # noqa: BLE001 - never raise into training code
            return _unavailable(f"ftwatch SDK on_retry failed: {type(exc).__name__}: {exc}")
        if not isinstance(answer, dict) or not answer.get("ok"):
            sock.close()
            return Status(False, str(answer.get("error", "refused") if isinstance(answer, dict) else "refused"))
        sock.settimeout(None)
        self._retry_sock = sock
        threading.Thread(target=self._retry_loop, args=(rfile,), name="ftwatch-retry", daemon=True).start()
        return Status(True, "", answer)

    def _retry_loop(self, rfile: Any) -> None:
        for line in rfile:
            try:
                notice = json.loads(line)
            except ValueError:
                continue
            if not isinstance(notice, dict) or notice.get("event") != "retry":
                continue
            ok, error = True, ""
            for callback in list(self._retry_callbacks):
                try:
                    if callback(notice) is False:
                        ok, error = False, "the retry callback returned False"
                except Exception as exc:  # noqa: BLE001 - reported to ftwatch, never raised
                    ok, error = False, f"{type(exc).__name__}: {exc}"
            self._call("retry_done", id=notice.get("id"), ok=ok, error=error)

    def dump_done(self, path: str | None = None, ok: bool = True) -> Status:
        """MindCluster ``dump`` (保存临终遗言; SPEC D5): the last-words checkpoint is written
        (``path``, if any) or could not be (``ok=False``). ftwatch records it and stops waiting
        for this process."""
        return self._call("dump_done", path=None if path is None else str(path), ok=bool(ok))

    def on_dump(self, callback: Callable[[], Any]) -> Status:
        """On ftwatch's dump signal (``FTWATCH_DUMP_SIGNAL``, default SIGUSR1) run ``callback()``
        (it writes the last-words checkpoint and may return its path), then :meth:`dump_done`.

        The handler runs in the main thread between bytecodes (Python's signal semantics). Call
        this from the main thread; elsewhere it returns a not-ok Status.
        """
        name = os.environ.get(ENV_DUMP_SIGNAL, "SIGUSR1").strip().upper()
        try:
            signum = signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        except KeyError:
            return Status(False, f"unknown dump signal {name!r}")

        def handler(signo: int, frame: Any) -> None:
            try:
                path = callback()
            except Exception as exc:  # noqa: BLE001 - reported to ftwatch, never raised
                self.dump_done(None, ok=False)
                warnings.warn(f"ftwatch dump callback failed: {exc}", RuntimeWarning, stacklevel=2)
                return
            self.dump_done(path, ok=True)

        try:
            signal.signal(signum, handler)
        except ValueError as exc:       # not the main thread
            return Status(False, f"on_dump: {exc}")
        # ftwatch signals only the processes that said so (others would die of the signal)
        self._call("dump_ready", pid=os.getpid())
        return Status(True, signum.name)

    # -- the wire -----------------------------------------------------------------------------

    def _call(self, op: str, **fields: Any) -> Status:
        try:
            return self._request(op, fields)
        except Exception as exc:  # noqa: BLE001 - never raise into training code
            return _unavailable(f"ftwatch SDK {op} failed: {type(exc).__name__}: {exc}")

    def _request(self, op: str, fields: dict[str, Any]) -> Status:
        if not self.socket_path and self.url:
            return self._http(op, fields)
        if not self.socket_path:
            return _unavailable(f"no ftwatch monitor ({ENV_SOCKET} is not set); ftwatch.sdk calls do nothing")
        message = {"token": self.token, "op": op, "rank": self.rank, "instance": self.instance, **fields}
        data = (json.dumps(message) + "\n").encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
                sock.sendall(data)
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
        except OSError as exc:
            return _unavailable(f"cannot reach the ftwatch monitor at {self.socket_path}: {exc}; "
                                "ftwatch.sdk calls do nothing")
        try:
            answer = json.loads(buf)
        except ValueError:
            return _unavailable(f"no valid answer from the ftwatch monitor at {self.socket_path}")
        if not isinstance(answer, dict):
            return Status(False, "malformed answer")
        if answer.get("ok"):
            return Status(True, "", answer)
        return Status(False, str(answer.get("error", "refused")), answer)


    def _http_answer(self, answer: Any) -> Status:
        if not isinstance(answer, dict):
            return Status(False, "malformed answer")
        if answer.get("ok"):
            return Status(True, "", answer)
        return Status(False, str(answer.get("error", "refused")), answer)

    def _http(self, op: str, fields: dict[str, Any]) -> Status:
        """One call to ``ftwatch watch``'s endpoint (module doc)."""
        import urllib.error
        import urllib.request
        body = json.dumps({"op": op, "job": self.job, "rank": self.rank, "instance": self.instance,
                           **fields}).encode()
        req = urllib.request.Request(self.url.rstrip("/") + "/v1/control", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.token}"})
        try:
            context = None
            if self.url.lower().startswith("https:"):     # a CA file that cannot be read: an OSError
                import ssl
                context = ssl.create_default_context(cafile=os.environ.get(ENV_CA) or None)
            with urllib.request.urlopen(req, timeout=self.timeout, context=context) as resp:
                return self._http_answer(json.loads(resp.read() or b"null"))
        except urllib.error.HTTPError as exc:      # 400 / 401: the endpoint says why
            try:
                return self._http_answer(json.loads(exc.read() or b"null"))
            except ValueError:
                return Status(False, f"HTTP {exc.code} from the ftwatch monitor at {self.url}")
        except (OSError, ValueError) as exc:
            return _unavailable(f"cannot reach the ftwatch monitor at {self.url}: {exc}; "
                                "ftwatch.sdk calls do nothing")


def _unavailable(message: str) -> Status:
    global _warned
    with _warn_lock:
        first, _warned = not _warned, True
    if first:
        warnings.warn(message, MonitorUnavailableWarning, stacklevel=_caller_level())
    return Status(False, message)


def _caller_level() -> int:
    """The ``stacklevel`` (seen from the function that calls this) of the first frame outside
    this module: the training code's line that called the SDK, however deep the SDK's own
    calls went (a method, a ``with hang_detect``, a decorated function)."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level
