"""Worker slots on one machine and the devices isolated from them (SPEC A1: "excludes an isolated
device or slot"; elastic ``--nproc-per-node MIN:MAX``).

Slot ``i`` is ``LOCAL_RANK i``, which uses the ``i``-th entry of the workers' visible-devices list
(torchrun's convention: every worker sees the same ``CUDA_VISIBLE_DEVICES`` and picks
``cuda:LOCAL_RANK``). The list is the healthy devices in order, at most MAX of them; isolating a
device drops it, so the next start has one worker fewer (``WORLD_SIZE`` follows) unless a spare
device fills the slot. Fewer healthy devices than MIN: the job cannot go on. Where the environment
hides every GPU (``CUDA_VISIBLE_DEVICES=`` or ``-1``: ``ftwatch.config.supervisor.hidden_devices``),
the slots are modelled and the workers see the variable as it was set.

The isolated devices persist for the job in ``<state_dir>/isolation/<job>.json`` (atomic writes,
the budgets' lifecycle: a file whose job is still ``running`` is continued by a restarted ftwatch,
one whose job ended starts afresh)::

    {"format": "ftwatch-isolation", "version": 1, "job": "train-42", "status": "running",
     "isolated": {"1": {"rank": 1, "rule": "xid.79", "line": "NVRM: Xid ...", "time": 1795219200.0,
                        "attempt": 0}}}
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ftwatch.config.supervisor import DEVICE_ENV, ElasticRange, default_devices, hidden_devices
from ftwatch.errors import ConfigError, Issue
from ftwatch.policy.plan import Exclusion, SlotFacts

_FORMAT = "ftwatch-isolation"


class Slots:
    """The devices of one local job, which are isolated, and the worker count that follows.

    Args:
        devices: every device the job may use, in slot order (strings: ``0``, ``GPU-5f3c...``).
        nproc: the elastic range of workers.
        path: the persistence file, or None (kept in memory only).
        job: the job id.
        hidden: visible-devices variables set to hide every GPU (``hidden_devices``): the workers
            and the health checks' agents keep these values.

    Raises:
        ConfigError: fewer devices than MIN, or a device listed twice.
    """

    def __init__(self, devices: list[str], nproc: ElasticRange, path: Path | None = None, job: str = "local",
                 hidden: Mapping[str, str] | None = None):
        if len(set(devices)) != len(devices):
            raise ConfigError(Issue("<config>", 0, f"supervisor.devices lists a device twice: {devices}"))
        if len(devices) < nproc.min:
            raise ConfigError(Issue("<config>", 0, f"supervisor.nproc_per_node {nproc} needs at least "
                                                   f"{nproc.min} devices, only {len(devices)} known: {devices} (supervisor.devices, "
                                                   "else CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES)"))
        self.devices, self.range, self.path, self.job = list(devices), nproc, path, job
        self.hidden = dict(hidden or {})
        self.isolated: dict[str, dict[str, Any]] = {}
        self.status = "running"
        if path is not None:
            self._load()

    @classmethod
    def for_job(cls, state_dir: Path | str, job: str, nproc: ElasticRange, devices: list[str] | None = None,
                env: Mapping[str, str] | None = None) -> "Slots":
        """Slots persisted at ``<state_dir>/isolation/<job>.json``; ``devices`` None: ``default_devices``.
        ``env`` (``os.environ`` when None) also says which devices it hides (``hidden_devices``)."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", job) or "_"
        devs = list(devices) if devices else default_devices(nproc.max, env)
        return cls(devs, nproc, Path(state_dir) / "isolation" / f"{safe}.json", job, hidden_devices(env))

    # -- reading -----------------------------------------------------------------------------------

    def facts(self) -> SlotFacts:
        """The slots as plain data for the policy (``ftwatch.policy.plan``), which reads them."""
        return SlotFacts(tuple(d for d in self.devices if d not in self.isolated), self.range,
                         tuple((d, v.get("rule")) for d, v in self.isolated.items()))

    @property
    def healthy(self) -> list[str]:
        """Devices not isolated, in order."""
        return list(self.facts().healthy)

    @property
    def active(self) -> list[str]:
        """The devices the next start uses: the first MAX healthy ones."""
        return self.facts().active

    @property
    def nproc(self) -> int:
        """Workers of the next start (may be below MIN: see ``viable``)."""
        return self.facts().nproc

    @property
    def viable(self) -> bool:
        """True while at least MIN healthy devices are left."""
        return self.facts().viable

    def device_of(self, local_rank: int | None) -> str | None:
        """The device slot ``local_rank`` uses now (None for an unknown rank)."""
        return self.facts().device_of(local_rank)

    @property
    def checked(self) -> list[str] | None:
        """The devices the health checks put their agents on (``active``), or None where the
        environment hides every GPU: the agents then see what the workers see."""
        return None if self.hidden else self.active

    def env(self) -> dict[str, str]:
        """The workers' visible-devices variables (CUDA and Ascend): the healthy active devices,
        except a variable that hides every GPU, kept as it was set."""
        value = ",".join(self.active)
        return {name: self.hidden.get(name, value) for name in DEVICE_ENV}

    def describe(self) -> str:
        """``devices 0,2 (isolated: 1 by xid.79)``, for the terminal and decisions."""
        return self.facts().describe()

    # -- changing ----------------------------------------------------------------------------------

    def isolate(self, device: str, **why: Any) -> None:
        """Exclude ``device`` from every later start of this job; ``why`` is kept with it
        (``rank``, ``rule``, ``line``, ``time``, ``attempt``). Raises KeyError for an unknown device."""
        if device not in self.devices:
            raise KeyError(device)
        self.isolated[device] = dict(why)
        self._save()

    def exclude(self, excluded: list[Exclusion] | tuple[Exclusion, ...], time: float, attempt: int) -> None:
        """Carry out a plan's exclusions (``Plan.exclude``): each device leaves every later start."""
        for e in excluded:
            self.isolate(e.device, rank=e.rank, rule=e.rule, line=e.line, time=time, attempt=attempt)

    def close(self, status: str) -> None:
        """The job ended (``succeeded``, ``failed``, ``stopped``): the next run of it starts afresh."""
        self.status = status
        self._save()

    # -- persistence -------------------------------------------------------------------------------

    def _load(self) -> None:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if (isinstance(data, dict) and data.get("format") == _FORMAT and data.get("job") == self.job
                and data.get("status") == "running" and isinstance(data.get("isolated"), dict)):
            self.isolated = {str(k): dict(v) for k, v in data["isolated"].items()
                             if str(k) in self.devices and isinstance(v, dict)}
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": _FORMAT, "version": 1, "job": self.job, "status": self.status, "isolated": self.isolated}
        fd, tmp = tempfile.mkstemp(prefix=".isolation-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with_suppressed_unlink(tmp)
            raise


def with_suppressed_unlink(path: str) -> None:
    """Remove a temporary file if it is still there."""
    try:
        os.unlink(path)
    except OSError:
        pass
