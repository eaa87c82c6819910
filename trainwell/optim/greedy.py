"""GreedyLR: a metric-driven scheduler that raises the LR while a metric keeps improving and lowers it on a
plateau (https://arxiv.org/abs/2512.14527).

Owns :class:`GreedyLR`. Like ``ReduceLROnPlateau`` it is stepped with a metric after each evaluation
(``scheduler.step(metrics)``), not once per optimizer step; the Trainer decides when.
"""

from __future__ import annotations

import logging
from typing import Any

from torch.optim import Optimizer

logger = logging.getLogger(__name__)

# Everything that changes while stepping, plus the settings, under the reference's key names so that a
# scheduler.pt written by either implementation loads into the other.
_STATE_KEYS = (
    "factor", "min_lrs", "max_lrs", "patience", "verbose", "cooldown", "warmup", "cooldown_counter",
    "warmup_counter", "mode", "threshold", "threshold_mode", "best", "num_bad_epochs", "num_good_epochs", "eps",
    "last_epoch", "smooth", "window_size", "reset_start", "reset_start_original", "_last_lr", "_init_lrs",
)  # fmt: skip


def _per_group(value: float | list[float] | tuple[float, ...], n: int, name: str) -> list[float]:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"GreedyLR: expected {n} {name}s (one per param group), got {len(value)}")
        return list(value)
    return [value] * n


