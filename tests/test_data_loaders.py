"""Loader options, worker seeding, persistent eval loaders, iterable datasets and `datasets` interop."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer


def test_dataloader_options_reach_the_loader(out_dir):
    args = make_args(out_dir, dataloader_drop_last=True, dataloader_num_workers=2, dataloader_prefetch_factor=3,
                     dataloader_pin_memory=False, dataloader_persistent_workers=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=20))
    loader = trainer.get_train_dataloader()
    assert loader.drop_last and loader.num_workers == 2 and loader.prefetch_factor == 3
    assert not loader.pin_memory and loader.persistent_workers and loader.worker_init_fn is not None
    assert len(loader) == 20 // 8
    eval_loader = trainer.get_eval_dataloader(RegressionDataset(length=20))
    assert eval_loader.drop_last and len(eval_loader) == 2


def test_persistent_workers_cache_eval_loaders(out_dir):
    data, other = RegressionDataset(length=8), RegressionDataset(length=8, seed=1)
    args = make_args(out_dir, dataloader_num_workers=1, dataloader_persistent_workers=True)
    trainer = Trainer(model=RegressionModel(), args=args, eval_dataset={"a": data, "b": other})
    first = trainer.get_eval_dataloader("a")
    assert trainer.get_eval_dataloader("a") is first and trainer.get_eval_dataloader(data) is first
    assert trainer.get_eval_dataloader("b") is not first
    metrics = trainer.evaluate()
    assert {"eval_a_loss", "eval_b_loss"} <= set(metrics)
    plain = Trainer(model=RegressionModel(), args=make_args(out_dir), eval_dataset=data)
    assert plain.get_eval_dataloader() is not plain.get_eval_dataloader()


class RandomDraws(torch.utils.data.Dataset):
    """Each sample records what python, numpy and torch RNGs give in the worker that loads it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return {"input_x": torch.tensor(0.0), "worker": info.id if info else -1,
                "draws": (random.random(), float(np.random.rand()), float(torch.rand(())))}


def _draws(out_dir, seed=0):
    args = make_args(out_dir, dataloader_num_workers=2, per_device_train_batch_size=1, seed=seed,
                     train_sampling_strategy="sequential", remove_unused_columns=False)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RandomDraws(),
                      data_collator=lambda features: features[0])
    loader = trainer.get_train_dataloader()
    return [(b["worker"], b["draws"]) for b in loader]


def test_workers_are_seeded_distinctly_and_reproducibly(out_dir):
    first, again = _draws(out_dir), _draws(out_dir)
    assert first == again
    by_worker = {w: d for w, d in first}
    assert set(by_worker) == {0, 1} and by_worker[0] != by_worker[1]
    for k in range(3):  # python, numpy and torch each differ between the two workers
        assert by_worker[0][k] != by_worker[1][k]
    assert _draws(out_dir, seed=1) != first


class EpochStream(IterableDataset):
    """An iterable dataset whose content depends on the epoch set by the trainer."""

    def __init__(self):
        self.epochs = []
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epochs.append(epoch)
        self.epoch = epoch

    def __iter__(self):
        data = RegressionDataset(length=16, seed=self.epoch)
        return (data[i] for i in range(16))


def test_iterable_dataset_epochs_call_set_epoch(out_dir):
    stream = EpochStream()
    args = make_args(out_dir, max_steps=6, per_device_train_batch_size=8)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=stream)
    trainer.train()
    assert trainer.state.global_step == 6
    assert stream.epochs[:3] == [0, 1, 2]


def test_iterable_dataset_needs_max_steps(out_dir):
    with pytest.raises(ValueError, match="max_steps"):
        Trainer(model=RegressionModel(), args=make_args(out_dir), train_dataset=EpochStream())


# ------------------------------------------------------------------------------------------ datasets interop
datasets = pytest.importorskip("datasets")


def _hf(n=32, extra=True):
    base = RegressionDataset(length=n)
    columns = {"input_x": base.x.tolist(), "labels": base.ys[0].tolist()}
    if extra:
        columns["text"] = ["t"] * n
    return datasets.Dataset.from_dict(columns), base


@pytest.mark.parametrize("fmt", [None, "torch", "numpy"])
def test_hf_dataset_formats_train_and_predict_in_order(out_dir, fmt):
    ds, base = _hf()
    ds = ds.with_format(fmt) if fmt else ds
    trainer = Trainer(model=RegressionModel(a=1.0), args=make_args(out_dir, max_steps=2), train_dataset=ds)
    trainer.train()
    out = trainer.predict(ds)
    assert out.predictions.shape == (32,)
    np.testing.assert_allclose(out.label_ids, base.ys[0], rtol=1e-6)


def test_hf_iterable_dataset_trains_and_evaluates(out_dir):
    ds, _ = _hf()
    stream = ds.to_iterable_dataset(num_shards=2)
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=5, per_device_train_batch_size=8),
                      train_dataset=stream.with_format("torch"))
    trainer.train()
    assert trainer.state.global_step == 5
    metrics = trainer.evaluate(stream)
    mapped = trainer.evaluate(ds)
    assert metrics["eval_loss"] == pytest.approx(mapped["eval_loss"], rel=1e-5)


def test_hf_iterable_without_known_columns_uses_the_collator_filter(out_dir):
    ds, _ = _hf()

    def gen():
        yield from ds

    stream = datasets.IterableDataset.from_generator(gen)  # no declared features: column names unknown
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=2), train_dataset=stream)
    trainer.train()  # "text" is dropped by the collator wrapper
    assert trainer.state.global_step == 2


def test_hf_dataset_with_no_usable_column_is_a_clear_error(out_dir):
    ds = datasets.Dataset.from_dict({"text": ["a", "b"], "idx": [0, 1]})
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=1), train_dataset=ds)
    with pytest.raises(ValueError, match=r"forward takes \['input_x'"):
        trainer.train()


class _NeedsX(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, labels=None):
        if labels is not None and labels.dtype != torch.float32:
            raise TypeError("labels must be float")  # a TypeError from inside forward
        return {"loss": self.linear(x).pow(2).mean()}


@pytest.mark.parametrize("remove_unused", [True, False])
def test_a_batch_that_does_not_fit_forward_names_keys_and_arguments(out_dir, remove_unused):
    data = [{"inputs": torch.ones(2), "labels": torch.zeros(1)} for _ in range(4)]
    args = make_args(out_dir, max_steps=1, remove_unused_columns=remove_unused)
    with pytest.raises(TypeError) as err:
        Trainer(model=_NeedsX(), args=args, train_dataset=data).train()
    text = str(err.value)
    assert "_NeedsX.forward(x, labels)" in text and "missing a required argument: 'x'" in text
    assert ("['inputs', 'labels']" if not remove_unused else "['labels']") in text
    assert "remove_unused_columns" in text


def test_a_type_error_inside_forward_is_not_rewritten(out_dir):
    data = [{"x": torch.ones(2), "labels": torch.zeros(1, dtype=torch.float64)} for _ in range(4)]
    with pytest.raises(TypeError, match="^labels must be float$"):
        Trainer(model=_NeedsX(), args=make_args(out_dir, max_steps=1), train_dataset=data).train()
