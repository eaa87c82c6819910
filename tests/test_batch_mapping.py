"""Batches that are Mappings but not dicts (``transformers.BatchEncoding`` is a ``UserDict``): every collator of
a tokenizer returns one, and the Trainer must treat it exactly as a dict batch."""

from __future__ import annotations

from collections import UserDict

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.backend.runtime import to_device
from trainwell.loop.accumulation import find_batch_size


class Encoding(UserDict):
    """Stands in for BatchEncoding: a UserDict (not a dict) that also has attribute access."""

    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


def mapping_collate(features):
    return Encoding(default_collate(features))


def _run(tmp_path, collator):
    torch.manual_seed(0)
    args = make_args(str(tmp_path), max_steps=4, per_device_train_batch_size=8, per_device_eval_batch_size=8,
                     logging_steps=1)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=20), data_collator=collator)
    trainer.train()
    return trainer, trainer.evaluate(), trainer.predict(RegressionDataset(length=20))


def test_a_userdict_batch_trains_evaluates_and_predicts_like_a_dict_batch(tmp_path):
    trainer, metrics, prediction = _run(tmp_path / "mapping", mapping_collate)
    _, plain_metrics, plain_prediction = _run(tmp_path / "dict", default_collate)
    assert "eval_loss" in metrics and metrics["eval_loss"] == pytest.approx(plain_metrics["eval_loss"])
    assert "test_loss" in prediction.metrics
    assert prediction.metrics["test_loss"] == pytest.approx(plain_prediction.metrics["test_loss"])
    np.testing.assert_array_equal(prediction.predictions, plain_prediction.predictions)
    np.testing.assert_array_equal(prediction.label_ids, plain_prediction.label_ids)
    assert metrics["eval_samples_per_second"] > 0


def test_batch_size_and_device_placement_see_into_a_mapping():
    batch = Encoding(input_x=torch.zeros(5), labels=torch.ones(5))
    assert find_batch_size(batch) == 5
    moved = to_device(batch, torch.device("cpu"), torch.float64)
    assert isinstance(moved, Encoding) and moved["input_x"].dtype == torch.float64
