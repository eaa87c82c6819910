"""End-to-end training behaviour of the Trainer on CPU: golden values, step arithmetic, metrics, outputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from tests.common.models import (
    CountingIterable,
    DataclassOutputModel,
    RegressionDataset,
    RegressionModel,
)
from tests.common.timing import hang_timeout
from tests.conftest import make_args
from trainwell import Trainer, TrainOutput
from trainwell.data.train_loader import TrainFeed


class ReferenceRegressionData(Dataset):
    """The regression data of the reference's own tests: global numpy seed, then normal draws."""

    def __init__(self, a=2.0, b=3.0, length=64, seed=42):
        np.random.seed(seed)
        self.x = np.random.normal(size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + np.random.normal(scale=0.1, size=(length,))).astype(np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_x": self.x[i], "labels": self.y[i]}


def test_golden_values_match_reference(out_dir):
    # Values printed by transformers 5.23's Trainer for the same model, data and defaults (lr 0.1, 3 epochs).
    args = make_args(out_dir, learning_rate=0.1)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=ReferenceRegressionData())
    result = trainer.train()
    assert isinstance(result, TrainOutput)
    assert result.global_step == 24
    assert trainer.model.a.item() == pytest.approx(0.7102535963058472, abs=1e-6)
    assert trainer.model.b.item() == pytest.approx(1.2327066659927368, abs=1e-6)
    assert result.training_loss == pytest.approx(5.870065689086914, rel=1e-6)
    eval_loss = trainer.evaluate(ReferenceRegressionData())["eval_loss"]
    assert eval_loss == pytest.approx(3.6655423641204834, rel=1e-5)


def test_train_metrics_names_and_log_history(out_dir):
    args = make_args(out_dir, learning_rate=0.1, logging_steps=5)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())
    result = trainer.train()
    metrics = result.metrics
    for key in ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos",
                "train_loss", "epoch"):
        assert key in metrics, key
    assert metrics["epoch"] == 3.0
    assert metrics["total_flos"] == 0  # a plain module has no num_parameters(): no estimate, as the reference
    step_logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in step_logs] == [5, 10, 15, 20]
    for h in step_logs:
        assert set(h) >= {"loss", "grad_norm", "learning_rate", "epoch", "step"}
        assert math.isfinite(h["grad_norm"])
    # The lr logged at step 5 is the one used for step 5: linear decay from 0.1 over 24 steps.
    assert step_logs[0]["learning_rate"] == pytest.approx(0.1 * (1 - 4 / 24))
    # train_loss is the mean of every step's loss, which the step logs sample.
    assert trainer.state.log_history[-1]["train_loss"] == pytest.approx(result.training_loss)


def test_max_steps_overrides_epochs_and_fractional_epochs(out_dir):
    data = RegressionDataset(length=64)
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=5), train_dataset=data)
    assert trainer.train().global_step == 5
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, num_train_epochs=1.5), train_dataset=data)
    result = trainer.train()
    assert result.global_step == 12  # ceil(1.5 × 8 updates per epoch)
    assert trainer.state.epoch == pytest.approx(1.5)


def test_ratio_logging_steps(out_dir):
    args = make_args(out_dir, logging_steps=0.25, max_steps=20)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=160))
    trainer.train()
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [5, 10, 15, 20]


def test_iterable_dataset_requires_max_steps(out_dir):
    with pytest.raises(ValueError, match="max_steps"):
        Trainer(model=RegressionModel(), args=make_args(out_dir), train_dataset=CountingIterable())
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=12),
                      train_dataset=CountingIterable(n=40))
    assert trainer.train().global_step == 12  # 5 batches per pass: the data is iterated again


@pytest.mark.parametrize("model_cls,kwargs", [
    (RegressionModel, {"as_tuple": True}),
    (RegressionModel, {}),
    (DataclassOutputModel, {}),
])
def test_output_shapes_dict_tuple_dataclass(out_dir, model_cls, kwargs):
    trainer = Trainer(model=model_cls(**kwargs), args=make_args(out_dir, learning_rate=0.1),
                      train_dataset=RegressionDataset())
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    pred = trainer.predict(RegressionDataset(length=16))
    assert pred.predictions.shape == (16,)
    assert pred.label_ids.shape == (16,)
    assert "test_loss" in pred.metrics


def test_model_without_loss_gives_clear_error(out_dir):
    class NoLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(1, 1)

        def forward(self, input_x, labels=None):
            return {"logits": self.lin(input_x[:, None])}

    trainer = Trainer(model=NoLoss(), args=make_args(out_dir, max_steps=1), train_dataset=RegressionDataset())
    with pytest.raises(ValueError, match="without a 'loss'"):
        trainer.train()


def test_compute_loss_func_receives_num_items(out_dir):
    seen = []

    def loss_func(outputs, labels, num_items_in_batch=None):
        seen.append(int(num_items_in_batch))
        return ((outputs["logits"] - labels) ** 2).sum() / num_items_in_batch

    args = make_args(out_dir, max_steps=2, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32),
                      compute_loss_func=loss_func)
    trainer.train()
    assert seen == [8, 8, 8, 8]  # the whole window's items, for each of its micro-batches