class GreedyLR:
    """Adaptive LR: divide the LR by ``factor`` after more than ``patience`` consecutive improvements of the
    metric, multiply it by ``factor`` after more than ``patience`` consecutive non-improvements.

    Args (the reference's names and defaults):
        optimizer: the optimizer whose ``param_groups[i]["lr"]`` are adjusted in place.
        mode: ``"min"`` (lower metric is better) or ``"max"``.
        factor: multiplier on a plateau, divisor on improvement; must be < 1.
        patience: consecutive good (bad) steps tolerated before increasing (reducing) the LR.
        threshold, threshold_mode: an improvement must beat the best by ``threshold`` (``"abs"``) or by a
            ``threshold`` fraction of it (``"rel"``).
        cooldown: steps to ignore after a reduction. warmup: steps to ignore after an increase.
        min_lr, max_lr: bounds on each group's LR (a float, or one per group).
        eps: a change smaller than this is not applied.
        verbose: print each change.
        smooth, window_size: compare a moving average of the last ``window_size`` metrics instead of the raw one.
        reset_start: after this many reductions with every group already at ``min_lr``, restore the initial
            LRs and forget the best metric.

    With the defaults, ``min_lr=1e-3`` is above typical fine-tuning LRs (5e-5): a reduction then never lowers
    the LR, and only increases happen (reference behaviour, kept; a warning is logged).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.95,
        patience: int = 10,
        threshold: float = 1e-6,
        threshold_mode: str = "abs",
        cooldown: int = 0,
        warmup: int = 0,
        min_lr: float | list[float] = 1e-3,
        max_lr: float | list[float] = 1.0,
        eps: float = 1e-8,
        verbose: bool = False,
        smooth: bool = False,
        window_size: int = 50,
        reset_start: int = 500,
    ) -> None:
        if factor >= 1.0:
            raise ValueError(f"GreedyLR: factor={factor} must be < 1.0")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"GreedyLR: {type(optimizer).__name__} is not a torch.optim.Optimizer")
        if mode not in ("min", "max"):
            raise ValueError(f"GreedyLR: mode={mode!r} must be 'min' or 'max'")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"GreedyLR: threshold_mode={threshold_mode!r} must be 'rel' or 'abs'")
        n = len(optimizer.param_groups)
        self.optimizer = optimizer
        self.mode, self.factor, self.patience = mode, factor, patience
        self.threshold, self.threshold_mode, self.eps, self.verbose = threshold, threshold_mode, eps, verbose
        self.cooldown, self.warmup = cooldown, warmup
        self.min_lrs, self.max_lrs = _per_group(min_lr, n, "min_lr"), _per_group(max_lr, n, "max_lr")
        self.smooth, self.window_size = smooth, window_size
        self.reset_start = self.reset_start_original = reset_start
        self._init_lrs = [group["lr"] for group in optimizer.param_groups]
        self._last_lr = list(self._init_lrs)
        self._window: list[float] = []
        self.last_epoch = 0
        self._forget()
        if any(lr < lo for lr, lo in zip(self._init_lrs, self.min_lrs)):
            logger.warning(
                "GreedyLR: min_lr=%s is above the initial learning rate %s, so the LR can only grow; "
                "pass a smaller min_lr in lr_scheduler_kwargs",
                self.min_lrs[0],
                self._init_lrs[0],
            )

    def _forget(self) -> None:
        self.best = float("inf") if self.mode == "min" else float("-inf")
        self.num_bad_epochs = self.num_good_epochs = 0
        self.cooldown_counter = self.warmup_counter = 0

    def step(self, metrics: float, epoch: int | None = None) -> None:
        """Feed one metric value (after an evaluation) and adjust the LRs."""
        current = self._smoothed(float(metrics))
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.cooldown_counter > 0 or self.warmup_counter > 0:
            # A recent change is still settling: skip the comparison and restart both streaks.
            if self.cooldown_counter > 0:
                self.cooldown_counter -= 1
            else:
                self.warmup_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        else:
            self._compare(current)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _compare(self, current: float) -> None:
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs, self.num_good_epochs = 0, self.num_good_epochs + 1
        else:
            self.num_bad_epochs, self.num_good_epochs = self.num_bad_epochs + 1, 0
        if self.num_good_epochs > self.patience:
            self._increase_lr()
            self.warmup_counter, self.num_good_epochs = self.warmup, 0
        elif self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0

    def _smoothed(self, value: float) -> float:
        if not self.smooth:
            return value
        self._window = (self._window + [value])[-self.window_size :]
        return sum(self._window) / len(self._window)

    def is_better(self, current: float, best: float) -> bool:
        """Whether ``current`` improves on ``best`` by more than the threshold."""
        if self.threshold_mode == "rel":
            if self.mode == "min":
                return current < best * (1.0 - self.threshold)
            return current > best * (1.0 + self.threshold)
        return current < best - self.threshold if self.mode == "min" else current > best + self.threshold

    def _set_lr(self, i: int, new_lr: float, verb: str) -> None:
        self.optimizer.param_groups[i]["lr"] = new_lr
        if self.verbose:
            print(f"Epoch {self.last_epoch}: {verb} learning rate of group {i} to {new_lr:.4e}.")

    def _reduce_lr(self) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                self._set_lr(i, new, "reducing")
        if all(group["lr"] <= lo for group, lo in zip(self.optimizer.param_groups, self.min_lrs)):
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._reset()

    def _increase_lr(self) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = min(old / self.factor, self.max_lrs[i])
            if new - old > self.eps:
                self._set_lr(i, new, "increasing")
        self.reset_start = self.reset_start_original

    def _reset(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._init_lrs):
            group["lr"] = lr
        self._forget()
        self.reset_start = self.reset_start_original
        self._window = []
        if self.verbose:
            print("GreedyLR: reset to the initial learning rates.")

    def get_last_lr(self) -> list[float]:
        """The LR of each param group after the last :meth:`step`."""
        return self._last_lr

    def state_dict(self) -> dict[str, Any]:
        """Settings and counters as plain numbers, strings and lists (safe for ``weights_only`` loading)."""
        state = {key: getattr(self, key) for key in _STATE_KEYS}
        if self.smooth:
            state["_streaming_avg"] = {
                "window_size": self.window_size,
                "values": list(self._window),
                "sum": sum(self._window),
            }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` and put the saved LRs back into the optimizer's param groups."""
        for key in _STATE_KEYS:
            if key in state_dict:
                setattr(self, key, state_dict[key])
        if "_streaming_avg" in state_dict:
            self._window = list(state_dict["_streaming_avg"].get("values", []))
        if "_last_lr" in state_dict:
            for group, lr in zip(self.optimizer.param_groups, self._last_lr):
                group["lr"] = lr
