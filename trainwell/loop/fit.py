"""The training loop: epochs, accumulation windows, optimizer steps and the callback events between them.

Owns one call of ``Trainer.train()``: the step arithmetic, resuming at the right batch, walking each epoch
window by window, and finishing with the train metrics. What a micro-batch does (forward, loss, backward)
is ``Trainer.training_step``, so subclasses that override it are honoured; what happens at a boundary (log,
evaluate, save) is ``Trainer._maybe_log_save_evaluate``. The order of events is written once, on
``trainwell.events.callback.TrainerCallback``.

Hot-path rules: no host-device sync per step (losses and norms stay tensors on an accelerator until a log
step reads them), no dict rebuilt per step, and event dispatch only to callbacks that listen.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator

import torch

from trainwell.loop.accumulation import count_items, loss_factors, updates_per_epoch, window_sizes
from trainwell.outputs import TrainOutput
from trainwell.trainer_parts import TrainerPartsMixin
from trainwell.utils.model import unwrap
from trainwell.utils.metrics import speed_metrics

if TYPE_CHECKING:
    from trainwell.trainer import Trainer

logger = logging.getLogger(__name__)


class LossTracker:
    """Sums the (already scaled) micro-batch losses between two log steps.

    On the CPU a Python float is cheapest (reading a CPU tensor is not a device sync); on an accelerator the
    sum stays a device tensor and is read only by :meth:`take`, at a log step.
    """

    def __init__(self, device: torch.device, nan_inf_filter: bool) -> None:
        self.on_host = device.type == "cpu"
        self.nan_inf_filter = nan_inf_filter
        self.device = device
        self.total = 0.0 if self.on_host else torch.zeros((), device=device)
        self.logged_total = 0.0  # every loss taken so far in this train() call

    def add(self, loss: torch.Tensor, steps_since_log: int) -> None:
        # A non-finite loss is replaced by the mean loss per step since the last log, as the reference does.
        if self.on_host:
            value = float(loss)
            if self.nan_inf_filter and not math.isfinite(value):
                value = self.total / (1 + steps_since_log)
            self.total += value
        elif self.nan_inf_filter:
            fallback = self.total / (1 + steps_since_log)
            self.total = self.total + torch.where(torch.isfinite(loss), loss.to(self.total.dtype), fallback)
        else:
            self.total = self.total + loss

    def take(self) -> torch.Tensor | float:
        """The sum since the last take (a sync point on an accelerator), resetting it."""
        value = self.total
        self.total = 0.0 if self.on_host else torch.zeros((), device=self.device)
        return value


class FitLoop:
    """One ``train()`` call. Created by the Trainer, used once."""

    def __init__(self, trainer: Trainer, resume_from_checkpoint: str | None, trial: Any, ignore_keys: Any) -> None:
        self.trainer = trainer
        self.args = trainer.args
        self.runtime = trainer.runtime
        self.resume_from_checkpoint = resume_from_checkpoint
        self.trial = trial
        self.ignore_keys = ignore_keys
        self.accumulation = self.args.gradient_accumulation_steps

    # ------------------------------------------------------------------------------------------- plan
    def run(self) -> TrainOutput:
        t = self.trainer
        train_dataloader = t.get_train_dataloader()
        plan = t.set_initial_training_values(self.args, train_dataloader)
        num_train_epochs, self.updates_per_epoch, _, num_train_samples, _, self.steps_in_epoch, max_steps = plan
        epochs_trained, windows_done = t._init_training_state(
            max_steps, self.updates_per_epoch, self.resume_from_checkpoint, self.trial
        )
        model = t._prepare_for_training(max_steps, train_dataloader, self.resume_from_checkpoint)
        self.model = model
        self.train_dataloader = train_dataloader

        start_time = time.time()
        self.start_time = start_time
        t._initial_global_step = t.state.global_step
        t._initial_num_input_tokens_seen = t.state.num_input_tokens_seen
        t._globalstep_last_logged = t.state.global_step
        self.losses = LossTracker(self.runtime.device, self.args.logging_nan_inf_filter)
        t._loss_tracker = self.losses
        self._setup_step_policy()

        model.zero_grad(set_to_none=True)
        t.control = t.callback_handler.on_train_begin(self.args, t.state, t.control)
        self._cache_listeners()
        if self.args.eval_on_start:
            t._evaluate(self.trial, self.ignore_keys, skip_scheduler=True)

        if self.resume_from_checkpoint is not None and t.state.global_step >= max_steps:
            # A checkpoint of a finished run (the reference takes one step past max_steps here).
            logger.warning(
                "The checkpoint is at step %d and max_steps is %d: nothing is left to train. Raise max_steps "
                "(or num_train_epochs) to train further.", t.state.global_step, max_steps,
            )
            num_train_epochs = epochs_trained  # no epoch left to run
        for epoch in range(epochs_trained, num_train_epochs):
            skip_windows = windows_done if epoch == epochs_trained else 0
            t.control = t.callback_handler.on_epoch_begin(self.args, t.state, t.control)
            self._run_epoch(epoch, skip_windows)
            if t.control.should_training_stop:
                break
        return self._finish(num_train_samples, start_time)

    def _setup_step_policy(self) -> None:
        """Decide once how micro-batch losses are scaled (see ``trainwell.loop.accumulation``)."""
        t = self.trainer
        world = self.runtime.num_processes
        self.average_across = bool(self.args.average_tokens_across_devices) and world > 1
        self.loss_world = world if self.average_across else 1
        scaled = t.loss_is_scaled_for_ga
        if scaled is None:
            scaled = bool(t.model_accepts_loss_kwargs) or t.compute_loss_func is not None
        self.loss_normalized_by_window = scaled
        # With one micro-batch per step on one process and a mean loss, every factor is exactly 1: skip it all.
        self.needs_counts = scaled or self.accumulation > 1 or self.average_across
        self.label_names = t.label_names or ["labels"]
        self.shift_labels = t._loss_shifts_labels
        # Trainable parameters, listed once: clipping and zeroing then skip the module-tree walk per step.
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._scheduler_on_eval = t._scheduler_steps_on_eval
        self._may_skip = self.runtime.scaler is not None
        self._max_norm = self.args.max_grad_norm if self.args.max_grad_norm and self.args.max_grad_norm > 0 else math.inf
        self._no_sync = contextlib.nullcontext()
        # Flops and tokens are only counted when something can be counted: token counting is on, the model
        # reports its parameter count, or a subclass overrides floating_point_ops.
        self._counts_inputs = (
            self.args.include_num_input_tokens_seen != "no"
            or t.floating_point_ops.__func__ is not TrainerPartsMixin.floating_point_ops
            or callable(getattr(unwrap(self.model), "num_parameters", None))
        )
        steps = self.steps_in_epoch
        self._epoch_length = steps if steps is not None else self.args.max_steps * self.accumulation

    def _cache_listeners(self) -> None:
        """Which per-step events have listeners, decided once the callbacks are settled (after on_train_begin)."""
        handler = self.trainer.callback_handler
        self._fires = {
            event: handler.has_listeners(event)
            for event in ("on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step")
        }

    # ------------------------------------------------------------------------------------------- epochs
    def _run_epoch(self, epoch: int, skip_windows: int) -> None:
        t = self.trainer
        sizes = self._epoch_windows()
        skip_batches = sum(sizes[:skip_windows]) if sizes is not None else skip_windows * self.accumulation
        iterator = t._epoch_iterator(self.train_dataloader, epoch, skip_batches, self.resume_from_checkpoint)
        if self.resume_from_checkpoint is not None and epoch == t._resume_epoch:
            t._restore_rng(self.resume_from_checkpoint)
        step = skip_batches - 1  # index of the last micro-batch consumed in this epoch
        window = skip_windows
        while not (t.control.should_epoch_stop or t.control.should_training_stop):
            if sizes is not None and window >= len(sizes):
                break
            size = sizes[window] if sizes is not None else self.accumulation
            batches = _take(iterator, size)
            if not batches:
                break
            step = self._run_window(batches, epoch, step)
            window += 1
            if sizes is None and len(batches) < size:
                break
        if step < 0:
            logger.warning(
                "The training data yielded no batch in epoch %d; stopping at step %d. An IterableDataset shorter "
                "than max_steps × batch size ends training early like this.",
                epoch,
                t.state.global_step,
            )
            t.control.should_training_stop = True
        t.control = t.callback_handler.on_epoch_end(self.args, t.state, t.control)
        t._maybe_log_save_evaluate(
            self.losses, self._grad_norm, self.model, self.trial, epoch, self.ignore_keys, self.start_time,
            learning_rate=self._learning_rate,
        )

    def _epoch_windows(self) -> list[int] | None:
        """Micro-batches per window for a sized epoch; ``None`` for an iterable one (always full windows)."""
        if self.steps_in_epoch is None:
            return None
        return window_sizes(self.steps_in_epoch, self.accumulation)

    _grad_norm: Any = None
    _learning_rate: float | None = None

    # ------------------------------------------------------------------------------------------- one step
    def _run_window(self, batches: list[Any], epoch: int, step: int) -> int:
        t, args, state = self.trainer, self.args, self.trainer.state
        handler = t.callback_handler
        num_items, factors = self._window_scaling(batches)
        last = len(batches) - 1
        for i, inputs in enumerate(batches):
            step += 1
            if i == 0:
                if self._fires["on_step_begin"]:
                    t.control = handler.on_step_begin(args, state, t.control)
                else:
                    t.control._new_step()  # the flag reset the handler would do, without the dispatch
            t._loss_factor = factors[i] if factors is not None else None
            with self._no_sync if i == last else self.runtime.no_sync(self.model):
                loss = t.training_step(self.model, inputs, num_items)
            self.losses.add(loss, state.global_step - t._globalstep_last_logged)
            if self._counts_inputs:
                t._count_flos_and_tokens(inputs)
            if i != last and self._fires["on_substep_end"]:
                t.control = handler.on_substep_end(args, state, t.control)
        self._optimizer_step()
        state.global_step += 1
        state.epoch = epoch + (step + 1) / self._epoch_length
        t.control = handler.on_step_end(args, state, t.control)
        t._maybe_log_save_evaluate(
            self.losses, self._grad_norm, self.model, self.trial, epoch, self.ignore_keys, self.start_time,
            learning_rate=self._learning_rate,
        )
        return step


    def _window_scaling(self, batches: list[Any]) -> tuple[torch.Tensor | int | None, list[Any] | None]:
        """``num_items_in_batch`` for the window and each micro-batch's loss factor (None: leave as is)."""
        if not self.needs_counts:
            return None, None
        device = self.runtime.device
        micro = [count_items(b, self.label_names, self.shift_labels) for b in batches]
        total = sum(micro[1:], micro[0])  # stays a device tensor when the counts are (no host sync)
        if self.average_across:
            total = self.runtime.reduce_sum(torch.as_tensor(total, device=device))
        if isinstance(total, torch.Tensor):
            total = total.to(device)
        return total, loss_factors(micro, total, self.loss_world, self.loss_normalized_by_window)

    def _optimizer_step(self) -> None:
        t, args, handler = self.trainer, self.args, self.trainer.callback_handler
        self._grad_norm = self.runtime.clip_grad_norm_(self._params, self._max_norm)
        if self._fires["on_pre_optimizer_step"]:
            t.control = handler.on_pre_optimizer_step(args, t.state, t.control)
        t.optimizer.step()
        if self._fires["on_optimizer_step"]:
            t.control = handler.on_optimizer_step(args, t.state, t.control)
        self._learning_rate = t._get_learning_rate()
        # Only a grad scaler can skip a step (fp16 overflow); asking Accelerate otherwise is wasted work.
        if not self._scheduler_on_eval and not (self._may_skip and self.runtime.optimizer_step_was_skipped):
            t.lr_scheduler.step()
        for param in self._params:  # model.zero_grad() would walk the module tree again
            param.grad = None

    # ------------------------------------------------------------------------------------------- finish
    def _finish(self, num_train_samples: float, start_time: float) -> TrainOutput:
        t = self.trainer
        remaining = self.losses.take()
        self.losses.logged_total += float(t._gather_loss_sum(remaining))
        steps_this_call = t.state.global_step - t._initial_global_step
        train_loss = self.losses.logged_total / max(steps_this_call, 0.001)
        metrics = speed_metrics(
            "train",
            start_time,
            num_samples=num_train_samples * steps_this_call / max(t.state.max_steps, 1),
            num_steps=steps_this_call,
        )
        t.store_flos()
        metrics["total_flos"] = t.state.total_flos
        metrics["train_loss"] = train_loss
        if self.args.include_num_input_tokens_seen != "no":
            metrics["num_input_tokens_seen"] = t.state.num_input_tokens_seen
        if t.state.epoch is not None:
            metrics["epoch"] = t.state.epoch  # the reference's TrainOutput.metrics carries it too
        t.log(metrics)
        t._finish_training()
        t.control = t.callback_handler.on_train_end(self.args, t.state, t.control)
        return TrainOutput(t.state.global_step, train_loss, metrics)


