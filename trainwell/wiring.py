"""Building the Trainer's parts from its constructor arguments, and checking those arguments.

Owns what ``Trainer.__init__`` (and a ``model_init`` run of ``train()``) decides once: the model (given, or
built by ``model_init``, placed on the device), :class:`ModelInfo` (what the model's ``forward`` takes and how
its loss is normalized, read once), the default collator, the default callbacks (flow, trackers, progress,
preemption saves), and the checks of the constructor's arguments that must fail before any work. The
Trainer keeps the results; nothing here runs during training.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainwell.data import loaders
from trainwell.loop.plan import require_max_steps
from trainwell.utils import model as model_utils


@dataclass
class ModelInfo:
    """What the Trainer reads off a model once: label names, loss conventions, input name, flops factor."""

    accepts_loss_kwargs: bool
    default_label_names: list[str]  #: forward arguments that hold labels (``args.label_names`` overrides them)
    can_return_loss: bool
    shifts_labels: bool  #: a causal LM: its loss ignores the first label of each row
    main_input_name: str
    counts_flops: bool  #: the model reports ``num_parameters`` (the flops estimate needs it)
    forward_parameters: dict[str, inspect.Parameter] = field(repr=False, default_factory=dict)
    flops_params: int | None = None  #: non-embedding parameters for the flops estimate (computed on first use)

    @classmethod
    def of(cls, model: nn.Module) -> ModelInfo:
        return cls(
            accepts_loss_kwargs=model_utils.accepts_loss_kwargs(model),
            default_label_names=model_utils.find_label_names(model),
            can_return_loss=model_utils.can_return_loss(model),
            shifts_labels=model_utils.loss_shifts_labels(model),
            main_input_name=model_utils.main_input_name(model),
            counts_flops=callable(getattr(model_utils.unwrap(model), "num_parameters", None)),
            forward_parameters=model_utils.forward_parameters(model),
        )

    def signature_columns(self, label_names: list[str]) -> list[str]:
        """Sample keys the model can take (``remove_unused_columns`` keeps these)."""
        return loaders.signature_columns(self.forward_parameters, label_names)

    def floating_point_ops(self, model: nn.Module, inputs: Any) -> int:
        """6 × input tokens × non-embedding parameters, for models that report ``num_parameters`` (else 0)."""
        if self.flops_params is None:
            counter = getattr(model_utils.unwrap(model), "num_parameters", None)
            self.flops_params = 0
            if callable(counter):
                try:
                    self.flops_params = int(counter(exclude_embeddings=True))
                except TypeError:
                    self.flops_params = int(counter())
        if not self.flops_params or not isinstance(inputs, Mapping):
            return 0
        main = inputs.get(self.main_input_name)
        return 6 * main.numel() * self.flops_params if isinstance(main, torch.Tensor) else 0


def build_model(
    model: nn.Module | None, model_init: Callable | None, make: Callable[[], Any], device: Any
) -> nn.Module:
    """The model to train: ``model``, or ``make()`` (``call_model_init``) when only ``model_init`` is given."""
    if model is not None and model_init is not None:
        raise ValueError(
            "Trainer got both model and model_init: pass only one (model_init builds a fresh model for each "
            "train() call, e.g. for hyperparameter search)."
        )
    if model is None:
        if model_init is None:
            raise RuntimeError("Trainer requires either a model or a model_init function.")
        model = make()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    if not getattr(model, "hf_device_map", None):
        model = model.to(device)
    return model


def call_model_init(model_init: Callable, trial: Any) -> nn.Module:
    """``model_init()`` or ``model_init(trial)``, whichever it takes; None is an error."""
    n_args = len(inspect.signature(model_init).parameters)
    model = model_init() if n_args == 0 else model_init(trial)
    if model is None:
        raise RuntimeError("model_init returned None: it must return a torch.nn.Module.")
    return model


def label_smoothing(args: Any, model: nn.Module) -> float | None:
    """The label-smoothing factor the Trainer applies itself (None: off)."""
    if args.label_smoothing_factor == 0:
        return None
    if getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification":
        warnings.warn(
            "label_smoothing_factor is ignored for a multi-label classification model (label smoothing only "
            "applies to single-label cross-entropy).",
            UserWarning,
            stacklevel=4,  # the user's Trainer(...) or train() call
        )
        return None
    return args.label_smoothing_factor


def default_collator(processing_class: Any) -> Callable:
    """Padding with the tokenizer when there is one that can pad; stacking otherwise."""
    from trainwell.data.collators import DataCollatorWithPadding, default_data_collator

    pc = processing_class
    if pc is not None and (hasattr(pc, "pad") or getattr(pc, "pad_token_id", None) is not None):
        return DataCollatorWithPadding(pc)
    return default_data_collator


def default_callbacks(args: Any, runtime: Any, user: list | None) -> list:
    """Flow, trackers of ``report_to``, the user's callbacks, progress display, and preemption saves."""
    from trainwell.events.flow import DefaultFlowCallback
    from trainwell.events.progress import PrinterCallback, ProgressCallback, apply_log_level
    from trainwell.integrations import reporting_callbacks

    # Set before any callback is built, so trackers and the progress display log at the chosen level.
    apply_log_level(args)
    callbacks: list[Any] = [DefaultFlowCallback]
    callbacks += reporting_callbacks(args.report_to)
    callbacks += list(user or [])
    callbacks.append(PrinterCallback if args.disable_tqdm else ProgressCallback)
    if args.enable_jit_checkpoint:
        from trainwell.checkpoint.preemption import JITCheckpointCallback

        callbacks.append(JITCheckpointCallback(runtime.reduce_sum if runtime.distributed else None))
    return callbacks


