"""Mixed precision as one object (``trainwell.backend.precision.Precision``): what happens around the fp16 grad
scaler. No CPU run has a scaler (Accelerate builds one on GPUs only), so these tests give the Precision of a CPU
run a real ``torch.amp.GradScaler("cpu")``, or a skip pattern, to exercise the same code paths."""

from __future__ import annotations

import os

import torch

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.backend.precision import Precision


def _trainer(out_dir, **kwargs):
    torch.manual_seed(0)
    args = make_args(out_dir, per_device_train_batch_size=8, logging_steps=1, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())


class SkipsEverySecondStep(Precision):
    """As an fp16 scaler does on overflow: the optimizer step is skipped (here every second one)."""

    @property
    def step_was_skipped(self) -> bool:
        self.asked = getattr(self, "asked", 0) + 1
        return self.asked % 2 == 0


def test_a_skipped_step_does_not_step_the_scheduler(out_dir):
    trainer = _trainer(out_dir, max_steps=4, warmup_steps=0)
    trainer.precision.__class__ = SkipsEverySecondStep
    trainer.precision.can_skip_steps = True
    trainer.train()
    assert trainer.lr_scheduler.last_epoch == 2  # 4 optimizer steps, 2 of them skipped
    lrs = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    assert lrs[1] == lrs[2] and lrs[3] < lrs[2]  # the schedule stood still over the skipped step


def _with_scaler(trainer, scale):
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    trainer.precision._scaler, trainer.precision.can_skip_steps = scaler, True
    return scaler


def test_the_grad_scaler_state_is_saved_in_scaler_pt_and_restored(out_dir):
    first = _trainer(out_dir, max_steps=2, save_strategy="steps", save_steps=2)
    _with_scaler(first, 1024.0)
    first.train()
    assert os.path.isfile(os.path.join(out_dir, "checkpoint-2", "scaler.pt"))
    resumed = _trainer(out_dir, max_steps=4)
    scaler = _with_scaler(resumed, 2.0)
    resumed.train(resume_from_checkpoint=True)
    assert scaler.get_scale() == 1024.0


def test_without_a_scaler_no_scaler_pt_is_written(out_dir):
    _trainer(out_dir, max_steps=2, save_strategy="steps", save_steps=2).train()
    assert not os.path.exists(os.path.join(out_dir, "checkpoint-2", "scaler.pt"))


def test_trainers_with_different_precisions_train_in_one_process(tmp_path):
    """A notebook or a sweep builds Trainers one after another; each sets up its own precision."""
    from tests.common.models import RegressionDataset, RegressionModel
    from tests.conftest import make_args
    from trainwell import Trainer

    outputs = []
    for name, precision in (("fp32", {}), ("bf16", {"bf16": True}), ("again-fp32", {})):
        trainer = Trainer(model=RegressionModel(), args=make_args(str(tmp_path / name), max_steps=3, **precision),
                          train_dataset=RegressionDataset())
        outputs.append(trainer.train())
        assert trainer.precision.mode == ("bf16" if precision else "no")
    assert [o.global_step for o in outputs] == [3, 3, 3]


def test_under_bf16_overrides_see_float32_outputs_and_the_default_path_makes_no_copy(out_dir):
    """What the reference hands on under bf16 autocast (checked by running it on a CPU): float32 outputs to a
    compute_loss override, to compute_loss_func, to forward hooks and as predictions, before training and after.
    The default compute_loss path, whose outputs nobody sees, skips the float32 copy: its loss is float32 still."""
    from torch import nn

    from trainwell.backend.outputs import has_output_cast

    seen: list[tuple[str, torch.dtype]] = []

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(2, 3)

        def forward(self, input_x, labels=None):
            logits = self.linear(input_x.unsqueeze(-1).expand(-1, 2))
            seen.append(("inside", logits.dtype))
            return {"logits": logits, "loss": logits.float().pow(2).mean() if labels is not None else None}

    class Overrides(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(**inputs)
            seen.append(("override", outputs["logits"].dtype))
            return (outputs["loss"], outputs) if return_outputs else outputs["loss"]

    def loss_func(outputs, labels, num_items_in_batch=None):
        seen.append(("loss_func", outputs["logits"].dtype))
        return outputs["logits"].pow(2).mean()

    def run(cls, **kwargs):
        torch.manual_seed(0)
        args = make_args(out_dir, bf16=True, max_steps=2, per_device_train_batch_size=8)
        return cls(model=Model(), args=args, train_dataset=RegressionDataset(),
                   eval_dataset=RegressionDataset(length=16), **kwargs)

    for cls, kwargs in ((Overrides, {}), (Trainer, {"compute_loss_func": loss_func})):
        trainer = run(cls, **kwargs)
        trainer.evaluate()  # before training: the model is not prepared yet
        trainer.train()
        trainer.evaluate()
        assert {dtype for who, dtype in seen if who != "inside"} == {torch.float32}
        assert trainer.predict(RegressionDataset(length=16)).predictions.dtype == "float32"
        seen.clear()
    trainer = run(Trainer)
    hooked: list[torch.dtype] = []
    trainer.train()
    assert has_output_cast(trainer.model_wrapped) and trainer.precision.output_cast is not None
    losses = []
    trainer.precision.output_cast.unobserved(lambda: losses.append(trainer.model(torch.ones(4), torch.ones(4))))
    assert losses[0]["logits"].dtype == torch.bfloat16  # the cast skipped
    trainer.model.register_forward_hook(lambda module, args, output: hooked.append(output["logits"].dtype))
    trainer.precision.output_cast.unobserved(lambda: trainer.model(torch.ones(4), torch.ones(4)))
    assert hooked == [torch.float32]  # a forward hook sees the outputs: the cast stays
    plain = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    assert plain.forward.__func__ is Model.forward  # Accelerate still finds the original forward under ours


def test_fp16_on_a_cpu_trains_in_float32_as_the_reference_does_and_says_so_once(tmp_path, caplog):
    """32 of sentence-transformers' 45 training examples set fp16=True: on a CPU they train, in float32 (Accelerate
    runs no fp16 autocast or scaler there), exactly as without it, and one warning says fp16 does nothing."""
    from trainwell.backend import precision

    precision._say_fp16_does_nothing_on_a_cpu.cache_clear()
    with caplog.at_level("WARNING", logger="trainwell.backend.precision"):
        half = _trainer(str(tmp_path / "fp16"), max_steps=3, fp16=True)
        half.train()
        _trainer(str(tmp_path / "again"), max_steps=1, fp16=True).train()
    full = _trainer(str(tmp_path / "fp32"), max_steps=3)
    full.train()
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (half, full)]
    assert losses[0] == losses[1] and len(losses[0]) == 3
    assert all(torch.equal(a, b) for a, b in zip(half.model.state_dict().values(), full.model.state_dict().values()))
    said = [r.getMessage() for r in caplog.records if "does nothing on a CPU" in r.getMessage()]
    assert len(said) == 1 and "trains in float32" in said[0] and "bf16=True" in said[0]
