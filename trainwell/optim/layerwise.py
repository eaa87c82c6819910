"""Stand-ins that let a layer-wise optimizer (GaLore ``*_layerwise``, APOLLO ``*_layerwise``) sit where the
training loop expects one optimizer and one scheduler.

Owns :class:`LayerWiseDummyOptimizer`, :class:`LayerWiseDummyScheduler` and :func:`attach_layerwise_schedulers`.
With a layer-wise optimizer every parameter has its own optimizer, stepped by a post-accumulate-grad hook as
soon as its gradient is ready (so full gradients never coexist in memory); the loop's ``optimizer.step()`` and
``scheduler.step()`` are then no-ops. The hooks are registered by :mod:`trainwell.optim.registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler


class LayerWiseDummyOptimizer(torch.optim.Optimizer):
    """A no-op optimizer holding ``optimizer_dict`` (parameter -> its own optimizer).

    ``step`` and ``zero_grad`` do nothing: the per-parameter optimizers run from gradient hooks.
    """

    def __init__(self, optimizer_dict: dict[torch.Tensor, torch.optim.Optimizer] | None = None, **kwargs: Any):
        # zeros, not randn: building the stand-in must not consume the global RNG (bitwise resume).
        placeholder = torch.zeros(1, 1)
        self.optimizer_dict = optimizer_dict or {}
        super().__init__([placeholder], {"lr": kwargs.get("lr", 1e-3)})

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return None


class LayerWiseDummyScheduler(LRScheduler):
    """A no-op scheduler for :class:`LayerWiseDummyOptimizer`; ``get_last_lr()[0]`` reports the LR of the first
    per-parameter optimizer (all of them follow the same schedule)."""

    def __init__(
        self,
        optimizer_dict: dict[torch.Tensor, torch.optim.Optimizer],
        lr: float,
        optimizer: LayerWiseDummyOptimizer | None = None,
    ) -> None:
        self.default_lr = lr
        self.optimizer_dict = optimizer_dict
        # Wrapping the loop's own stand-in (when given) keeps torch's "scheduler stepped before optimizer" check
        # quiet: the loop calls that stand-in's step().
        super().__init__(optimizer or LayerWiseDummyOptimizer(optimizer_dict=optimizer_dict, lr=lr))

    def get_lr(self) -> list[float]:
        # One value, for the stand-in's single param group (torch zips the two strictly).
        for inner in self.optimizer_dict.values():
            return [inner.param_groups[0]["lr"]]
        return [self.default_lr]


def attach_layerwise_schedulers(
    optimizer: LayerWiseDummyOptimizer, build: Callable[[torch.optim.Optimizer], Any]
) -> LayerWiseDummyScheduler:
    """Give every per-parameter optimizer its own scheduler from ``build(inner_optimizer)``, stepped by a
    post-accumulate-grad hook right after that parameter's optimizer step, and return the stand-in scheduler."""
    schedulers = {param: build(inner) for param, inner in optimizer.optimizer_dict.items()}

    def step_scheduler(param: torch.Tensor) -> None:
        schedulers[param].step()

    for param in optimizer.optimizer_dict:
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(step_scheduler)
    return LayerWiseDummyScheduler(optimizer.optimizer_dict, optimizer.defaults["lr"], optimizer=optimizer)