def test_label_names_from_forward_signature(out_dir):
    class TwoLabels(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))

        def forward(self, input_x, labels=None, labels_2=None):
            return {"loss": ((input_x * self.w - labels) ** 2).mean()}

    trainer = Trainer(model=TwoLabels(), args=make_args(out_dir))
    assert trainer.label_names == ["labels", "labels_2"]
    trainer = Trainer(model=TwoLabels(), args=make_args(out_dir, label_names=["labels"]))
    assert trainer.label_names == ["labels"]


def test_label_smoothing_on_plain_module(out_dir):
    from tests.common.models import ClassificationDataset, DropoutMLP

    # A plain module without a config: the reference raises AttributeError here.
    args = make_args(out_dir, label_smoothing_factor=0.1, max_steps=3)
    trainer = Trainer(model=DropoutMLP(p=0.0), args=args, train_dataset=ClassificationDataset())
    loss = trainer.train().training_loss
    assert math.isfinite(loss)
    # Smoothing raises the minimum achievable loss: compare with the model's own (unsmoothed) CE.
    batch = ClassificationDataset()[0:8]
    out = trainer.model(x=batch["x"])
    smoothed = trainer.compute_loss(trainer.model, {"x": batch["x"], "labels": batch["labels"]})
    plain = nn.functional.cross_entropy(out["logits"], batch["labels"])
    assert smoothed.item() != pytest.approx(plain.item())


def test_nan_loss_is_filtered_in_logs(out_dir):
    class SometimesNaN(RegressionModel):
        calls = 0

        def forward(self, input_x, labels=None):
            out = super().forward(input_x, labels)
            SometimesNaN.calls += 1
            if SometimesNaN.calls == 3:
                out["loss"] = out["loss"] * float("nan")
            return out

    args = make_args(out_dir, max_steps=4, logging_steps=4, max_grad_norm=0.0, learning_rate=0.0)
    trainer = Trainer(model=SometimesNaN(), args=args, train_dataset=RegressionDataset())
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    assert math.isfinite(trainer.state.log_history[0]["loss"])


def test_seed_makes_runs_repeatable(out_dir):
    from tests.common.models import ClassificationDataset, DropoutMLP

    def run():
        torch.manual_seed(123)  # the Trainer must reseed, whatever happened before
        trainer = Trainer(model=DropoutMLP(), args=make_args(out_dir, max_steps=6, seed=7),
                          train_dataset=ClassificationDataset())
        trainer.train()
        return [p.detach().clone() for p in trainer.model.parameters()]

    first, second = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_data_seed_changes_order_but_not_init(out_dir):
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, data_seed=3))
    trainer.train_dataset = RegressionDataset()
    loader = trainer.get_train_dataloader()
    sampler = TrainFeed.of(loader).sampler
    assert sampler.seed == 3
    assert len(list(loader)) == 8


def test_model_init_builds_fresh_model_each_train(out_dir):
    calls = []

    def model_init():
        calls.append(1)
        return RegressionModel()

    trainer = Trainer(model_init=model_init, args=make_args(out_dir, max_steps=2), train_dataset=RegressionDataset())
    trainer.train()
    trainer.train()
    assert len(calls) == 3
    with pytest.raises(ValueError, match="model_init"):
        Trainer(model=RegressionModel(), model_init=model_init, args=make_args(out_dir))
    with pytest.raises(RuntimeError, match="model"):
        Trainer(args=make_args(out_dir))


def test_include_num_input_tokens_seen(out_dir):
    from tests.common.models import TinyTokenLM, VariableLengthTokenDataset

    args = make_args(out_dir, include_num_input_tokens_seen=True, max_steps=4, logging_steps=2,
                     per_device_train_batch_size=4)
    trainer = Trainer(model=TinyTokenLM(), args=args, train_dataset=VariableLengthTokenDataset())
    result = trainer.train()
    assert result.metrics["num_input_tokens_seen"] == 4 * 4 * 10
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs[0]["num_input_tokens_seen"] == 2 * 4 * 10


def test_optimizers_tuple_and_optimizer_cls_and_kwargs(out_dir):
    model = RegressionModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    trainer = Trainer(model=model, args=make_args(out_dir, max_steps=3), train_dataset=RegressionDataset(),
                      optimizers=(opt, sched))
    trainer.train()
    assert trainer.lr_scheduler is sched
    assert trainer.state.log_history[-1]["train_loss"] > 0

    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=3),
                      train_dataset=RegressionDataset(),
                      optimizer_cls_and_kwargs=(torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}))
    trainer.train()
    assert isinstance(getattr(trainer.optimizer, "optimizer", trainer.optimizer), torch.optim.SGD)
    assert trainer.optimizer.param_groups[0]["momentum"] == 0.9
    with pytest.raises(RuntimeError):
        Trainer(model=model, args=make_args(out_dir), optimizers=(opt, None),
                optimizer_cls_and_kwargs=(torch.optim.SGD, {}))


