"""evaluate() and predict(): metrics, prefixes, padding of variable lengths, dict eval sets, options."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import EvalPrediction, Trainer


def test_eval_loss_is_weighted_per_sample(out_dir):
    trainer = Trainer(model=RegressionModel(a=1.0, b=1.0), args=make_args(out_dir, per_device_eval_batch_size=8))
    data = RegressionDataset(length=20)  # batches of 8, 8, 4
    metrics = trainer.evaluate(data)
    x = torch.tensor(data.x)
    expected = nn.functional.mse_loss(x * 1.0 + 1.0, torch.tensor(data.ys[0])).item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)
    for key in ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second"):
        assert key in metrics


def test_compute_metrics_and_prefix(out_dir):
    def compute_metrics(pred: EvalPrediction):
        preds, labels = pred
        assert isinstance(preds, np.ndarray) and preds.shape == labels.shape == (20,)
        return {"mae": float(np.abs(preds - labels).mean())}

    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir), compute_metrics=compute_metrics)
    metrics = trainer.evaluate(RegressionDataset(length=20), metric_key_prefix="dev")
    assert "dev_mae" in metrics and "dev_loss" in metrics
    out = trainer.predict(RegressionDataset(length=20))
    assert "test_mae" in out.metrics


def test_prediction_loss_only_and_ignore_keys(out_dir):
    trainer = Trainer(model=RegressionModel(double_output=True), args=make_args(out_dir, prediction_loss_only=True))
    out = trainer.predict(RegressionDataset(length=8))
    assert out.predictions is None and "test_loss" in out.metrics

    class Extra(RegressionModel):
        def forward(self, input_x, labels=None):
            out = super().forward(input_x, labels)
            out["hidden"] = input_x * 2
            return out

    trainer = Trainer(model=Extra(), args=make_args(out_dir))
    assert isinstance(trainer.predict(RegressionDataset(length=8)).predictions, tuple)
    preds = trainer.predict(RegressionDataset(length=8), ignore_keys=["hidden"]).predictions
    assert isinstance(preds, np.ndarray)


class VarLenData(Dataset):
    """Samples whose sequence length differs between batches."""

    def __init__(self):
        self.items = [torch.arange(3 + (i // 4)) for i in range(10)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"ids": self.items[i].float(), "labels": self.items[i]}


class EchoModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, ids, labels=None):
        return {"loss": (ids * self.w).mean() * 0, "logits": ids * self.w}


def test_outputs_of_different_lengths_are_padded_with_minus_100(out_dir):
    def collate(features):
        # pad within a batch only: batches have different lengths
        width = max(len(f["ids"]) for f in features)
        ids = torch.stack([nn.functional.pad(f["ids"], (0, width - len(f["ids"])), value=0) for f in features])
        labels = torch.stack([nn.functional.pad(f["labels"], (0, width - len(f["labels"])), value=-100)
                              for f in features])
        return {"ids": ids, "labels": labels}

    trainer = Trainer(model=EchoModel(), args=make_args(out_dir, per_device_eval_batch_size=4), data_collator=collate)
    out = trainer.predict(VarLenData())
    assert out.predictions.shape == (10, 5)
    assert (out.predictions[:4, 3:] == -100).all()
    assert (out.label_ids[:4, 3:] == -100).all()
    assert out.label_ids[9].tolist() == [0, 1, 2, 3, 4]


def test_predict_in_dataset_order(out_dir):
    trainer = Trainer(model=RegressionModel(a=1.0), args=make_args(out_dir, per_device_eval_batch_size=3))
    data = RegressionDataset(length=10)
    out = trainer.predict(data)
    np.testing.assert_allclose(out.predictions, data.x, rtol=1e-6)
    np.testing.assert_allclose(out.label_ids, data.ys[0])


def test_dict_of_eval_datasets(out_dir):
    evals = {"small": RegressionDataset(length=8), "large": RegressionDataset(length=16, seed=1)}
    args = make_args(out_dir, eval_strategy="epoch", metric_for_best_model="eval_small_loss", max_steps=8)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(), eval_dataset=evals)
    metrics = trainer.evaluate()
    assert {"eval_small_loss", "eval_large_loss"} <= set(metrics)
    trainer.train()
    logged = [h["eval_small_loss"] for h in trainer.state.log_history if "eval_small_loss" in h]
    assert len(logged) >= 1 and trainer.state.best_metric == min(logged)
    with pytest.raises(KeyError, match="missing"):
        trainer.evaluate(eval_dataset="missing")


def test_evaluate_named_dataset(out_dir):
    evals = {"a": RegressionDataset(length=8), "b": RegressionDataset(length=16, seed=1)}
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir), eval_dataset=evals)
    metrics = trainer.evaluate(eval_dataset="b")
    direct = trainer.evaluate(evals["b"])
    assert metrics["eval_loss"] == direct["eval_loss"]  # "b" was evaluated, under the usual "eval" prefix
    assert metrics["eval_loss"] != trainer.evaluate(evals["a"])["eval_loss"]


class DtypeRecorder(RegressionModel):
    seen: list = []  # on the class: the half-precision copy evaluated with appends here too

    def forward(self, input_x, labels=None):
        self.seen.append((self.training, self.a.dtype))
        return super().forward(input_x, labels)


def test_full_eval_does_not_leave_model_cast(out_dir):
    args = make_args(out_dir, bf16_full_eval=True, max_steps=2)
    model = DtypeRecorder()
    model.seen.clear()
    trainer = Trainer(model=model, args=args, train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=8))
    trainer.evaluate()
    assert {dtype for training, dtype in model.seen if not training} == {torch.bfloat16}  # evaluated in bf16
    assert trainer.model.a.dtype == torch.float32
    model.seen.clear()
    trainer.train()  # the reference crashes here with a dtype mismatch
    assert trainer.model.a.dtype == torch.float32
    assert {dtype for training, dtype in model.seen if training} == {torch.float32}


class OutputDtypeRecorder(RegressionModel):
    """Records the dtype its matmul computes in (bf16 under a bf16 autocast, float32 otherwise)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.seen = []

    def forward(self, input_x, labels=None):
        self.seen.append((self.training, self.linear(input_x.unsqueeze(-1)).dtype))
        return super().forward(input_x, labels)


