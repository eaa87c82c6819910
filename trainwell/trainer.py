"""The ``Trainer`` facade: the reference Trainer's constructor, ``train``/``evaluate``/``predict``, and the
override surface that subclasses rely on.

Owns wiring: it builds the runtime (``trainwell.backend``), resolves the model, collator and callbacks, and
delegates — the training loop to ``trainwell.loop.fit``, evaluation to ``trainwell.loop.evaluation``,
checkpoints to ``trainwell.checkpoint``, optimizers to ``trainwell.optim``. Every method a subclass of the
reference Trainer may override (``compute_loss``, ``training_step``, ``prediction_step``,
``create_optimizer``, ``get_train_dataloader``, ``log``, ...) is called by those loops through ``self``, so an
override is honoured.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from typing import Any, Callable

import torch
from torch import nn

from trainwell.backend.runtime import Runtime
from trainwell.data import loaders
from trainwell.events.callback import TrainerCallback
from trainwell.events.handler import CallbackHandler
from trainwell.loop import evaluation
from trainwell.loop.fit import FitLoop, max_steps_plan
from trainwell.loop.losses import label_smoothed_loss, logits_of
from trainwell.outputs import EvalLoopOutput, PredictionOutput, TrainOutput
from trainwell.state import TrainerControl, TrainerState
from trainwell.trainer_checkpointing import CheckpointMixin
from trainwell.trainer_data import DataMixin
from trainwell.trainer_parts import TrainerPartsMixin
from trainwell.training_args import TrainingArguments
from trainwell.utils import model as model_utils
from trainwell.utils.metrics import speed_metrics
from trainwell.utils.seed import enable_full_determinism, set_seed

logger = logging.getLogger(__name__)


class Trainer(DataMixin, CheckpointMixin, TrainerPartsMixin):
    """Train, evaluate and predict with any ``torch.nn.Module`` (``transformers`` models included).

    A drop-in for ``transformers.Trainer``: same constructor, arguments, metric names, checkpoint layout and
    callback events. See the README for the places where trainwell deliberately differs.
    """

    # Set to True/False to say whether the loss from compute_loss is already normalized over the whole
    # accumulation window (None: decided from the model and compute_loss_func).
    loss_is_scaled_for_ga: bool | None = None

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable | None = None,
        compute_metrics: Callable | None = None,
        callbacks: list[TrainerCallback | type[TrainerCallback]] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None,
        preprocess_logits_for_metrics: Callable | None = None,
    ) -> None:
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        self.args = args
        self._seed()
        self.runtime = Runtime(args)
        # log_level on the main process, log_level_replica on the others ("passive" keeps the current level)
        logging.getLogger("trainwell").setLevel(args.get_process_log_level())
        self.accelerator = self.runtime.accelerator
        self.model_init = model_init
        self.hp_search_backend = None
        self.is_in_train = False
        self.model = self.model_wrapped = self._resolve_model(model)
        self._inspect_model()
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.processing_class = processing_class
        self.data_collator = data_collator if data_collator is not None else self._default_collator()
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self._created_lr_scheduler = False
        self._validate_trainer_args()
        self.callback_handler = CallbackHandler(
            self._default_callbacks(callbacks), self.model, processing_class, self.optimizer, self.lr_scheduler
        )
        if args.should_save:
            os.makedirs(args.output_dir, exist_ok=True)
        self.control = TrainerControl()
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero()
        )
        self.current_flos = 0
        self._tokens_pending: Any = 0
        self._loss_factor: Any = None
        self._optimizer_has_modes = False
        self._resumed_from: str | None = None
        self._resume_epoch = -1
        self._train_batch_size = args.train_batch_size
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)
        config = getattr(self.model, "config", None)
        if config is not None and hasattr(config, "use_cache"):
            config.use_cache = args.use_cache

    # ------------------------------------------------------------------------------------------ set-up
    def _seed(self) -> None:
        if self.args.full_determinism:
            enable_full_determinism(self.args.seed)
        else:
            set_seed(self.args.seed)

    def _resolve_model(self, model: nn.Module | None) -> nn.Module:
        if model is not None and self.model_init is not None:
            raise ValueError(
                "Trainer got both model and model_init: pass only one (model_init builds a fresh model for each "
                "train() call, e.g. for hyperparameter search)."
            )
        if model is None:
            if self.model_init is None:
                raise RuntimeError("Trainer requires either a model or a model_init function.")
            model = self.call_model_init()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        if not getattr(model, "hf_device_map", None):
            model = model.to(self.runtime.device)
        return model

    def _inspect_model(self) -> None:
        model = self.model
        self.model_accepts_loss_kwargs = model_utils.accepts_loss_kwargs(model)
        default_labels = model_utils.find_label_names(model)
        self.label_names = default_labels if self.args.label_names is None else list(self.args.label_names)
        self.can_return_loss = model_utils.can_return_loss(model)
        self._loss_shifts_labels = model_utils.loss_shifts_labels(model)
        self._signature_columns: list[str] | None = None
        self._flops_params: int | None = None
        self.label_smoother = None
        if self.args.label_smoothing_factor != 0:
            problem = getattr(getattr(model, "config", None), "problem_type", None)
            if problem == "multi_label_classification":
                warnings.warn(
                    "label_smoothing_factor is ignored for a multi-label classification model (label smoothing "
                    "only applies to single-label cross-entropy).",
                    UserWarning,
                )
            else:
                self.label_smoother = self.args.label_smoothing_factor

    def _default_collator(self) -> Callable:
        from trainwell.data.collators import DataCollatorWithPadding, default_data_collator

        pc = self.processing_class
        if pc is not None and (hasattr(pc, "pad") or getattr(pc, "pad_token_id", None) is not None):
            return DataCollatorWithPadding(pc)
        return default_data_collator

    def _default_callbacks(self, user: list | None) -> list:
        from trainwell.events.flow import DefaultFlowCallback
        from trainwell.events.progress import PrinterCallback, ProgressCallback, apply_log_level
        from trainwell.integrations import reporting_callbacks

        # Set before any callback is built, so trackers and the progress display log at the chosen level.
        apply_log_level(self.args)
        callbacks: list[Any] = [DefaultFlowCallback]
        callbacks += reporting_callbacks(self.args.report_to)
        callbacks += list(user or [])
        callbacks.append(PrinterCallback if self.args.disable_tqdm else ProgressCallback)
        if self.args.enable_jit_checkpoint:
            from trainwell.checkpoint.preemption import JITCheckpointCallback

            distributed = self.runtime.distributed
            callbacks.append(JITCheckpointCallback(self.runtime.reduce_sum if distributed else None))
        return callbacks

    def _validate_trainer_args(self) -> None:
        args = self.args
        if self.optimizer_cls_and_kwargs is not None and self.optimizer is not None:
            raise RuntimeError("Pass either optimizers or optimizer_cls_and_kwargs to the Trainer, not both.")
        if self.model_init is not None and (self.optimizer is not None or self.lr_scheduler is not None):
            raise RuntimeError(
                "optimizers cannot be combined with model_init: the optimizer must be built for each fresh model. "
                "Override create_optimizer_and_scheduler instead."
            )
        strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
        if strategy != "no" and self.eval_dataset is None:
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
        if self.data_collator is not None and not callable(self.data_collator):
            raise TypeError(f"data_collator must be callable, got {type(self.data_collator).__name__}.")
        dataset = self.train_dataset
        if dataset is not None and not loaders.has_length(dataset) and args.max_steps <= 0:
            raise ValueError(
                f"max_steps={args.max_steps}: the train_dataset has no length (an IterableDataset), so the number "
                "of steps cannot be derived from num_train_epochs. Pass max_steps > 0."
            )

    # ------------------------------------------------------------------------------------------ callbacks
    def add_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> TrainerCallback | None:
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.remove_callback(callback)

    # ------------------------------------------------------------------------------------------ train
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """Train the model; ``resume_from_checkpoint`` is a checkpoint path, or True for the newest complete one."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        if resume_from_checkpoint is False:
            resume_from_checkpoint = None
        self.is_in_train = True
        if self.model_init is not None:
            self._seed()
            self.model = self.model_wrapped = self._resolve_model(None)
            self._inspect_model()
            self.optimizer, self.lr_scheduler = None, None
        if self.args.activation_checkpointing:
            self._enable_activation_checkpointing()
        resume_from_checkpoint = self._resolve_resume(resume_from_checkpoint)
        try:
            output = FitLoop(self, resume_from_checkpoint, trial, ignore_keys_for_eval).run()
        finally:
            self.is_in_train = False
            interrupted = self._end_preemption()
        if interrupted:  # Ctrl-C with enable_jit_checkpoint: the checkpoint is saved, now stop as Ctrl-C would
            raise KeyboardInterrupt
        return output

    def _enable_activation_checkpointing(self) -> None:
        """Turn on the model's own activation checkpointing (the newer method name first, as transformers 5)."""
        kwargs = self.args.activation_checkpointing_kwargs or {}
        for method_name, kwarg_name in (
            ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
            ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
        ):
            method = getattr(self.model, method_name, None)
            if callable(method):
                method(**{kwarg_name: kwargs})
                return
        raise AttributeError(
            f"activation_checkpointing=True but {type(self.model).__name__} has no activation_checkpointing_enable "
            "or gradient_checkpointing_enable method. Add one (e.g. wrap blocks with torch.utils.checkpoint), or "
            "set activation_checkpointing=False."
        )

    def set_initial_training_values(self, args: TrainingArguments, dataloader: Any) -> tuple:
        """(epochs, updates per epoch, examples, samples, total batch size, micro-batches per epoch, max steps)."""
        total_batch_size = self.get_total_train_batch_size(args)
        sized = loaders.has_length(dataloader)
        plan = max_steps_plan(args, len(dataloader) if sized else None, total_batch_size)
        num_examples = self.num_examples(dataloader) if sized else total_batch_size * plan["max_steps"]
        samples = plan["samples"]
        if samples is None:
            samples = num_examples * args.num_train_epochs
        return (plan["epochs"], plan["updates_per_epoch"], num_examples, samples, total_batch_size,
                plan["steps_in_epoch"], plan["max_steps"])

    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        return self._train_batch_size * args.gradient_accumulation_steps * self.runtime.num_processes

    def _num_train_epochs(self, max_steps: int, upe: int) -> int:
        return max_steps // upe + int(max_steps % upe > 0)

    def _prepare_for_training(self, max_steps: int, train_dataloader: Any, resume: str | None) -> nn.Module:
        if self.optimizer is None:
            self.create_optimizer()
        model = self.runtime.prepare_model(self.model)
        self.model_wrapped = model
        if type(self.optimizer).__name__ != "AcceleratedOptimizer":
            self.optimizer = self.runtime.prepare_optimizer(self.optimizer)
        if self._created_lr_scheduler or self.lr_scheduler is None:
            self.lr_scheduler = None
            self.create_scheduler(num_training_steps=max_steps, optimizer=self.optimizer)
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        self._optimizer_has_modes = callable(getattr(inner, "train", None)) and callable(getattr(inner, "eval", None))
        if resume is not None:
            self._load_optimizer_and_scheduler(resume)
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader = train_dataloader
        return model

    # ------------------------------------------------------------------------------------------ steps
    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """Forward, loss, backward for one micro-batch; returns the detached loss as it was backpropagated.

        The loss is multiplied by this micro-batch's share of the accumulation window (see
        ``trainwell.loop.accumulation``), so the returned values of a window sum to the window's loss.
        """
        if not model.training:  # model.train() walks every submodule: only pay for it after an evaluation
            model.train()
        if self._optimizer_has_modes:
            self.optimizer.train()  # schedule-free optimizers keep separate train/eval weights
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if self._loss_factor is not None:
            loss = loss * self._loss_factor
        self.runtime.backward(loss)
        return loss.detach()

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The loss of one batch: ``compute_loss_func``, label smoothing, or the model's own loss."""
        labels = None
        if (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs:
            inputs = dict(inputs)
            labels = inputs.pop("labels")
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        outputs = model_utils.call_forward(model, inputs)
        if self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None:
            loss = label_smoothed_loss(
                logits_of(outputs), labels, self.label_smoother, shift_labels=self._loss_shifts_labels,
                num_items_in_batch=num_items_in_batch,
            )
        else:
            loss = model_utils.extract_loss(outputs)
        return (loss, outputs) if return_outputs else loss

    def compute_loss_context_manager(self) -> contextlib.AbstractContextManager:
        """Context for the forward pass (mixed precision is applied by Accelerate when the model is prepared)."""
        return contextlib.nullcontext()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def _prepare_inputs(self, inputs: Any) -> Any:
        """Move a batch to the device; an empty batch is an error naming the fix."""
        if isinstance(inputs, dict) and not inputs:
            raise ValueError(
                "The batch is empty: the data collator returned no keys. Check the dataset's columns against the "
                "model's forward arguments, or pass remove_unused_columns=False."
            )
        device = self.runtime.device
        if device.type == "cpu":
            return inputs  # CPU batches are already in place; skipping the walk saves per-step overhead
        return _to_device(inputs, device)

    # ------------------------------------------------------------------------------------------ evaluate
    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Evaluate and return metrics prefixed ``{metric_key_prefix}_``; a dict of datasets evaluates each."""
        override = eval_dataset is not None
        dataset = eval_dataset if override else self.eval_dataset
        if isinstance(dataset, dict):
            metrics: dict[str, float] = {}
            for name, data in dataset.items():
                metrics.update(self.evaluate(data if override else name, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        dataloader = self.get_eval_dataloader(eval_dataset)
        start = time.time()
        output = self.evaluation_loop(
            dataloader, "Evaluation", prediction_loss_only=True if self.compute_metrics is None else None,
            ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
        )
        metrics = dict(output.metrics)
        metrics.update(self._eval_speed(metric_key_prefix, start, output.num_samples))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        if self.state.epoch is not None:
            metrics["epoch"] = self.state.epoch  # the reference's evaluate() returns it too
        return metrics

    def predict(
        self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Predictions (in dataset order), label ids when present, and ``test_`` metrics."""
        dataloader = self.get_test_dataloader(test_dataset)
        start = time.time()
        output = self.evaluation_loop(
            dataloader, "Prediction", ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix
        )
        metrics = dict(output.metrics)
        metrics.update(self._eval_speed(metric_key_prefix, start, output.num_samples))
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics=metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=metrics)

    def _eval_speed(self, prefix: str, start: float, num_samples: int) -> dict[str, float]:
        batch = self.args.eval_batch_size * self.runtime.num_processes
        return speed_metrics(prefix, start, num_samples=num_samples, num_steps=-(-num_samples // batch))

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        return evaluation.evaluation_loop(
            self, dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
        )

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, logits, labels) for one batch, without gradients."""
        has_labels = bool(self.label_names) and all(inputs.get(k) is not None for k in self.label_names)
        return_loss = inputs.get("return_loss", None)
        if return_loss is None:
            return_loss = self.can_return_loss
        loss_without_labels = not self.label_names and bool(return_loss)
        inputs = self._prepare_inputs(inputs)
        if ignore_keys is None:
            config = getattr(model_utils.unwrap(model), "config", None)
            ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", ["past_key_values"])) if config else []
        labels = None
        if has_labels or loss_without_labels:
            labels = tuple(inputs.get(name) for name in self.label_names)
            labels = labels[0] if len(labels) == 1 else (labels or None)
        with torch.no_grad():
            if has_labels or loss_without_labels:
                with self.compute_loss_context_manager():
                    loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
                loss = loss.detach().mean()
                logits = model_utils.output_items(outputs, ignore_keys)
                if isinstance(outputs, (tuple, list)):
                    logits = logits[1:]
            else:
                loss = None
                outputs = model_utils.call_forward(model, inputs)
                logits = model_utils.output_items(outputs, ignore_keys)
        if prediction_loss_only:
            return loss, None, None
        logits = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in logits)
        if len(logits) == 1:
            logits = logits[0]
        elif len(logits) == 0:
            logits = None
        labels = labels.detach() if isinstance(labels, torch.Tensor) else labels
        return loss, logits, labels


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return type(data)({k: _to_device(v, device) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(v, device) for v in data)
    return data

