"""The contract between the Trainer and the code that drives it: what the loops may call and read.

``TrainerHooks`` lists, exactly, the Trainer methods that ``trainwell.loop`` (fit, step, epochs, boundary,
evaluation) and ``trainwell.checkpoint`` call: the reference Trainer's overridable methods, under the
reference's names and signatures (the underscore ones too: subclasses of the reference override
``_prepare_inputs``, ``_save_checkpoint``, ``_maybe_log_save_evaluate``...). Every call goes through the
Trainer object, so an override in a subclass is honoured; ``tests/test_hooks.py`` overrides each one and checks
that train, evaluate, predict and resume call it. Below the methods are the attributes the loops read and
write: the reference's public ones, plus trainwell's components (``runtime``, ``precision``) and the state and
checkpointer of the ``train()`` call in progress (``training_run``, ``checkpointer``). The loops read nothing else
of the Trainer.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from trainwell.backend.precision import Precision
    from trainwell.backend.runtime import Runtime
    from trainwell.backend.stall import Heartbeat
    from trainwell.checkpoint.checkpointer import Checkpointer
    from trainwell.events.handler import CallbackHandler
    from trainwell.loop.plan import StepPlan
    from trainwell.outputs import EvalLoopOutput
    from trainwell.state import TrainerControl, TrainerState
    from trainwell.training_args import TrainingArguments
    from trainwell.utils.model import ModelInfo


class TrainerHooks(Protocol):
    """What the loops see of a Trainer. The methods' behaviour is documented on ``trainwell.Trainer``."""

    # ------------------------------------------------------------------------------ training
    def get_train_dataloader(self) -> Any: ...
    def set_initial_training_values(self, args: TrainingArguments, dataloader: Any) -> StepPlan: ...
    def num_examples(self, dataloader: Any) -> int: ...
    def get_total_train_batch_size(self, args: TrainingArguments) -> int: ...
    def get_num_trainable_parameters(self) -> int: ...
    def call_model_init(self, trial: Any = None) -> nn.Module: ...
    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer: ...
    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any: ...
    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor: ...
    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> Any: ...
    def compute_loss_context_manager(self) -> contextlib.AbstractContextManager: ...
    def autocast_smart_context_manager(
        self, cache_enabled: bool | None = True
    ) -> contextlib.AbstractContextManager: ...
    def _prepare_inputs(self, inputs: Any) -> Any: ...
    def floating_point_ops(self, inputs: dict[str, Any]) -> int: ...
    def store_flos(self) -> None: ...
    def _get_learning_rate(self) -> float: ...
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None: ...
    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, model: nn.Module, trial: Any, epoch: int,
                                 ignore_keys_for_eval: Any, start_time: float,
                                 learning_rate: float | None = None) -> None: ...
    def _evaluate(self, trial: Any, ignore_keys_for_eval: Any, skip_scheduler: bool = False) -> dict[str, float]: ...
    def _determine_best_metric(self, metrics: dict[str, float], trial: Any = None) -> bool: ...
    def _load_best_model(self) -> None: ...

    # ------------------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]: ...
    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any: ...
    def get_test_dataloader(self, test_dataset: Any) -> Any: ...
    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput: ...
    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]: ...

    # ------------------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None: ...
    def _get_output_dir(self, trial: Any) -> str: ...
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None: ...
    def _save_scaler(self, output_dir: str) -> None: ...
    def _save_rng_state(self, output_dir: str) -> None: ...
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None: ...
    def _load_optimizer_and_scheduler(self, checkpoint: str) -> None: ...
    def _load_scaler(self, checkpoint: str) -> None: ...
    def _load_rng_state(self, checkpoint: str) -> None: ...
    def _load_callback_state(self) -> None: ...
    def _finish_current_push(self) -> None: ...

    # ------------------------------------------------------------------------------ processes
    def is_local_process_zero(self) -> bool: ...
    def is_world_process_zero(self) -> bool: ...

    # ------------------------------------------------------------------------------ attributes
    args: TrainingArguments
    state: TrainerState
    control: TrainerControl
    callback_handler: CallbackHandler
    model: nn.Module
    model_wrapped: nn.Module
    deepspeed: Any  #: the DeepSpeed engine once prepared (None otherwise), as the reference
    optimizer: Any
    lr_scheduler: Any
    train_dataset: Any
    eval_dataset: Any
    processing_class: Any
    data_collator: Any
    compute_metrics: Any
    preprocess_logits_for_metrics: Any
    compute_loss_func: Any
    label_names: list[str]
    label_smoother: Any
    can_return_loss: bool
    model_accepts_loss_kwargs: bool
    loss_is_scaled_for_ga: bool | None
    is_in_train: bool
    current_flos: float
    #: micro-batches in the accumulation window being trained (the reference's attribute)
    current_gradient_accumulation_steps: int
    #: the factor ``training_step`` multiplies the micro-batch's loss by (see ``trainwell.loop.accumulation``)
    micro_batch_loss_scale: torch.Tensor | float | None
    model_info: ModelInfo
    runtime: Runtime
    precision: Precision
    #: the counters and positions of the ``train()`` call in progress (the last one after it returns)
    #: (a ``trainwell.loop.progress.TrainingRun``: not imported here, since that module names this protocol, and
    #: a circle of imports, type-only ones included, never leaves its folder: ``tests/test_layers.py``)
    training_run: Any
    #: the checkpoints of the ``train()`` call in progress (the last one after it returns; before the first, one
    #: that saves synchronously): its saves, its resume, the providers the loop registers
    checkpointer: Checkpointer
    #: the run's progress counter: the loops add one per micro-batch, optimizer step, evaluation batch and save end;
    #: ``step_timeout``'s watchdog reads it (one per Trainer: two trainings in one process never share one)
    heartbeat: Heartbeat


def hook_methods() -> list[str]:
    """The names of the contract's methods, in the order above."""
    return [name for name, value in vars(TrainerHooks).items() if callable(value) and not name.startswith("__")]