def test_weight_decay_groups(out_dir):
    class WithNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)

        def forward(self, x, labels=None):
            return {"loss": self.norm(self.lin(x)).pow(2).mean()}

    trainer = Trainer(model=WithNorm(), args=make_args(out_dir, weight_decay=0.1))
    opt = trainer.create_optimizer()
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    assert decayed == {id(trainer.model.lin.weight)}


def test_report_to_none_means_no_reporting(out_dir):
    # The reference turns report_to=None into [None] and then fails; here it means "no trackers".
    args = make_args(out_dir, report_to=None)
    assert args.report_to == []
    Trainer(model=RegressionModel(), args=args)


def test_unsupported_argument_is_an_error_naming_it(out_dir):
    with pytest.raises(NotImplementedError, match=r"parallelism_config.cp_size=2 .*CUDA-only"):
        make_args(out_dir, parallelism_config={"cp_size": 2})
    with pytest.raises(NotImplementedError, match="debug='tpu_metrics_debug'.*underflow_overflow"):
        make_args(out_dir, debug="tpu_metrics_debug")


def test_log_level_sets_the_trainwell_logger(out_dir):
    import logging

    logger = logging.getLogger("trainwell")
    before = logger.level
    try:
        Trainer(model=RegressionModel(), args=make_args(out_dir, log_level="error"))
        assert logger.getEffectiveLevel() == logging.ERROR
        Trainer(model=RegressionModel(), args=make_args(out_dir, log_level="info"))
        assert logger.getEffectiveLevel() == logging.INFO
    finally:
        logger.setLevel(before)


def test_activation_checkpointing_calls_the_models_method(out_dir):
    class Checkpointable(RegressionModel):
        enabled_with = None

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            Checkpointable.enabled_with = gradient_checkpointing_kwargs

    args = make_args(out_dir, activation_checkpointing=True, activation_checkpointing_kwargs={"use_reentrant": False},
                     max_steps=1)
    Trainer(model=Checkpointable(), args=args, train_dataset=RegressionDataset()).train()
    assert Checkpointable.enabled_with == {"use_reentrant": False}
    with pytest.raises(AttributeError, match="activation_checkpointing"):
        Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset()).train()


def test_trainwell_never_imports_transformers(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from trainwell import Trainer, TrainingArguments, DataCollatorWithPadding\n"
        "from tests.common.models import RegressionDataset, RegressionModel\n"
        f"args = TrainingArguments(output_dir={str(tmp_path)!r}, max_steps=2, report_to='none', use_cpu=True)\n"
        "t = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())\n"
        "t.train(); t.evaluate(RegressionDataset(length=8)); t.save_model()\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    root = __import__("os").path.dirname(__import__("os").path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=hang_timeout(120))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_full_determinism_switches_torch_to_deterministic_algorithms(out_dir):
    try:
        Trainer(model=RegressionModel(), args=make_args(out_dir, full_determinism=True, max_steps=2),
                train_dataset=RegressionDataset()).train()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_dataloader_workers_give_the_same_run_as_the_main_process(out_dir):
    def final(**kwargs):
        args = make_args(out_dir, learning_rate=0.1, max_steps=10, **kwargs)
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())
        trainer.train()
        return trainer.model.a.item(), trainer.model.b.item()

    assert final(dataloader_num_workers=2, dataloader_persistent_workers=True,
                 dataloader_prefetch_factor=4) == final()
    for drop_last, steps in ((True, 7), (False, 8)):  # 60 samples in batches of 8
        args = make_args(out_dir, num_train_epochs=1, dataloader_drop_last=drop_last)
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=60))
        assert trainer.train().global_step == steps


def test_a_second_train_call_reuses_the_prepared_model(out_dir):
    """The optimizer and model prepared by the first train() carry on: the second call continues training them."""
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=2), train_dataset=RegressionDataset())
    trainer.train()
    wrapped = trainer.model_wrapped
    optimizer = trainer.optimizer
    trainer.args.max_steps = 4
    assert trainer.train().global_step == 4
    assert trainer.model_wrapped is wrapped and trainer.optimizer is optimizer


def test_a_model_wrapped_around_an_eval_mode_module_trains_in_train_mode(out_dir):
    # sentence-transformers builds its model around one that from_pretrained left in eval mode: the top reports
    # training=True while the inner module (its dropout) is off. The reference's steps call model.train().
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = RegressionModel()
            self.inner.eval()
            self.seen: list[bool] = []

        def forward(self, input_x, labels=None):
            self.seen.append(self.inner.training)
            return self.inner(input_x, labels)

    model = Wrapper()
    assert model.training and not model.inner.training
    trainer = Trainer(model=model, args=make_args(out_dir, max_steps=3, eval_strategy="steps", eval_steps=2),
                      train_dataset=RegressionDataset(length=32), eval_dataset=RegressionDataset(length=8))
    trainer.train()
    # steps 1-2 train, step 2's evaluation runs in eval mode, step 3 trains again, then the final evaluation
    assert model.seen[0] is True and model.seen[-1] is False and model.seen.count(True) >= 3
