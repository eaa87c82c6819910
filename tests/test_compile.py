"""torch_compile, torch_compile_backend and torch_compile_mode: compiled training and evaluation (CPU).

Most checks use the ``eager`` backend (Dynamo traces the model, nothing is code-generated: seconds); one test
compiles with ``inductor`` for real (about 20-40 s cold on the CI machine).
"""

from __future__ import annotations

import logging
import os

import pytest
import torch
from safetensors.torch import load_file

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer


def _trainer(out_dir, max_steps=4, **kwargs):
    args = make_args(out_dir, max_steps=max_steps, logging_steps=1, per_device_train_batch_size=8, **kwargs)
    torch.manual_seed(0)
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                   eval_dataset=RegressionDataset(length=16))


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_compiled_training_matches_eager_and_saves_plain_weights(out_dir, caplog):
    eager = _trainer(out_dir + "-eager")
    eager.train()
    compiled = _trainer(out_dir, torch_compile_backend="eager", save_strategy="steps", save_steps=2)
    with caplog.at_level(logging.INFO, logger="trainwell"):
        compiled.train()
    assert hasattr(compiled.model_wrapped, "_orig_mod")  # Dynamo's wrapper: the model really was compiled
    assert not hasattr(compiled.model, "_orig_mod")  # trainer.model stays the user's module
    assert _losses(compiled) == _losses(eager)
    assert caplog.text.count("torch.compile (eager backend): the first training step took") == 1
    compiled.save_model()
    for folder in (out_dir, os.path.join(out_dir, "checkpoint-4")):
        keys = set(load_file(os.path.join(folder, "model.safetensors")))
        assert keys == {"a", "b"}  # no "_orig_mod." prefix
    resumed = _trainer(out_dir, torch_compile_backend="eager", max_steps=6)
    resumed.train(resume_from_checkpoint=os.path.join(out_dir, "checkpoint-4"))
    assert resumed.state.global_step == 6


def test_evaluation_before_training_runs_compiled(out_dir):
    trainer = _trainer(out_dir, torch_compile=True, torch_compile_backend="eager")
    evaluated = trainer.runtime.compiled(trainer.model)
    assert hasattr(evaluated, "_orig_mod") and trainer.runtime.compiled(trainer.model) is evaluated  # built once
    assert trainer.evaluate()["eval_loss"] == pytest.approx(_trainer(out_dir + "-eager").evaluate()["eval_loss"])


def test_inductor_compiles_and_trains_like_eager(out_dir):
    eager = _trainer(out_dir + "-eager")
    eager.train()
    compiled = _trainer(out_dir, torch_compile=True)  # the reference's default backend: inductor
    assert compiled.args.torch_compile_backend == "inductor"
    compiled.train()
    assert compiled.runtime.compile_backend == "inductor"
    assert _losses(compiled) == pytest.approx(_losses(eager), rel=1e-5)
    assert torch.allclose(compiled.model.a, eager.model.a, atol=1e-5)


@pytest.mark.parametrize(("field", "value", "hint"), [
    ("torch_compile_backend", "inducter", "Did you mean 'inductor'?"),
    ("torch_compile_mode", "max_autotune", "Did you mean 'max-autotune'?"),
])
def test_unknown_compile_choices_fail_at_construction(out_dir, field, value, hint):
    with pytest.raises(ValueError, match=rf"{field}='{value}'.*{hint}"):
        make_args(out_dir, **{field: value})
