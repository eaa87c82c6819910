"""Every bad ``Trainer(...)`` input is caught before any work, naming the parameter, the value and the fix.

Two tables. ``ROWS``: inputs caught at construction, as (kwargs builder, exception or warning class, regex, the
``name=value`` text the message must contain). A builder gets a :class:`Kit` (a fresh model, an optimizer over
it, argument factories) and returns the ``Trainer`` keyword arguments, on top of ``model=kit.model`` and quiet
``args``. ``RUNTIME``: what only an evaluation can show (what ``compute_metrics`` returns, the metrics it lacks):
the run saves a checkpoint at step 2 and fails at its first evaluation (step 4); the checkpoint must be complete.
Then the inputs that look unusual but work (as they do with the reference), which must stay silent.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tests.common.models import ClassificationDataset, CountingIterable, DropoutMLP, RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer, TrainerCallback
from trainwell.checkpoint.resume import incomplete_reason
from trainwell.data.collators import DataCollatorWithPadding


class MyCallback(TrainerCallback):
    pass


class OnlyOnLog:
    """Duck-typed callback missing most events (the reference fails on its first event)."""

    def on_log(self, args, state, control, **kwargs):
        return None


class Kit:
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.model = RegressionModel()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.other_model = RegressionModel()
        self.foreign_opt = torch.optim.SGD(self.other_model.parameters(), lr=0.1)
        self.half_opt = torch.optim.SGD([self.model.a], lr=0.1)
        self.data = RegressionDataset(length=16)

    def args(self, **kwargs):
        return make_args(self.out_dir, **kwargs)


def _hf_args(kit):
    transformers = pytest.importorskip("transformers")
    return transformers.TrainingArguments(output_dir=kit.out_dir, report_to="none", use_cpu=True)


_EVAL = {"eval_strategy": "steps", "eval_steps": 2}
ROWS = [
    # --- args: TrainingArguments or None ---
    pytest.param(lambda k: {"args": {"output_dir": "out"}}, TypeError,
                 r"^args=\{'output_dir': 'out'\}: pass TrainingArguments, not a dict: "
                 r"args=TrainingArguments\(\*\*that_dict\)", "args={'output_dir': 'out'}", id="args-dict"),
    pytest.param(lambda k: {"args": "out"}, TypeError, r"^args='out': .*args=TrainingArguments\(output_dir='out'\)",
                 "args='out'", id="args-path"),
    pytest.param(lambda k: {"args": 42}, TypeError, r"^args=42: pass TrainingArguments, .*\(got int\)", "args=42",
                 id="args-int"),
    pytest.param(lambda k: {"args": _hf_args(k)}, TypeError,
                 r"^args=TrainingArguments\(.*: this is transformers' TrainingArguments: .*from trainwell import",
                 "args=TrainingArguments(", id="args-transformers"),
    # --- callbacks: a list of TrainerCallback instances or subclasses ---
    pytest.param(lambda k: {"callbacks": [42]}, TypeError,
                 r"^callbacks\[0\]=42: pass a TrainerCallback instance .* or a TrainerCallback subclass",
                 "callbacks[0]=42", id="callbacks-int-item"),
    pytest.param(lambda k: {"callbacks": [MyCallback(), "x"]}, TypeError,
                 r"^callbacks\[1\]='x': pass a TrainerCallback", "callbacks[1]='x'", id="callbacks-str-item"),
    pytest.param(lambda k: {"callbacks": MyCallback()}, TypeError,
                 r"^callbacks=<.*MyCallback object at .*>: pass a list: callbacks=\[MyCallback\(\)\]\.$",
                 "callbacks=<", id="callbacks-instance-not-list"),
    pytest.param(lambda k: {"callbacks": MyCallback}, TypeError,
                 r"^callbacks=<class .*MyCallback'>: pass a list: callbacks=\[MyCallback\]\.$", "callbacks=<class",
                 id="callbacks-class-not-list"),
    pytest.param(lambda k: {"callbacks": "wandb"}, TypeError, r"^callbacks='wandb': .*report_to='wandb'",
                 "callbacks='wandb'", id="callbacks-str"),
    pytest.param(lambda k: {"callbacks": 3}, TypeError, r"^callbacks=3: pass a list of TrainerCallback", "callbacks=3",
                 id="callbacks-int"),
    pytest.param(lambda k: {"callbacks": [OnlyOnLog()]}, TypeError,
                 r"^callbacks\[0\]=<.*OnlyOnLog object .*> has no on_init_end, .*derive it from TrainerCallback",
                 "callbacks[0]=<", id="callbacks-partial-duck"),
    # --- optimizers: (torch.optim.Optimizer or None, scheduler or None) ---
    pytest.param(lambda k: {"optimizers": ("adam", None)}, TypeError,
                 r"^optimizers\[0\]='adam': the optimizer must be a torch\.optim\.Optimizer or None; .*"
                 r"TrainingArguments\(optim=\.\.\.\), e\.g\. optim='adamw_torch'", "optimizers[0]='adam'",
                 id="optimizers-name"),
    pytest.param(lambda k: {"optimizers": k.opt}, TypeError,
                 r"^optimizers=SGD \(.*: pass a pair .* e\.g\. optimizers=\(optimizer, None\)", "optimizers=SGD (",
                 id="optimizers-not-a-pair"),
    pytest.param(lambda k: {"optimizers": (k.opt,)}, TypeError, r"^optimizers=\(SGD \(.*: pass a pair",
                 "optimizers=(SGD (", id="optimizers-one-tuple"),
    pytest.param(lambda k: {"optimizers": (None, None, None)}, TypeError,
                 r"^optimizers=\(None, None, None\): pass a pair", "optimizers=(None, None, None)",
                 id="optimizers-triple"),
    pytest.param(lambda k: {"optimizers": (torch.optim.AdamW, None)}, TypeError,
                 r"^optimizers\[0\]=<class 'torch\.optim\.adamw\.AdamW'>: .*pass an instance, "
                 r"AdamW\(model\.parameters\(\), lr=\.\.\.\), or .* optimizer_cls_and_kwargs=\(AdamW",
                 "optimizers[0]=<class 'torch.optim.adamw.AdamW'>", id="optimizers-class"),
    pytest.param(lambda k: {"optimizers": (k.opt, "cosine")}, TypeError,
                 r"^optimizers\[1\]='cosine': .*lr_scheduler_type='cosine'", "optimizers[1]='cosine'",
                 id="scheduler-name"),
    pytest.param(lambda k: {"optimizers": (k.foreign_opt, None)}, ValueError,
                 r"^optimizers\[0\]=SGD \(.* holds none of the model's 2 trainable parameters.*model\.parameters\(\)",
                 "optimizers[0]=SGD (", id="optimizer-of-another-model"),
    pytest.param(lambda k: {"optimizers": (k.half_opt, None)}, UserWarning,
                 r"^optimizers\[0\]=SGD \(.* does not hold 1 of the model's 2 trainable parameters \(1 values: b\)",
                 "optimizers[0]=SGD (", id="optimizer-missing-some"),
    pytest.param(lambda k: {"optimizers": (k.foreign_opt, torch.optim.lr_scheduler.LambdaLR(k.opt, lambda s: 1.0)),
                            "model": k.other_model}, UserWarning,
                 r"^optimizers\[1\]=<torch\.optim\.lr_scheduler\.LambdaLR .* steps another optimizer than "
                 r"optimizers\[0\]", "optimizers[1]=<torch.optim.lr_scheduler.LambdaLR", id="scheduler-of-another-opt"),
    pytest.param(lambda k: {"optimizers": (None, torch.optim.lr_scheduler.LambdaLR(k.opt, lambda s: 1.0))},
                 UserWarning, r"^optimizers\[1\]=<.*LambdaLR .* another optimizer than the optimizer the Trainer "
                 r"builds",
                 "optimizers[1]=<torch.optim.lr_scheduler.LambdaLR", id="scheduler-without-its-optimizer"),
    # --- model, model_init ---
    pytest.param(lambda k: {"model": "bert-base"}, TypeError,
                 r"^model='bert-base': pass a torch\.nn\.Module, not a name or path\. .*"
                 r"from_pretrained\('bert-base'\)", "model='bert-base'", id="model-name"),
    pytest.param(lambda k: {"model": RegressionModel}, TypeError,
                 r"^model=<class .*RegressionModel'>: pass an instance, not the class, e\.g\. model=RegressionModel",
                 "model=<class", id="model-class"),
    pytest.param(lambda k: {"model": 42}, TypeError, r"^model=42: pass a torch\.nn\.Module .*model_init", "model=42",
                 id="model-int"),
    pytest.param(lambda k: {"model": None, "model_init": 3}, TypeError,
                 r"^model_init=3: pass a function that returns a fresh torch\.nn\.Module", "model_init=3",
                 id="model_init-not-callable"),
    pytest.param(lambda k: {"model": None, "model_init": lambda: "bert-base"}, TypeError,
                 r"^model_init returned 'bert-base' \(str\): it must return a torch\.nn\.Module",
                 "returned 'bert-base'", id="model_init-returns-str"),
    # --- datasets ---
    pytest.param(lambda k: {"train_dataset": 5}, TypeError,
                 r"^train_dataset=5: pass a dataset: a torch Dataset or datasets\.Dataset .*\(got int\)",
                 "train_dataset=5", id="train_dataset-int"),
    pytest.param(lambda k: {"train_dataset": "data.csv"}, TypeError,
                 r"^train_dataset='data\.csv': pass a dataset, not a path .*load_dataset", "train_dataset='data.csv'",
                 id="train_dataset-path"),
    pytest.param(lambda k: {"train_dataset": RegressionDataset}, TypeError,
                 r"^train_dataset=<class .*>: pass an instance, not the class, e\.g\. RegressionDataset\(",
                 "train_dataset=<class", id="train_dataset-class"),
    pytest.param(lambda k: {"train_dataset": {"train": k.data, "test": k.data}}, TypeError,
                 r"^train_dataset=\{'train': .* is a dict of datasets .*train_dataset=dataset\['train'\]",
                 "train_dataset={'train': ", id="train_dataset-dict"),
    pytest.param(lambda k: {"eval_dataset": 5}, TypeError, r"^eval_dataset=5: pass a dataset", "eval_dataset=5",
                 id="eval_dataset-int"),
    pytest.param(lambda k: {"eval_dataset": {"a": k.data, "b": 7}}, TypeError,
                 r"^eval_dataset\['b'\]=7: pass a dataset", "eval_dataset['b']=7", id="eval_dataset-dict-item"),
    pytest.param(lambda k: {"train_dataset": len}, TypeError,
                 r"^train_dataset=<built-in function len>: .*this is a function: pass what it returns",
                 "train_dataset=<built-in function len>", id="train_dataset-function"),
    # --- functions ---
    pytest.param(lambda k: {"data_collator": 3}, TypeError, r"^data_collator=3: pass a function .* into a batch",
                 "data_collator=3", id="data_collator-int"),
    pytest.param(lambda k: {"data_collator": DataCollatorWithPadding}, TypeError,
                 r"^data_collator=<class .*DataCollatorWithPadding'>: pass an instance, not the class, e\.g\. "
                 r"data_collator=DataCollatorWithPadding\(tokenizer\)", "data_collator=<class",
                 id="data_collator-class"),
    pytest.param(lambda k: {"compute_metrics": "accuracy"}, TypeError,
                 r"^compute_metrics='accuracy': pass a function\(eval_pred\) that returns a dict of metric name -> "
                 r"number", "compute_metrics='accuracy'", id="compute_metrics-str"),
    pytest.param(lambda k: {"preprocess_logits_for_metrics": 3}, TypeError,
                 r"^preprocess_logits_for_metrics=3: pass a function\(logits, labels\)",
                 "preprocess_logits_for_metrics=3", id="preprocess_logits-int"),
    pytest.param(lambda k: {"compute_loss_func": "mse"}, TypeError,
                 r"^compute_loss_func='mse': pass a function\(outputs, labels, num_items_in_batch=None\)",
                 "compute_loss_func='mse'", id="compute_loss_func-str"),
    # --- metric_for_best_model that the evaluation cannot produce (no compute_metrics) ---
    pytest.param(lambda k: {"args": k.args(metric_for_best_model="accuracy", **_EVAL), "eval_dataset": k.data},
                 ValueError, r"^metric_for_best_model='accuracy': without compute_metrics the evaluation produces only "
                 r"eval_loss, .*'eval_accuracy' would be missing.*metric_for_best_model='loss'",
                 "metric_for_best_model='accuracy'", id="best-metric-unreachable"),
    pytest.param(lambda k: {"args": k.args(metric_for_best_model="loss", **_EVAL),
                            "eval_dataset": {"a": k.data, "b": k.data}}, ValueError,
                 r"^metric_for_best_model='loss': .* eval_a_loss, .* set metric_for_best_model='a_loss' or 'b_loss'",
                 "metric_for_best_model='loss'", id="best-metric-loss-with-eval-dict"),
    pytest.param(lambda k: {"args": k.args(metric_for_best_model="acc", prediction_loss_only=True, **_EVAL),
                            "eval_dataset": k.data, "compute_metrics": lambda p: {"acc": 1.0}}, ValueError,
                 r"^metric_for_best_model='acc': with prediction_loss_only=True the evaluation produces only eval_loss",
                 "metric_for_best_model='acc'", id="best-metric-with-prediction-loss-only"),
]


@pytest.fixture
def kit(tmp_path):
    return Kit(str(tmp_path / "out"))


@pytest.mark.parametrize("build, expected, pattern, shown", ROWS)
def test_bad_input_is_named_with_its_fix(build, expected, pattern, shown, kit):
    kwargs = {"model": kit.model, "args": kit.args(), **build(kit)}
    if issubclass(expected, Warning):
        with pytest.warns(expected, match=pattern) as record:
            assert isinstance(Trainer(**kwargs), Trainer)
        messages = [str(w.message) for w in record if issubclass(w.category, expected)]
    else:
        with pytest.raises(expected, match=pattern) as err:
            Trainer(**kwargs)
        messages = [str(err.value)]
    assert any(shown in m for m in messages), (shown, messages)
    if not issubclass(expected, Warning):
        assert not os.path.exists(kit.out_dir)  # refused before anything was created


def test_a_long_value_is_shortened(kit):
    with pytest.raises(TypeError) as err:
        Trainer(model=kit.model, args={f"key_{i}": i for i in range(100)})
    shown = str(err.value).split(": pass")[0]
    assert shown.startswith("args={'key_0': 0,") and shown.endswith("...") and len(shown) < 100


# --- what only an evaluation shows ---------------------------------------------------------------------------------
class Returns:
    """A compute_metrics returning a fixed value (its name appears in the messages)."""

    def __init__(self, value):
        self.value = value

    def __call__(self, eval_pred, compute_result=True):
        return self.value if compute_result else None


RUNTIME = [
    pytest.param(Returns(0.5), {}, TypeError,
                 r"^compute_metrics \(Returns\) returned 0\.5: it must return a dict of metric name -> number, e\.g\. "
                 r"\{'accuracy': 0\.91\} \(got float\)", "returned 0.5", id="float"),
    pytest.param(Returns(None), {}, TypeError, r"^compute_metrics \(Returns\) returned None \(a missing return\?\)",
                 "returned None", id="none"),
    pytest.param(Returns(({"acc": 1.0},)), {}, TypeError,
                 r"^compute_metrics \(Returns\) returned \(\{'acc': 1\.0\},\) \(a trailing comma after the dict\?\)",
                 "returned ({'acc': 1.0},)", id="tuple-of-dict"),
    pytest.param(Returns({0: 0.5}), {}, TypeError,
                 r"^compute_metrics \(Returns\) returned \{0: 0\.5\}: its keys must be metric names \(str\), but 0",
                 "returned {0: 0.5}", id="int-key"),
    pytest.param(Returns({"acc": "high"}), {"metric_for_best_model": "acc"}, TypeError,
                 r"^metric_for_best_model='acc': the evaluation's 'eval_acc' is 'high' \(str\), but the best model is "
                 r"chosen by comparing numbers", "metric_for_best_model='acc'", id="str-best-metric"),
    pytest.param(Returns({"acc": 1.0}), {"metric_for_best_model": "accuracy"}, KeyError,
                 r"metric_for_best_model='accuracy': the evaluation produced no 'eval_accuracy'; it produced "
                 r"epoch, eval_acc, eval_loss, eval_runtime", "metric_for_best_model='accuracy'", id="missing-metric"),
    pytest.param(Returns(None), {"batch_eval_metrics": True}, TypeError,
                 r"^compute_metrics \(Returns\) returned None", "returned None", id="batch-eval-none"),
    pytest.param(Returns({"acc": [1.0, "x"]}), {}, UserWarning,
                 r"^compute_metrics \(Returns\) returned 'acc': \[1\.0, 'x'\], which is not a number",
                 "'acc': [1.0, 'x']", id="str-value-warns"),
]


@pytest.mark.filterwarnings("ignore:compute_metrics .* which is not a number")  # str-best-metric warns, then fails
@pytest.mark.parametrize("compute_metrics, overrides, expected, pattern, shown", RUNTIME)
def test_bad_metrics_fail_at_the_first_evaluation_keeping_saved_checkpoints(compute_metrics, overrides, expected,
                                                                            pattern, shown, out_dir):
    args = make_args(out_dir, max_steps=4, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=4,
                     per_device_eval_batch_size=4, **overrides)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16),
                      eval_dataset=RegressionDataset(length=8), compute_metrics=compute_metrics)
    if issubclass(expected, Warning):
        with pytest.warns(expected, match=pattern) as record:
            trainer.train()
        assert any(shown in str(w.message) for w in record)
        return
    with pytest.raises(expected, match=pattern) as err:
        trainer.train()
    assert shown in str(err.value)
    assert trainer.state.global_step == 4
    assert incomplete_reason(os.path.join(out_dir, "checkpoint-2")) is None
    assert not os.path.exists(os.path.join(out_dir, "checkpoint-4"))  # the failing evaluation precedes the save


def test_bad_metrics_fail_a_plain_evaluate(out_dir):
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir), compute_metrics=Returns(0.5))
    with pytest.raises(TypeError, match=r"compute_metrics \(Returns\) returned 0\.5"):
        trainer.evaluate(RegressionDataset(length=8))


def test_a_non_number_metric_warns_once(out_dir):
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir), compute_metrics=Returns({"note": "ok"}))
    with pytest.warns(UserWarning, match="'note': 'ok', which is not a number"):
        trainer.evaluate(RegressionDataset(length=8))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert trainer.evaluate(RegressionDataset(length=8))["eval_note"] == "ok"  # kept, as the reference keeps it
    assert not [w for w in record if "not a number" in str(w.message)]


# --- losses the reference's logging_nan_inf_filter hides ----------------------------------------------------------
class NanLoss(RegressionModel):
    def forward(self, input_x, labels=None):
        out = super().forward(input_x, labels)
        out["loss"] = out["loss"] * float("nan")
        return out


class IgnoredLabels(ClassificationDataset):
    def __getitem__(self, i):
        return {"x": self.x[i], "labels": torch.tensor(-100)}


def _loud(record, phrase):
    return [str(w.message) for w in record if phrase in str(w.message)]


def test_a_window_of_non_finite_losses_warns_once(out_dir):
    args = make_args(out_dir, max_steps=6, logging_steps=2)
    trainer = Trainer(model=NanLoss(), args=args, train_dataset=RegressionDataset(length=16))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.train()
    found = _loud(record, "NaN or infinite on every")
    assert len(found) == 1 and "logging_nan_inf_filter" in found[0], found


def test_batches_whose_labels_are_all_ignored_warn(out_dir):
    args = make_args(out_dir, max_steps=2, logging_steps=1, gradient_accumulation_steps=2,
                     per_device_train_batch_size=4)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=IgnoredLabels(n=32))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer.train()
    found = _loud(record, "had every label -100")
    assert len(found) == 1 and found[0].startswith("2 of the 2 micro-batches since step 0"), found
    assert _loud(record, "NaN or infinite on every")  # their mean loss is NaN: the weights are lost too


# --- unusual inputs that work (with the reference too): silent ----------------------------------------------------
def _valid_cases():
    def numpy_metrics(p):
        return {"mae": np.float32(np.abs(p.predictions - p.label_ids).mean()), "n": np.int64(len(p.label_ids)),
                "t": torch.tensor(0.5), "per_class": np.array([0.1, 0.2])}

    def frozen_b(k):
        k.model.b.requires_grad_(False)
        return {"optimizers": (torch.optim.SGD([k.model.a], lr=0.1), None)}

    def extra_param(k):
        weight = nn.Parameter(torch.ones(()))
        return {"optimizers": (torch.optim.SGD([*k.model.parameters(), weight], lr=0.1), None)}

    def hf_dataset(k):
        datasets = pytest.importorskip("datasets")
        return {"train_dataset": datasets.Dataset.from_dict({"input_x": k.data.x.tolist(),
                                                              "labels": k.data.ys[0].tolist()})}

    def hf_callback(k):
        transformers = pytest.importorskip("transformers")
        return {"callbacks": [transformers.TrainerCallback(), transformers.TrainerCallback]}

    return [
        pytest.param(lambda k: {"callbacks": [MyCallback]}, id="callbacks-class"),
        pytest.param(lambda k: {"callbacks": (MyCallback(),)}, id="callbacks-tuple"),
        pytest.param(hf_callback, id="callbacks-transformers"),
        pytest.param(lambda k: {"optimizers": (k.opt, None)}, id="optimizers-opt-none"),
        pytest.param(lambda k: {"optimizers": [k.opt, torch.optim.lr_scheduler.LambdaLR(k.opt, lambda s: 1.0)]},
                     id="optimizers-list-with-scheduler"),
        pytest.param(frozen_b, id="optimizer-without-frozen-params"),
        pytest.param(extra_param, id="optimizer-with-extra-param"),
        pytest.param(lambda k: {"eval_dataset": {"a": k.data, "b": k.data},
                                "args": k.args(max_steps=2, metric_for_best_model="a_loss", **_EVAL)}, id="eval-dict"),
        pytest.param(lambda k: {"eval_dataset": k.data, "compute_metrics": numpy_metrics,
                                "args": k.args(max_steps=2, metric_for_best_model="mae", **_EVAL)},
                     id="numpy-metrics"),
        pytest.param(lambda k: {"eval_dataset": k.data, "args": k.args(max_steps=2, metric_for_best_model="eval_loss",
                                                                       **_EVAL)}, id="best-metric-loss"),
        pytest.param(lambda k: {"train_dataset": [k.data[i] for i in range(8)]}, id="list-of-samples"),
        pytest.param(lambda k: {"train_dataset": CountingIterable(n=16)}, id="iterable-dataset"),
        pytest.param(hf_dataset, id="datasets-Dataset"),
        pytest.param(lambda k: {"model": None, "model_init": lambda: RegressionModel()}, id="model_init"),
        pytest.param(lambda k: {"data_collator": lambda features: {
            "input_x": torch.tensor([f["input_x"] for f in features]),
            "labels": torch.tensor([f["labels"] for f in features])}}, id="collator-lambda"),
    ]


@pytest.mark.parametrize("build", _valid_cases())
def test_unusual_valid_inputs_work_silently(build, kit):
    kwargs = {"model": kit.model, "args": kit.args(max_steps=2), "train_dataset": kit.data, **build(kit)}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=UserWarning, module=r"trainwell\..*")
        warnings.filterwarnings("error", message=r".*(optimizers|callbacks|compute_metrics|metric_for_best_model)")
        trainer = Trainer(**kwargs)
        trainer.train()
    assert trainer.state.global_step == 2
    if trainer.args.metric_for_best_model:  # the evaluation produced it, as a number
        assert trainer.state.best_metric is not None


def test_an_optimizer_over_the_same_model_is_accepted_again(out_dir):
    model = RegressionModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):  # a second Trainer over the same model and optimizer (as in notebooks)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", category=UserWarning, module=r"trainwell\..*")
            Trainer(model=model, args=make_args(out_dir, max_steps=1), train_dataset=RegressionDataset(length=8),
                    optimizers=(opt, None)).train()
