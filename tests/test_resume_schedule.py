"""A resume with another length (``max_steps``, ``num_train_epochs``) or other schedule arguments changes the
learning-rate schedule: one warning at resume names each value that changes, before and after (issue 34). The
numbers it gives are checked against the learning rates the resumed run then logs."""

from __future__ import annotations

import logging
import re

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from trainwell import Trainer, TrainingArguments
from trainwell.optim.schedule_change import Schedule, schedule_changes, schedule_of


def _train(out, resume=None, **overrides):
    args = dict(output_dir=str(out), max_steps=10, learning_rate=1e-3, warmup_steps=4, lr_scheduler_type="cosine",
                logging_steps=1, save_steps=5, report_to="none", disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=RegressionModel(), args=TrainingArguments(**{**args, **overrides}),
                      train_dataset=RegressionDataset(length=64))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if "differ from its run" in r.getMessage()]


def test_a_resume_with_another_length_names_the_schedule_values_that_change(tmp_path, caplog):
    _train(tmp_path)
    caplog.set_level(logging.WARNING, logger="trainwell")
    _train(tmp_path, resume=str(tmp_path / "checkpoint-5"))  # the same arguments: silent
    assert _warnings(caplog) == []
    resumed = _train(tmp_path, resume=str(tmp_path / "checkpoint-5"), max_steps=20, warmup_steps=0.5,
                     learning_rate=5e-4)
    (message,) = _warnings(caplog)
    assert "the learning-rate schedule (max_steps 10 -> 20): warmup steps: 4 -> 10" in message
    assert "total steps, where the cosine decay ends: 10 -> 20" in message
    assert "learning_rate: 0.001 -> 0.0005, which does not apply: the checkpoint's scheduler state keeps its " \
           "peak, 0.001" in message
    assert "To keep the checkpoint's schedule, resume with max_steps=10" in message
    before, after = re.search(r"learning rate at step 7: ([\d.e-]+) -> ([\d.e-]+) \(step 6 still takes the "
                              r"checkpoint's\)", message).groups()
    logged = {e["step"]: e["learning_rate"] for e in resumed.state.log_history if "learning_rate" in e}
    assert float(after) == pytest.approx(logged[7], rel=1e-3)  # what the warning says is what the run does
    assert float(before) == pytest.approx(0.00075) and float(after) == pytest.approx(0.0006)
    # the peak stayed the checkpoint's, as the warning says: the new warmup reaches 1e-3 at its end
    assert logged[11] == pytest.approx(1e-3)


def test_schedule_changes_by_kind():
    cosine = Schedule("cosine", 2e-3, 50, 1000)
    short = Schedule("cosine", 2e-3, 5, 100)
    changes = schedule_changes(cosine, short, 52)
    assert changes[:2] == ["warmup steps: 50 -> 5", "total steps, where the cosine decay ends: 1000 -> 100"]
    assert changes[2].startswith("learning rate at step 54: 0.002 -> 0.00") and len(changes) == 3
    assert schedule_changes(cosine, cosine, 52) == []
    # a constant schedule has no end to move, and ignores warmup: nothing changes with the length
    assert schedule_changes(Schedule("constant", 1e-3, 0, 10), Schedule("constant", 1e-3, 0, 20), 5) == []
    assert schedule_changes(Schedule("linear", 1e-3, 0, 10), Schedule("cosine", 1e-3, 0, 10), 5)[0] == \
        "lr_scheduler_type: linear -> cosine"
    assert schedule_changes(None, short, 5) == []
    # an older run's training_args.json: warmup_ratio, and a ratio written as warmup_steps below 1
    assert schedule_of({"learning_rate": 1e-3, "lr_scheduler_type": "linear", "warmup_steps": 0,
                        "warmup_ratio": 0.1}, 200).warmup == 20
    assert schedule_of({"learning_rate": 1e-3, "warmup_steps": 0.05}, 200).warmup == 10
    assert schedule_of({"learning_rate": 1e-3, "lr_scheduler_type": "not-a-schedule"}, 200) is None
