"""Gradient accumulation: the pure arithmetic, and k micro-batches of b equal one batch of k·b end to end."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tests.common.models import (
    RegressionDataset,
    RegressionModel,
    TinyTokenLM,
    VariableLengthTokenDataset,
)
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.loop.accumulation import count_items, loss_factors, updates_per_epoch, window_sizes


def test_window_sizes_and_updates():
    assert window_sizes(10, 4) == [4, 4, 2]
    assert window_sizes(8, 4) == [4, 4]
    assert window_sizes(3, 4) == [3]
    assert window_sizes(0, 4) == []
    assert updates_per_epoch(10, 4) == 3
    assert updates_per_epoch(1, 4) == 1


def test_count_items():
    labels = torch.tensor([[1, 2, -100], [3, -100, -100]])
    assert count_items({"labels": labels}, ["labels"]) == 3
    assert count_items({"labels": labels}, ["labels"], shift_labels=True) == 1  # labels[..., 1:]
    assert count_items({"labels": torch.ones(4, 2)}, ["labels"]) == 8  # float targets: every entry
    assert count_items({"x": torch.ones(5, 3)}, ["labels"]) == 5  # no labels: samples
    assert count_items([{"prompt": "a"}, {"prompt": "b"}], ["labels"]) is None  # no tensor: nothing to count
    shifted = {"labels": labels, "shift_labels": torch.tensor([[2, -100], [-100, -100]])}
    assert count_items(shifted, ["labels"]) == 1


def test_loss_factors():
    micro = [torch.tensor(3), torch.tensor(1)]
    factors = loss_factors(micro, torch.tensor(4), world_size=1, loss_normalized_by_window=False)
    assert [float(f) for f in factors] == [0.75, 0.25]
    factors = loss_factors(micro, torch.tensor(8), world_size=2, loss_normalized_by_window=False)
    assert [float(f) for f in factors] == [0.75, 0.25]
    assert loss_factors(micro, torch.tensor(4), world_size=2, loss_normalized_by_window=True) == [2.0, 2.0]
    # a window whose labels are all -100 contributes nothing instead of dividing by zero
    zero = loss_factors([torch.tensor(0)], torch.tensor(0), 1, False)
    assert float(zero[0]) == 0.0


def _final_params(out_dir, model, data, **kwargs):
    args = make_args(out_dir, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
                     train_sampling_strategy="sequential", **kwargs)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return trainer, [p.detach().clone() for p in trainer.model.parameters()]


def _logged_losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h and "step" in h and "train_loss" not in h]


def test_mean_loss_model_accumulation_equals_big_batch(out_dir):
    t1, big = _final_params(out_dir, RegressionModel(), RegressionDataset(length=64), per_device_train_batch_size=8,
                            num_train_epochs=2, logging_steps=1)
    t2, acc = _final_params(out_dir, RegressionModel(), RegressionDataset(length=64), per_device_train_batch_size=4,
                            gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=1)
    for a, b in zip(big, acc):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the logged loss is the loss of what was optimized: the same per step
    assert _logged_losses(t1) == pytest.approx(_logged_losses(t2), rel=1e-5)
    assert t1.state.global_step == t2.state.global_step == 16


def test_uneven_last_window_is_weighted_by_samples(out_dir):
    # 36 samples, batch 4 → 9 micro-batches: windows of 4, 4 and a last window of 1 (per epoch).
    _, big_last = _final_params(out_dir, RegressionModel(), RegressionDataset(length=36),
                                per_device_train_batch_size=16, num_train_epochs=1)
    _, acc = _final_params(out_dir, RegressionModel(), RegressionDataset(length=36), per_device_train_batch_size=4,
                           gradient_accumulation_steps=4, num_train_epochs=1)
    for a, b in zip(big_last, acc):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_uneven_micro_batches_weighted_by_samples(out_dir):
    # 20 samples, batch 8, GA 3: one window of micro-batches with 8, 8 and 4 samples = one batch of 20.
    _, big = _final_params(out_dir, RegressionModel(), RegressionDataset(length=20), per_device_train_batch_size=20,
                           num_train_epochs=1)
    _, acc = _final_params(out_dir, RegressionModel(), RegressionDataset(length=20), per_device_train_batch_size=8,
                           gradient_accumulation_steps=3, num_train_epochs=1)
    for a, b in zip(big, acc):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_token_level_loss_with_padding_is_token_weighted(out_dir):
    torch.manual_seed(0)
    init = TinyTokenLM().state_dict()

    def model():
        m = TinyTokenLM()
        m.load_state_dict(init)
        return m

    data = VariableLengthTokenDataset(n=16)
    _, big = _final_params(out_dir, model(), data, per_device_train_batch_size=8, num_train_epochs=1)
    _, acc = _final_params(out_dir, model(), data, per_device_train_batch_size=2, gradient_accumulation_steps=4,
                           num_train_epochs=1)
    for a, b in zip(big, acc):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_model_taking_num_items_gets_window_count(out_dir):
    seen = []

    class SumLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))

        def forward(self, input_x, labels=None, num_items_in_batch=None):
            seen.append(None if num_items_in_batch is None else int(num_items_in_batch))
            err = (input_x * self.w - labels) ** 2
            return {"loss": err.sum() / num_items_in_batch if num_items_in_batch is not None else err.mean()}

    trainer, acc = _final_params(out_dir, SumLoss(), RegressionDataset(length=16), per_device_train_batch_size=4,
                                 gradient_accumulation_steps=2, num_train_epochs=1)
    assert seen == [8] * 4
    _, big = _final_params(out_dir, SumLoss(), RegressionDataset(length=16), per_device_train_batch_size=8,
                           num_train_epochs=1)
    torch.testing.assert_close(acc[0], big[0])


def test_plain_module_with_kwargs_is_not_scaled_by_accumulation(out_dir):
    # The reference treats any forward(**kwargs) as normalizing by num_items_in_batch, so a mean-loss module's
    # loss and gradient norm come out multiplied by the accumulation steps. trainwell does not.
    class KwargsModel(RegressionModel):
        def forward(self, input_x, labels=None, **kwargs):
            assert "num_items_in_batch" not in kwargs
            return super().forward(input_x, labels)

    t_acc, acc = _final_params(out_dir, KwargsModel(), RegressionDataset(length=32), per_device_train_batch_size=4,
                               gradient_accumulation_steps=2, num_train_epochs=1, logging_steps=1)
    t_big, big = _final_params(out_dir, RegressionModel(), RegressionDataset(length=32), per_device_train_batch_size=8,
                               num_train_epochs=1, logging_steps=1)
    for a, b in zip(acc, big):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    grad_acc = [h["grad_norm"] for h in t_acc.state.log_history if "grad_norm" in h]
    grad_big = [h["grad_norm"] for h in t_big.state.log_history if "grad_norm" in h]
    assert grad_acc == pytest.approx(grad_big, rel=1e-5)
    assert _logged_losses(t_acc) == pytest.approx(_logged_losses(t_big), rel=1e-5)


def test_explicit_accepts_loss_kwargs_attribute_wins(out_dir):
    class Opted(RegressionModel):
        accepts_loss_kwargs = True

        def forward(self, input_x, labels=None, **kwargs):
            assert "num_items_in_batch" in kwargs
            return super().forward(input_x, labels)

    trainer = Trainer(model=Opted(), args=make_args(out_dir, max_steps=1), train_dataset=RegressionDataset())
    assert trainer.model_accepts_loss_kwargs
    trainer.train()


@pytest.mark.parametrize("scaled_for_ga", [True, None])
def test_batches_without_tensors_get_no_item_count_and_no_warning_as_on_the_reference(out_dir, scaled_for_ga):
    # TRL's GRPO collates a batch as the list of its prompts (no tensor): the reference passes
    # num_items_in_batch=None, scales the loss by the accumulation only when it is not scaled for it already,
    # and warns of nothing. trainwell passed 0 and warned that every label was -100.
    seen = []

    class PromptTrainer(Trainer):
        loss_is_scaled_for_ga = scaled_for_ga

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen.append(num_items_in_batch)
            return model.w * sum(len(row["prompt"]) for row in inputs)

    class Weight(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))

    prompts = [{"prompt": "a" * (i + 1)} for i in range(8)]
    args = make_args(out_dir, learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
                     per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=1,
                     remove_unused_columns=False, train_sampling_strategy="sequential")
    trainer = PromptTrainer(model=Weight(), args=args, train_dataset=prompts, data_collator=lambda rows: rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        trainer.train()
    assert seen == [None, None]
    # the window's prompts have 1+2 and 3+4 characters: the gradient is their sum, or their mean per micro-batch
    expected = -(3 + 7) if scaled_for_ga else -(3 + 7) / 2
    assert trainer.model.w.item() == pytest.approx(expected)