def test_mixed_precision_evaluates_under_its_autocast_before_and_after_training(out_dir):
    # As the reference: it prepares the model for evaluation, so bf16=True evaluates in bf16 even before train().
    model = OutputDtypeRecorder()
    trainer = Trainer(model=model, args=make_args(out_dir, bf16=True, max_steps=2), train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=8))
    trainer.evaluate()
    assert {dtype for training, dtype in model.seen} == {torch.bfloat16}
    trainer.train()
    model.seen.clear()
    trainer.predict(RegressionDataset(length=8))
    assert {dtype for training, dtype in model.seen} == {torch.bfloat16}


def test_full_precision_evaluates_without_autocast(out_dir):
    model = OutputDtypeRecorder()
    Trainer(model=model, args=make_args(out_dir), eval_dataset=RegressionDataset(length=8)).evaluate()
    assert {dtype for training, dtype in model.seen} == {torch.float32}


def test_eval_strategy_without_eval_dataset_is_an_error(out_dir):
    with pytest.raises(ValueError, match="eval_dataset"):
        Trainer(model=RegressionModel(), args=make_args(out_dir, eval_strategy="epoch"),
                train_dataset=RegressionDataset())


def test_remove_unused_columns_for_dict_samples(out_dir):
    class Extra(RegressionDataset):
        def __getitem__(self, i):
            item = super().__getitem__(i)
            item["note"] = "text"
            item["idx"] = i
            return item

    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=2), train_dataset=Extra())
    trainer.train()  # "note" and "idx" are dropped before collation

    class Mismatch(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 1)

        def forward(self, features):
            return self.lin(features)

    trainer = Trainer(model=Mismatch(), args=make_args(out_dir, max_steps=1), train_dataset=RegressionDataset())
    with pytest.raises(ValueError, match=r"forward takes \['features'"):
        trainer.train()
    # remove_unused_columns=False keeps every key
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=1, remove_unused_columns=False),
                      train_dataset=RegressionDataset())
    trainer.train()


def test_hf_datasets_columns_removed(out_dir, caplog):
    datasets = pytest.importorskip("datasets")
    base = RegressionDataset(length=32)
    ds = datasets.Dataset.from_dict({"input_x": base.x.tolist(), "labels": base.ys[0].tolist(),
                                     "text": ["t"] * 32}).with_format("torch")
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=3), train_dataset=ds,
                      eval_dataset=ds)
    with caplog.at_level(logging.INFO, logger="trainwell"):
        trainer.train()
        assert "eval_loss" in trainer.evaluate()
    # the message names the set, as _get_dataloader's description says it
    for name in ("Training", "Evaluation"):
        assert f"removed from the {name} set: ['text']" in caplog.text, caplog.text


class _PairModel(nn.Module):
    """A reward model's shape (TRL's RewardTrainer): each sample a (chosen, rejected) pair, collated as 2 rows."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(0.37))

    def forward(self, x, labels=None):
        chosen, rejected = (x * self.w).chunk(2)
        return {"loss": -nn.functional.logsigmoid(chosen - rejected).mean(), "logits": x * self.w}


def test_a_batch_of_two_rows_per_sample_enters_the_eval_loss_once_per_sample_as_on_the_reference(out_dir):
    # The reference repeats a batch's loss once per sample of the loader's batch (eval_batch_size, the rest of the
    # dataset on the last batch), not once per row: 7 loss entries here (3, 3, 1), where trainwell had 14. The
    # mean is then the reference's to the last bit (TRL's reward eval_loss differed there for 1 seed in 12).
    def pairs(rows):
        x = torch.tensor([r["c"] for r in rows] + [r["r"] for r in rows])
        return {"x": x, "labels": torch.zeros(2 * len(rows))}

    seen = {}

    def metrics(prediction):
        seen["losses"] = prediction.losses
        return {}

    g = torch.Generator().manual_seed(3)
    data = [{"c": float(c), "r": float(r)} for c, r in torch.randn(7, 2, generator=g)]
    args = make_args(out_dir, per_device_eval_batch_size=3, remove_unused_columns=False, include_for_metrics=["loss"])
    trainer = Trainer(model=_PairModel(), args=args, data_collator=pairs, compute_metrics=metrics)
    eval_loss = trainer.evaluate(data)["eval_loss"]
    model = _PairModel()
    with torch.no_grad():
        batch_losses = [model(**pairs(data[i:i + 3]))["loss"].float().item() for i in (0, 3, 6)]
    expected = np.repeat(np.array(batch_losses, dtype=np.float32), [3, 3, 1])
    np.testing.assert_array_equal(seen["losses"], expected)
    assert eval_loss == expected.mean().item()
