"""The Hugging Face Trainer's logged loss under its NaN/inf filter (``python.loss_not_finite``).

With ``logging_nan_inf_filter`` on (its default) the Trainer logs, for a step whose loss is nan or
inf, the logging window's running average instead, so a window of nothing but non-finite steps is
logged as ``'loss': 0.0``; beside a non-finite ``grad_norm`` that is divergence, not a value. A
finite loss beside an infinite gradient norm stays the fp16 loss scaler's skipped step."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
RULE = "python.loss_not_finite"


def hits(line: str):
    found = ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), f"{line}\n".encode(), 1.0, final=True)
    return [f for f in found if f.rule_id == RULE]


def test_a_filtered_window_of_non_finite_steps_is_divergence():
    for norm in ("nan", "inf"):
        found = hits(f"{{'loss': 0.0, 'grad_norm': {norm}, 'learning_rate': 4.99900e-05, 'epoch': 0.001}}")
        assert found and (found[0].failure_class, found[0].action) == (FailureClass.USER_CODE, Action.FAIL_JOB), norm


def test_a_finite_loss_beside_an_overflowed_norm_is_the_scalers_skipped_step():
    assert not hits("{'loss': 0.0012, 'grad_norm': inf, 'learning_rate': 2e-05, 'epoch': 2.0}")


def test_a_zero_loss_with_a_finite_norm_is_no_finding():
    assert not hits("{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 0.0, 'epoch': 3.0}")
