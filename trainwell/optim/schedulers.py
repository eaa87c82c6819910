"""Learning-rate schedulers by name: :func:`get_scheduler` and one builder per schedule.

Owns the mapping ``SchedulerType -> torch scheduler`` and its argument checks. The maths lives in
:mod:`trainwell.optim.schedules` (pure ``step -> factor`` functions); GreedyLR in :mod:`trainwell.optim.greedy`.
Step-based schedules are ``LambdaLR`` over a ``functools.partial`` of a module-level function, so their
``state_dict()`` is plain numbers: it survives ``torch.load(weights_only=True)``, and a scheduler rebuilt with
the same arguments and loaded from it continues with identical LRs. Importing this module costs torch only.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from trainwell.optim import SCHEDULER_NAMES, schedules
from trainwell.optim.greedy import GreedyLR
from trainwell.optim.layerwise import LayerWiseDummyOptimizer, attach_layerwise_schedulers
from trainwell.outputs import SchedulerType

logger = logging.getLogger(__name__)

__all__ = list(SCHEDULER_NAMES)  # the one list of public builders lives in the torch-free package __init__


def _lambda_schedule(optimizer: Optimizer, schedule: Callable[..., float], last_epoch: int, **params: Any) -> LambdaLR:
    """The body every step-based builder shares: ``LambdaLR`` over ``partial(schedule, **params)``.

    ``schedule`` must be a module-level function of :mod:`trainwell.optim.schedules`: a partial of one carries
    no state, so the scheduler's ``state_dict()`` stays plain numbers (see the module docstring).
    """
    return LambdaLR(optimizer, partial(schedule, **params), last_epoch=last_epoch)


def get_constant_schedule(optimizer: Optimizer, last_epoch: int = -1) -> LambdaLR:
    """Keep every group's initial LR. (There is no warmup: use :func:`get_constant_schedule_with_warmup`.)"""
    return LambdaLR(optimizer, schedules.constant, last_epoch=last_epoch)


def get_constant_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1) -> LambdaLR:
    """Rise linearly from 0 to the initial LR over ``num_warmup_steps``, then stay there."""
    return _lambda_schedule(optimizer, schedules.constant_with_warmup, last_epoch, num_warmup_steps=num_warmup_steps)


def get_linear_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Rise linearly from 0 over ``num_warmup_steps``, then fall linearly to 0 at ``num_training_steps``."""
    return _lambda_schedule(
        optimizer, schedules.linear, last_epoch,
        num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
    )  # fmt: skip


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then a cosine to 0 (``num_cycles=0.5``: one half-wave ending at ``num_training_steps``)."""
    return _lambda_schedule(
        optimizer, schedules.cosine, last_epoch,
        num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles,
    )  # fmt: skip


def get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: int = 1,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then ``num_cycles`` cosine decays to 0, each jumping back to the initial LR."""
    return _lambda_schedule(
        optimizer, schedules.cosine_with_hard_restarts, last_epoch,
        num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles,
    )  # fmt: skip


def get_polynomial_decay_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float = 1e-7,
    power: float = 1.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then a polynomial decay of power ``power`` from the optimizer's default LR to ``lr_end``.

    Raises ValueError unless ``optimizer.defaults["lr"] > lr_end``.
    """
    lr_init = optimizer.defaults["lr"]
    if not lr_init > lr_end:
        raise ValueError(f"polynomial schedule: lr_end={lr_end} must be smaller than the initial lr {lr_init}")
    return _lambda_schedule(
        optimizer, schedules.polynomial, last_epoch,
        num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, lr_end=lr_end, power=power,
        lr_init=lr_init,
    )  # fmt: skip


