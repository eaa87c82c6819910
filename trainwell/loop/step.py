"""One optimizer step: the micro-batches of an accumulation window, then clip, step, schedule and zero.

Owns :class:`OptimizerStep`, used by the fit loop once per window (what one micro-batch does, forward, loss and
backward, is ``Trainer.training_step``). For each window:

1. count the window's loss items and derive each micro-batch's loss factor (``trainwell.loop.accumulation``);
   the factor reaches ``training_step`` as ``trainer.micro_batch_loss_scale``, and the window's length as
   ``trainer.current_gradient_accumulation_steps`` (the reference's attribute);
2. run ``trainer.training_step`` per micro-batch in the engine's micro-batch context (all but the last
   without a gradient all-reduce, one per window; under DeepSpeed the last is marked as the window's
   boundary), adding each returned loss to the run's ``LossTracker``;
3. clip (unscaling fp16 gradients), apply the step through the run's step applier (``trainwell.loop.guard``: the
   plain step, the loss-scaled one, or ``skip_nonfinite_steps``' guard, bound once), step the scheduler unless the
   step was skipped (fp16 overflow) or the scheduler follows evaluation metrics, and let the engine drop the
   gradients.
   DeepSpeed has done its clip, step and zeroing in the boundary's backward already: its optimizer's ``step``
   is a no-op, the norm is the one it measured, and its engine leaves the gradients alone.

Callback events fire in between (``on_step_begin``, ``on_substep_end``, ``on_pre_optimizer_step``,
``on_optimizer_step``), only to callbacks that listen. Hot-path rules: no host-device sync, no dict rebuilt,
the trainable parameters listed once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainwell.backend.precision import clipping_limit
from trainwell.loop.accumulation import count_items, loss_factors, loss_scaling, uncounted_factors
from trainwell.optim.schedulers import steps_on_metrics
from trainwell.utils.model import accepts_keyword

if TYPE_CHECKING:
    from trainwell.hooks import TrainerHooks
    from trainwell.loop.progress import TrainingRun

PER_STEP_EVENTS = ("on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step")


class OptimizerStep:
    """Runs the optimizer steps of one ``train()`` call, one accumulation window at a time."""

    def __init__(self, hooks: TrainerHooks, model: torch.nn.Module, run: TrainingRun) -> None:
        args, runtime = hooks.args, hooks.runtime
        self.hooks, self.model, self.run = hooks, model, run
        self.precision = hooks.precision
        self.runtime = runtime
        world = runtime.data_parallel_size  # processes of one tensor-parallel group share their batches
        self.average_across = bool(args.average_tokens_across_devices) and world > 1
        self.loss_world = world if self.average_across else 1
        scaled, self.scaled_without_counts = loss_scaling(hooks.loss_is_scaled_for_ga,
                                                          bool(hooks.model_accepts_loss_kwargs),
                                                          hooks.compute_loss_func is not None)
        self.loss_normalized_by_window = scaled
        # With one micro-batch per step on one process and a mean loss, every factor is exactly 1: skip it all.
        self.needs_counts = scaled or args.gradient_accumulation_steps > 1 or self.average_across
        self.unscaled = [None] * args.gradient_accumulation_steps  # the factors then: each loss left as it is
        self.label_names = hooks.label_names or ["labels"]
        self.shift_labels = hooks.model_info.shifts_labels
        # Trainable parameters, listed once: clipping and zeroing then skip the module-tree walk per step.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.steps_schedule = not steps_on_metrics(hooks.lr_scheduler)
        self.max_norm = clipping_limit(args.max_grad_norm)
        # The engine's parts of a step, bound once: a micro-batch's context, and dropping the gradients after it
        self.micro_batch, self.drop_gradients = runtime.engine.micro_batch, runtime.engine.drop_gradients
        self.heart = hooks.heartbeat  # the run's progress counter (step_timeout's watchdog reads it)
        # The default floating_point_ops adds 0 for a model that reports no size: skip calling it then.
        default_flops = getattr(type(hooks).floating_point_ops, "is_trainwell_default", False)
        self.counts_flops = not default_flops or hooks.model_info.counts_flops
        self.grad_norm: Any = None
        self.learning_rate: float | None = None
        self.listening: dict[str, bool] = {}
        #: how the step is applied (the run's, bound once: ``trainwell.loop.guard``)
        self.applier = run.applier
        self.sums_loss = self.applier.needs_window_loss  # the guard's device path reads the window's summed loss
        self.window_loss: Any = None

    def listen(self) -> None:
        """Note which per-step events have listeners, once the callbacks are settled (after on_train_begin)."""
        hooks = self.hooks
        handler = hooks.callback_handler
        self.listening = {event: handler.has_listeners(event) for event in PER_STEP_EVENTS}
        # training_step, bound once: an override written to the reference's older (model, inputs) signature is
        # called without the count
        self.training_step = hooks.training_step
        if not accepts_keyword(hooks.training_step, "num_items_in_batch"):
            self.training_step = lambda model, inputs, num_items: hooks.training_step(model, inputs)

    def _fire(self, event: str) -> None:
        hooks = self.hooks
        hooks.control = getattr(hooks.callback_handler, event)(hooks.args, hooks.state, hooks.control)

    # ------------------------------------------------------------------------------------------ a window
    def run_window(self, batches: list[Any]) -> None:
        """Train on the micro-batches of one window, then take the optimizer step."""
        hooks, state, losses = self.hooks, self.hooks.state, self.run.losses
        num_items, factors = self._window_scaling(batches)
        hooks.current_gradient_accumulation_steps = len(batches)
        last = len(batches) - 1
        if self.listening["on_step_begin"]:
            self._fire("on_step_begin")
        else:
            hooks.control._new_step()  # the flag reset the handler would do, without the dispatch
        heart = self.heart  # step_timeout's progress counter: a plain int add per micro-batch
        for i, inputs in enumerate(batches):
            heart.beats += 1
            hooks.micro_batch_loss_scale = factors[i]
            with self.micro_batch(self.model, i == last):
                loss = self.training_step(self.model, inputs, num_items)
            losses.add(loss, state.global_step - losses.last_logged_step)
            if self.sums_loss:  # the guard's view of the window's loss: one add per micro-batch after the first
                self.window_loss = loss if i == 0 else self.window_loss + loss
            if self.counts_flops:
                hooks.current_flos += hooks.floating_point_ops(inputs)
            if self.run.counts_tokens:
                self.run.count_tokens(inputs)
            if i != last and self.listening["on_substep_end"]:
                self._fire("on_substep_end")
        self._optimizer_step()
        heart.beats += 1  # and one per optimizer step done (the watchdog arms once the first one is)

    def _window_scaling(self, batches: list[Any]) -> tuple[torch.Tensor | int | None, list[Any]]:
        """``num_items_in_batch`` for the window and each micro-batch's loss factor (None: leave as is)."""
        if not self.needs_counts:
            return None, self.unscaled
        device = self.runtime.device
        micro = [count_items(b, self.label_names, self.shift_labels) for b in batches]
        if any(items is None for items in micro):  # batches without tensors (TRL's GRPO): nothing to count
            return None, uncounted_factors(len(batches), self.scaled_without_counts)
        self.run.losses.count_empty(micro)
        total = sum(micro[1:], micro[0])  # stays a device tensor when the counts are (no host sync)
        if self.average_across:
            total = self.runtime.reduce_data_sum(torch.as_tensor(total, device=device))
        if isinstance(total, torch.Tensor):
            total = total.to(device)
        return total, loss_factors(micro, total, self.loss_world, self.loss_normalized_by_window)

    def _optimizer_step(self) -> None:
        hooks = self.hooks
        self.grad_norm = self.precision.clip_grad_norm_(self.params, self.max_norm)
        if self.listening["on_pre_optimizer_step"]:
            self._fire("on_pre_optimizer_step")
        skipped = self.applier.apply(self.grad_norm, self.window_loss)  # True: a loss scaler's skip (fp16 overflow)
        if self.listening["on_optimizer_step"]:
            self._fire("on_optimizer_step")
        self.learning_rate = hooks._get_learning_rate()
        if self.steps_schedule and not skipped:
            hooks.lr_scheduler.step()
        self.drop_gradients(self.params)
