"""Behaviours of the Trainer that scripts and libraries observe, each as the reference has it (issue 23, item 3):
the ``set_initial_training_values`` tuple, ``torch_empty_cache_steps`` kinds, how ``model_init`` is called,
``Trainer.log`` adding ``epoch`` to the caller's dict, the order of ``evaluate()``'s metrics and what
``save_state()`` writes. Each test runs the reference too when ``transformers`` is installed, and pins the
reference's observed values otherwise.
"""

from __future__ import annotations

import functools
import importlib
import json
import os

import pytest

import trainwell
from tests.common.models import RegressionDataset, RegressionModel


def _modules():
    """trainwell, then the reference when it is installed."""
    try:
        import transformers
    except ImportError:
        return [trainwell]
    return [trainwell, transformers]


def _args(module, out, **kwargs):
    defaults = dict(report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no")
    return module.TrainingArguments(out, **{**defaults, **kwargs})


def _trainer(module, out, model=None, **kwargs):
    extra = {k: kwargs.pop(k) for k in ("compute_metrics", "callbacks", "eval_dataset") if k in kwargs}
    return module.Trainer(model=model if model is not None else RegressionModel(), args=_args(module, out, **kwargs),
                          train_dataset=RegressionDataset(length=40), **extra)


def _mae(prediction):
    return {"mae": float(abs(prediction.predictions - prediction.label_ids).mean()), "eval_first": 1.0}


# --- set_initial_training_values ----------------------------------------------------------------------------------

# (num_train_epochs, num_update_steps_per_epoch, num_examples, num_train_samples, total_train_batch_size,
#  steps_in_epoch, max_steps), observed on transformers 5.x for 40 samples in batches of 8
PLANS = {
    "epochs": ({"num_train_epochs": 2, "gradient_accumulation_steps": 2}, (2, 3, 40, 80, 16, 5, 6)),
    "max_steps": ({"max_steps": 7}, (2, 5, 40, 56, 8, 5, 7)),
}


@pytest.mark.parametrize("name", PLANS)
def test_set_initial_training_values_unpacks_and_indexes_as_the_reference(tmp_path, name):
    kwargs, expected = PLANS[name]
    for module in _modules():
        trainer = _trainer(module, str(tmp_path / module.__name__), per_device_train_batch_size=8, **kwargs)
        values = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())
        assert tuple(values) == expected and len(values) == 7, module.__name__
        assert values[5] == expected[5] and values[-1] == expected[6] and tuple(values[1:3]) == expected[1:3]


# --- torch_empty_cache_steps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1.0, 2.5, 0, -1])
def test_torch_empty_cache_steps_refuses_what_the_reference_refuses(tmp_path, value):
    for module in _modules():
        with pytest.raises(ValueError, match="torch_empty_cache_steps"):
            module.TrainingArguments(str(tmp_path), torch_empty_cache_steps=value, report_to="none")
    assert trainwell.TrainingArguments(str(tmp_path), torch_empty_cache_steps=3).torch_empty_cache_steps == 3


# --- model_init -----------------------------------------------------------------------------------------------------


def test_model_init_with_more_than_one_parameter_is_the_reference_error(tmp_path):
    built = []

    def two(trial, extra):  # never called: neither Trainer guesses what to pass
        built.append((trial, extra))
        return RegressionModel()

    for module in _modules():
        for model_init in (RegressionModel, two, functools.partial(RegressionModel, 1.0)):
            with pytest.raises(RuntimeError, match="model_init should have 0 or 1 argument"):
                module.Trainer(model_init=model_init, args=_args(module, str(tmp_path)))
    assert built == []


def test_model_init_gets_the_trial_only_when_it_takes_one_parameter(tmp_path):
    seen = []

    def one(trial):
        seen.append(trial)
        return RegressionModel()

    for module in _modules():
        seen.clear()
        args = _args(module, str(tmp_path / module.__name__))
        module.Trainer(model_init=one, args=args)
        # a partial that binds all but nothing, or all: called without the trial
        bound = module.Trainer(model_init=functools.partial(RegressionModel, 1.0, 2.0, False, False), args=args)
        keywords = module.Trainer(model_init=functools.partial(RegressionModel, a=1.0, b=2.0, double_output=False,
                                                               as_tuple=False), args=args)
        assert seen == [None] and bound.model.a.item() == 1.0 and keywords.model.b.item() == 2.0, module.__name__


def test_model_init_argument_count_is_the_reference_count():
    from trainwell.wiring import number_of_arguments

    def f(a, b=1, *args, c, **kwargs):
        return None

    cases = [lambda: None, lambda t: None, f, RegressionModel, functools.partial(f, 1), functools.partial(f, 1, c=2),
             functools.partial(RegressionModel, a=1.0)]
    expected = [0, 1, 5, 4, 4, 3, 3]  # observed with transformers.trainer_utils.number_of_arguments
    assert [number_of_arguments(c) for c in cases] == expected
    if len(_modules()) > 1:
        from transformers.trainer_utils import number_of_arguments as reference

        assert [reference(c) for c in cases] == expected


