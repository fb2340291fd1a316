"""Restart and error budgets that survive a restart of ftwatch itself (SPEC D3).

One JSON file per job, written atomically (a temporary file in the same folder, ``fsync``, then
``os.replace``, then an ``fsync`` of the folder), so a crash leaves the old or the new version,
never half of one. Format (``version`` 1)::

    {
      "format": "ftwatch-budgets", "version": 1,
      "job": "train-42",
      "status": "running",              # running | succeeded | failed | stopped
      "attempt": 2,                     # the current attempt of the job, 0 for the first run
      "restarts_used": 2,               # job-level restarts (restart_job / isolate_node / restart_in_place)
      "instance_restarts": {"worker-3": 1},           # Async: restarts per instance
      "same_error": {"xid.79@worker-3": {"count": 2, "last": "1:0"}},
                                        # fingerprint -> times seen; "last" is the occurrence key
                                        # that counted last, so one attempt counts once
      "history": [{"job": "train-42", "status": "failed", "attempt": 3, "restarts_used": 3}],
      "free_restarts": 1,               # restarts that cost no budget (ModelArts in-place / hang restarts)
      "streaks": {"hang": 2},           # in-a-row counters of the recovery strategies (rules/modelarts.py)
      "memo": {"in_place": {...}}       # small facts a strategy keeps between attempts
    }

The last three keys came later; a file without them reads as zero / empty (same version).

A store opened on a file whose job is still ``running`` continues it (ftwatch was restarted); a
file whose job ended (``close``), or that belongs to another job, is archived into ``history``
(the last 20 kept) and the budgets start fresh.

One process at a time may own a job's file; nothing here locks.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from ftwatch.errors import ConfigError, Issue
from ftwatch.policy.statefile import read_state, write_state

RUNNING = "running"
ENDED = ("succeeded", "failed", "stopped")
_FORMAT = "ftwatch-budgets"
_VERSION = 1
_HISTORY = 20


def budget_path(state_dir: Path, job: str) -> Path:
    """``<state_dir>/budgets/<job>.json``, the job id made safe for a file name."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", job) or "_"
    return Path(state_dir) / "budgets" / f"{safe}.json"


def prune_budgets(state_dir: Path, before: float, keep: Iterable[str] = ()) -> int:
    """Delete the budget files under ``<state_dir>/budgets`` last written (mtime) before
    ``before`` (epoch s), except those of the jobs in ``keep`` (a job in use: its store writes
    it only when something changes). ``watch`` meets a job it keeps a file for, for ever, on an
    open-ended stream of jobs: this bounds the folder (``limits.budget_retention``). A job whose
    file went starts its budgets afresh, as after a clean end. Returns the files deleted; a
    file that cannot be read or deleted is left (never raises)."""
    folder = Path(state_dir) / "budgets"
    kept = {budget_path(state_dir, job).name for job in keep}
    gone = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.endswith(".json") or entry.name in kept:
            continue
        try:
            if entry.stat().st_mtime < before:
                os.unlink(entry.path)
                gone += 1
        except OSError:
            continue
    return gone


