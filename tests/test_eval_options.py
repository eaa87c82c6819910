"""Evaluation options: eval_accumulation_steps, preprocess_logits_for_metrics, batch_eval_metrics,
include_for_metrics, eval_do_concat_batches, eval_use_gather_object, prediction_loss_only, iterable eval sets.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

from tests.common.models import (
    RegressionDataset,
    RegressionModel,
    TinyTokenLM,
    VariableLengthTokenDataset,
)
from tests.conftest import make_args
from trainwell import EvalPrediction, Trainer


def _mae(pred: EvalPrediction) -> dict:
    return {"mae": float(np.abs(pred.predictions - pred.label_ids).mean())}


def _token_trainer(out_dir, **kwargs):
    torch.manual_seed(0)
    return Trainer(model=TinyTokenLM(), args=make_args(out_dir, per_device_eval_batch_size=4, **kwargs))


def test_eval_accumulation_steps_changes_nothing_but_when_outputs_move(out_dir):
    data = VariableLengthTokenDataset(n=22)
    base = _token_trainer(out_dir).predict(data)
    for steps in (1, 3, 100):
        out = _token_trainer(out_dir, eval_accumulation_steps=steps).predict(data)
        np.testing.assert_array_equal(out.predictions, base.predictions)
        np.testing.assert_array_equal(out.label_ids, base.label_ids)
        assert out.metrics["test_loss"] == base.metrics["test_loss"]


@pytest.mark.parametrize("steps, staged", [(None, [1, 1, 1, 1, 1, 1]), (2, [2, 2, 2]), (4, [4, 2])])
def test_eval_accumulation_steps_moves_outputs_every_n_batches(out_dir, monkeypatch, steps, staged):
    """22 samples in batches of 4: 6 batches, moved to the host in groups of eval_accumulation_steps."""
    from trainwell.loop import evaluation

    staged_sizes = []
    flush = evaluation._EvalRun._flush

    def spy(self):
        if self.stage:
            staged_sizes.append(len(self.stage))
        flush(self)

    monkeypatch.setattr(evaluation._EvalRun, "_flush", spy)
    _token_trainer(out_dir, eval_accumulation_steps=steps).predict(VariableLengthTokenDataset(n=22))
    assert staged_sizes == staged


def test_preprocess_logits_runs_per_batch_before_accumulation(out_dir):
    seen = []

    def argmax(logits, labels):
        assert isinstance(logits, torch.Tensor) and logits.shape[:2] == labels.shape
        seen.append(logits.shape[0])
        return logits.argmax(-1)

    def accuracy(pred):
        assert pred.predictions.shape == pred.label_ids.shape == (10, 10)
        mask = pred.label_ids != -100
        return {"accuracy": float((pred.predictions[mask] == pred.label_ids[mask]).mean())}

    trainer = _token_trainer(out_dir)
    trainer.compute_metrics, trainer.preprocess_logits_for_metrics = accuracy, argmax
    metrics = trainer.evaluate(VariableLengthTokenDataset(n=10))
    assert seen == [4, 4, 2] and 0.0 <= metrics["eval_accuracy"] <= 1.0


class BatchAccuracy:
    """A compute_metrics for batch_eval_metrics: accumulates, returns the result when compute_result."""

    def __init__(self):
        self.calls, self.correct, self.total = [], 0, 0

    def __call__(self, pred, compute_result):
        self.calls.append((type(pred.predictions), len(pred.label_ids), compute_result))
        self.correct += int((pred.predictions - pred.label_ids).abs().lt(0.5).sum())
        self.total += len(pred.label_ids)
        if compute_result:
            result = {"close": self.correct / self.total, "n": self.total}
            self.correct = self.total = 0
            return result


def test_batch_eval_metrics_calls_compute_metrics_per_batch(out_dir):
    metric = BatchAccuracy()
    args = make_args(out_dir, batch_eval_metrics=True, per_device_eval_batch_size=8)
    trainer = Trainer(model=RegressionModel(a=2.0, b=3.0), args=args, compute_metrics=metric)
    metrics = trainer.evaluate(RegressionDataset(length=20))
    assert metric.calls == [(torch.Tensor, 8, False), (torch.Tensor, 8, False), (torch.Tensor, 4, True)]
    assert metrics["eval_n"] == 20 and metrics["eval_close"] > 0.9 and "eval_loss" in metrics
    loop = trainer.evaluation_loop(trainer.get_eval_dataloader(RegressionDataset(length=20)), "Evaluation")
    assert loop.predictions is None and loop.label_ids is None  # nothing accumulated
    out = trainer.predict(RegressionDataset(length=20))  # predict() still returns the predictions
    assert out.predictions.shape == (20,) and out.metrics["test_n"] == 20


def test_batch_eval_metrics_needs_compute_result_at_init(out_dir):
    args = make_args(out_dir, batch_eval_metrics=True)
    with pytest.raises(ValueError, match="compute_result"):
        Trainer(model=RegressionModel(), args=args, compute_metrics=_mae)
    Trainer(model=RegressionModel(), args=args, compute_metrics=lambda pred, **kwargs: {})
    Trainer(model=RegressionModel(), args=make_args(out_dir), compute_metrics=_mae)  # fine without the flag


def test_include_for_metrics_inputs_and_loss(out_dir):
    captured = {}

    def metrics(pred):
        captured["pred"] = pred
        return {}

    args = make_args(out_dir, include_for_metrics=["inputs", "loss"], per_device_eval_batch_size=8)
    # RegressionModel has no main_input_name: its first input (input_x) is used, not a KeyError
    trainer = Trainer(model=RegressionModel(a=1.0), args=args, compute_metrics=metrics)
    data = RegressionDataset(length=20)
    trainer.evaluate(data)
    pred = captured["pred"]
    assert len(pred) == 4
    np.testing.assert_allclose(pred.inputs, data.x)
    assert pred.losses.shape == (20,)
    assert len(set(pred.losses[:8].tolist())) == 1  # the batch's loss, once per sample

    torch.manual_seed(0)
    tokens = Trainer(model=TinyTokenLM(), args=make_args(out_dir, include_for_metrics=["inputs"]),
                     compute_metrics=metrics)
    data = VariableLengthTokenDataset(n=10)
    tokens.evaluate(data)
    assert len(captured["pred"]) == 3 and captured["pred"].losses is None
    np.testing.assert_array_equal(captured["pred"].inputs, np.stack([d["input_ids"].numpy() for d in data.items]))


def test_eval_do_concat_batches_false_returns_a_list_of_batches(out_dir):
    args = make_args(out_dir, eval_do_concat_batches=False, per_device_eval_batch_size=8)
    trainer = Trainer(model=RegressionModel(a=1.0), args=args)
    data = RegressionDataset(length=20)
    out = trainer.predict(data)
    assert isinstance(out.predictions, list) and [len(p) for p in out.predictions] == [8, 8, 4]
    np.testing.assert_allclose(np.concatenate(out.predictions), data.x, rtol=1e-6)
    assert [len(p) for p in out.label_ids] == [8, 8, 4] and "test_loss" in out.metrics


def test_eval_use_gather_object_single_process_is_unchanged(out_dir):
    data = RegressionDataset(length=20)
    plain = Trainer(model=RegressionModel(a=1.0), args=make_args(out_dir), compute_metrics=_mae).predict(data)
    args = make_args(out_dir, eval_use_gather_object=True)
    gathered = Trainer(model=RegressionModel(a=1.0), args=args, compute_metrics=_mae).predict(data)
    np.testing.assert_array_equal(gathered.predictions, plain.predictions)
    assert gathered.metrics["test_mae"] == plain.metrics["test_mae"]


def test_prediction_loss_only_skips_outputs_and_metrics(out_dir):
    calls = []
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir),
                      compute_metrics=lambda p: calls.append(1) or {"x": 1.0})
    loop = trainer.evaluation_loop(trainer.get_eval_dataloader(RegressionDataset(length=8)), "Evaluation",
                                   prediction_loss_only=True)
    assert loop.predictions is None and loop.label_ids is None and calls == []
    assert set(loop.metrics) == {"eval_loss"}


class Stream(IterableDataset):
    def __init__(self, n):
        self.inner = RegressionDataset(length=n)

    def __iter__(self):
        return (self.inner[i] for i in range(len(self.inner)))


def test_iterable_eval_dataset(out_dir):
    trainer = Trainer(model=RegressionModel(a=1.0), args=make_args(out_dir, per_device_eval_batch_size=8),
                      compute_metrics=_mae)
    metrics = trainer.evaluate(Stream(21))
    reference = trainer.evaluate(RegressionDataset(length=21))
    assert metrics["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-6)
    assert metrics["eval_samples_per_second"] > 0
    out = trainer.predict(Stream(21))
    np.testing.assert_allclose(out.predictions, RegressionDataset(length=21).x, rtol=1e-6)


def test_group_by_length_never_reorders_evaluation(out_dir):
    args = make_args(out_dir, train_sampling_strategy="group_by_length", per_device_eval_batch_size=3)
    trainer = Trainer(model=TinyTokenLM(), args=args)
    data = VariableLengthTokenDataset(n=20)
    out = trainer.predict(data)
    np.testing.assert_array_equal(out.label_ids, np.stack([d["labels"].numpy() for d in data.items]))