# --- Trainer.log and the metrics dicts ------------------------------------------------------------------------------


def test_log_adds_epoch_to_the_callers_dict(tmp_path):
    for module in _modules():
        trainer = _trainer(module, str(tmp_path / module.__name__), max_steps=3)
        before = {"custom": 1.0}
        trainer.log(before)  # before training: the state's epoch is 0
        trainer.train()
        after = {"custom": 2.0}
        trainer.log(after)
        assert before == {"custom": 1.0, "epoch": 0} and after == {"custom": 2.0, "epoch": 0.6}, module.__name__
        assert trainer.state.log_history[-1] == {"custom": 2.0, "epoch": 0.6, "step": 3}


class _EvalSeen:
    """Mixed into each module's TrainerCallback: records the metrics on_evaluate receives."""

    def __init__(self):
        self.metrics = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.append(dict(metrics))


def test_evaluate_returns_and_hands_on_the_logged_metrics_in_the_reference_order(tmp_path):
    orders = []
    for module in _modules():
        seen = type("Seen", (_EvalSeen, module.TrainerCallback), {})()
        trainer = _trainer(module, str(tmp_path / module.__name__), max_steps=2, eval_dataset=RegressionDataset(16),
                           compute_metrics=_mae, callbacks=[seen])
        trainer.train()
        metrics = trainer.evaluate()
        assert metrics["epoch"] == seen.metrics[-1]["epoch"] == trainer.state.epoch, module.__name__
        orders.append(list(metrics))
    # keys compute_metrics prefixed itself first, then the loss, then the others prefixed, then speed and epoch
    assert orders[0] == ["eval_first", "eval_loss", "eval_mae", "eval_runtime", "eval_samples_per_second",
                         "eval_steps_per_second", "epoch"]
    assert all(order == orders[0] for order in orders)


def _qa_trainer_class(module):
    """The shape of the reference example scripts' QuestionAnsweringTrainer.evaluate: log its own metrics
    dict, fire on_evaluate and return that dict."""

    class QuestionAnsweringLike(module.Trainer):
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            output = self.evaluation_loop(self.get_eval_dataloader(eval_dataset), "Evaluation",
                                          metric_key_prefix=metric_key_prefix)
            metrics = {f"{metric_key_prefix}_exact_match": 50.0, **output.metrics}
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return QuestionAnsweringLike


def test_a_subclass_that_logs_its_own_metrics_returns_and_saves_the_epoch(tmp_path):
    for module in _modules():
        out = str(tmp_path / module.__name__)
        trainer = _qa_trainer_class(module)(model=RegressionModel(), args=_args(module, out, max_steps=2),
                                            train_dataset=RegressionDataset(length=40),
                                            eval_dataset=RegressionDataset(length=8))
        trainer.train()
        metrics = trainer.evaluate()
        trainer.save_metrics("eval", metrics)
        with open(os.path.join(out, "eval_results.json"), encoding="utf-8") as fh:
            saved = json.load(fh)
        assert metrics["epoch"] == saved["epoch"] == 0.4 and saved["eval_exact_match"] == 50.0, module.__name__


# --- save_state -------------------------------------------------------------------------------------------------------


def _counter_class(module):
    exportable = importlib.import_module(f"{module.__name__}.trainer_callback").ExportableState

    class Counter(module.TrainerCallback, exportable):
        def __init__(self, steps=0):
            self.steps = steps

        def on_step_end(self, args, state, control, **kwargs):
            self.steps += 1

        def state(self):
            return {"args": {"steps": self.steps}, "attributes": {}}

    return Counter


@pytest.mark.parametrize("saves", [False, True])
def test_save_state_writes_the_callback_states_as_they_are(tmp_path, saves):
    written = []
    for module in _modules():
        out = str(tmp_path / module.__name__)
        kwargs = {"save_strategy": "steps", "save_steps": 3} if saves else {}
        counter = _counter_class(module)()
        trainer = _trainer(module, out, max_steps=4, callbacks=[counter], **kwargs)
        trainer.train()
        counter.steps = 99  # changed since it was recorded: save_state() does not record it again
        trainer.save_state()
        with open(os.path.join(out, "trainer_state.json"), encoding="utf-8") as fh:
            written.append(json.load(fh)["stateful_callbacks"])
    # Recorded when training began, or at the last checkpoint (the final step 4, while should_save was set).
    control = {"should_epoch_stop": False, "should_evaluate": False, "should_log": False, "should_save": saves,
               "should_training_stop": saves}
    assert written[0] == {"Counter": {"args": {"steps": 4 if saves else 0}, "attributes": {}},
                          "TrainerControl": {"args": control, "attributes": {}}}
    assert all(w == written[0] for w in written)
