"""auto_find_batch_size: smaller micro-batches after out-of-memory errors, with the global batch kept."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.techniques.batch_size import is_out_of_memory, smaller_micro_batch


class FitsUpTo(RegressionModel):
    """Runs out of memory on batches larger than ``limit`` (from step ``after`` on, counting training forwards)."""

    def __init__(self, limit, after=0, eval_limit=None):
        super().__init__()
        self.limit, self.after, self.eval_limit, self.forwards = limit, after, eval_limit, 0

    def forward(self, input_x, labels=None):
        if self.training:
            self.forwards += 1
            if len(input_x) > self.limit and self.forwards > self.after:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        elif self.eval_limit is not None and len(input_x) > self.eval_limit:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return super().forward(input_x, labels)


def _run(out_dir, model, **kwargs):
    settings = dict(per_device_train_batch_size=16, max_steps=6, logging_steps=1, auto_find_batch_size=True)
    trainer = Trainer(model=model, args=make_args(str(out_dir), **{**settings, **kwargs}),
                      train_dataset=RegressionDataset(length=96), eval_dataset=RegressionDataset(length=16))
    return trainer, trainer.train()


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_the_micro_batch_shrinks_and_the_global_batch_stays(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        trainer, out = _run(tmp_path / "auto", FitsUpTo(limit=4), save_strategy="steps", save_steps=6)
    assert out.global_step == 6
    assert trainer._train_batch_size == 4 and trainer.args.gradient_accumulation_steps == 4
    assert "micro-batch of 16" in caplog.text and "4 x 4 accumulation steps" in caplog.text
    state = json.loads((tmp_path / "auto" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["train_batch_size"] == 4
    # the same optimization as asking for 4 x 4 from the start
    plain, _ = _run(tmp_path / "plain", RegressionModel(), per_device_train_batch_size=4,
                    gradient_accumulation_steps=4, auto_find_batch_size=False)
    assert _losses(trainer) == pytest.approx(_losses(plain), rel=1e-6)


def test_a_resume_takes_back_the_chosen_size(tmp_path):
    _run(tmp_path, FitsUpTo(limit=4), save_strategy="steps", save_steps=3)
    trainer = Trainer(model=FitsUpTo(limit=4), train_dataset=RegressionDataset(length=96),
                      args=make_args(str(tmp_path), per_device_train_batch_size=16, max_steps=9,
                                     auto_find_batch_size=True, save_strategy="steps", save_steps=3))
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert trainer.model.forwards == 3 * 4  # three more steps of 4 x 4, no out-of-memory attempt first
    assert trainer.state.global_step == 9


def test_an_error_after_steps_resumes_from_this_runs_checkpoint(tmp_path):
    model = FitsUpTo(limit=4, after=4)  # fine for the first 2 steps of 8 x 2, then out of memory
    trainer, out = _run(tmp_path, model, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                        save_strategy="steps", save_steps=2)
    assert out.global_step == 6 and trainer._train_batch_size == 4 and trainer.args.gradient_accumulation_steps == 4
    logged = [h["step"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [1, 2, 3, 4, 5, 6]  # step 3 failed; the retry resumed from checkpoint-2 with 4 x 4
    assert model.forwards == 4 + 1 + 4 * 4


def test_an_error_after_steps_without_a_checkpoint_names_the_fix(tmp_path):
    with pytest.raises(RuntimeError, match="at step 2, after the weights had changed"):
        _run(tmp_path, FitsUpTo(limit=8, after=2), per_device_train_batch_size=16)


def test_out_of_memory_at_one_and_other_errors(tmp_path):
    with pytest.raises(RuntimeError, match="micro-batch of 1"):
        _run(tmp_path / "a", FitsUpTo(limit=0))

    class Broken(RegressionModel):
        def forward(self, input_x, labels=None):
            raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        _run(tmp_path / "b", Broken())


def test_an_evaluation_out_of_memory_does_not_shrink_the_train_batch(tmp_path):
    with pytest.raises(RuntimeError, match="per_device_eval_batch_size") as err:
        _run(tmp_path, FitsUpTo(limit=16, eval_limit=2), eval_strategy="steps", eval_steps=2)
    assert is_out_of_memory(err.value.__cause__)


def test_the_building_blocks():
    assert smaller_micro_batch(16, 16) == 8 and smaller_micro_batch(30, 30) == 15 and smaller_micro_batch(15, 30) == 6
    assert smaller_micro_batch(1, 8) is None
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"))
    assert is_out_of_memory(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"))
    assert not is_out_of_memory(RuntimeError("expected scalar type Float"))
