"""Host evidence: kernel and driver lines of a node, which carry the node but no job (issue 12 item 5).

A host line (``NVRM: Xid (PCI:0000:3b:00): 79, ...`` from the kernel ring buffer, the journal or
``/var/log/kern.log``) is about a machine and its devices, not about a process. Its origin is
:func:`host_origin`: instance ``host/<node>``, no rank, ``source`` :data:`HOST_SOURCE`. The
drivers attach it to the jobs that run there (``ftwatch.pipeline.watch``, :func:`share_host_lines`:
every job with instances on the node, narrowed to the instances on the named device when their
devices are known; ``ftwatch.pipeline.run``: the one local job; ``ftwatch.pipeline.replay``: a ``kern.log``
side file). In a job's incident it is evidence like any other and counts by its time; it is never
an instance (no world size, no hang timer, no failed instance: ``ftwatch.policy.triggers``).

Where host lines come from:

* ``watch``: a source with ``host: true`` (every line of it), a record whose ``host_log`` field is
  true (a fluent-bit ``record_modifier`` on the kmsg / systemd input), or a record whose tag
  matches ``watch.identity.host_tags`` (``ftwatch.pipeline.sources.identity``).
* ``run``: :class:`KernelLog`: ``--kernel-log PATH`` (a file tailed from its end), else
  ``/dev/kmsg`` when readable, else ``journalctl -k -f`` when present (:func:`open_kernel_log`).

Device names: the PCI bus id a line names (``PCI:0000:3b:00`` in an Xid line, nvidia-smi's
``00000000:3B:00.0``) is compared as ``dddd:bb:dd`` (:func:`pci_bus_id`): domain's last four hex
digits, bus, device, lower case; the function number is dropped (one GPU is one PCI device).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import queue
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ftwatch.events import Finding, Origin
from ftwatch.pipeline.sources.base import Shipped

__all__ = ["HOST_KEY", "HOST_SOURCE", "HostQueue", "KernelLog", "gpu_bus_ids", "host_origin", "is_host",
           "is_host_file", "is_host_meta", "line_device", "on_devices", "open_kernel_log", "pci_bus_id"]

HOST_SOURCE = "host"         # Origin.source of host evidence
HOST_KEY = "host_log"        # a shipped record's field that marks it as host evidence
_TRUE = (True, 1, "true", "True", "yes", "1", "on")
# ``PCI:0000:3b:00`` (Xid / SXid lines), nvidia-smi's ``00000000:3B:00.0``, ``0000:3b:00.0``
_PCI = re.compile(rb"(?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?")
_PCI_IN_LINE = re.compile(rb"\(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})")
#: side files of a recorded job that hold the node's kernel log (tests/corpus/README.md)
_HOST_FILES = re.compile(r"(?:kern|kernel|dmesg|kmsg|syslog|messages)(?:\.log|\.txt)?(?:[.-]\d+)?",
                         re.IGNORECASE)


def host_origin(node: str, job: str = "", stream: str = "kernel") -> Origin:
    """The origin of a host line of ``node`` attached to ``job`` ("" while it is no job's)."""
    return Origin(f"host/{node}", None, job, node, stream, HOST_SOURCE)


def is_host(origin: Origin) -> bool:
    """True for host evidence (:func:`host_origin`)."""
    return origin.source == HOST_SOURCE


def is_host_meta(meta: Any) -> bool:
    """True when a shipped record says it is host evidence (``host_log: true``)."""
    value = meta.get(HOST_KEY)
    return value is not None and value in _TRUE


def is_host_file(path: Path) -> bool:
    """True for a recorded side file that holds a node's kernel log (``kern.log``, ``dmesg.txt``)."""
    return _HOST_FILES.fullmatch(Path(path).name) is not None


def pci_bus_id(text: str | bytes) -> str | None:
    """A PCI bus id as ``dddd:bb:dd`` (module doc), or None when ``text`` is none.

    >>> pci_bus_id("00000000:3B:00.0"), pci_bus_id("PCI:0000:3b:00")
    ('0000:3b:00', '0000:3b:00')
    """
    raw = text.encode() if isinstance(text, str) else text
    m = _PCI.fullmatch(raw.strip())
    return None if m is None else _canonical(m)


def line_device(line: bytes) -> str | None:
    """The PCI bus id a kernel line names in ``(PCI:dddd:bb:dd)`` (NVRM Xid / SXid), else None."""
    m = _PCI_IN_LINE.search(line)
    return None if m is None else _canonical(m)


def share_host_lines(lines: Iterable[bytes], on_node: Mapping[str, Sequence[Origin]],
                     devices: Mapping[tuple[str, str], frozenset[str]]) -> tuple[dict[str, list[bytes]], list[bytes]]:
    """Splits a node's host lines among the jobs with instances on that node (``watch``).

    Args:
        lines: the node's host lines.
        on_node: job -> the origins of its instances on the node (a job with none left out).
        devices: ``(job, instance)`` (``Origin.key``) -> the PCI bus ids of its devices; an
            instance not in it has none known.

    Returns:
        (job -> its lines, the lines no job takes). A line naming a device goes to the jobs with
        an instance on that device, or whose instances on the node have no known devices (the
        line then counts for the whole node); a line naming none goes to every job on the node.
    """
    taken: dict[str, list[bytes]] = {}
    left: list[bytes] = []
    for line in lines:
        device = line_device(line) if on_node else None
        jobs = [job for job, origins in on_node.items() if device is None or _on_device(origins, device, devices)]
        for job in jobs:
            taken.setdefault(job, []).append(line)
        if not jobs:
            left.append(line)
    return taken, left


def _on_device(origins: Sequence[Origin], device: str, devices: Mapping[tuple[str, str], frozenset[str]]) -> bool:
    """Whether one of a job's instances on a node uses ``device``; True when none of them has
    known devices."""
    known = [devices[o.key] for o in origins if o.key in devices]
    return not known or any(device in ids for ids in known)


def _canonical(m: re.Match) -> str:
    return f"{m.group(1)[-4:].decode().lower()}:{m.group(2).decode().lower()}:{m.group(3).decode().lower()}"


class HostQueue:
    """The queue a ``host: true`` source puts on: each line is marked as host evidence
    (``HOST_KEY``) before it goes on ``out``; the batch object is kept (its ``ack``)."""

    def __init__(self, out: queue.Queue):
        self.out = out

    def put(self, batch: list, block: bool = True, timeout: float | None = None) -> None:
        """Mark ``batch``'s lines in place, then ``out.put`` it (raises ``queue.Full`` as it does)."""
        for i, s in enumerate(batch):
            if isinstance(s, Shipped) and not is_host_meta(s.meta):
                batch[i] = Shipped(s.time, s.line, {**s.meta, HOST_KEY: True})
        self.out.put(batch, block, timeout)

    def put_nowait(self, batch: list) -> None:
        """:meth:`put` without waiting."""
        self.put(batch, False)

    def __getattr__(self, name: str) -> Any:       # qsize, empty, maxsize ... of the real queue
        return getattr(self.out, name)


class KernelLog:
    """This host's kernel log, read without blocking from where it was at start (``ftwatch run``).

    Args:
        kind: ``file`` (a path tailed from its end; a truncated or replaced file is read from its
            start), ``kmsg`` (``/dev/kmsg``: records ``prio,seq,usec,flags;text``) or
            ``journal`` (``journalctl -k -f -o short-iso -n 0``).
        path: the file (``file``, ``kmsg``).
        describe: words for the start line (``reading the kernel log from /dev/kmsg``).
    """

    def __init__(self, kind: str, path: str | None = None, describe: str = ""):
        self.kind = kind
        self.path = path
        self.describe = describe
        self._fd: int | None = None
        self._proc: subprocess.Popen | None = None
        self._carry = b""
        self._inode: tuple[int, int] | None = None
        self._offset = 0

    # -- opening -------------------------------------------------------------------------------

    def open(self) -> None:
        """Start reading at the log's current end.

        Raises:
            OSError: the file or device cannot be opened; journalctl cannot start.
        """
        if self.kind == "file":
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                os.close(fd)
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), self.path)
            self._fd, self._inode, self._offset = fd, (st.st_dev, st.st_ino), os.lseek(fd, 0, os.SEEK_END)
        elif self.kind == "kmsg":
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(fd, 0, os.SEEK_END)              # /dev/kmsg: SEEK_END = after the last record
            self._fd = fd
        else:
            self._proc = subprocess.Popen(["journalctl", "-k", "-f", "-o", "short-iso", "-n", "0"],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          stdin=subprocess.DEVNULL)
            os.set_blocking(self._proc.stdout.fileno(), False)

    def close(self) -> None:
        """Stop reading (journalctl is terminated); idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()
            self._proc = None

    # -- reading -------------------------------------------------------------------------------

    def read(self) -> bytes:
        """The complete lines written since the last read (``b""`` when none); never blocks. A
        log that can no longer be read (``OSError``) is closed: nothing more is read from it."""
        try:
            return self._read()
        except OSError:
            self.close()
            return b""

    def _read(self) -> bytes:
        if self.kind == "kmsg":
            return b"".join(self._kmsg_records())
        data = self._file_bytes() if self.kind == "file" else self._pipe_bytes()
        data = self._carry + data
        cut = data.rfind(b"\n") + 1
        self._carry = data[cut:]
        return data[:cut]

    def _file_bytes(self) -> bytes:
        if self._fd is None:
            return b""
        try:
            st = os.stat(self.path)
        except OSError:
            st = None                                  # rotated away: read what is left of ours
        if st is not None and ((st.st_dev, st.st_ino) != self._inode or st.st_size < self._offset):
            remainder = self._drain(self._fd)
            os.close(self._fd)                         # replaced or truncated: the new one from its start
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self._inode, self._offset, self._carry = (st.st_dev, st.st_ino), 0, self._carry + remainder
        data = self._drain(self._fd)
        self._offset += len(data)
        return data

    @staticmethod
    def _drain(fd: int) -> bytes:
        parts = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)

    def _pipe_bytes(self) -> bytes:
        if self._proc is None:
            return b""
        parts = []
        while True:
            try:
                chunk = os.read(self._proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            parts.append(chunk)
        return b"".join(parts)

    def _kmsg_records(self) -> Iterable[bytes]:
        """``/dev/kmsg`` gives one record per read (Documentation/ABI/testing/dev-kmsg):
        ``prio,seq,usec,flags;text`` then continuation lines starting with a space."""
        out = []
        while self._fd is not None:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:             # overwritten before we read it: go on
                    continue
                raise
            if not record:
                break
            head, _, rest = record.partition(b";")
            text = rest.split(b"\n", 1)[0] if rest else record.rstrip(b"\n")
            out.append(text + b"\n")
        return out


def gpu_bus_ids(query: Callable[[list[str]], str] | None = None) -> dict[str, tuple[str, ...]]:
    """This host's GPUs by PCI bus id: ``dddd:bb:dd`` -> the names ``CUDA_VISIBLE_DEVICES`` may
    give that GPU (its UUID; its index too where the index means the same GPU to CUDA).

    From ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id --format=csv,noheader``. nvidia-smi
    numbers GPUs in PCI bus order; CUDA does so only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, its
    default ``FASTEST_FIRST`` puts faster GPUs first (CUDA C++ Programming Guide, "CUDA
    Environment Variables"). So the index is given only under ``PCI_BUS_ID`` or when every GPU
    has the same name (none is faster); the UUID always.

    Args:
        query: runs the argv and returns its stdout (tests); default ``subprocess.run``, 10 s.

    Returns:
        The map; empty without nvidia-smi or when it fails.
    """
    argv = ["nvidia-smi", "--query-gpu=index,uuid,name,pci.bus_id", "--format=csv,noheader"]
    try:
        if query is not None:
            text = query(argv)
        elif shutil.which("nvidia-smi") is None:
            return {}
        else:
            text = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.count(",") == 3]
    by_index = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or len({r[2] for r in rows}) <= 1
    out: dict[str, tuple[str, ...]] = {}
    for index, uuid, _, bus in rows:
        bus_id = pci_bus_id(bus)
        if bus_id is not None:
            out[bus_id] = (uuid, index) if by_index else (uuid,)
    return out


def on_devices(findings: Iterable[Finding], bus_ids: Mapping[str, tuple[str, ...]],
               devices: Sequence[str]) -> tuple[list[Finding], list[Finding]]:
    """Splits host findings into a job's and the others, by the GPU their line names.

    Args:
        findings: findings of host lines.
        bus_ids: PCI bus id -> that GPU's names (:func:`gpu_bus_ids`).
        devices: the job's devices as its slots name them (``CUDA_VISIBLE_DEVICES`` entries).

    Returns:
        (the job's: a finding whose GPU is one of ``devices`` carries it as ``fields["device"]``,
        one that names no GPU or an unknown one is the whole node's; the others: a GPU known
        and not the job's).
    """
    mine: list[Finding] = []
    others: list[Finding] = []
    for f in findings:
        names = bus_ids.get(line_device(f.line.encode()) or "")
        device = next((n for n in names if n in devices), None) if names else None
        if not names:
            mine.append(f)
        elif device is None:
            others.append(f)
        else:
            mine.append(dataclasses.replace(f, fields={**f.fields, "device": device}))
    return mine, others


def open_kernel_log(path: Path | None) -> tuple[KernelLog | None, str]:
    """The kernel log ``ftwatch run`` reads, opened at its end, and one line saying what it is.

    Args:
        path: ``--kernel-log PATH``; None: ``/dev/kmsg`` when it can be read, else
            ``journalctl`` when it is on PATH, else none.

    Returns:
        (the reader, ``reading the kernel log from ...``) or, with no path given and nothing
        readable, (None, ``no kernel log: ... (why)``).

    Raises:
        OSError: ``path`` was given and cannot be opened (the caller prints one line).
    """
    if path is not None:
        log = KernelLog("file", str(path), f"reading the kernel log from {path}")
        log.open()
        return log, log.describe
    kmsg = KernelLog("kmsg", "/dev/kmsg", "reading the kernel log from /dev/kmsg")
    try:
        kmsg.open()
        return kmsg, kmsg.describe
    except OSError as e:
        why = f"/dev/kmsg: {e.strerror or e}"
    if shutil.which("journalctl"):
        journal = KernelLog("journal", None, "reading the kernel log from journalctl -k")
        try:
            journal.open()
            return journal, journal.describe
        except OSError as e:
            why += f"; journalctl: {e.strerror or e}"
    else:
        why += "; no journalctl"
    return None, f"no kernel log ({why}); give --kernel-log PATH to read one"

