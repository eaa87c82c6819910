"""The default mapping from logging/evaluation/save strategies to control flags.

Owns: ``DefaultFlowCallback``. Acting on the flags (logging, evaluating, writing checkpoints, stopping)
belongs to the fit loop; the ``"best"`` save strategy is decided by the Trainer after an evaluation, not here.
"""

from __future__ import annotations

from typing import Any

from trainwell.events.callback import TrainerCallback
from trainwell.outputs import IntervalStrategy, SaveStrategy
from trainwell.state import TrainerControl, TrainerState


class DefaultFlowCallback(TrainerCallback):
    """Sets ``should_log``/``should_evaluate``/``should_save``/``should_training_stop`` from the strategies.

    After each optimizer step (``on_step_end``), with ``step = state.global_step``:

    * log at step 1 when ``logging_first_step``, and every ``state.logging_steps`` steps with the
      ``"steps"`` logging strategy;
    * evaluate every ``state.eval_steps`` steps with the ``"steps"`` eval strategy, once
      ``args.eval_delay <= step``;
    * save every ``state.save_steps`` steps with the ``"steps"`` save strategy;
    * at ``step >= state.max_steps``: stop training; with the ``"steps"`` eval strategy also evaluate
      (subject to ``eval_delay``), so the final model is always evaluated; with the ``"steps"`` save
      strategy also save (``checkpoint-{max_steps}``, as in the reference).

    After each epoch (``on_epoch_end``): log, evaluate (once ``args.eval_delay <= state.epoch``) and save
    for the ``"epoch"`` strategies.

    Differences from the reference, on purpose:

    * ``logging_strategy="no"`` never logs, as documented: ``logging_first_step`` does not override it
      (the reference logs step 1 anyway).
    """

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        step = state.global_step
        logging_strategy = getattr(args, "logging_strategy", IntervalStrategy.STEPS)
        eval_strategy = getattr(args, "eval_strategy", IntervalStrategy.NO)
        save_strategy = getattr(args, "save_strategy", SaveStrategy.STEPS)
        eval_ready = getattr(args, "eval_delay", 0) <= step

        if logging_strategy != IntervalStrategy.NO:
            if step == 1 and getattr(args, "logging_first_step", False):
                control.should_log = True
            if logging_strategy == IntervalStrategy.STEPS and _every(step, state.logging_steps):
                control.should_log = True

        if eval_strategy == IntervalStrategy.STEPS and eval_ready and _every(step, state.eval_steps):
            control.should_evaluate = True

        if save_strategy == SaveStrategy.STEPS and _every(step, state.save_steps):
            control.should_save = True

        if step >= state.max_steps:
            control.should_training_stop = True
            if eval_strategy == IntervalStrategy.STEPS and eval_ready:
                control.should_evaluate = True
            if save_strategy == SaveStrategy.STEPS:  # the last step is saved, as in the reference
                control.should_save = True
        return control

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        if getattr(args, "logging_strategy", IntervalStrategy.STEPS) == IntervalStrategy.EPOCH:
            control.should_log = True
        if (
            getattr(args, "eval_strategy", IntervalStrategy.NO) == IntervalStrategy.EPOCH
            and getattr(args, "eval_delay", 0) <= state.epoch
        ):
            control.should_evaluate = True
        if getattr(args, "save_strategy", SaveStrategy.STEPS) == SaveStrategy.EPOCH:
            control.should_save = True
        return control


def _every(step: int, interval: int | float | None) -> bool:
    # A zero or missing interval means "never"; argument validation rejects it with a clear error earlier,
    # so this only keeps a hand-built state from dividing by zero.
    return bool(interval) and interval > 0 and step % interval == 0
