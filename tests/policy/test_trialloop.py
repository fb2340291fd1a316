"""Rule 6 of rootcause and ftwatch.policy.trialloop: a "training finished" line that ended one trial
of a hyper-parameter search (Optuna, a W&B sweep agent) is not the job's end when the traceback
after it was raised through the driver's trial loop: the search itself failed."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin, Severity
from ftwatch.policy.rootcause import analyse
from ftwatch.policy.trialloop import in_trial_loop, trial_finish

T0 = 1_795_219_200.0
ORIGIN = Origin("train", None, "job", "node-0", "stdout", "process")


def finished(t: float = 1.0) -> Finding:
    return Finding("lifecycle.finished.hf_trainer_metrics", "keyword", FailureClass.INFO, Action.NONE, Severity.INFO,
                   ORIGIN, "{'train_runtime': 1268.4, 'train_samples_per_second': 3.94, 'epoch': 1.0}", T0 + t,
                   seq=int(t))


def oom(frames: tuple[str, ...], t: float = 10.0) -> Finding:
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB."
    evidence = ("Traceback (most recent call last):", *frames, line)
    return Finding("cuda.out_of_memory", "keyword", FailureClass.OOM, Action.FAIL_JOB, Severity.ERROR, ORIGIN, line,
                   T0 + t, seq=int(t), evidence=evidence)


OPTUNA = ('  File "/home/ml/hpo/search.py", line 94, in <module>', "    study.optimize(objective, n_trials=20)",
          '  File "/venv/lib/python3.10/site-packages/optuna/study/study.py", line 475, in optimize',
          '  File "/home/ml/hpo/search.py", line 71, in objective')
WANDB = ('  File "/srv/venv/lib/python3.8/site-packages/wandb/agents/pyagent.py", line 235, in _run_jobs_from_queue',
         "    del self._run_threads[job.run_id]")
PLAIN = ('  File "/home/ml/train.py", line 80, in <module>', "    trainer.save_model()")


def test_an_error_raised_through_the_search_driver_is_the_jobs_failure():
    done, err = finished(), oom(OPTUNA)
    assert in_trial_loop(err)
    assert trial_finish(done, [done, err]) is err
    an = analyse([done, err])
    assert an.root_cause is err and not an.after_finish


def test_the_wandb_sweep_agents_loop_is_a_driver_too():
    assert in_trial_loop(oom(WANDB))


def test_an_error_outside_a_driver_after_the_finish_stays_a_notice():
    done, err = finished(), oom(PLAIN)
    assert not in_trial_loop(err) and trial_finish(done, [done, err]) is None
    an = analyse([done, err])
    assert an.after_finish and an.finished is done


def test_a_driver_error_before_the_finish_does_not_undo_it():
    err, done = oom(OPTUNA, t=1.0), finished(t=10.0)
    assert trial_finish(done, [err, done]) is None