def get_inverse_sqrt_schedule(
    optimizer: Optimizer, num_warmup_steps: int, timescale: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    """Linear warmup, then decay as ``1/sqrt`` of the step; ``timescale`` defaults to ``num_warmup_steps``, or
    10 000 when there is no warmup."""
    if timescale is None:
        timescale = num_warmup_steps or 10_000
    return _lambda_schedule(
        optimizer, schedules.inverse_sqrt, last_epoch, num_warmup_steps=num_warmup_steps, timescale=timescale
    )


def _min_lr_rate(optimizer: Optimizer, name: str, min_lr: float | None, min_lr_rate: float | None) -> float:
    if (min_lr is None) == (min_lr_rate is None):
        got = "both" if min_lr is not None else "neither"
        raise ValueError(
            f"the {name!r} scheduler needs exactly one of min_lr (an absolute LR) or min_lr_rate (a fraction of "
            f"the initial LR) in lr_scheduler_kwargs, got {got}; e.g. lr_scheduler_kwargs={{'min_lr_rate': 0.1}}"
        )
    return min_lr_rate if min_lr_rate is not None else min_lr / optimizer.defaults["lr"]


def get_cosine_with_min_lr_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    """Like :func:`get_cosine_schedule_with_warmup`, but the cosine ends at a floor: ``min_lr``, or
    ``min_lr_rate`` times the optimizer's default LR (exactly one of the two, else ValueError)."""
    rate = _min_lr_rate(optimizer, SchedulerType.COSINE_WITH_MIN_LR.value, min_lr, min_lr_rate)
    return _lambda_schedule(
        optimizer, schedules.cosine, last_epoch,
        num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles,
        min_lr_rate=rate,
    )  # fmt: skip


def get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    """Cosine to a floor (as :func:`get_cosine_with_min_lr_schedule_with_warmup`) whose warmup is non-zero
    from step 0: ``(s+1)/W``, or from ``warmup_lr_rate`` to 1 when given; the decay starts one step earlier."""
    rate = _min_lr_rate(optimizer, SchedulerType.COSINE_WARMUP_WITH_MIN_LR.value, min_lr, min_lr_rate)
    return _lambda_schedule(
        optimizer, schedules.cosine_warmup_with_min_lr, last_epoch,
        num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, num_cycles=num_cycles,
        min_lr_rate=rate, warmup_lr_rate=warmup_lr_rate,
    )  # fmt: skip


def get_wsd_schedule(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_decay_steps: int,
    num_training_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Warmup-stable-decay: warm up from ``min_lr_ratio`` to 1, hold, decay to ``min_lr_ratio`` over
    ``num_decay_steps``. The stable phase lasts ``num_stable_steps`` or, when that is not given,
    ``num_training_steps - num_warmup_steps - num_decay_steps``. Shapes: ``"linear"``, ``"cosine"``,
    ``"1-sqrt"``."""
    if num_training_steps is None and num_stable_steps is None:
        raise ValueError("warmup_stable_decay: pass num_training_steps or num_stable_steps")
    if num_training_steps is not None and num_stable_steps is not None:
        warnings.warn(
            "warmup_stable_decay: both num_training_steps and num_stable_steps given; using num_stable_steps",
            stacklevel=1,  # the default, made explicit: attributed to this module, so warning filters on it still match
        )
    for arg, shape in (("warmup_type", warmup_type), ("decay_type", decay_type)):
        if shape not in schedules.WSD_SHAPES:
            raise ValueError(f"warmup_stable_decay: {arg}={shape!r} must be one of {', '.join(schedules.WSD_SHAPES)}")
    if num_stable_steps is None:
        num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps
        if num_stable_steps < 0:
            logger.warning(
                "warmup_stable_decay: num_warmup_steps (%d) + num_decay_steps (%d) exceed num_training_steps "
                "(%d): the decay starts right after the warmup, %d steps into its course",
                num_warmup_steps, num_decay_steps, num_training_steps, -num_stable_steps,
            )  # fmt: skip
    return _lambda_schedule(
        optimizer, schedules.warmup_stable_decay, last_epoch,
        num_warmup_steps=num_warmup_steps, num_stable_steps=num_stable_steps, num_decay_steps=num_decay_steps,
        warmup_type=warmup_type, decay_type=decay_type, min_lr_ratio=min_lr_ratio, num_cycles=num_cycles,
    )  # fmt: skip


def get_reduce_on_plateau_schedule(optimizer: Optimizer, **kwargs: Any) -> ReduceLROnPlateau:
    """``torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **kwargs)``; step it with a metric."""
    return ReduceLROnPlateau(optimizer, **kwargs)


def get_greedy_schedule(optimizer: Optimizer, **kwargs: Any) -> GreedyLR:
    """:class:`~trainwell.optim.greedy.GreedyLR` ``(optimizer, **kwargs)``; step it with a metric."""
    return GreedyLR(optimizer, **kwargs)


TYPE_TO_SCHEDULER_FUNCTION: dict[SchedulerType, Callable[..., Any]] = {
    SchedulerType.LINEAR: get_linear_schedule_with_warmup,
    SchedulerType.COSINE: get_cosine_schedule_with_warmup,
    SchedulerType.COSINE_WITH_RESTARTS: get_cosine_with_hard_restarts_schedule_with_warmup,
    SchedulerType.POLYNOMIAL: get_polynomial_decay_schedule_with_warmup,
    SchedulerType.CONSTANT: get_constant_schedule,
    SchedulerType.CONSTANT_WITH_WARMUP: get_constant_schedule_with_warmup,
    SchedulerType.INVERSE_SQRT: get_inverse_sqrt_schedule,
    SchedulerType.REDUCE_ON_PLATEAU: get_reduce_on_plateau_schedule,
    SchedulerType.COSINE_WITH_MIN_LR: get_cosine_with_min_lr_schedule_with_warmup,
    SchedulerType.COSINE_WARMUP_WITH_MIN_LR: get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    SchedulerType.WARMUP_STABLE_DECAY: get_wsd_schedule,
    SchedulerType.GREEDY: get_greedy_schedule,
}

# Metric-driven schedulers: built from kwargs alone, stepped with a metric after evaluation.
_METRIC_DRIVEN = {SchedulerType.REDUCE_ON_PLATEAU: ReduceLROnPlateau, SchedulerType.GREEDY: GreedyLR}
# Schedules whose length must be known up front (warmup_stable_decay may use num_stable_steps instead).
_NEEDS_TRAINING_STEPS = {
    SchedulerType.LINEAR, SchedulerType.COSINE, SchedulerType.COSINE_WITH_RESTARTS, SchedulerType.POLYNOMIAL,
    SchedulerType.COSINE_WITH_MIN_LR, SchedulerType.COSINE_WARMUP_WITH_MIN_LR,
}  # fmt: skip
# Schedules that take no extra kwargs: the reference silently ignores any it is given.
_NO_KWARGS = {SchedulerType.CONSTANT, SchedulerType.CONSTANT_WITH_WARMUP}


def _scheduler_type(name: str | SchedulerType) -> SchedulerType:
    try:
        return SchedulerType(name)
    except ValueError:
        valid = ", ".join(repr(t.value) for t in SchedulerType)
        raise ValueError(f"unknown lr_scheduler_type {name!r}: choose one of {valid}") from None


def _check_kwargs(kind: SchedulerType, target: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    # A clear error instead of Python's "unexpected keyword argument" deep inside the builder.
    reserved = {"self", "optimizer", "num_warmup_steps", "num_training_steps"}
    accepted = [p for p in inspect.signature(target).parameters if p not in reserved]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"lr_scheduler_kwargs {unknown} are not accepted by the {kind.value!r} scheduler; "
            f"it accepts: {', '.join(accepted) or 'nothing'}"
        )


def get_scheduler(
    name: str | SchedulerType,
    optimizer: Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict | None = None,
) -> Any:
    """Build the scheduler called ``name`` (a :class:`~trainwell.outputs.SchedulerType` value) for ``optimizer``.

    ``num_warmup_steps`` is required by every schedule except ``constant``, ``reduce_lr_on_plateau`` and
    ``greedy``; ``num_training_steps`` by ``linear``, ``cosine``, ``cosine_with_restarts``, ``polynomial``,
    ``cosine_with_min_lr`` and ``cosine_warmup_with_min_lr``; ``warmup_stable_decay`` needs ``num_decay_steps``
    in ``scheduler_specific_kwargs``. A missing one raises ValueError naming it; an unknown kwarg raises
    TypeError listing the accepted ones. ``constant`` ignores ``num_warmup_steps`` (as the reference does; a
    warning is logged when it is positive). Returns a ``LambdaLR`` for step-based schedules,
    ``ReduceLROnPlateau`` / ``GreedyLR`` for the metric-driven ones, and a no-op stand-in (per-parameter
    schedulers stepped by hooks) for a layer-wise optimizer.
    """
    kind = _scheduler_type(name)
    build = TYPE_TO_SCHEDULER_FUNCTION[kind]
    kwargs = dict(scheduler_specific_kwargs or {})
    if isinstance(optimizer, LayerWiseDummyOptimizer):
        inner = partial(
            get_scheduler,
            kind,
            num_warmup_steps=num_warmup_steps,
            num_training_steps=num_training_steps,
            scheduler_specific_kwargs=kwargs,
        )
        return attach_layerwise_schedulers(optimizer, inner)
    if kind in _METRIC_DRIVEN:
        _check_kwargs(kind, _METRIC_DRIVEN[kind].__init__, kwargs)
        return build(optimizer, **kwargs)
    if kind in _NO_KWARGS and kwargs:
        logger.warning("the %r scheduler takes no lr_scheduler_kwargs; ignoring %s", kind.value, sorted(kwargs))
    if kind == SchedulerType.CONSTANT:
        if num_warmup_steps:
            msg = "the 'constant' scheduler ignores num_warmup_steps=%s; use 'constant_with_warmup'"
            logger.warning(msg, num_warmup_steps)
        return build(optimizer)
    if num_warmup_steps is None:
        raise ValueError(f"num_warmup_steps is required for the {kind.value!r} scheduler")
    if kind == SchedulerType.CONSTANT_WITH_WARMUP:
        return build(optimizer, num_warmup_steps=num_warmup_steps)
    _check_kwargs(kind, build, kwargs)
    if kind == SchedulerType.INVERSE_SQRT:
        return build(optimizer, num_warmup_steps=num_warmup_steps, **kwargs)
    if kind == SchedulerType.WARMUP_STABLE_DECAY and "num_decay_steps" not in kwargs:
        raise ValueError(
            "num_decay_steps is required for the 'warmup_stable_decay' scheduler: pass it in "
            "lr_scheduler_kwargs, e.g. lr_scheduler_kwargs={'num_decay_steps': 100}"
        )
    if kind == SchedulerType.WARMUP_STABLE_DECAY and kwargs.get("num_stable_steps") is not None:
        num_training_steps = None  # the user's num_stable_steps wins; don't warn about the Trainer's total
    if kind in _NEEDS_TRAINING_STEPS and num_training_steps is None:
        raise ValueError(f"num_training_steps is required for the {kind.value!r} scheduler")
    return build(optimizer, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, **kwargs)


def scheduler_for_args(args: Any, optimizer: Optimizer, num_training_steps: int) -> Any:
    """The scheduler of ``args.lr_scheduler_type`` (warmup and ``lr_scheduler_kwargs`` from ``args``)."""
    return get_scheduler(
        args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=args.get_warmup_steps(num_training_steps),
        num_training_steps=num_training_steps,
        scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}),
    )


def steps_on_metrics(scheduler: Any) -> bool:
    """Whether ``scheduler`` steps on an evaluation metric (plateau-style) rather than after every optimizer step."""
    return isinstance(scheduler, ReduceLROnPlateau) or type(scheduler).__name__ == "GreedyLR"


def current_learning_rate(scheduler: Any, optimizer: Optimizer) -> float:
    """``Trainer._get_learning_rate``: the first group's learning rate as ``scheduler`` last set it (read off the
    optimizer for a plateau-style scheduler, whose ``get_last_lr`` may lag a reduction)."""
    if steps_on_metrics(scheduler):
        return optimizer.param_groups[0]["lr"]
    return scheduler.get_last_lr()[0]


def rewind(scheduler: Any, steps: int) -> bool:
    """Move a step-based ``scheduler`` back by ``steps`` steps, as if it had not stepped for them (the optimizer
    steps ``skip_nonfinite_steps`` did not apply); False when it cannot be moved back (its schedule then counts
    them). ``LambdaLR`` (every schedule :func:`get_scheduler` builds) and torch's schedulers with a closed form
    are set from their formula, so the learning rates are those of a run that never took the steps."""
    inner = getattr(scheduler, "scheduler", scheduler)  # Accelerate's wrapper
    if steps <= 0 or steps_on_metrics(inner):
        return True
    if isinstance(inner, LambdaLR):
        inner.last_epoch -= steps
        lrs = [base * fn(inner.last_epoch) for fn, base in zip(inner.lr_lambdas, inner.base_lrs, strict=True)]
    elif callable(getattr(inner, "_get_closed_form_lr", None)):
        inner.last_epoch -= steps
        lrs = inner._get_closed_form_lr()
    else:
        return False
    for group, lr in zip(inner.optimizer.param_groups, lrs, strict=True):
        if hasattr(group["lr"], "fill_"):  # a tensor learning rate (fused or capturable optimizers) stays one
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    inner._last_lr = [float(group["lr"]) for group in inner.optimizer.param_groups]
    return True
