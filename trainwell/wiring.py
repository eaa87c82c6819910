"""Building the Trainer's parts from its constructor arguments.

Owns what ``Trainer.__init__`` (and a ``model_init`` run of ``train()``) decides once: the process-wide set-up
(seed, runtime, the ``trainwell`` logger's level: :func:`set_up_process`, each set here and nowhere else), the
model (given, or built by ``model_init``, placed on the device) and what the Trainer reads off it once
(:func:`set_model`, with ``trainwell.utils.model.ModelInfo``), the default collator, the callbacks and their
handler, the reference's public attributes and the attributes the loops read (``trainwell.hooks``). Checking
the inputs is ``trainwell.checks``'; nothing here runs during training.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from trainwell import techniques
from trainwell.args.trackers import wants_live_log
from trainwell.backend import failures, stall
from trainwell.backend.runtime import RUNTIME_ATTRIBUTES, attach_runtime  # noqa: F401  (the Trainer's)
from trainwell.checkpoint import lock as output_lock
from trainwell.checkpoint import preemption
from trainwell.checkpoint.checkpointer import Checkpointer
from trainwell.checkpoint.resume import Resume, last_usable_checkpoint
from trainwell.checks import checked_callbacks
from trainwell.data import loaders
from trainwell.data.train_loader import build_train_feed
from trainwell.events.handler import CallbackHandler
from trainwell.events.progress import apply_log_level
from trainwell.loop.live_log import LiveLogCallback
from trainwell.loop.rollback import SpikeWatch
from trainwell.utils import model as model_utils
from trainwell.utils import quantization
from trainwell.utils.errors import short_repr
from trainwell.utils.seed import enable_full_determinism, set_seed


def set_up_process(trainer: Any, model: nn.Module | None) -> None:
    """The process-wide set-up, in the reference's order: the seed, the runtime (accelerator, device,
    precision), then the ``trainwell`` logger's level (``log_level`` on the main process, ``log_level_replica``
    on the others), before any callback is built so trackers and the progress display log at that level."""
    seed_run(trainer.args)
    attach_runtime(trainer, model)
    apply_log_level(trainer.args)


def seed_run(args: Any) -> None:
    """Seed python, numpy and torch from ``args.seed`` (fully deterministic with ``full_determinism``): when the
    Trainer is built, and again before ``model_init`` builds a fresh model in ``train()``."""
    seed = enable_full_determinism if args.full_determinism else set_seed
    seed(args.seed)


def set_model(trainer: Any, model: nn.Module) -> None:
    """Make ``model`` the Trainer's, and read what the loops need to know about it once."""
    trainer.model = trainer.model_wrapped = model
    trainer.model_info = info = model_utils.ModelInfo.of(model)
    trainer.model_accepts_loss_kwargs = info.accepts_loss_kwargs
    names = trainer.args.label_names
    trainer.label_names = info.default_label_names if names is None else list(names)
    trainer.can_return_loss = info.can_return_loss
    trainer.label_smoother = label_smoothing(trainer.args, model)


def build_model(
    model: nn.Module | None, model_init: Callable | None, make: Callable[[], Any], runtime: Any
) -> nn.Module:
    """The model to train: ``model``, or ``make()`` (``call_model_init``) when only ``model_init`` is given, on
    ``runtime``'s device; a quantized model that cannot train there, or so, is refused first."""
    if model is not None and model_init is not None:
        raise ValueError(
            "Trainer got both model and model_init: pass only one (model_init builds a fresh model for each "
            "train() call, e.g. for hyperparameter search)."
        )
    if model_init is not None and not callable(model_init):
        raise TypeError(
            f"model_init={short_repr(model_init)}: pass a function that returns a fresh torch.nn.Module "
            "(called as model_init() or model_init(trial)), or None and a model."
        )
    if model is None:
        if model_init is None:
            raise RuntimeError("Trainer requires either a model or a model_init function.")
        model = make()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model_init returned {short_repr(model)} ({type(model).__name__}): it must return a "
                            "torch.nn.Module, e.g. return AutoModelForSequenceClassification.from_pretrained(name).")
    if not isinstance(model, nn.Module):
        raise TypeError(_not_a_module(model))
    device = torch.device(runtime.device)
    quantization.check_trainable(model, runtime.compile_backend is not None, device.type)
    # a model placed by from_pretrained(device_map=...) stays there; bitsandbytes models cannot be moved (.to raises)
    bitsandbytes = quantization.quantization_method(model) == quantization.BITSANDBYTES
    if not (getattr(model, "hf_device_map", None) or bitsandbytes):
        model = model.to(device)
    return model


