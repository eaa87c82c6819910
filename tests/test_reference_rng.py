"""Same seed, same numbers: trainwell consumes the random generators as the reference does, and resumes exactly.

The reference's training loader draws one int64 from the global torch RNG as each epoch's iterator starts (its
worker base seed) and collates each batch one ahead of the step (Accelerate's prepared loader); dropout and a
collator that draws random numbers see that order. trainwell keeps it, so a model with dropout trained with a
random collator gives the reference's losses bit for bit, and a resume mid-epoch still continues exactly.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.common.models import ClassificationDataset, DropoutMLP
from tests.conftest import make_args
from trainwell import Trainer, TrainerCallback, set_seed


def noisy_collate(features):
    """A collator with randomness from torch, numpy and python (augmentation, masking...)."""
    x = torch.stack([f["x"] for f in features])
    noise = 0.1 * torch.randn_like(x) + float(np.random.rand()) * 0.01 + random.random() * 0.01
    return {"x": x + noise, "labels": torch.stack([f["labels"] for f in features])}


def torch_noise_collate(features):
    x = torch.stack([f["x"] for f in features])
    return {"x": x + 0.1 * torch.randn_like(x), "labels": torch.stack([f["labels"] for f in features])}


SETTINGS = dict(max_steps=16, logging_steps=1, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                eval_strategy="steps", eval_steps=5)


def _losses(trainer):
    return [(h["step"], h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h]


def test_dropout_and_a_random_collator_give_the_references_losses(tmp_path):
    transformers = pytest.importorskip("transformers")
    import trainwell

    def run(lib):
        lib.set_seed(0)
        model = DropoutMLP()
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), report_to="none", use_cpu=True, disable_tqdm=True,
                                     save_strategy="no", **SETTINGS)
        trainer = lib.Trainer(model=model, args=args, train_dataset=ClassificationDataset(),
                              eval_dataset=ClassificationDataset(n=16, seed=1), data_collator=torch_noise_collate)
        trainer.train()  # 16 windows of 2 x 8 over 96 samples: three epochs, each starting its loader anew
        return _losses(trainer), [p.detach().clone() for p in model.parameters()]

    (mine, my_weights), (theirs, their_weights) = run(trainwell), run(transformers)
    assert mine == theirs
    for a, b in zip(my_weights, their_weights):
        assert torch.equal(a, b)


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = control.should_training_stop = True


def _train(out_dir, collate, resume=None, stop=None, workers=0):
    set_seed(0)
    model = DropoutMLP()
    args = make_args(out_dir, save_strategy="no", dataloader_num_workers=workers, **SETTINGS)
    trainer = Trainer(model=model, args=args, train_dataset=ClassificationDataset(),
                      eval_dataset=ClassificationDataset(n=16, seed=1), data_collator=collate,
                      callbacks=[StopAt(stop)] if stop else [])
    trainer.train(resume_from_checkpoint=resume)
    return _losses(trainer), [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("collate", [torch_noise_collate, noisy_collate])
@pytest.mark.parametrize("stop", [5, 6])  # mid-epoch (3 windows per epoch) and at an epoch's end
def test_a_resume_with_a_random_collator_continues_exactly(tmp_path, collate, stop):
    full_losses, full_weights = _train(str(tmp_path / "full"), collate)
    _train(str(tmp_path / "cut"), collate, stop=stop)
    losses, weights = _train(str(tmp_path / "cut"), collate, resume=str(tmp_path / "cut" / f"checkpoint-{stop}"))
    assert [e for e in losses if e[0] > stop] == [e for e in full_losses if e[0] > stop]
    for a, b in zip(weights, full_weights):
        assert torch.equal(a, b)


def test_workers_draw_as_the_references_workers(tmp_path):
    transformers = pytest.importorskip("transformers")
    import trainwell

    def run(lib):
        lib.set_seed(0)
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), report_to="none", use_cpu=True, disable_tqdm=True,
                                     save_strategy="no", dataloader_num_workers=2, max_steps=14, logging_steps=1,
                                     per_device_train_batch_size=8)
        trainer = lib.Trainer(model=DropoutMLP(), args=args, train_dataset=ClassificationDataset(),
                              data_collator=noisy_collate)
        trainer.train()  # the collator's draws happen in the workers, seeded from each epoch's base seed
        return _losses(trainer)

    assert run(trainwell) == run(transformers)


def _logged(out_dir, resume=None, stop=None, logging_steps=4):
    set_seed(0)
    args = make_args(out_dir, save_strategy="no", **{**SETTINGS, "logging_steps": logging_steps})
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=ClassificationDataset(),
                      eval_dataset=ClassificationDataset(n=16, seed=1), data_collator=torch_noise_collate,
                      callbacks=[StopAt(stop)] if stop else [])
    output = trainer.train(resume_from_checkpoint=resume)
    return [h for h in trainer.state.log_history if "loss" in h], output


def test_logs_after_a_resume_equal_the_uninterrupted_runs(tmp_path):
    full, _ = _logged(str(tmp_path / "full"))
    _logged(str(tmp_path / "cut"), stop=6)  # step 6 is not a logging step (every 4): the window 5-8 is open
    resumed, output = _logged(str(tmp_path / "cut"), resume=str(tmp_path / "cut" / "checkpoint-6"))
    assert [h for h in resumed if h["step"] > 6] == [h for h in full if h["step"] > 6]
    # train_loss keeps the reference's meaning: the mean loss of this call's steps (7 to 16)
    per_step, _ = _logged(str(tmp_path / "steps"), logging_steps=1)
    expected = sum(h["loss"] for h in per_step if h["step"] > 6) / 10
    assert output.training_loss == pytest.approx(expected, rel=1e-6)
