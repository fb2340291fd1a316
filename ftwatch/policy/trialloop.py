"""A "training finished" line that ended one trial of a hyper-parameter search, not the job
(issue 12 item 3: an error after the end of training is a notice only when training, the job's
work, had ended).

The knowledge: a search driver runs the program's training function once per trial in one process
and goes on to the next trial when it returns.

* Optuna: ``Study.optimize(func, n_trials=...)`` calls the objective once per trial
  (``optuna/study/_optimize.py``: ``_optimize_sequential`` -> ``_run_trial``); an exception the
  objective raises marks the trial failed ("Trial N failed ...") and, unless its type is in
  ``optimize``'s ``catch`` argument (empty by default), is raised again out of ``optimize``: the study
  stops there (Optuna docs, FAQ "How are exceptions from trials handled?", and the ``catch`` argument of
  ``Study.optimize``; checked with the search tool).
* W&B sweeps: ``wandb.agent(sweep_id, function, count=...)`` asks the sweep controller for runs and
  calls ``function`` once per run (``wandb/wandb_agent.py`` -> ``wandb/agents/pyagent.py``, whose
  ``_run_jobs_from_queue`` loop starts each run); each run ends with wandb's own exit lines
  ("Program ended successfully.") before the agent starts the next (W&B docs, ``wandb.agent``;
  written from memory).

So the HF Trainer's end-of-training metrics or wandb's exit line of one trial says that trial's
training ended, not the study's: a traceback that came after it and passes through the driver's own
trial loop (:data:`DRIVER_FRAMES`) is the exception that ended the search itself, a failure of the
job graded by its class like any other (an out-of-memory trial: the next trial at those settings
fails the same way). :func:`trial_finish` tells the root-cause reading (``ftwatch.policy.rootcause``,
rule 6) to drop such a finish.
"""

from __future__ import annotations

import re
from typing import Iterable

from ftwatch.events import Finding, precedes
from ftwatch.parsers.multiline import FRAME
from ftwatch.policy.lifecycle import uncaught_traceback

#: a frame of a search driver's trial loop: Optuna's ``Study.optimize`` (``study.py``, ``_optimize.py``),
#: W&B's sweep agent (``wandb_agent.py``, ``agents/pyagent.py``)
DRIVER_FRAMES = re.compile(r"(?:optuna[/\\]study[/\\](?:study|_optimize)\.py"
                           r"|wandb[/\\](?:wandb_agent|agents[/\\]pyagent)\.py)$")


def in_trial_loop(f: Finding) -> bool:
    """``f`` is an uncaught Python traceback whose frames pass through a search driver's trial loop."""
    return uncaught_traceback(f) and any(
        (m := FRAME.match(line)) is not None and DRIVER_FRAMES.search(m.group(1)) is not None for line in f.evidence)


def trial_finish(finished: Finding, findings: Iterable[Finding]) -> Finding | None:
    """The error that says ``finished`` ended one trial of a search and not the job: the first
    uncaught traceback after it, on its stream, raised through the driver's trial loop
    (:func:`in_trial_loop`); None when there is none (``finished`` keeps its reading)."""
    return min((f for f in findings if precedes(finished, f) and _one_stream(finished, f) and in_trial_loop(f)),
               key=lambda f: (f.time, f.seq), default=None)


def _one_stream(a: Finding, b: Finding) -> bool:
    """``a`` and ``b`` come from one process's output: one instance, or one of them a rank of the other's stream."""
    x, y = a.origin.instance, b.origin.instance
    return x == y or x.startswith(y + "/") or y.startswith(x + "/")
