"""The loop's seams (issue 40): run-time features enter through objects the wiring binds, not the core loop files.

* the optimizer step applies through one step applier bound once per ``train()`` call (``trainwell.loop.guard``);
* the log-time features are callbacks the wiring adds (the live log with the trackers, rollback_on_spike's watch
  last), so ``TrainingRun`` carries no optional slot for them;
* a rollback's record rides on the ``Resume`` it chose, not on the Trainer.
"""

from __future__ import annotations

import pytest

from tests.common.models import ClassificationDataset, DropoutMLP
from trainwell import Trainer, TrainingArguments
from trainwell.events.flow import DefaultFlowCallback
from trainwell.loop.guard import PlainStep, ScaledStep, StepGuard
from trainwell.loop.live_log import LiveLogCallback
from trainwell.loop.rollback import SpikeWatch


def _trainer(out, **kwargs):
    settings = {"max_steps": 4, "per_device_train_batch_size": 4, "logging_steps": 1, "save_strategy": "steps",
                "save_steps": 2, "report_to": "none", "disable_tqdm": True, **kwargs}
    return Trainer(DropoutMLP(), TrainingArguments(str(out), **settings), train_dataset=ClassificationDataset())


def test_log_time_features_are_callbacks_the_wiring_adds(tmp_path):
    trainer = _trainer(tmp_path, report_to=["live"], rollback_on_spike=100.0)
    callbacks = trainer.callback_handler.callbacks
    assert isinstance(callbacks[0], DefaultFlowCallback) and isinstance(callbacks[1], LiveLogCallback)
    assert isinstance(callbacks[-1], SpikeWatch)  # after every other callback has seen (and shown) the log
    trainer.train()
    assert (tmp_path / "live_log.jsonl").is_file()
    run = vars(trainer.training_run)
    assert not {"live_log", "spikes", "guard"} & set(run), sorted(run)
    assert not hasattr(trainer, "_pending_rollback")


def test_a_plain_run_has_none_of_them(tmp_path):
    trainer = _trainer(tmp_path)
    assert not any(isinstance(c, (LiveLogCallback, SpikeWatch)) for c in trainer.callback_handler.callbacks)
    trainer.train()
    assert not (tmp_path / "live_log.jsonl").exists()


def test_the_step_applier_is_bound_once_per_call(tmp_path):
    plain = _trainer(tmp_path / "plain", skip_nonfinite_steps=False)
    plain.train()
    assert type(plain.training_run.applier) is PlainStep and plain.training_run.guard is None
    guarded = _trainer(tmp_path / "guarded", skip_nonfinite_steps=True)
    guarded.train()
    assert isinstance(guarded.training_run.applier, StepGuard) and guarded.training_run.guard is not None
    assert issubclass(ScaledStep, PlainStep) and issubclass(StepGuard, PlainStep)


def test_the_retry_room_asks_each_policy_and_lets_other_errors_through(monkeypatch):
    """rollback_on_spike and auto_find_batch_size are two policies of one loop (trainwell.techniques.retry): the
    first policy that recovers an error says where the next attempt starts; an error none recovers ends the call."""
    from trainwell.techniques import retry

    class Policy:
        def __init__(self, kind, to):
            self.kind, self.to, self.begun, self.seen = kind, to, [], []

        def begin(self, resume):
            self.begun.append(resume)

        def recovers(self, error):
            return isinstance(error, self.kind)

        def retry(self, error, resume):
            self.seen.append((type(error).__name__, resume))
            return self.to

    memory, spike = Policy(MemoryError, "smaller"), Policy(KeyError, "checkpoint-2")
    monkeypatch.setattr(retry, "policies", lambda trainer: [spike, memory])
    errors = [MemoryError(), KeyError("spike"), None]
    starts = []

    def attempt(resume):
        starts.append(resume)
        error = errors.pop(0)
        if error is not None:
            raise error
        return "done"

    assert retry.train_with_retries(object(), attempt, None) == "done"
    assert starts == [None, "smaller", "checkpoint-2"]
    assert memory.seen == [("MemoryError", None)] and spike.seen == [("KeyError", "smaller")]
    assert memory.begun == spike.begun == [None]
    errors[:] = [ValueError("not ours")]
    with pytest.raises(ValueError, match="not ours"):
        retry.train_with_retries(object(), attempt, None)
