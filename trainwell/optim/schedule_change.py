"""What a resume with other arguments does to the learning-rate schedule, said in numbers before it happens.

A resumed run builds its scheduler from *this* run's arguments (``lr_scheduler_type``, ``warmup_steps``,
``lr_scheduler_kwargs`` and the total steps, from ``max_steps`` or ``num_train_epochs``), then loads the
checkpoint's scheduler state into it: the step count and the peak learning rate (``LambdaLR``'s ``base_lrs``)
come from the checkpoint, the shape of the curve from the new arguments. The first resumed step still takes the
learning rate the checkpoint's optimizer holds; from the next one on, the new shape applies. So a resume with
another ``max_steps`` silently moves the warmup and the end of the decay (warmup 50 -> 5 steps, the learning rate
halved at once), and a new ``learning_rate`` changes nothing. The reference says nothing; ``schedule_changes``
names each value that changes, before and after, for the resume warning (``trainwell.checkpoint.resume``).

Pure: it builds throwaway schedulers on a one-parameter optimizer to read their factors.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainwell.outputs import SchedulerType

_KIND_NAMES = {kind.value for kind in SchedulerType}


@dataclass(frozen=True)
class Schedule:
    """A schedule as the arguments describe it: its kind, peak learning rate, warmup and total steps, options."""

    kind: str
    peak: float
    warmup: int
    total: int
    options: dict[str, Any] = field(default_factory=dict)

    def factor(self, step: int) -> float | None:
        """The multiplier of the peak after ``step`` scheduler steps; None for a schedule driven by metrics, or
        arguments no scheduler accepts."""
        import torch

        from trainwell.optim.schedulers import get_scheduler

        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        warmup = None if self.kind == SchedulerType.CONSTANT.value else self.warmup
        try:
            with _quiet():
                scheduler = get_scheduler(self.kind, optimizer, warmup, self.total, dict(self.options))
        except (TypeError, ValueError):
            return None
        lambdas = getattr(scheduler, "lr_lambdas", None)
        return float(lambdas[0](step)) if lambdas else None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Build a throwaway scheduler without repeating the warnings the run's own scheduler gave."""
    log = logging.getLogger("trainwell.optim.schedulers")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def _warmup(value: Any, ratio: Any, total: int) -> int:
    """``warmup_steps`` as ``TrainingArguments.get_warmup_steps`` reads it (a number below 1 is a ratio of the total
    steps), or an older run's ``warmup_ratio``."""
    steps = value if _finite(value) else 0  # a crafted file's NaN or 1e999 counts as none
    if steps >= 1:
        return int(steps)
    if not steps and _finite(ratio) and ratio > 0:
        steps = ratio
    return math.ceil(total * steps)


def _finite(value: Any) -> bool:
    """A finite int or float (not a bool): what a ``training_args.json`` value must be to count."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return -1e300 < value < 1e300  # false for NaN and infinities; an int of 400 digits is not a float


def schedule_of(args: Mapping[str, Any] | Any, total: int) -> Schedule | None:
    """The schedule that arguments (a ``training_args.json`` dict or a ``TrainingArguments``) give over ``total``
    steps; None when they do not name a known one."""
    get = args.get if isinstance(args, Mapping) else lambda key, default=None: getattr(args, key, default)
    kind = get("lr_scheduler_type", "linear")
    kind = getattr(kind, "value", kind)
    peak = get("learning_rate")
    if not isinstance(kind, str) or kind not in _KIND_NAMES or not _finite(peak):
        return None
    options = get("lr_scheduler_kwargs") or {}
    options = dict(options) if isinstance(options, Mapping) else {}
    return Schedule(kind, float(peak), _warmup(get("warmup_steps", 0), get("warmup_ratio"), total), total, options)


def _uses_total(kind: str) -> bool:
    from trainwell.optim.schedulers import _NEEDS_TRAINING_STEPS

    return SchedulerType(kind) in _NEEDS_TRAINING_STEPS


def _lr(value: float) -> str:
    return f"{value:.3g}"


def schedule_changes(old: Schedule | None, new: Schedule | None, step: int) -> list[str]:
    """What changes from the checkpoint's schedule ``old`` to this run's ``new`` for a resume at ``step``, one
    ``"name: before -> after"`` item per value (empty when nothing does, or either is unknown)."""
    if old is None or new is None:
        return []
    changes = []
    if old.kind != new.kind:
        changes.append(f"lr_scheduler_type: {old.kind} -> {new.kind}")
    if old.warmup != new.warmup and new.kind != SchedulerType.CONSTANT.value:
        changes.append(f"warmup steps: {old.warmup} -> {new.warmup}")
    if old.total != new.total and _uses_total(new.kind):
        changes.append(f"total steps, where the {new.kind} decay ends: {old.total} -> {new.total}")
    if old.options != new.options:
        changes.append(f"lr_scheduler_kwargs: {old.options} -> {new.options}")
    if old.peak != new.peak:
        changes.append(f"learning_rate: {_lr(old.peak)} -> {_lr(new.peak)}, which does not apply: the checkpoint's "
                       f"scheduler state keeps its peak, {_lr(old.peak)}")
    before, after = old.factor(step + 1), new.factor(step + 1)
    if changes and before is not None and after is not None and not math.isclose(before, after, rel_tol=1e-6):
        changes.append(f"learning rate at step {step + 2}: {_lr(old.peak * before)} -> {_lr(old.peak * after)} "
                       f"(step {step + 1} still takes the checkpoint's)")
    return changes


__all__ = ["Schedule", "schedule_changes", "schedule_of"]
