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