def _not_a_module(model: Any) -> str:
    shown = f"model={short_repr(model)}"
    if isinstance(model, (str, os.PathLike)):
        return (f"{shown}: pass a torch.nn.Module, not a name or path. Build the model first, e.g. "
                f"model=AutoModelForSequenceClassification.from_pretrained({str(model)!r}) (transformers), "
                "then pass it to the Trainer.")
    if isinstance(model, type):
        return f"{shown}: pass an instance, not the class, e.g. model={model.__name__}(...)."
    return (f"{shown}: pass a torch.nn.Module (e.g. a transformers PreTrainedModel), or model_init=a function "
            f"that returns one (got {type(model).__name__}).")


def call_model_init(model_init: Callable, trial: Any) -> nn.Module:
    """``model_init()`` or ``model_init(trial)``, by the number of parameters its signature lists (counted as
    the reference counts them, :func:`number_of_arguments`); any other number is the reference's RuntimeError,
    never a call that passes the trial to a parameter meant for something else. None is an error."""
    n_args = number_of_arguments(model_init)
    if n_args not in (0, 1):
        raise RuntimeError(
            f"model_init should have 0 or 1 argument: {short_repr(model_init)} takes {n_args} "
            f"({_parameter_names(model_init)}). Pass a function that takes nothing, or only the trial, e.g. "
            "model_init=lambda: MyModel(a=0.0, b=0.0) or functools.partial(MyModel, a=0.0, b=0.0)."
        )
    model = model_init() if n_args == 0 else model_init(trial)
    if model is None:
        raise RuntimeError("model_init returned None: it must return a torch.nn.Module.")
    return model


def number_of_arguments(func: Callable) -> int:
    """The parameters ``inspect.signature`` lists for ``func`` (``*args``/``**kwargs`` and defaulted ones
    count too); for a ``functools.partial``, those of the wrapped function less the arguments it binds. The
    reference's count, so a ``model_init`` is called the same way under both Trainers."""
    if isinstance(func, functools.partial):
        return len(inspect.signature(func.func).parameters) - len(func.args) - len(func.keywords)
    return len(inspect.signature(func).parameters)


