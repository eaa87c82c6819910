"""The ``Trainer`` facade: the reference Trainer's constructor and its whole override surface, delegating.

``__init__`` wires the components (``trainwell.wiring``); every other method is the reference's method of that
name, a few lines that hand the work to the module that owns it (docs/architecture.md draws the map: loops,
data, checkpoints, optimizers). The loops call back only the methods of ``trainwell.hooks.TrainerHooks``, always
through the Trainer object, so a subclass's override of any of them (as with the reference) is honoured.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from trainwell import checks, search, wiring
from trainwell.args.storage import local_output_dir
from trainwell.backend import failures
from trainwell.backend.runtime import to_device
from trainwell.checkpoint import contents, loading
from trainwell.checkpoint import lock as output_lock
from trainwell.checkpoint.checkpointer import Checkpointer
from trainwell.checkpoint.layout import (  # noqa: F401  (the reference's module-level names)
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
)
from trainwell.checkpoint.resume import Resume, last_usable_checkpoint
from trainwell.data import loaders
from trainwell.events.callback import TrainerCallback
from trainwell.events.flow import DefaultFlowCallback
from trainwell.events.notebook import NotebookProgressCallback, in_notebook
from trainwell.events.progress import ProgressCallback
from trainwell.integrations import hub
from trainwell.loop import boundary, evaluation, losses
from trainwell.loop.fit import FitLoop
from trainwell.loop.metric_checks import CheckedComputeMetrics
from trainwell.loop.plan import StepPlan, build_plan
from trainwell.optim import param_groups, registry
from trainwell.optim.schedulers import current_learning_rate, scheduler_for_args
from trainwell.outputs import BestRun, EvalLoopOutput, PredictionOutput, TrainOutput
from trainwell.state import TrainerControl, TrainerState
from trainwell.techniques import retry
from trainwell.techniques.memory import MemoryTracker
from trainwell.training_args import TrainingArguments
from trainwell.utils import metrics as metric_utils
from trainwell.utils import model as model_utils

#: the reference's default callbacks (trainwell adds trackers, the progress display and preemption as it runs)
DEFAULT_CALLBACKS = [DefaultFlowCallback]
#: the progress display unless ``disable_tqdm``: in a notebook (decided when this module is imported, as by the
#: reference) the HTML bar and metrics table, else the console's; a script may set its own here before building
DEFAULT_PROGRESS_CALLBACK = NotebookProgressCallback if in_notebook() else ProgressCallback


class Trainer:
    """Train, evaluate and predict with any ``torch.nn.Module`` (``transformers`` models included).

    A drop-in for ``transformers.Trainer``: same constructor, arguments, metric names, checkpoint layout and
    callback events. docs/differences.md lists the places where trainwell deliberately differs.
    """

    #: True/False: the loss from ``compute_loss`` is already normalized over the whole accumulation window
    #: (None: decided from the model and ``compute_loss_func``)
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
        checks.check_early_inputs(args, optimizers)  # both are read before any other check could run
        self.args = args = args if args is not None else TrainingArguments(output_dir="tmp_trainer")
        self._memory_tracker = MemoryTracker(args.skip_memory_metrics)
        self._memory_tracker.start("init")
        wiring.set_up_process(self, model)  # seed, runtime, log level: each set there and nowhere else
        self.model_init, self.hp_search_backend, self.is_in_train = model_init, None, False
        wiring.set_model(self, wiring.build_model(model, model_init, self.call_model_init, self.runtime))
        self.compute_loss_func, self.compute_metrics = compute_loss_func, compute_metrics
        self.preprocess_logits_for_metrics, self.processing_class = preprocess_logits_for_metrics, processing_class
        self.data_collator = data_collator if data_collator is not None else wiring.default_collator(processing_class)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        checks.check_trainer_arguments(self)
        self.callback_handler = wiring.callback_handler(self, callbacks, DEFAULT_PROGRESS_CALLBACK)
        output_lock.prepare(local_output_dir(args), args.should_save, self.is_world_process_zero(),
                            output_lock.writes(args))
        self.state = TrainerState(is_local_process_zero=self.is_local_process_zero(),
                                  is_world_process_zero=self.is_world_process_zero())
        wiring.set_run_attributes(self)
        self.checkpointer = Checkpointer(self)  # saves outside train(); each train() call makes its own
        wiring.set_reference_attributes(self)
        self._hub = None  # the Hub uploader, set by init_hf_repo
        if args.push_to_hub:
            self.init_hf_repo()
        self.control = self.callback_handler.on_init_end(args, self.state, TrainerControl())
        wiring.apply_use_cache(self.model, args.use_cache)
        self._memory_tracker.stop("init")

    compute_metrics = CheckedComputeMetrics()  # checked whenever it is set, before any training

    # ------------------------------------------------------------------------------------------ callbacks
    def add_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> TrainerCallback | None:
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        self.callback_handler.remove_callback(callback)

    # ------------------------------------------------------------------------------------------ training
    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> TrainOutput:
        """Train the model; ``resume_from_checkpoint`` is a checkpoint path, or True for the newest complete one."""
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        # the call's wrappers, in order (wiring.TRAIN_CALL), then the checkpoint found and validated once per call
        with wiring.train_call(self, trial, resume_from_checkpoint) as resume:
            attempt = functools.partial(self._train_attempt, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval)
            return retry.train_with_retries(self, attempt, resume)  # rollback_on_spike, auto_find_batch_size

    def _train_attempt(self, resume: Resume | None, trial: Any, ignore_keys_for_eval: list[str] | None) -> TrainOutput:
        with wiring.train_attempt(self, trial):  # each attempt's wrappers, in order (wiring.TRAIN_ATTEMPT)
            self.checkpointer = Checkpointer.of(self, resume)
            add_memory = functools.partial(self._memory_tracker.stop, "train")
            return FitLoop(self, trial, ignore_keys_for_eval, add_memory).run()

    def set_initial_training_values(self, args: TrainingArguments, dataloader: Any) -> StepPlan:
        """The run's step arithmetic; unpacks as the reference's 7-tuple (see ``trainwell.loop.plan``)."""
        batches = loaders.length_or_none(dataloader)
        examples = self.num_examples(dataloader) if batches is not None else None
        return build_plan(args, batches, examples, self.get_total_train_batch_size(args))

    def get_total_train_batch_size(self, args: TrainingArguments) -> int:
        return self._train_batch_size * args.gradient_accumulation_steps * self.runtime.data_parallel_size

    def num_examples(self, dataloader: Any) -> int:
        return loaders.num_examples(dataloader, self.args.per_device_train_batch_size)

    def call_model_init(self, trial: Any = None) -> nn.Module:
        return wiring.call_model_init(self.model_init, trial)

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Build the optimizer of ``model`` (default: the Trainer's) from ``optim`` (or ``optimizer_cls_and_kwargs``)
        with weight-decay groups, through ``get_optimizer_cls_and_kwargs`` and ``get_decay_parameter_names``, so a
        subclass's override of either counts (sentence-transformers' adds the parameters of its loss modules)."""
        if self.optimizer is None:
            target = self.model if model is None else model
            chosen = self.optimizer_cls_and_kwargs or self.get_optimizer_cls_and_kwargs(self.args, target)
            self.optimizer = registry.create_optimizer(target, self.args, chosen,
                                                       self.get_decay_parameter_names(target))
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """Build the LR schedule of ``lr_scheduler_type`` over ``num_training_steps`` (once per train())."""
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            self.lr_scheduler = scheduler_for_args(self.args, optimizer, num_training_steps)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[type, dict[str, Any]]:
        return registry.get_optimizer_cls_and_kwargs(args, model)

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        return param_groups.get_decay_parameter_names(model)

    def _get_learning_rate(self) -> float:
        return current_learning_rate(self.lr_scheduler, self.optimizer)

    def get_learning_rates(self) -> list[float]:
        return param_groups.learning_rates(self.optimizer)

    def get_optimizer_group(self, param: torch.nn.Parameter | None = None) -> Any:
        return param_groups.group_of(self.optimizer, param)

    def get_num_trainable_parameters(self) -> int:
        return model_utils.num_parameters(self.model, trainable_only=True)

    # ------------------------------------------------------------------------------------------ one step
    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None = None
    ) -> torch.Tensor:
        """Forward, loss, backward for one micro-batch; returns the detached loss as it was backpropagated.

        The loss is multiplied by ``micro_batch_loss_scale``, this micro-batch's share of the accumulation window
        (see ``trainwell.loop.accumulation``), so the returned values of a window sum to the window's loss.
        """
        if not model.training:  # model.train() walks every submodule: only pay for it after an evaluation
            model.train()
        if self.training_run is not None and self.training_run.optimizer_has_modes:
            self.optimizer.train()  # schedule-free optimizers keep separate train/eval weights
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            if self._loss_takes_items:
                loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            else:  # an override written to the reference's older documented signature
                loss = self.compute_loss(model, inputs)
        if self.micro_batch_loss_scale is not None:
            loss = loss * self.micro_batch_loss_scale
        self.precision.backward(loss)
        return loss.detach()

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The loss of one batch: ``compute_loss_func``, label smoothing, or the model's own loss; ``inputs`` are
        never modified (``trainwell.loop.losses.compute_loss``)."""
        return losses.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    def compute_loss_context_manager(self) -> contextlib.AbstractContextManager:
        """The context of the forward pass: ``autocast_smart_context_manager``'s."""
        return self.autocast_smart_context_manager()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> contextlib.AbstractContextManager:
        """A no-op, as in the reference: the prepared model's ``forward`` already runs under the autocast."""
        return contextlib.nullcontext()

    def _prepare_inputs(self, inputs: Any) -> Any:
        """Move a batch to the device; an empty batch is an error naming the fix."""
        if isinstance(inputs, Mapping) and not inputs:
            raise ValueError(
                "The batch is empty: the data collator returned no keys. Check the dataset's columns against the "
                "model's forward arguments, or pass remove_unused_columns=False."
            )
        runtime = self.runtime
        if runtime.device.type == "cpu" and runtime.input_dtype is None:
            return inputs  # already in place: skipping the walk saves per-step overhead
        return to_device(inputs, runtime.device, runtime.input_dtype)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """6 × input tokens × non-embedding parameters, for models that report ``num_parameters`` (else 0)."""
        return self.model_info.floating_point_ops(self.model, inputs)

    floating_point_ops.is_trainwell_default = True  # type: ignore[attr-defined]  (skipped for a model of no size)

    def store_flos(self) -> None:
        self.state.total_flos += self.runtime.data_sum_of_number(float(self.current_flos))
        self.current_flos = 0

    # ------------------------------------------------------------------------------------------ logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Record ``logs`` (plus ``epoch`` and token counts) in ``state.log_history`` and fire ``on_log``."""
        boundary.log(self, logs, start_time)

    def _maybe_log_save_evaluate(
        self, tr_loss: Any, grad_norm: Any, model: nn.Module, trial: Any, epoch: int,
        ignore_keys_for_eval: Any, start_time: float, learning_rate: float | None = None,
    ) -> None:
        """At a step or epoch boundary: log, then evaluate, then save — as the control flags say."""
        boundary.maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, ignore_keys_for_eval, start_time,
                                         learning_rate)

    def _evaluate(self, trial: Any, ignore_keys_for_eval: Any, skip_scheduler: bool = False) -> dict[str, float]:
        metrics = boundary.evaluate_in_training(self, ignore_keys_for_eval, skip_scheduler)
        self._report_to_hp_search(trial, self.state.global_step, metrics)
        return metrics

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any = None) -> bool:
        """Update ``best_metric``/``best_global_step``; True when this evaluation is the best so far."""
        return boundary.determine_best_metric(self, metrics)

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        if self.is_world_process_zero():
            metric_utils.log_metrics(split, metrics)

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        if self.is_world_process_zero():
            metric_utils.save_metrics(local_output_dir(self.args), split, metrics, combined)

    @staticmethod
    def metrics_format(metrics: dict[str, Any]) -> dict[str, Any]:
        return metric_utils.metrics_format(metrics)

    # ------------------------------------------------------------------------------------------ evaluation
    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Evaluate and return metrics prefixed ``{metric_key_prefix}_``; a dict of datasets evaluates each."""
        with self._memory_tracker.track("eval") as add_memory, failures.stop_together(self, last_usable_checkpoint):
            return add_memory(evaluation.evaluate(self, eval_dataset, ignore_keys, metric_key_prefix))

    def predict(
        self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test"
    ) -> PredictionOutput:
        """Predictions (in dataset order), label ids when present, and ``test_`` metrics."""
        with self._memory_tracker.track("test") as add_memory, failures.stop_together(self, last_usable_checkpoint):
            output = evaluation.predict(self, test_dataset, ignore_keys, metric_key_prefix)
            add_memory(output.metrics)
            return output

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        return evaluation.evaluation_loop(self, dataloader, description, prediction_loss_only, ignore_keys,
                                          metric_key_prefix)

    def prediction_step(
        self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys: list[str] | None = None
    ) -> tuple[torch.Tensor | None, Any, Any]:
        """(loss, logits, labels) for one batch, without gradients."""
        return evaluation.prediction_step(self, model, inputs, prediction_loss_only, ignore_keys)

    # ------------------------------------------------------------------------------------------ data
    def get_train_dataloader(self) -> Any:
        """The training loader: seeded resumable sampler, collator, worker seeding; prepared by the runtime."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset: pass it to the Trainer.")
        return self._get_dataloader(self.train_dataset, "Training", self._train_batch_size, self._get_train_sampler,
                                    is_training=True)

    def _get_dataloader(self, dataset: Any, description: str, batch_size: int, sampler_fn: Any = None,
                        is_training: bool = False, dataloader_key: str | None = None) -> Any:
        """A loader over ``dataset`` with the columns the model does not take removed, as the reference's method
        (TRL's GRPO and RLOO trainers call it from their ``get_*_dataloader``): for training with its resumable
        parts (``build_train_feed``), else in trainwell's evaluation order unless ``sampler_fn`` returns a sampler.
        ``description`` names the set in the log of the removed columns; ``dataloader_key``: with persistent workers,
        kept in ``_eval_dataloaders`` under it."""
        return wiring.dataloader(self, dataset, description, batch_size, sampler_fn, is_training, dataloader_key)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        group = self._train_batch_size * self.args.gradient_accumulation_steps
        return loaders.sampler_for_training(dataset, self.args, group, self.processing_class,
                                            self.model_info.main_input_name)

    def _set_signature_columns_if_needed(self) -> None:
        """Fill ``_signature_columns`` from ``forward``'s parameters unless set (TRL's trainers set their own)."""
        if self._signature_columns is None:
            self._signature_columns = self.model_info.signature_columns(self.label_names)

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """The evaluation loader (dataset order); ``eval_dataset`` may be a dataset or a key of a dict of them."""
        dataset = loaders.pick_eval_dataset(eval_dataset, self.eval_dataset)
        key = eval_dataset if isinstance(eval_dataset, str) else "eval"
        return self._get_dataloader(dataset, "Evaluation", self.args.eval_batch_size, self._get_eval_sampler,
                                    dataloader_key=key)

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        return self._get_dataloader(test_dataset, "test", self.args.eval_batch_size, self._get_eval_sampler)

    def _get_eval_sampler(self, eval_dataset: Any) -> Any:
        """None: evaluation reads the dataset in order (sharded without duplicates across processes). A subclass may
        return a sampler of its own (TRL's GRPO does); the loader is then built with it, as the reference's."""
        return None

    # ------------------------------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        if self.training_run is not None:
            self.training_run.flush_tokens(self)
        self.store_flos()
        folder = self.checkpointer.save_checkpoint(self._get_output_dir(trial))
        if self.args.push_to_hub:
            self._push_from_checkpoint(str(folder))

    def _get_output_dir(self, trial: Any) -> str:
        return search.output_dir(self, trial)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model (safetensors), processing class and training args to ``output_dir``.

        Under FSDP the full weights are gathered from every process first: every process must call it.
        """
        contents.save_model(self, output_dir, _internal_call)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        if self.args.should_save:
            contents.save_model_files(self, output_dir or local_output_dir(self.args), state_dict)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        contents.save_optimizer_and_scheduler(self, output_dir)

    def _save_scaler(self, output_dir: str) -> None:
        contents.save_scaler(self, output_dir)

    def _save_rng_state(self, output_dir: str) -> None:
        contents.save_rng_and_data_position(self, output_dir, self.checkpointer.provided("_save_rng_state"))

    def save_state(self) -> None:
        """Write ``self.state`` as it is to ``output_dir/trainer_state.json`` (first process only). The callback
        states are those recorded when training began or at the last checkpoint, as with the reference."""
        if self.is_world_process_zero():
            os.makedirs(local_output_dir(self.args), exist_ok=True)
            self.state.save_to_json(os.path.join(local_output_dir(self.args), TRAINER_STATE_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        loading.load_model(model if model is not None else self.model, self.checkpointer.files(resume_from_checkpoint))

    def _load_optimizer_and_scheduler(self, checkpoint: str) -> None:
        loading.load_optimizer_and_scheduler(self, self.checkpointer.files(checkpoint))

    def _load_scaler(self, checkpoint: str) -> None:
        loading.load_scaler(self, self.checkpointer.files(checkpoint))

    def _load_rng_state(self, checkpoint: str) -> None:
        loading.load_rng_state(self.checkpointer.saved_rng(checkpoint), checkpoint, self.runtime.process_index)

    def _load_callback_state(self) -> None:
        loading.load_callback_state(self)

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        loading.load_best_model(self.model_wrapped, self.checkpointer.files(best), self.state.best_metric)

    # ------------------------------------------------------------------------------------------ misc
    def is_local_process_zero(self) -> bool:
        return self.runtime.is_local_main_process

    def is_world_process_zero(self) -> bool:
        return self.runtime.is_main_process

    def end(self) -> None:
        """Release the runtime (trackers, process group)."""
        self.runtime.end()

    def get_tp_size(self) -> int:
        """Tensor-parallel degree (``parallelism_config.tp_size``, or a model loaded tensor-parallel); 1 without."""
        return self.runtime.tp_size

    def get_cp_size(self) -> int:
        """Context-parallel degree (``parallelism_config.cp_size``); 1 without."""
        return self.runtime.cp_size

    def get_sp_size(self) -> int:
        """Sequence-parallel degree (``parallelism_config.sp_size``); 1 without."""
        return self.runtime.sp_size

    def create_model_card(
        self, language: str | None = None, license: str | None = None, tags: str | list[str] | None = None,
        model_name: str | None = None, finetuned_from: str | None = None, tasks: str | list[str] | None = None,
        dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
        dataset_args: str | list[str] | None = None,
    ) -> None:
        """Write a ``README.md`` model card into ``output_dir`` from this run (main process only; no Hub needed)."""
        from trainwell.report.model_card import create_model_card

        create_model_card(self, **{k: v for k, v in locals().items() if k not in ("self", "create_model_card")})

    def hyperparameter_search(
        self, hp_space: Callable[[Any], dict[str, Any]] | None = None,
        compute_objective: Callable[[dict[str, float]], float] | None = None, n_trials: int = 20,
        direction: str | list[str] = "minimize", backend: str | None = None,
        hp_name: Callable[[Any], str] | None = None, **kwargs: Any,
    ) -> BestRun | list[BestRun]:
        """Search hyperparameters with Optuna or Ray Tune (needs ``model_init``); see docs/search.md."""
        return search.search(self, hp_space, compute_objective, n_trials, direction, backend, hp_name, kwargs)

    def _hp_search_setup(self, trial: Any) -> None:
        self._trial = trial
        search.apply_trial(self, trial)

    def _report_to_hp_search(self, trial: Any, step: int, metrics: dict[str, float]) -> None:
        search.report(self, trial, step, metrics)

    def _tune_save_checkpoint(self, checkpoint_dir: str) -> None:
        self.checkpointer.write_into(os.path.join(checkpoint_dir, f"checkpoint-{self.state.global_step}"))

    # ------------------------------------------------------------------------------------------ the Hub
    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create (or find) the Hub repository ``hub_model_id`` (default: output_dir's name); main process only."""
        if self.is_world_process_zero():
            self.hub_model_id, self._hub = hub.init_repo(self.args, token, private)
            self.push_in_progress = None

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> Any:
        """Save the model and a model card (``kwargs`` go to ``create_model_card``) and upload ``output_dir``."""
        return hub.push_to_hub(self, self._hub, commit_message, blocking, token, revision, private, kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        hub.push_from_checkpoint(self, self._hub, checkpoint_folder,
                                 lambda: contents.save_model_files(self, local_output_dir(self.args), weights=False))

    def _finish_current_push(self) -> None:
        hub.finish_current_push(self)
