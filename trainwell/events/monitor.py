"""Watching ``metric_for_best_model``: which key to read, which direction is better, what counts as better.

Owns: the shared rules used by ``EarlyStoppingCallback`` and by best-checkpoint tracking, so the two can
never disagree about what "improved" means. Keeping ``state.best_metric`` up to date belongs to the Trainer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


def metric_key(args: Any) -> str:
    """The eval-metrics key of ``args.metric_for_best_model``, with the ``eval_`` prefix added if missing.

    Raises ValueError when ``metric_for_best_model`` is not set.
    """
    name = getattr(args, "metric_for_best_model", None)
    if not name:
        raise ValueError(
            "metric_for_best_model is not set: pass TrainingArguments(metric_for_best_model=...), "
            "e.g. 'eval_loss' or the name of a metric returned by compute_metrics"
        )
    return name if name.startswith("eval_") else f"eval_{name}"


def greater_is_better(args: Any) -> bool:
    """``args.greater_is_better``; when unset, True unless the metric name ends with "loss"."""
    explicit = getattr(args, "greater_is_better", None)
    if explicit is not None:
        return bool(explicit)
    return not str(getattr(args, "metric_for_best_model", "") or "").endswith("loss")


def is_improvement(new: float, best: float | None, greater_is_better: bool, threshold: float = 0.0) -> bool:
    """Whether ``new`` beats ``best`` by strictly more than ``threshold`` in the better direction.

    There is nothing to beat when ``best`` is None (or NaN), so any real ``new`` improves; a NaN ``new``
    never does.
    """
    if new is None or math.isnan(new):
        return False
    if best is None or math.isnan(best):
        return True
    gain = new - best if greater_is_better else best - new
    return gain > threshold


class MetricMonitor:
    """Mixin for callbacks that watch ``metric_for_best_model`` in the eval metrics."""

    def monitored_value(self, args: Any, metrics: Mapping[str, Any] | None) -> float | None:
        """The monitored metric's value in ``metrics``, or None (with a warning naming the keys) if absent."""
        key = metric_key(args)
        value = (metrics or {}).get(key)
        if value is None:
            logger.warning(
                "%s watches %r (metric_for_best_model=%r), but the evaluation metrics only have %s; "
                "skipping this evaluation",
                type(self).__name__,
                key,
                getattr(args, "metric_for_best_model", None),
                sorted(metrics or {}),
            )
            return None
        return float(value)

    def improved(self, args: Any, value: float, best: float | None, threshold: float = 0.0) -> bool:
        """Whether ``value`` improves on ``best`` in the direction given by ``args``."""
        return is_improvement(value, best, greater_is_better(args), threshold)
