"""Checking what ``compute_metrics`` is and what it returns, at each evaluation.

Owns the checks the evaluation loop runs on the metrics function: its signature against ``batch_eval_metrics``
(also whenever the Trainer's ``compute_metrics`` is set: :class:`CheckedComputeMetrics`), its result (a dict of
metric name -> number, converted to Python numbers; a warning, once per metric, for a value that is not one),
and what counts as a number a best metric can be compared by.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from trainwell.utils.errors import short_repr
from trainwell.utils.metrics import to_python


def check_compute_metrics(compute_metrics: Callable | None, batch_eval_metrics: bool) -> None:
    """``compute_metrics`` is a function; with ``batch_eval_metrics`` it is called per batch and must accept
    ``compute_result``."""
    if compute_metrics is not None and not callable(compute_metrics):
        raise TypeError(
            f"compute_metrics={short_repr(compute_metrics)}: pass a function(eval_pred) that returns a dict of "
            "metric name -> number, e.g. lambda p: {'accuracy': float((p.predictions.argmax(-1) == "
            f"p.label_ids).mean())}}, or None (got {type(compute_metrics).__name__})."
        )
    if not batch_eval_metrics or compute_metrics is None:
        return
    try:
        params = inspect.signature(compute_metrics).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "compute_result" not in params and not takes_kwargs:
        name = getattr(compute_metrics, "__qualname__", type(compute_metrics).__name__)
        raise ValueError(
            f"batch_eval_metrics=True calls compute_metrics once per batch as compute_metrics(eval_pred, "
            f"compute_result=...), but {name} takes no compute_result argument. Add a compute_result parameter "
            "(accumulate per batch; return the metrics when it is True), or set batch_eval_metrics=False."
        )


class CheckedComputeMetrics:
    """The Trainer's ``compute_metrics`` attribute, checked by :func:`check_compute_metrics` whenever it is set (in
    ``__init__`` and on any later assignment), so a ``batch_eval_metrics`` mismatch fails before training rather
    than at the first evaluation."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj.__dict__.get("_compute_metrics")

    def __set__(self, obj: Any, value: Callable | None) -> None:
        check_compute_metrics(value, bool(getattr(obj.args, "batch_eval_metrics", False)))
        obj.__dict__["_compute_metrics"] = value


def is_metric_number(value: Any) -> bool:
    """A number a best metric can be compared by: int, float, a numpy scalar, a 0-d tensor or array."""
    if isinstance(value, numbers.Real):
        return True
    return callable(getattr(value, "item", None)) and getattr(value, "ndim", 1) == 0


#: per compute_metrics function, the metrics already warned about (a value that is not a number)
_WARNED_VALUES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def checked_metrics(result: Any, compute_metrics: Any) -> dict[str, Any]:
    """What ``compute_metrics`` returned, as a dict with Python numbers; a TypeError naming the fix when it is not
    a dict of metric name -> value, a warning (once per metric) for a value that is not a number."""
    fn = getattr(compute_metrics, "__qualname__", type(compute_metrics).__name__)
    shown = f"compute_metrics ({fn}) returned {short_repr(result)}"
    if not isinstance(result, Mapping):
        hint = " (a missing return?)" if result is None else ""
        if isinstance(result, tuple) and len(result) == 1 and isinstance(result[0], Mapping):
            hint = " (a trailing comma after the dict?)"
        raise TypeError(f"{shown}{hint}: it must return a dict of metric name -> number, e.g. "
                        f"{{'accuracy': 0.91}} (got {type(result).__name__}).")
    bad_key = next((key for key in result if not isinstance(key, str)), None)
    if bad_key is not None:
        raise TypeError(f"{shown}: its keys must be metric names (str), but {bad_key!r} is a "
                        f"{type(bad_key).__name__}: return e.g. {{'accuracy': 0.91}}.")
    metrics = to_python(dict(result))
    for key, value in metrics.items():
        if not _numeric(value) and _first_time(compute_metrics, key):
            warnings.warn(
                f"compute_metrics ({fn}) returned {key!r}: {short_repr(value, 60)}, which is not a number: trackers "
                f"drop it and it cannot be metric_for_best_model. Return a number (e.g. {key!r}: 0.91), or leave "
                "it out.", UserWarning, stacklevel=2,
            )
    return metrics


def _first_time(compute_metrics: Any, key: str) -> bool:
    try:
        seen = _WARNED_VALUES.setdefault(compute_metrics, set())
    except TypeError:  # not weak-referenceable: warn each time
        return True
    if key in seen:
        return False
    seen.add(key)
    return True


def _numeric(value: Any) -> bool:
    """A number, or lists/dicts of numbers (kept, as the reference keeps them)."""
    if isinstance(value, Mapping):
        return all(_numeric(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_numeric(v) for v in value)
    return isinstance(value, numbers.Real)
