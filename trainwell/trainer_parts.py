"""The rest of the ``Trainer`` override surface: optimizer and scheduler, flops and token counting,
logging, the log → evaluate → save boundary, and small public helpers.

Kept apart from ``trainwell.trainer`` only to keep both files readable; ``Trainer`` is the one class users
see. Every method here reads the Trainer's attributes (``args``, ``runtime``, ``state``, ``control``,
``callback_handler``, ``model``...) set up by ``Trainer.__init__``.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import nn

from trainwell.events.monitor import greater_is_better, is_improvement, metric_key
from trainwell.utils import metrics as metric_utils
from trainwell.utils import model as model_utils

logger = logging.getLogger(__name__)


class TrainerPartsMixin:
    # ------------------------------------------------------------------------------------------ data
    # ------------------------------------------------------------------------------------------ optimization
    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps, optimizer=self.optimizer)

    def create_optimizer(self) -> torch.optim.Optimizer:
        """Build the optimizer from ``optim`` (or ``optimizer_cls_and_kwargs``) with weight-decay groups."""
        if self.optimizer is None:
            from trainwell.optim.registry import create_optimizer

            self.optimizer = create_optimizer(self.model, self.args, self.optimizer_cls_and_kwargs)
        return self.optimizer

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[type, dict[str, Any]]:
        from trainwell.optim.registry import get_optimizer_cls_and_kwargs

        return get_optimizer_cls_and_kwargs(args, model)

    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        from trainwell.optim.param_groups import get_decay_parameter_names

        return get_decay_parameter_names(model)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """Build the LR schedule of ``lr_scheduler_type`` over ``num_training_steps`` (once per train())."""
        if self.lr_scheduler is None:
            from trainwell.optim.schedulers import get_scheduler

            self.lr_scheduler = get_scheduler(
                self.args.lr_scheduler_type,
                optimizer=optimizer if optimizer is not None else self.optimizer,
                num_warmup_steps=self.args.get_warmup_steps(num_training_steps),
                num_training_steps=num_training_steps,
                scheduler_specific_kwargs=dict(self.args.lr_scheduler_kwargs or {}),
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler

    @property
    def _scheduler_steps_on_eval(self) -> bool:
        """Plateau-style schedulers step on evaluation metrics, not after every optimizer step."""
        sched = self.lr_scheduler
        return isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau) or type(sched).__name__ == "GreedyLR"

    def _get_learning_rate(self) -> float:
        if self._scheduler_steps_on_eval:
            return self.optimizer.param_groups[0]["lr"]
        return self.lr_scheduler.get_last_lr()[0]

    def get_learning_rates(self) -> list[float]:
        if self.optimizer is None:
            raise ValueError("The optimizer is not created yet: call create_optimizer() or train() first.")
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_optimizer_group(self, param: torch.nn.Parameter | None = None) -> Any:
        if self.optimizer is None:
            raise ValueError("The optimizer is not created yet: call create_optimizer() or train() first.")
        if param is not None:
            for group in self.optimizer.param_groups:
                if any(p is param for p in group["params"]):
                    return group
            return None
        return [group["params"] for group in self.optimizer.param_groups]

    def get_num_trainable_parameters(self) -> int:
        return model_utils.num_parameters(self.model, trainable_only=True)

    # ------------------------------------------------------------------------------------------ counting
    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        if self._flops_params is None:
            inner = model_utils.unwrap(self.model)
            counter = getattr(inner, "num_parameters", None)
            if callable(counter):
                try:
                    self._flops_params = int(counter(exclude_embeddings=True))
                except TypeError:
                    self._flops_params = int(counter())
            else:
                self._flops_params = 0
        if not self._flops_params or not isinstance(inputs, dict):
            return 0
        main = inputs.get(model_utils.main_input_name(self.model))
        return 6 * main.numel() * self._flops_params if isinstance(main, torch.Tensor) else 0

    def _count_flos_and_tokens(self, inputs: Any) -> None:
        self.current_flos += self.floating_point_ops(inputs)
        mode = self.args.include_num_input_tokens_seen
        if mode == "no" or not isinstance(inputs, dict):
            return
        main = inputs.get(model_utils.main_input_name(self.model))
        if not isinstance(main, torch.Tensor):
            return
        mask = inputs.get("attention_mask")
        if mode == "non_padding" and isinstance(mask, torch.Tensor):
            self._tokens_pending = self._tokens_pending + mask.sum()  # stays on device until a log reads it
        else:
            self._tokens_pending = self._tokens_pending + main.numel()

    def _flush_token_count(self) -> None:
        pending = self._tokens_pending
        if isinstance(pending, torch.Tensor) or pending:
            total = torch.as_tensor(pending, device=self.runtime.device).reshape(())
            self.state.num_input_tokens_seen += int(self.runtime.reduce_sum(total).item())
            self._tokens_pending = 0

    def store_flos(self) -> None:
        flos = torch.tensor(float(self.current_flos), device=self.runtime.device)
        self.state.total_flos += float(self.runtime.reduce_sum(flos).item())
        self.current_flos = 0

    # ------------------------------------------------------------------------------------------ logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Record ``logs`` (plus ``epoch`` and token counts) in ``state.log_history`` and fire ``on_log``.

        Unlike the reference, the caller's dict is never modified.
        """
        logs = dict(logs)
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            self._flush_token_count()
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                seen = self.state.num_input_tokens_seen - self._initial_num_input_tokens_seen
                logs.update(metric_utils.speed_metrics("train", start_time, num_tokens=seen))
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    def _gather_loss_sum(self, value: Any) -> float:
        """The mean over processes of each process's loss sum (one collective, at log steps only)."""
        tensor = torch.as_tensor(value, dtype=torch.float32, device=self.runtime.device).reshape(1)
        if self.runtime.distributed:
            tensor = self.runtime.gather(tensor).mean()
        return float(tensor.sum().item())

    def _maybe_log_save_evaluate(
        self, tr_loss: Any, grad_norm: Any, model: nn.Module, trial: Any, epoch: int,
        ignore_keys_for_eval: Any, start_time: float, learning_rate: float | None = None,
    ) -> None:
        """At a step or epoch boundary: log, then evaluate, then save — as the control flags say."""
        control, state = self.control, self.state
        if control.should_log and state.global_step > self._globalstep_last_logged:
            loss_sum = self._gather_loss_sum(tr_loss.take())
            tr_loss.logged_total += loss_sum
            logs: dict[str, float] = {"loss": loss_sum / (state.global_step - self._globalstep_last_logged)}
            if grad_norm is not None:
                logs["grad_norm"] = float(grad_norm)
            if learning_rate is not None:
                logs["learning_rate"] = learning_rate
            self._globalstep_last_logged = state.global_step
            self.store_flos()
            self.log(logs, start_time)
        if self.control.should_evaluate:
            metrics = self._evaluate(trial, ignore_keys_for_eval)
            is_new_best = self._determine_best_metric(metrics, trial)
            if getattr(self.args.save_strategy, "value", self.args.save_strategy) == "best":
                self.control.should_save = is_new_best
        if self.control.should_save:
            self._save_checkpoint(model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _evaluate(self, trial: Any, ignore_keys_for_eval: Any, skip_scheduler: bool = False) -> dict[str, float]:
        metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        if self._scheduler_steps_on_eval and not skip_scheduler and self.args.metric_for_best_model:
            key = metric_key(self.args)
            if key not in metrics:
                raise KeyError(self._missing_metric_message(key, metrics))
            self.lr_scheduler.step(metrics[key])
        return metrics

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any = None) -> bool:
        """Update ``best_metric``/``best_global_step``; True when this evaluation is the best so far."""
        if self.args.metric_for_best_model is None:
            return False
        key = metric_key(self.args)
        if key not in metrics:
            raise KeyError(self._missing_metric_message(key, metrics))
        value = float(metrics[key])
        if is_improvement(value, self.state.best_metric, greater_is_better(self.args)):
            self.state.best_metric = value
            self.state.best_global_step = self.state.global_step
            return True
        return False

    @staticmethod
    def _missing_metric_message(key: str, metrics: dict[str, Any]) -> str:
        return (
            f"metric_for_best_model refers to {key!r}, which the evaluation did not produce "
            f"(available: {sorted(metrics)}). Set metric_for_best_model to one of those, or return it from "
            "compute_metrics."
        )

    def _model_for_evaluation(self) -> nn.Module:
        """The model to run evaluation with: the training wrapper during training, a half copy for *_full_eval."""
        args = self.args
        dtype = torch.float16 if args.fp16_full_eval else torch.bfloat16 if args.bf16_full_eval else None
        if dtype is not None:
            # A copy, so the trained weights are never cast in place (the reference casts them, and a later
            # train() then fails on a dtype mismatch).
            return copy.deepcopy(model_utils.unwrap(self.model)).to(dtype=dtype)
        if self.is_in_train or self.model_wrapped is not self.model:
            return self.model_wrapped
        return self.model

    # ------------------------------------------------------------------------------------------ saving
    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        if self.is_world_process_zero():
            metric_utils.log_metrics(split, metrics)

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        if self.is_world_process_zero():
            metric_utils.save_metrics(self.args.output_dir, split, metrics, combined)

    @staticmethod
    def metrics_format(metrics: dict[str, Any]) -> dict[str, Any]:
        return metric_utils.metrics_format(metrics)

    # ------------------------------------------------------------------------------------------ misc
    def is_local_process_zero(self) -> bool:
        return self.runtime.is_local_main_process

    def is_world_process_zero(self) -> bool:
        return self.runtime.is_main_process

    def call_model_init(self, trial: Any = None) -> nn.Module:
        import inspect

        n_args = len(inspect.signature(self.model_init).parameters)
        model = self.model_init() if n_args == 0 else self.model_init(trial)
        if model is None:
            raise RuntimeError("model_init returned None: it must return a torch.nn.Module.")
        return model

    def end(self) -> None:
        """Release the runtime (trackers, process group)."""
        self.runtime.end()

    def hyperparameter_search(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("Trainer.hyperparameter_search is not implemented in trainwell yet.")

    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "trainwell never uploads to the Hugging Face Hub: save_model() and push the folder with huggingface_hub."
        )