def _take(iterator: Iterator[Any], count: int) -> list[Any]:
    batches = []
    for _ in range(count):
        try:
            batches.append(next(iterator))
        except StopIteration:
            break
    return batches


def max_steps_plan(args: Any, batches_per_epoch: int | None, total_batch_size: int) -> dict[str, Any]:
    """The step arithmetic of ``set_initial_training_values``, as a pure function.

    Sized data: ``updates_per_epoch = max(ceil(batches / GA), 1)``; ``max_steps`` wins over epochs when > 0
    (then ``epochs = ceil(max_steps / updates_per_epoch)``), else ``max_steps = ceil(epochs × updates)`` and
    ``ceil(epochs)`` epochs run. Unsized data needs ``max_steps`` and runs "forever" until it is reached.
    """
    ga = args.gradient_accumulation_steps
    if batches_per_epoch is not None:
        upe = updates_per_epoch(batches_per_epoch, ga)
        if args.max_steps > 0:
            max_steps = args.max_steps
            epochs = max_steps // upe + int(max_steps % upe > 0)
            samples = max_steps * total_batch_size
        else:
            max_steps = math.ceil(args.num_train_epochs * upe)
            epochs = math.ceil(args.num_train_epochs)
            samples = None  # filled in by the caller from the dataset length
        return {"epochs": epochs, "updates_per_epoch": upe, "max_steps": max_steps, "samples": samples,
                "steps_in_epoch": batches_per_epoch}
    if args.max_steps <= 0:
        raise ValueError(
            f"max_steps={args.max_steps}: the training dataset has no length (an IterableDataset), so the number "
            "of steps cannot be derived from num_train_epochs. Pass max_steps > 0."
        )
    return {"epochs": sys.maxsize, "updates_per_epoch": args.max_steps, "max_steps": args.max_steps,
            "samples": args.max_steps * total_batch_size, "steps_in_epoch": None}