class BudgetStore:
    """The budgets of one job, kept in a JSON file.

    Args:
        path: the JSON file (its folder is created); see ``for_job`` for the usual place. None:
            kept in memory only, for a process that is the job's whole life (``replay`` without
            ``--state-dir``, ``evaluate``, ``mine``): a file in a temporary folder written with
            two ``fsync`` calls at every change was ~10 s of a 46 s ``evaluate`` of the corpus.
        job: the job id.

    Raises:
        ConfigError: the file exists but is not a budgets file this version can read (it is left
            alone: delete it to start the job's budgets afresh).
    """

    def __init__(self, path: Path | None, job: str):
        self.path = Path(path) if path is not None else None
        self.job = job
        self._data = self._fresh([])
        loaded = self._read()
        if loaded is not None:
            history = list(loaded.get("history", []))
            if loaded.get("job") == job and loaded.get("status") == RUNNING:
                self._data = loaded
                for key, empty in (("free_restarts", 0), ("streaks", {}), ("memo", {})):
                    self._data.setdefault(key, empty)
            else:
                history.append({k: loaded.get(k) for k in ("job", "status", "attempt", "restarts_used")})
                self._data = self._fresh(history[-_HISTORY:])
        self._save()

    @classmethod
    def for_job(cls, state_dir: Path, job: str) -> "BudgetStore":
        """The store at ``<state_dir>/budgets/<job>.json`` (the job id made safe for a file name)."""
        return cls(budget_path(state_dir, job), job)

    # ------------------------------------------------------------------ reading

    @property
    def status(self) -> str:
        return self._data["status"]

    @property
    def attempt(self) -> int:
        """The current attempt, 0 for the first run; each job-level restart adds one."""
        return self._data["attempt"]

    @property
    def restarts_used(self) -> int:
        """Job-level restarts used so far."""
        return self._data["restarts_used"]

    @property
    def history(self) -> list[dict[str, Any]]:
        """Summaries of earlier, ended runs kept in the same file (oldest first)."""
        return list(self._data["history"])

    def instance_restarts(self, instance: str) -> int:
        """Restarts of one instance so far (Async)."""
        return self._data["instance_restarts"].get(instance, 0)

    def same_error(self, fingerprint: str) -> int:
        """How many occurrences of ``fingerprint`` (``rule@instance``) were counted."""
        entry = self._data["same_error"].get(fingerprint)
        return entry["count"] if entry else 0

    @property
    def free_restarts(self) -> int:
        """Restarts that cost no budget so far (``next_attempt``)."""
        return self._data["free_restarts"]

    def streak(self, name: str) -> int:
        """An in-a-row counter (``hang``, ``unconditional`` ...); 0 when never set."""
        return self._data["streaks"].get(name, 0)

    def memo(self, name: str) -> Any:
        """A fact a recovery strategy kept (JSON data), or None."""
        return self._data["memo"].get(name)

    def to_dict(self) -> dict[str, Any]:
        """A copy of the file's content."""
        return json.loads(json.dumps(self._data))

    # ------------------------------------------------------------------ changing

    def count_errors(self, fingerprints: Iterable[str], occurrence: str) -> dict[str, int]:
        """Count each fingerprint once per ``occurrence`` (e.g. ``"<attempt>:<instance restarts>"``).

        Calling again with the same occurrence key does not count again, so several decisions in
        one attempt count an error once.

        Returns:
            {fingerprint: count after this call} for the fingerprints given.
        """
        table = self._data["same_error"]
        counts: dict[str, int] = {}
        changed = False
        for fp in fingerprints:
            entry = table.setdefault(fp, {"count": 0, "last": None})
            if entry["last"] != occurrence:
                entry["count"] += 1
                entry["last"] = occurrence
                changed = True
            counts[fp] = entry["count"]
        if changed:
            self._save()
        return counts

    def use_job_restart(self) -> int:
        """Spend one job-level restart; the attempt number goes up by one. Returns restarts used."""
        self._data["restarts_used"] += 1
        self._data["attempt"] += 1
        self._save()
        return self.restarts_used

    def next_attempt(self) -> int:
        """A restart that costs no budget (ModelArts in-place recovery, hang restart: seed 002):
        the attempt goes up by one, ``restarts_used`` stays. Returns the new attempt."""
        self._data["free_restarts"] += 1
        self._data["attempt"] += 1
        self._save()
        return self.attempt

    def set_streaks(self, **values: int) -> None:
        """Set in-a-row counters at once (one write), e.g. ``set_streaks(hang=0, unconditional=2)``."""
        self._data["streaks"].update(values)
        self._save()

    def set_memo(self, name: str, value: Any) -> None:
        """Keep a JSON-ready fact under ``name`` (None removes it)."""
        if value is None:
            self._data["memo"].pop(name, None)
        else:
            self._data["memo"][name] = value
        self._save()

    def use_instance_restart(self, instance: str) -> int:
        """Spend one restart of ``instance`` (Async). Returns that instance's restarts used."""
        per = self._data["instance_restarts"]
        per[instance] = per.get(instance, 0) + 1
        self._save()
        return per[instance]

    def close(self, status: str) -> None:
        """Mark the job ended (``succeeded``, ``failed`` or ``stopped``): the next store opened for
        this job starts fresh.

        Raises:
            ValueError: for another status.
        """
        if status not in ENDED:
            raise ValueError(f"status must be one of {ENDED}, not {status!r}")
        self._data["status"] = status
        self._save()

    # ------------------------------------------------------------------ file

    def _fresh(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {"format": _FORMAT, "version": _VERSION, "job": self.job, "status": RUNNING, "attempt": 0,
                "restarts_used": 0, "instance_restarts": {}, "same_error": {}, "history": history,
                "free_restarts": 0, "streaks": {}, "memo": {}}

    def _read(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        try:
            return read_state(self.path, _FORMAT, _VERSION)
        except ConfigError as exc:
            raise ConfigError(Issue(str(self.path), 0, f"budgets file: {exc.issues[0].message}")) from None

    def _save(self) -> None:
        if self.path is not None:
            write_state(self.path, self._data)
