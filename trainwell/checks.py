"""Checking what the Trainer is given to its constructor.

Owns the checks that must fail before any work, each error naming the parameter, its value (shortened) and the
fix: ``args`` and ``optimizers`` (read first), the callables, the datasets, the callbacks, an optimizer that holds
none of the model's parameters, a ``metric_for_best_model`` the evaluation cannot produce. ``trainwell.wiring``
builds the parts; this module only refuses or warns. What the loop checks at each evaluation (a
``compute_metrics`` function or result that does not fit) is ``trainwell.loop.metric_checks``'s, and so is checking
``compute_metrics`` whenever it is set.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from trainwell.data import loaders
from trainwell.loop.plan import require_max_steps
from trainwell.utils.errors import short_repr


def check_early_inputs(args: Any, optimizers: Any) -> None:
    """What ``Trainer.__init__`` reads before any other check: ``args`` and the ``optimizers`` pair it unpacks."""
    check_args(args)
    check_optimizers(optimizers)


def check_args(args: Any) -> None:
    """``args`` is a (trainwell) TrainingArguments, or None for the defaults."""
    from trainwell.training_args import TrainingArguments

    if args is None or isinstance(args, TrainingArguments):
        return
    shown = f"args={short_repr(args)}"
    if isinstance(args, Mapping):
        fix = "pass TrainingArguments, not a dict: args=TrainingArguments(**that_dict)"
    elif type(args).__module__.split(".")[0] == "transformers":
        fix = ("this is transformers' TrainingArguments: build trainwell's with the same arguments "
               "(from trainwell import TrainingArguments)")
    elif isinstance(args, (str, os.PathLike)):
        fix = f"pass TrainingArguments, not a path: args=TrainingArguments(output_dir={str(args)!r})"
    else:
        fix = "pass TrainingArguments, e.g. args=TrainingArguments(output_dir='out'), or None for the defaults"
    raise TypeError(f"{shown}: {fix} (got {type(args).__name__}).")


def check_optimizers(optimizers: Any) -> None:
    """``optimizers`` is a pair (optimizer or None, scheduler or None)."""
    if isinstance(optimizers, (tuple, list)) and len(optimizers) == 2:
        check_optimizer(optimizers[0])
        check_scheduler(optimizers[1])
        return
    example = "(optimizer, None)" if _is_optimizer(optimizers) else "(optimizer, scheduler)"
    raise TypeError(
        f"optimizers={short_repr(optimizers)}: pass a pair (a torch.optim.Optimizer or None, a learning-rate "
        f"scheduler or None), e.g. optimizers={example}; leave it unset to build both from TrainingArguments."
    )


def _is_optimizer(value: Any) -> bool:
    """A torch optimizer, or any object with ``step()`` and ``param_groups`` (all the reference uses)."""
    return not isinstance(value, type) and callable(getattr(value, "step", None)) and hasattr(value, "param_groups")


def check_optimizer(optimizer: Any) -> None:
    if optimizer is None or _is_optimizer(optimizer):
        return
    shown = f"optimizers[0]={short_repr(optimizer)}"
    if isinstance(optimizer, str):
        fix = ("to choose an optimizer by name, leave optimizers unset and set TrainingArguments(optim=...), e.g. "
               f"optim={_closest(optimizer, 'OptimizerNames', 'adamw_torch')!r}")
    elif isinstance(optimizer, type):
        name = optimizer.__name__
        fix = (f"pass an instance, {name}(model.parameters(), lr=...), or the class and its arguments as "
               f"optimizer_cls_and_kwargs=({name}, {{'lr': ...}})")
    else:
        fix = "pass a torch.optim.Optimizer built from model.parameters(), or None"
    raise TypeError(f"{shown}: the optimizer must be a torch.optim.Optimizer or None; {fix}.")


def check_scheduler(scheduler: Any) -> None:
    if scheduler is None or (not isinstance(scheduler, type) and callable(getattr(scheduler, "step", None))):
        return
    shown = f"optimizers[1]={short_repr(scheduler)}"
    if isinstance(scheduler, str):
        fix = ("to choose a schedule by name, leave it None and set TrainingArguments(lr_scheduler_type=...), e.g. "
               f"lr_scheduler_type={_closest(scheduler, 'SchedulerType', 'linear')!r}")
    elif isinstance(scheduler, type):
        fix = f"pass an instance built on the optimizer, e.g. {scheduler.__name__}(optimizer, ...)"
    else:
        fix = "pass a torch.optim.lr_scheduler scheduler built on optimizers[0], or None"
    raise TypeError(f"{shown}: the scheduler must be a learning-rate scheduler (with step()) or None; {fix}.")


def _closest(name: str, enum: str, default: str) -> str:
    """``default``, or the first name of ``trainwell.outputs.<enum>`` that starts with ``name``."""
    from trainwell import outputs

    names = [default] + [member.value for member in getattr(outputs, enum)]
    return next((valid for valid in names if valid.startswith(name.lower())), default)


def check_trainer_arguments(trainer: Any) -> None:
    """Constructor arguments that cannot work together: an error naming the fix, before any work."""
    args = trainer.args
    check_optimizer(trainer.optimizer)
    check_scheduler(trainer.lr_scheduler)
    if trainer.optimizer_cls_and_kwargs is not None and trainer.optimizer is not None:
        raise RuntimeError("Pass either optimizers or optimizer_cls_and_kwargs to the Trainer, not both.")
    if trainer.model_init is not None and (trainer.optimizer is not None or trainer.lr_scheduler is not None):
        raise RuntimeError(
            "optimizers cannot be combined with model_init: the optimizer must be built for each fresh model. "
            "Override create_optimizer_and_scheduler instead."
        )
    _check_callables(trainer)
    _check_datasets(trainer.train_dataset, trainer.eval_dataset)
    strategy = str(args.eval_strategy)  # an IntervalStrategy member: str() is its value
    if strategy != "no" and trainer.eval_dataset is None:
        raise ValueError(
            f"eval_strategy={strategy!r} needs an eval_dataset: pass eval_dataset to the Trainer, or set "
            "eval_strategy='no'."
        )
    if (args.save_strategy == "best" or args.load_best_model_at_end) and args.metric_for_best_model is None:
        raise ValueError(
            "save_strategy='best' and load_best_model_at_end need metric_for_best_model: name the metric to "
            "compare (e.g. metric_for_best_model='loss')."
        )
    if strategy != "no":
        _check_best_metric_reachable(trainer)
    _check_optimizer_holds_model(trainer)
    if trainer.train_dataset is not None:
        require_max_steps(loaders.has_length(trainer.train_dataset), args.max_steps)


# What each function argument of the Trainer must be (compute_metrics is checked where it is set).
_FUNCTIONS = {
    "data_collator": "a function (or an object with __call__) that turns a list of samples into a batch, e.g. "
                     "DataCollatorWithPadding(tokenizer), or None for the default",
    "compute_loss_func": "a function(outputs, labels, num_items_in_batch=None) that returns the loss, or None",
    "preprocess_logits_for_metrics": "a function(logits, labels) that returns what compute_metrics should see "
                                     "(e.g. logits.argmax(-1)), or None",
}


def _check_callables(trainer: Any) -> None:
    for name, accepts in _FUNCTIONS.items():
        value = getattr(trainer, name)
        if value is None:
            continue
        if not callable(value):
            raise TypeError(f"{name}={short_repr(value)}: pass {accepts} (got {type(value).__name__}).")
        if isinstance(value, type) and "Collator" in value.__name__:  # the class called on a batch makes no batch
            raise TypeError(f"{name}={short_repr(value)}: pass an instance, not the class, e.g. "
                            f"{name}={value.__name__}(tokenizer).")


def dataset_problem(dataset: Any) -> str | None:
    """Why ``dataset`` cannot be a dataset, as the fix to name (None: it can: it has ``__getitem__`` or
    ``__iter__``, as a torch or ``datasets`` dataset, an IterableDataset or a list of samples has)."""
    if isinstance(dataset, (str, bytes, os.PathLike)):
        return ("pass a dataset, not a path or a string: load it first, e.g. "
                "datasets.load_dataset('csv', data_files=path)['train']")
    if isinstance(dataset, type):
        return f"pass an instance, not the class, e.g. {dataset.__name__}(...)"
    kind = type(dataset)
    if hasattr(kind, "__getitem__") or hasattr(kind, "__iter__"):
        return None
    called = " (this is a function: pass what it returns)" if callable(dataset) else ""
    return ("pass a dataset: a torch Dataset or datasets.Dataset (with __len__ and __getitem__), an "
            f"IterableDataset, or a list of samples{called}")


def _check_datasets(train_dataset: Any, eval_dataset: Any) -> None:
    named = [("train_dataset", train_dataset)]
    if isinstance(eval_dataset, Mapping):  # several evaluation sets, each evaluated under its own name
        named += [(f"eval_dataset[{key!r}]", data) for key, data in eval_dataset.items()]
    else:
        named.append(("eval_dataset", eval_dataset))
    for name, dataset in named:
        problem = None if dataset is None else dataset_problem(dataset)
        if problem:
            raise TypeError(f"{name}={short_repr(dataset)}: {problem} (got {type(dataset).__name__}).")
    if isinstance(train_dataset, Mapping) and any(isinstance(key, str) for key in train_dataset):
        first = next(key for key in train_dataset if isinstance(key, str))
        raise TypeError(
            f"train_dataset={short_repr(train_dataset)} is a dict of datasets (keys {sorted(map(str, train_dataset))}"
            f"): pass one of them, e.g. train_dataset=dataset[{first!r}]. Only eval_dataset takes a dict."
        )


def _uses_default_evaluation(trainer: Any) -> bool:
    """Whether the evaluation is trainwell's own (a subclass's override may produce any metric)."""
    hooks = ("evaluate", "evaluation_loop", "_evaluate", "_determine_best_metric")
    return all(getattr(getattr(type(trainer), h, None), "__module__", "").startswith("trainwell.") for h in hooks)


def _check_best_metric_reachable(trainer: Any) -> None:
    """Without compute_metrics the evaluation produces only its loss and speed metrics: another best metric would
    fail at the first evaluation, after training up to it."""
    from trainwell.events.monitor import metric_key

    name, loss_only = trainer.args.metric_for_best_model, trainer.args.prediction_loss_only
    if not name or (trainer.compute_metrics is not None and not loss_only) or not _uses_default_evaluation(trainer):
        return
    evals = trainer.eval_dataset
    prefixes = [f"eval_{key}" for key in evals] if isinstance(evals, Mapping) else ["eval"]
    produced = [f"{p}_{m}" for p in prefixes for m in ("loss", "runtime", "samples_per_second", "steps_per_second")]
    key = metric_key(trainer.args)
    if key in produced or "_mem_" in key:
        return
    loss_names = " or ".join(repr(m[len("eval_"):]) for m in produced if m.endswith("_loss"))
    why = "without compute_metrics" if trainer.compute_metrics is None else "with prediction_loss_only=True"
    raise ValueError(
        f"metric_for_best_model={name!r}: {why} the evaluation produces only "
        f"{', '.join(produced)}, so {key!r} would be missing at the first evaluation. Pass compute_metrics=a "
        f"function returning {{{key[len('eval_'):]!r}: ...}}, or set metric_for_best_model={loss_names}."
    )


def _check_optimizer_holds_model(trainer: Any) -> None:
    """An optimizer given in ``optimizers`` must update the model's weights (checked against the model given: a
    DeepSpeed or FSDP wrapper replaces the parameters later, together with the optimizer's)."""
    optimizer, model = trainer.optimizer, trainer.model
    _check_scheduler_follows(optimizer, trainer.lr_scheduler)
    if optimizer is None or trainer.model_init is not None:
        return
    try:
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    except (AttributeError, KeyError, TypeError):  # an optimizer-like object without torch's param_groups
        return
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [(n, p) for n, p in trainable if id(p) not in held]
    if not missing:
        return
    shown = f"optimizers[0]={short_repr(optimizer, 60)}"
    if len(missing) == len(trainable):
        raise ValueError(
            f"{shown} holds none of the model's {len(trainable)} trainable parameters, so training would never "
            "change the weights (was it built for another model, or a copy?). Create it from this model: "
            "torch.optim.AdamW(model.parameters(), lr=...), or leave optimizers unset."
        )
    names = ", ".join(n for n, _ in missing[:3]) + (", ..." if len(missing) > 3 else "")
    warnings.warn(
        f"{shown} does not hold {len(missing)} of the model's {len(trainable)} trainable parameters "
        f"({sum(p.numel() for _, p in missing):,} values: {names}); they will never change. Build the optimizer "
        "from model.parameters(), or freeze those (requires_grad=False) if that is the intent.",
        UserWarning, stacklevel=4,  # the user's Trainer(...)
    )


