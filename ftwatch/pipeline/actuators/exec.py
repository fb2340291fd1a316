"""Acting on decisions of jobs ftwatch did not launch (``ftwatch watch``).

``none`` only observes. ``exec`` runs a command with the decision JSON on stdin, so any
scheduler can be driven (delete the job's pods, cordon a node ...): the command's exit
status is recorded with the decision; a command that outlives its timeout is killed.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Protocol, Sequence

from ftwatch.events import Decision


@dataclass(frozen=True, slots=True)
class ActResult:
    """What the actuator did.

    ``status`` is ``done``, ``failed``, ``timeout``, ``skipped``, ``held`` (the kubernetes
    actuator's circuit breaker) or ``dry_run`` (nothing was sent); ``calls`` has one line per
    API call the kubernetes actuator made or would have made (``kubeapi.Call.line``).
    """

    status: str
    returncode: int | None = None
    output: str = ""
    calls: tuple[str, ...] = ()


class Actuator(Protocol):
    """Acts on a decision; never raises (a failure is an ActResult)."""

    def act(self, decision: Decision) -> ActResult: ...


class NoneActuator:
    """Observe only: decisions are recorded and alerted, nothing is done."""

    def act(self, decision: Decision) -> ActResult:
        return ActResult("skipped")


class ExecActuator:
    """Runs ``command`` with the decision (README "Decisions" JSON, one line) on stdin.

    Args:
        command: argv; the decision's action is also in the environment as FTWATCH_ACTION.
        timeout: seconds before the command is killed (status ``timeout``).
    """

    MAX_OUTPUT = 4096  # characters of the command's output kept

    def __init__(self, command: Sequence[str], timeout: float = 60.0):
        if not command:
            raise ValueError("exec actuator needs a command")
        self.command = list(command)
        self.timeout = timeout

    def act(self, decision: Decision) -> ActResult:
        import os
        payload = json.dumps(decision.to_json(), ensure_ascii=False) + "\n"
        env = {**os.environ, "FTWATCH_ACTION": decision.action.label,
               "FTWATCH_JOB": decision.target.job, "FTWATCH_NODE": decision.target.node or ""}
        try:
            proc = subprocess.run(self.command, input=payload, capture_output=True, text=True,
                                  timeout=self.timeout, env=env)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"")
            text = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
            return ActResult("timeout", None, text[-self.MAX_OUTPUT:])
        except OSError as exc:
            return ActResult("failed", None, str(exc))
        output = (proc.stdout + proc.stderr)[-self.MAX_OUTPUT:]
        return ActResult("done" if proc.returncode == 0 else "failed", proc.returncode, output)


def build_actuator(config, log=None, slurm=None) -> Actuator:
    """The actuator a ``watch.actuator`` config section names; ``log`` takes the kubernetes and
    slurm actuators' call lines; ``slurm`` is the top-level ``slurm`` section (``type: slurm``).

    Raises:
        ConfigError: ``kubernetes`` and no cluster configuration could be loaded; ``slurm`` and
            scontrol, scancel or sinfo missing.
    """
    if config.type == "exec":
        return ExecActuator(config.command, config.timeout)
    if config.type == "kubernetes":
        from ftwatch.pipeline.actuators.kubernetes import KubernetesActuator
        return KubernetesActuator(config.kubernetes, log=log)
    if config.type == "slurm":
        from ftwatch.config.slurm import SlurmConfig
        from ftwatch.errors import ConfigError
        from ftwatch.pipeline.actuators.slurm import SlurmActuator, missing_command
        slurm = slurm if slurm is not None else SlurmConfig()
        missing = missing_command(slurm)
        if missing:
            raise ConfigError(f"watch.actuator.type slurm: {missing}")
        return SlurmActuator(slurm, log=log)
    return NoneActuator()