def check_trainer_arguments(trainer: Any) -> None:
    """Constructor arguments that cannot work together: an error naming the fix, before any work."""
    args = trainer.args
    if trainer.optimizer_cls_and_kwargs is not None and trainer.optimizer is not None:
        raise RuntimeError("Pass either optimizers or optimizer_cls_and_kwargs to the Trainer, not both.")
    if trainer.model_init is not None and (trainer.optimizer is not None or trainer.lr_scheduler is not None):
        raise RuntimeError(
            "optimizers cannot be combined with model_init: the optimizer must be built for each fresh model. "
            "Override create_optimizer_and_scheduler instead."
        )
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if strategy != "no" and trainer.eval_dataset is None:
        raise ValueError(
            f"eval_strategy={strategy!r} needs an eval_dataset: pass eval_dataset to the Trainer, or set "
            "eval_strategy='no'."
        )
    save = getattr(args.save_strategy, "value", args.save_strategy)
    if (save == "best" or args.load_best_model_at_end) and args.metric_for_best_model is None:
        raise ValueError(
            "save_strategy='best' and load_best_model_at_end need metric_for_best_model: name the metric to "
            "compare (e.g. metric_for_best_model='loss')."
        )
    if trainer.data_collator is not None and not callable(trainer.data_collator):
        raise TypeError(f"data_collator must be callable, got {type(trainer.data_collator).__name__}.")
    if trainer.train_dataset is not None:
        require_max_steps(loaders.has_length(trainer.train_dataset), args.max_steps)


def check_compute_metrics(compute_metrics: Callable | None, batch_eval_metrics: bool) -> None:
    """With ``batch_eval_metrics``, ``compute_metrics`` is called per batch and must accept ``compute_result``."""
    if not batch_eval_metrics or compute_metrics is None:
        return
    try:
        params = inspect.signature(compute_metrics).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "compute_result" not in params and not takes_kwargs:
        name = getattr(compute_metrics, "__qualname__", type(compute_metrics).__name__)
        raise ValueError(
            f"batch_eval_metrics=True calls compute_metrics once per batch as compute_metrics(eval_pred, "
            f"compute_result=...), but {name} takes no compute_result argument. Add a compute_result parameter "
            "(accumulate per batch; return the metrics when it is True), or set batch_eval_metrics=False."
        )


def enable_activation_checkpointing(model: nn.Module, kwargs: dict | None) -> None:
    """Turn on the model's own activation checkpointing (the newer method name first, as transformers 5)."""
    for method_name, kwarg_name in (
        ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
        ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
    ):
        method = getattr(model, method_name, None)
        if callable(method):
            method(**{kwarg_name: kwargs or {}})
            return
    raise AttributeError(
        f"activation_checkpointing=True but {type(model).__name__} has no activation_checkpointing_enable or "
        "gradient_checkpointing_enable method. Add one (e.g. wrap blocks with torch.utils.checkpoint), or set "
        "activation_checkpointing=False."
    )


def end_preemption(handler: Any) -> bool:
    """Restore the signal handlers after ``train()``; True when Ctrl-C stopped it (after saving)."""
    from trainwell.checkpoint.preemption import JITCheckpointCallback

    callback = next((cb for cb in handler.callbacks if isinstance(cb, JITCheckpointCallback)), None)
    if callback is None:
        return False
    callback.uninstall()
    return callback.interrupted


def set_reference_attributes(trainer: Any) -> None:
    """The reference's public Trainer attributes that library subclasses read (TRL, sentence-transformers, ...)."""
    runtime = trainer.runtime
    trainer.is_deepspeed_enabled, trainer.is_fsdp_enabled = runtime.uses_deepspeed, runtime.shards_model
    trainer.place_model_on_device = not (trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled)
    trainer.is_model_parallel, trainer.deepspeed, trainer.hp_name = False, None, None
    trainer.neftune_noise_alpha = trainer.args.neftune_noise_alpha
    trainer.hub_model_id, trainer.push_in_progress = None, None  # set by init_hf_repo


# What attach_runtime builds: a process's own (Accelerate's process-wide state among it), never sent to another.
RUNTIME_ATTRIBUTES = ("runtime", "precision", "accelerator", "gather_function")


def attach_runtime(trainer: Any) -> None:
    """Build the Trainer's runtime (devices, Accelerate, precision) from its arguments: in ``__init__``, and again
    in a process the Trainer was sent to without it (a Ray Tune worker)."""
    from trainwell.backend.runtime import Runtime

    trainer.runtime = Runtime(trainer.args)
    trainer.precision, trainer.accelerator = trainer.runtime.precision, trainer.runtime.accelerator
    trainer.gather_function = trainer.accelerator.gather_for_metrics