def _check_scheduler_follows(optimizer: Any, scheduler: Any) -> None:
    driven = getattr(scheduler, "optimizer", None)
    if driven is None or driven is optimizer:
        return
    which = ("the optimizer the Trainer builds (optimizers[0] is None)" if optimizer is None
             else f"optimizers[0]={short_repr(optimizer, 40)}")
    warnings.warn(
        f"optimizers[1]={short_repr(scheduler, 60)} steps another optimizer than {which}, so its schedule never "
        "changes the learning rate used. Pass the pair it was built on: optimizers=(optimizer, scheduler).",
        UserWarning, stacklevel=5,  # the user's Trainer(...)
    )


def checked_callbacks(callbacks: Any) -> list:
    """``callbacks`` as a list, each a TrainerCallback instance or subclass (or an object with every event)."""
    from trainwell.events.callback import TrainerCallback

    if callbacks is None:
        return []
    shown = f"callbacks={short_repr(callbacks)}"
    if issubclass(callbacks if isinstance(callbacks, type) else type(callbacks), TrainerCallback):
        name = callbacks.__name__ if isinstance(callbacks, type) else f"{type(callbacks).__name__}()"
        raise TypeError(f"{shown}: pass a list: callbacks=[{name}].")
    if isinstance(callbacks, (str, bytes)):
        raise TypeError(f"{shown}: pass a list of TrainerCallback instances or classes; to report to a tracker, "
                        f"set TrainingArguments(report_to={callbacks!r}).")
    if isinstance(callbacks, Mapping) or not isinstance(callbacks, Iterable):
        raise TypeError(f"{shown}: pass a list of TrainerCallback instances or classes, e.g. "
                        "callbacks=[EarlyStoppingCallback(early_stopping_patience=3)].")
    callbacks = list(callbacks)
    for index, item in enumerate(callbacks):
        _check_callback(f"callbacks[{index}]", item)
    return callbacks


def _check_callback(name: str, item: Any) -> None:
    from trainwell.events.callback import TrainerCallback

    cls = item if isinstance(item, type) else type(item)
    if issubclass(cls, TrainerCallback):
        return
    events = [name for name in vars(TrainerCallback) if name.startswith("on_")]  # the Trainer calls them all
    missing = [event for event in events if not callable(getattr(item, event, None))]
    if not missing:  # duck-typed: transformers' TrainerCallback, or a class with every event
        return
    if len(missing) < len(events):
        raise TypeError(
            f"{name}={short_repr(item)} has no {', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}: "
            "derive it from TrainerCallback (whose no-op events fill in the ones it does not define)."
        )
    raise TypeError(
        f"{name}={short_repr(item)}: pass a TrainerCallback instance (e.g. EarlyStoppingCallback("
        "early_stopping_patience=3)) or a TrainerCallback subclass, which the Trainer instantiates "
        f"(got {cls.__name__})."
    )
