"""A training loop's own capitalised report of a non-finite loss (``python.loss_not_finite``): the
torchvision-reference / DETR / DeiT / MAE engines print ``Loss is nan, stopping training`` and exit 1,
and progress lines such as muzero-general's end in ``Loss: nan``. Without these forms the MAE run's
exit read as only the launcher's fallout (a restart) and the muzero run decided nothing."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
RULE = "python.loss_not_finite"


def hits(line: str):
    found = ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), f"{line}\n".encode(), 1.0, final=True)
    return [f for f in found if f.rule_id == RULE]


def test_the_engines_stop_sentence_is_divergence():
    for value in ("nan", "inf", "-inf"):
        found = hits(f"[10:41:36.508034] Loss is {value}, stopping training")
        assert found and (found[0].failure_class, found[0].action) == (FailureClass.USER_CODE, Action.FAIL_JOB), value


def test_a_capitalised_progress_loss_of_nan_is_divergence_and_a_finite_one_is_not():
    assert hits("Last test reward: 0.00. Training step: 15402/100000. Played games: 2441. Loss: nan")
    assert not hits("Last test reward: 20.00. Training step: 14890/100000. Played games: 2388. Loss: 2.41")
    assert not hits("Loss: nanometre scale factor 0.5")
