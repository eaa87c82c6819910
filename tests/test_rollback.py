"""rollback_on_spike: a spike in the logged loss sends the run back to its last good checkpoint, past the data.

Fault injection: the batches of chosen steps are corrupted (their inputs scaled by 1e3: the loss and the update
blow up). With rollback, the run must end bit-equal to a clean run that skipped exactly the steps the rollback
recorded; the record is in trainer_state.json, so a resume skips the same steps; a spike that keeps coming back
stops the run after MAX_ROLLBACKS with a clear error.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from tests.common.models import ClassificationDataset, DropoutMLP
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.args.resilience import MAX_ROLLBACKS
from trainwell.loop.rollback import DataSkips, SpikeWatch

CORRUPTED = (7, 8)


class Corrupted(Trainer):
    """The batches of the steps in ``bad`` have their inputs multiplied by 1e3."""

    def __init__(self, *args, bad=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.bad = bad

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.state.global_step + 1 in self.bad:
            inputs = {**inputs, "x": inputs["x"] * 1e3}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


class Record(TrainerCallback):
    """Puts a rollback record into the state before the first step: the clean run skips what it names."""

    def __init__(self, record):
        self.record = record

    def on_train_begin(self, args, state, control, **kwargs):
        state.log_history.append(dict(self.record))


def _run(out, bad=(), callbacks=(), resume=None, **kwargs):
    settings = {"max_steps": 12, "per_device_train_batch_size": 4, "logging_steps": 2, "save_strategy": "steps",
                "save_steps": 2, "report_to": "none", "disable_tqdm": True, "learning_rate": 1e-2,
                "rollback_on_spike": 5.0, **kwargs}
    torch.manual_seed(0)
    trainer = Corrupted(DropoutMLP(), TrainingArguments(str(out), **settings), train_dataset=ClassificationDataset(),
                        callbacks=list(callbacks), bad=bad)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("rollback"), bad=CORRUPTED)


def test_a_spike_rolls_back_and_the_run_equals_a_clean_run_that_skipped_the_window(rolled_back, tmp_path):
    records = [e for e in rolled_back.state.log_history if "rollback" in e]
    assert len(records) == 1
    record = records[0]
    assert {k: record[k] for k in ("rollback", "rollback_to_step", "skipped_steps_from", "skipped_steps_to", "step")} \
        == {"rollback": 1, "rollback_to_step": 6, "skipped_steps_from": 7, "skipped_steps_to": 8, "step": 8}
    assert record["spike_loss"] > 5.0 * record["spike_median"]
    clean = _run(tmp_path, callbacks=[Record(record)])
    assert clean.state.global_step == rolled_back.state.global_step == 12
    ours, theirs = _weights(rolled_back), _weights(clean)
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name
    losses = lambda t: [(e["step"], e["loss"]) for e in t.state.log_history if "loss" in e]  # noqa: E731
    assert losses(rolled_back) == losses(clean)
    assert [step for step, _ in losses(rolled_back)] == [2, 4, 6, 10, 12]  # nothing logged for the skipped steps


def test_the_record_is_in_trainer_state_and_a_resume_or_a_rerun_skips_the_same_steps(rolled_back, tmp_path):
    out = rolled_back.args.output_dir
    saved = json.loads(open(f"{out}/checkpoint-10/trainer_state.json").read())
    assert [e["skipped_steps_to"] for e in saved["log_history"] if "rollback" in e] == [8]
    # a resume from a checkpoint after the rollback keeps its record and ends where the rolled-back run did
    later = tmp_path / "later"
    shutil.copytree(f"{out}/checkpoint-10", later / "checkpoint-10")
    resumed = _run(later, bad=CORRUPTED, resume=str(later / "checkpoint-10"))
    assert [e["step"] for e in resumed.state.log_history if "rollback" in e] == [8]
    # a rerun from the checkpoint before it (its history has no record) meets the same spike, skips the same steps
    earlier = tmp_path / "earlier"
    shutil.copytree(f"{out}/checkpoint-6", earlier / "checkpoint-6")
    rerun = _run(earlier, bad=CORRUPTED, resume=str(earlier / "checkpoint-6"))
    assert [(e["skipped_steps_from"], e["skipped_steps_to"]) for e in rerun.state.log_history if "rollback" in e] \
        == [(7, 8)]
    for trainer in (resumed, rerun):
        ours, theirs = _weights(trainer), _weights(rolled_back)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_a_spike_that_keeps_coming_back_stops_the_run_after_the_bounded_rollbacks(tmp_path):
    with pytest.raises(RuntimeError, match=rf"after {MAX_ROLLBACKS} rollbacks in this run .* Stopping"):
        _run(tmp_path, bad=tuple(range(7, 40)), max_steps=30)


def test_no_checkpoint_before_the_spike_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match=r"holds no usable checkpoint at or before step 6"):
        _run(tmp_path, bad=CORRUPTED, save_steps=100)


class NaNFrom(Corrupted):
    """The loss is NaN from step ``self.bad[0]`` on (the weights stay finite: the optimizer skips those steps)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss * float("nan") if self.state.global_step + 1 >= self.bad[0] else loss


