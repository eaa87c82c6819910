"""Stopping a run when the monitored metric stops improving.

Owns: ``EarlyStoppingCallback``. The comparison rules live in ``monitor.py``; ``state.best_metric`` is
kept up to date by the Trainer after each ``on_evaluate``, so during ``on_evaluate`` it still holds the best
value *before* this evaluation.
"""

from __future__ import annotations

from typing import Any

from trainwell.events.callback import TrainerCallback
from trainwell.events.monitor import MetricMonitor
from trainwell.outputs import IntervalStrategy
from trainwell.state import ExportableState, TrainerControl, TrainerState


class EarlyStoppingCallback(TrainerCallback, ExportableState, MetricMonitor):
    """Stops training after ``early_stopping_patience`` evaluations in a row without improvement.

    An evaluation improves when ``metric_for_best_model`` beats ``state.best_metric`` by strictly more
    than ``early_stopping_threshold`` in the direction of ``greater_is_better``. An improvement resets the
    counter; anything else increments it, and reaching the patience sets ``should_training_stop``. An
    evaluation without the metric is skipped with a warning. The counter survives a resume through
    ``state()``/``from_state``.

    It needs ``metric_for_best_model`` and an ``eval_strategy`` other than ``"no"`` (checked at train
    begin, with a ValueError naming the fix). It does not need ``load_best_model_at_end`` (whatever the
    reference's documentation says): the best metric is tracked whenever ``metric_for_best_model`` is set.
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0) -> None:
        if isinstance(early_stopping_patience, bool) or not isinstance(early_stopping_patience, int):
            raise ValueError(f"early_stopping_patience={early_stopping_patience!r}: pass a positive integer")
        if early_stopping_patience < 1:
            raise ValueError(
                f"early_stopping_patience={early_stopping_patience}: pass a positive integer (1 stops at the "
                "first evaluation that does not improve)"
            )
        threshold = 0.0 if early_stopping_threshold is None else float(early_stopping_threshold)
        if threshold < 0:
            raise ValueError(
                f"early_stopping_threshold={early_stopping_threshold}: pass a non-negative number, the minimum "
                "gain that counts as an improvement"
            )
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = threshold
        # Evaluations in a row that did not improve on the best metric.
        self.early_stopping_patience_counter = 0

    def check_metric_value(self, args: Any, state: TrainerState, control: TrainerControl, metric_value: float) -> None:
        """Reset the counter if ``metric_value`` improves on ``state.best_metric``, else increment it."""
        if self.improved(args, metric_value, state.best_metric, self.early_stopping_threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not getattr(args, "metric_for_best_model", None):
            raise ValueError(
                "EarlyStoppingCallback needs a metric to watch: pass TrainingArguments(metric_for_best_model=...), "
                "e.g. metric_for_best_model='eval_loss'"
            )
        if getattr(args, "eval_strategy", IntervalStrategy.NO) == IntervalStrategy.NO:
            raise ValueError(
                "EarlyStoppingCallback needs evaluations, but eval_strategy='no': pass "
                "TrainingArguments(eval_strategy='steps') or eval_strategy='epoch' (and an eval_dataset)"
            )

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        value = self.monitored_value(args, kwargs.get("metrics"))
        if value is None:
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict[str, Any]:
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }
