"""Learning-rate schedules as pure functions ``(step, **params) -> factor``.

Owns the maths of every step-based schedule. Each function is module-level and side-effect free; the
scheduler builders in :mod:`trainwell.optim.schedulers` bind the parameters with ``functools.partial`` and
hand the result to ``torch.optim.lr_scheduler.LambdaLR``, which multiplies each group's initial LR by the
factor. Because a ``partial`` of a module-level function carries no state, ``LambdaLR.state_dict()`` holds only
numbers and round-trips through ``torch.load(weights_only=True)``.

Notation: ``s`` = step (``LambdaLR``'s ``last_epoch``, 0 before the first ``scheduler.step()``),
``W`` = warmup steps, ``T`` = total training steps, ``p`` = progress through the decay phase.
"""

from __future__ import annotations

import math


def _linear_warmup(step: int, num_warmup_steps: int) -> float:
    # s / max(1, W): 0 at step 0, reaching 1 at s = W.
    return float(step) / float(max(1, num_warmup_steps))


def constant(step: int) -> float:
    """Always 1."""
    return 1.0


def constant_with_warmup(step: int, *, num_warmup_steps: int) -> float:
    """``s / W`` during warmup, then 1."""
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    return 1.0


def linear(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    """Linear warmup, then linear decay to 0 at ``T`` (and 0 after)."""
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    # (T - s) / max(1, T - W), floored at 0
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def cosine(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5, min_lr_rate: float = 0.0
) -> float:
    """Linear warmup, then a cosine from 1 down to ``min_lr_rate``.

    Past ``T`` the cosine keeps going (it rises again for ``num_cycles=0.5``), as in the reference.
    """
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    # p = (s - W) / max(1, T - W);  f = 0.5 (1 + cos(2 pi c p));  factor = max(0, m + (1 - m) f)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    wave = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, wave * (1.0 - min_lr_rate) + min_lr_rate)


def cosine_with_hard_restarts(
    step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int = 1
) -> float:
    """Linear warmup, then ``num_cycles`` cosines from 1 to 0, each restarting at 1; 0 from ``T`` on."""
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    # p = (s - W) / max(1, T - W);  factor = 0.5 (1 + cos(pi ((c p) mod 1))) while p < 1, else 0
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def polynomial(
    step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float, lr_init: float
) -> float:
    """Linear warmup, then ``(lr_init - lr_end) (1 - p)^power + lr_end``, expressed as a factor of ``lr_init``;
    ``lr_end / lr_init`` after ``T``."""
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    if step > num_training_steps:
        return lr_end / lr_init
    # p = (s - W) / (T - W);  lr = (lr_init - lr_end)(1 - p)^power + lr_end;  factor = lr / lr_init
    # max(1, .) only matters when T == W, where the reference divides by zero at s == T.
    remaining = 1.0 - (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def inverse_sqrt(step: int, *, num_warmup_steps: int, timescale: int) -> float:
    """Linear warmup, then ``1 / sqrt((s + timescale - W) / timescale)``, which is 1 at ``s = W``."""
    if step < num_warmup_steps:
        return _linear_warmup(step, num_warmup_steps)
    return 1.0 / math.sqrt((step + timescale - num_warmup_steps) / timescale)


def cosine_warmup_with_min_lr(
    step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    min_lr_rate: float = 0.0,
    warmup_lr_rate: float | None = None,
) -> float:
    """Warmup that is already non-zero at step 0, then a cosine to ``min_lr_rate`` shifted one step earlier
    than :func:`cosine` (it reaches the floor at ``s = T - 1``)."""
    s, w, t = float(step), float(num_warmup_steps), float(num_training_steps)
    if s < w:
        if warmup_lr_rate is None:
            # (s + 1) / max(1, W): 1/W at step 0, 1 at the last warmup step.
            return (s + 1.0) / max(1.0, w)
        # r + (1 - r) s / max(1, W - 1): r at step 0, 1 at the last warmup step.
        rate = float(warmup_lr_rate)
        return rate + (1.0 - rate) * s / max(1.0, w - 1.0)
    # p = (s - W + 1) / max(1, T - W);  factor = max(0, m + (1 - m) 0.5 (1 + cos(2 pi c p)))
    progress = (s - w + 1.0) / max(1.0, t - w)
    wave = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0.0, wave * (1.0 - min_lr_rate) + min_lr_rate)


WSD_SHAPES = ("linear", "cosine", "1-sqrt")


def _wsd_rise(shape: str, p: float) -> float:
    # p | 0.5 (1 - cos(pi p)) | 1 - sqrt(1 - p): each goes 0 -> 1 as p goes 0 -> 1.
    if shape == "linear":
        return p
    if shape == "cosine":
        return 0.5 * (1.0 - math.cos(math.pi * p))
    return 1.0 - math.sqrt(1.0 - p)


def _wsd_fall(shape: str, p: float, num_cycles: float) -> float:
    # 1 - p | 0.5 (1 + cos(2 pi c p)) | 1 - sqrt(p): each goes 1 -> 0 as p goes 0 -> 1 (cosine with c = 0.5).
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * p))
    return 1.0 - math.sqrt(p)


def warmup_stable_decay(
    step: int,
    *,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """Warmup from ``min_lr_ratio`` to 1, hold 1 for ``num_stable_steps``, decay to ``min_lr_ratio`` over
    ``num_decay_steps``, then stay at ``min_lr_ratio``. Shapes (:data:`WSD_SHAPES`): ``"linear"``,
    ``"cosine"``, ``"1-sqrt"``."""
    m = min_lr_ratio
    if step < num_warmup_steps:
        # p = s / max(1, W);  factor = max(0, m + (1 - m) rise(p))
        progress = float(step) / float(max(1, num_warmup_steps))
        return max(0.0, _wsd_rise(warmup_type, progress) * (1.0 - m) + m)
    if step < num_warmup_steps + num_stable_steps:
        return 1.0
    if step < num_warmup_steps + num_stable_steps + num_decay_steps:
        # p = (s - W - S) / max(1, D);  factor = max(0, m + (1 - m) fall(p))
        progress = float(step - num_warmup_steps - num_stable_steps) / float(max(1, num_decay_steps))
        return max(0.0, _wsd_fall(decay_type, progress, num_cycles) * (1.0 - m) + m)
    return m