def test_a_loss_nan_from_some_step_on_rolls_back_then_stops_clearly(tmp_path):
    # issue 39: every step from 7 on was skipped, each window logged a loss of 0.0 and train() returned normally
    settings = {"max_steps": 30, "per_device_train_batch_size": 4, "logging_steps": 2, "save_steps": 2,
                "report_to": "none", "disable_tqdm": True, "learning_rate": 1e-2, "rollback_on_spike": 5.0}
    torch.manual_seed(0)
    trainer = NaNFrom(DropoutMLP(), TrainingArguments(str(tmp_path), **settings), train_dataset=ClassificationDataset(),
                      bad=(7,))
    with pytest.warns(RuntimeWarning, match="NaN or infinite on every"), \
            pytest.raises(RuntimeError, match=rf"loss nan at step 14 is not finite, after {MAX_ROLLBACKS} rollbacks"):
        trainer.train()
    records = [(e["rollback_to_step"], e["skipped_steps_to"]) for e in trainer.state.log_history if "rollback" in e]
    assert records == [(6, 12)]  # each rollback went back to checkpoint-6; the last one skips steps 7-12
    assert all(e["loss"] != 0.0 for e in trainer.state.log_history if "loss" in e)


def test_a_window_without_a_finite_loss_logs_nan_and_its_skipped_steps_not_zero(tmp_path):
    settings = {"max_steps": 10, "per_device_train_batch_size": 4, "logging_steps": 2, "save_strategy": "no",
                "report_to": "none", "disable_tqdm": True, "learning_rate": 1e-2}
    torch.manual_seed(0)
    trainer = NaNFrom(DropoutMLP(), TrainingArguments(str(tmp_path), **settings), train_dataset=ClassificationDataset(),
                      bad=(8,))
    with pytest.warns(RuntimeWarning, match="so the logged loss is NaN"):
        trainer.train()
    logs = [(e["step"], e["loss"], e.get("skipped_nonfinite_steps")) for e in trainer.state.log_history if "loss" in e]
    assert [(s, k) for s, _, k in logs] == [(2, None), (4, None), (6, None), (8, 1), (10, 2)]
    assert all(0 < v < 10 for _, v, _ in logs[:4])  # a window with a finite loss logs its mean, as before
    assert math.isnan(logs[4][1])  # not 0.0: no step of it had a loss
    summary = trainer.state.log_history[-1]
    assert summary["skipped_nonfinite_steps"] == 3 and math.isfinite(summary["train_loss"])


@pytest.mark.parametrize("device_counts", [False, True])
def test_a_window_without_a_finite_loss_sums_to_nan_on_either_path(device_counts):
    from trainwell.loop.progress import _nan_unless_any

    total, none, some = (torch.tensor(0.0), torch.tensor(0), torch.tensor(2)) if device_counts else (0.0, 0, 2)
    assert math.isnan(float(_nan_unless_any(total, none))) and float(_nan_unless_any(total, some)) == 0.0
    assert math.isnan(float(_nan_unless_any(torch.tensor(0.0), 0)))


# ---------------------------------------------------------------------------------------------- no training
class _State:
    def __init__(self, losses, step):
        self.log_history = [{"loss": v, "step": 2 * (i + 1)} for i, v in enumerate(losses)]
        self.global_step = step


@pytest.mark.parametrize(("losses", "spikes"), [
    ([1.0, 0.9, 0.8, 5.0], True),           # above 5 x the median 0.9
    ([1.0, 0.9, 0.8, 4.0], False),
    ([1.0, 0.9, 50.0], False),              # too little history for a median: only NaN/inf counts
    ([1.0, float("nan")], True),            # a NaN log always does
    ([-1.0, -2.0, -1.5, 10.0], False),      # a median at or below 0 cannot scale
])
def test_what_counts_as_a_spike(losses, spikes):
    watch = SpikeWatch(5.0)
    state = _State(losses, 2 * len(losses))
    if spikes:
        with pytest.raises(Exception, match="loss"):
            watch.check(state)
    else:
        watch.check(state)


class _Counted(dict):
    reads = 0

    def get(self, *args):
        _Counted.reads += 1
        return super().get(*args)


def test_a_log_reads_only_the_recent_history():
    """The check runs at every log of a run whose log_history only grows: it reads the last RECENT losses, not the
    whole history (a 100,000-step run logging every step would otherwise read 5e9 entries)."""
    state = _State([1.0] * 5000 + [0.9] * 5, 10010)
    state.log_history = [_Counted(e) for e in state.log_history]
    _Counted.reads = 0
    SpikeWatch(5.0).check(state)
    assert _Counted.reads < 100
    state.log_history.append(_Counted(loss=50.0, step=10012))
    with pytest.raises(Exception, match="loss 50.0 at step"):  # the median of the recent ones, 0.9 and 1.0
        SpikeWatch(5.0).check(state)


def test_data_skips_point_at_the_next_step_to_pass_over():
    skips = DataSkips([(7, 8), (15, 15)], global_step=0)
    assert skips.next_from == 6 and skips.skips(7) and skips.skips(8) and not skips.skips(9)
    skips.advance(8)
    assert skips.next_from == 14
    skips.advance(15)
    assert skips.next_from == float("inf")
    assert DataSkips([(7, 8)], global_step=7).next_from == 7  # resumed inside a skipped range


def test_the_report_marks_the_rollback(rolled_back):
    from trainwell.report import load_run
    from trainwell.report.tables import session_rows

    [row] = session_rows(load_run(rolled_back.args.output_dir))
    assert row["rollbacks"] == "to 6 (steps 7-8 skipped)"