def _parameter_names(func: Callable) -> str:
    try:
        return ", ".join(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return "its parameters cannot be read"


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


def callback_handler(trainer: Any, user: list | None, progress: Any = None) -> CallbackHandler:
    """The handler of :func:`default_callbacks` and the user's ``callbacks``, handed the Trainer's parts."""
    callbacks = default_callbacks(trainer.args, trainer.runtime, user, progress)
    early, late = log_time_callbacks(trainer)
    callbacks[1:1] = early  # after the flow callback, with the trackers
    callbacks += late
    return CallbackHandler(callbacks, trainer.model, trainer.processing_class, trainer.optimizer,
                           trainer.lr_scheduler)


def log_time_callbacks(trainer: Any) -> tuple[list[Any], list[Any]]:
    """The run-time features that act at log time, as callbacks: those that go with the trackers (the live log,
    when ``report_to`` names ``"live"``), and those that go last, after every other callback has seen the log
    (``rollback_on_spike``'s watch, which raises the rollback)."""
    args = trainer.args
    early = [LiveLogCallback(trainer)] if wants_live_log(args.report_to) else []
    late = []
    if args.rollback_on_spike is not None:
        late.append(SpikeWatch(args.rollback_on_spike, lambda: trainer.is_in_train))
    return early, late


def default_callbacks(args: Any, runtime: Any, user: list | None, progress: Any = None) -> list:
    """Flow, trackers of ``report_to``, the user's callbacks, progress display (``progress``, by default the
    console's; plain log lines with ``disable_tqdm``), and preemption saves."""
    from trainwell.events.flow import DefaultFlowCallback
    from trainwell.events.progress import PrinterCallback, ProgressCallback
    from trainwell.integrations.registry import reporting_callbacks

    user = checked_callbacks(user)  # a bad list fails before any tracker is looked up
    callbacks: list[Any] = [DefaultFlowCallback]
    callbacks += reporting_callbacks(args.report_to)
    callbacks += user
    callbacks.append(PrinterCallback if args.disable_tqdm else progress or ProgressCallback)
    if args.enable_jit_checkpoint:
        from trainwell.checkpoint.preemption import JITCheckpointCallback

        callbacks.append(JITCheckpointCallback(runtime.reduce_sum if runtime.distributed else None))
    return callbacks


#: The wrappers of one ``train()`` call (:func:`train_call`), outermost first, and of each of its attempts
#: (:func:`train_attempt`); between the two, ``Trainer.train`` finds the checkpoint once and hands its attempts to
#: the retry room (``trainwell.techniques.retry``).
TRAIN_CALL = ("the train stage's memory metrics and is_in_train", "preemption saves (enable_jit_checkpoint)",
              "the trial's settings (a search)", "output_dir's lock (runs that save)")
TRAIN_ATTEMPT = ("a fresh model_init model, the scheduler rebuilt", "step_timeout's watchdog",
                 "the techniques on the model (Liger, NEFTune, the overflow debugger)", "a lost peer stops together")


@contextlib.contextmanager
def train_call(trainer: Any, trial: Any, resume_from_checkpoint: str | bool | None) -> Iterator[Resume | None]:
    """The wrappers of one ``train()`` call, in the order of :data:`TRAIN_CALL`; yields the checkpoint to resume
    (``resume_from_checkpoint`` found and validated, once per call, by every process together)."""
    trainer._memory_tracker.start("train")
    trainer.is_in_train = True
    with preemption.ending_train(trainer.callback_handler):  # Ctrl-C with enable_jit_checkpoint: saved, re-raised
        try:
            trainer._hp_search_setup(trial)  # first: a trial's seed and batch size are this whole run's
            locks = trainer.is_world_process_zero() and output_lock.writes(trainer.args)  # runs that save only
            with output_lock.holding(trainer._get_output_dir(trial), enabled=locks):
                with failures.stop_together(trainer, last_usable_checkpoint):  # a collective: fail together
                    resume = Checkpointer.find(trainer, resume_from_checkpoint)
                yield resume
        finally:
            trainer.is_in_train = False
            trainer._memory_tracker.stop("train")  # after a failure (a finished run has stopped it already)


@contextlib.contextmanager
def train_attempt(trainer: Any, trial: Any) -> Iterator[None]:
    """The wrappers of one attempt of ``train()``, in the order of :data:`TRAIN_ATTEMPT`."""
    prepare_attempt(trainer, trial)
    with stall.watch(trainer, last_usable_checkpoint), techniques.during_training(trainer), \
            failures.stop_together(trainer, last_usable_checkpoint):  # step_timeout, then a lost peer
        yield


def dataloader(trainer: Any, dataset: Any, description: str, batch_size: int, sampler_fn: Any, is_training: bool,
               dataloader_key: str | None) -> Any:
    """The body of ``Trainer._get_dataloader`` (its docstring says what it does)."""
    args, runtime = trainer.args, trainer.runtime
    if not is_training:
        loader = trainer._eval_loaders.get(dataset, trainer.data_collator, _columns(trainer), args, runtime,
                                           batch_size, sampler_fn, description)
        if dataloader_key is not None and args.dataloader_persistent_workers:
            trainer._eval_dataloaders[dataloader_key] = loader
        return loader
    dataset, collator = loaders.without_unused_columns(dataset, trainer.data_collator, _columns(trainer), description)
    sampler = None if sampler_fn is None or loaders.is_iterable(dataset) else sampler_fn(dataset)
    return build_train_feed(dataset, collator, sampler, args, runtime, batch_size).loader


def _columns(trainer: Any) -> list[str] | None:
    """The sample keys ``remove_unused_columns`` keeps (None: it is off), through the Trainer's
    ``_set_signature_columns_if_needed`` (TRL's trainers set their own columns)."""
    if not trainer.args.remove_unused_columns:
        return None
    trainer._set_signature_columns_if_needed()
    return list(trainer._signature_columns)


def prepare_attempt(trainer: Any, trial: Any) -> None:
    """Before each attempt of ``train()``: with ``model_init``, a fresh model (seeded as the first one was) and no
    optimizer or scheduler of the previous one; a scheduler the Trainer built is built again for this call's
    length; the model's activation checkpointing turned on when asked."""
    if trainer.model_init is not None:
        seed_run(trainer.args)
        model = build_model(None, trainer.model_init, lambda: trainer.call_model_init(trial), trainer.runtime)
        set_model(trainer, model)
        trainer.optimizer, trainer.lr_scheduler = None, None
    if trainer._created_lr_scheduler:
        trainer.lr_scheduler = None
    if trainer.args.activation_checkpointing:
        enable_activation_checkpointing(trainer.model, trainer.args.activation_checkpointing_kwargs)


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


def set_reference_attributes(trainer: Any) -> None:
    """The reference's public Trainer attributes that library subclasses read (TRL, sentence-transformers, ...)."""
    engine = trainer.runtime.engine
    trainer.is_deepspeed_enabled, trainer.is_fsdp_enabled = engine.is_deepspeed_enabled, engine.is_fsdp_enabled
    trainer.place_model_on_device = engine.places_model
    trainer.is_model_parallel, trainer.deepspeed, trainer.hp_name = False, None, None
    trainer.neftune_noise_alpha = trainer.args.neftune_noise_alpha
    trainer.hub_model_id, trainer.push_in_progress = None, None  # set by init_hf_repo
    trainer._signature_columns = None  # the sample keys remove_unused_columns keeps, filled on first use


def set_run_attributes(trainer: Any) -> None:
    """A run's attributes before the first ``train()``: those the loops read and write (``current_flos``,
    ``micro_batch_loss_scale``, ``training_run``...: ``trainwell.hooks`` lists them) and the Trainer's own."""
    trainer._train_batch_size = trainer.args.train_batch_size  # a search trial or a batch-size search changes it
    trainer._eval_loaders = loaders.EvalLoaders()
    trainer._eval_dataloaders = {}  # the reference's: _get_dataloader(dataloader_key=...) keeps loaders here
    trainer._created_lr_scheduler = False  # True once create_scheduler built one (rebuilt for the next train())
    trainer.current_flos = 0
    trainer.current_gradient_accumulation_steps = 1
    trainer.micro_batch_loss_scale = None
    trainer.training_run = None
    trainer.heartbeat = stall.Heartbeat()  # this run's progress counter, read by its step_timeout watchdog
    # decided once, not per micro-batch: an override may predate the reference's num_items_in_batch
    trainer._loss_takes_items = model_utils.accepts_keyword(trainer.compute_loss, "num_items_in_batch")


def apply_use_cache(model: nn.Module, use_cache: bool) -> None:
    """``args.use_cache`` onto the model's config, for a model whose config has ``use_cache``."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = use_cache
