"""Subclasses that override the reference's hook methods are honoured by the loops."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer


def test_compute_loss_override(out_dir):
    calls = []

    class L1Trainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            loss = (outputs["logits"] - labels).abs().mean()
            calls.append(model.training)
            return (loss, outputs) if return_outputs else loss

    trainer = L1Trainer(model=RegressionModel(), args=make_args(out_dir, max_steps=3),
                        train_dataset=RegressionDataset())
    trainer.train()
    assert calls == [True] * 3
    metrics = trainer.evaluate(RegressionDataset(length=8))
    assert calls[-1] is False and "eval_loss" in metrics


def test_training_step_override(out_dir):
    seen = []

    class Counting(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            seen.append(inputs["input_x"].shape[0])
            return super().training_step(model, inputs, num_items_in_batch)

    trainer = Counting(model=RegressionModel(), args=make_args(out_dir, max_steps=2, gradient_accumulation_steps=2,
                                                               per_device_train_batch_size=4),
                       train_dataset=RegressionDataset())
    trainer.train()
    assert seen == [4, 4, 4, 4]


def test_prediction_step_and_evaluation_loop_overrides(out_dir):
    class Custom(Trainer):
        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            return loss, (logits * 0 + 7 if logits is not None else None), labels

    trainer = Custom(model=RegressionModel(), args=make_args(out_dir))
    out = trainer.predict(RegressionDataset(length=10))
    assert (out.predictions == 7).all()

    class LoopOverride(Trainer):
        def evaluation_loop(self, *args, **kwargs):
            out = super().evaluation_loop(*args, **kwargs)
            out.metrics["eval_custom"] = 1.0
            return out

    assert LoopOverride(model=RegressionModel(), args=make_args(out_dir)).evaluate(
        RegressionDataset(length=8))["eval_custom"] == 1.0


def test_create_optimizer_and_scheduler_overrides(out_dir):
    class Custom(Trainer):
        def create_optimizer(self):
            if self.optimizer is None:
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5)
            return self.optimizer

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer or self.optimizer, step_size=1, gamma=0.5)
            return self.lr_scheduler

    trainer = Custom(model=RegressionModel(), args=make_args(out_dir, max_steps=3, logging_steps=1),
                     train_dataset=RegressionDataset())
    trainer.train()
    lrs = [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h]
    assert lrs == [0.5, 0.25, 0.125]


def test_get_train_dataloader_override(out_dir):
    class Custom(Trainer):
        def get_train_dataloader(self):
            return DataLoader(self.train_dataset, batch_size=16)

    trainer = Custom(model=RegressionModel(), args=make_args(out_dir, num_train_epochs=1),
                     train_dataset=RegressionDataset(length=64))
    assert trainer.train().global_step == 4


def test_log_override_sees_every_log(out_dir):
    logged = []

    class Custom(Trainer):
        def log(self, logs, start_time=None):
            logged.append(dict(logs))
            super().log(logs, start_time)

    trainer = Custom(model=RegressionModel(), args=make_args(out_dir, logging_steps=4, max_steps=8),
                     train_dataset=RegressionDataset())
    trainer.train()
    assert [("loss" in entry) for entry in logged] == [True, True, False]
    assert "train_loss" in logged[-1]


def test_save_model_writes_safetensors_and_args(out_dir):
    import json
    import os

    from safetensors.torch import load_file

    trainer = Trainer(model=RegressionModel(a=1.5), args=make_args(out_dir))
    trainer.save_model()
    assert set(os.listdir(out_dir)) >= {"model.safetensors", "training_args.json"}
    assert load_file(os.path.join(out_dir, "model.safetensors"))["a"].item() == 1.5
    assert json.load(open(os.path.join(out_dir, "training_args.json")))["output_dir"] == out_dir
    trainer.save_state()
    assert os.path.isfile(os.path.join(out_dir, "trainer_state.json"))
    trainer.save_metrics("eval", {"eval_loss": 1.0})
    assert json.load(open(os.path.join(out_dir, "all_results.json"))) == {"eval_loss": 1.0}


def test_overrides_with_the_older_signatures_without_num_items_in_batch(tmp_path):
    """The reference's documented compute_loss example (no num_items_in_batch) and a training_step(model, inputs)
    override both work: the keyword reaches only the methods that take it."""
    calls = []

    class Old(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False):
            calls.append("compute_loss")
            return super().compute_loss(model, inputs, return_outputs=return_outputs)

        def training_step(self, model, inputs):
            calls.append("training_step")
            return super().training_step(model, inputs)

    args = make_args(str(tmp_path), max_steps=2, gradient_accumulation_steps=2, per_device_train_batch_size=4)
    Old(model=RegressionModel(), args=args, train_dataset=RegressionDataset()).train()
    assert calls.count("training_step") == 4 and calls.count("compute_loss") == 4


def test_get_optimizer_cls_and_kwargs_and_decay_names_overrides_build_the_optimizer_as_on_the_reference(tmp_path):
    """sentence-transformers overrides get_optimizer_cls_and_kwargs to hand the optimizer its loss module's
    parameters too (``optimizer_dict``; SoftmaxLoss's classifier lives there) and reads get_decay_parameter_names:
    the optimizer must come from those overrides, and the head must train as on the reference."""
    import pytest

    transformers = pytest.importorskip("transformers")
    import trainwell

    def run(lib):
        class LossWithWeights(lib.Trainer):
            def get_optimizer_cls_and_kwargs(self, args, model=None):
                cls, kwargs = super().get_optimizer_cls_and_kwargs(args, model)
                both = torch.nn.ModuleDict({"model": model, "head": self.head})
                decay = self.get_decay_parameter_names(both)
                kwargs["optimizer_dict"] = [
                    {"params": [p for n, p in both.named_parameters() if n in decay], "weight_decay": 0.1},
                    {"params": [p for n, p in both.named_parameters() if n not in decay], "weight_decay": 0.0}]
                return cls, kwargs

            def get_decay_parameter_names(self, model):
                return [n for n, _ in model.named_parameters() if not n.endswith(("b", "bias"))]  # not biases

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                outputs = model(input_x=inputs["input_x"])
                loss = ((self.head(outputs["logits"].unsqueeze(-1)).squeeze(-1) - inputs["labels"]) ** 2).mean()
                return (loss, outputs) if return_outputs else loss

        torch.manual_seed(0)
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), max_steps=4, report_to="none", use_cpu=True,
                                     save_strategy="no", learning_rate=0.1, weight_decay=0.5, disable_tqdm=True)
        trainer = LossWithWeights(model=RegressionModel(), train_dataset=RegressionDataset(), args=args)
        trainer.head = torch.nn.Linear(1, 1)
        trainer.train()
        return trainer, [p.detach().clone() for p in (*trainer.model.parameters(), *trainer.head.parameters())]

    (mine, my_weights), (_, their_weights) = run(trainwell), run(transformers)
    assert [g["weight_decay"] for g in mine.optimizer.param_groups] == [0.1, 0.0]
    assert len(mine.optimizer.param_groups[0]["params"]) == 2  # the model's a and the head's weight
    assert all(torch.equal(a, b) for a, b in zip(my_weights, their_weights, strict=True))
