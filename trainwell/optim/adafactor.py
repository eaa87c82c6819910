"""Adafactor (Shazeer & Stern, 2018, https://arxiv.org/abs/1804.04235) and a proxy scheduler for it.

Owns :class:`Adafactor` and :class:`AdafactorSchedule`. The optimizer keeps, for each parameter with two or
more dimensions, only running means of the squared gradient over its rows and over its columns (memory
O(n + m) instead of O(n m)); vectors and scalars keep a full second moment. The constructor mirrors the
reference's (``transformers.optimization.Adafactor``), so ``optim="adafactor"`` and scripts that build it
directly behave the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.norm(2) / (t.numel() ** 0.5)


class Adafactor(Optimizer):
    """Adafactor with optional relative step size, parameter scaling and first moment.

    Args:
        params: parameters or param-group dicts.
        lr: external learning rate; must be None when ``relative_step`` is True, and set when it is False.
        eps: ``(eps1, eps2)``: added to the squared gradient, and the floor of the parameter RMS scale.
        clip_threshold: the update is scaled down so that its RMS is at most this.
        decay_rate: the second-moment decay at step t is ``beta2_t = 1 - t ** decay_rate``.
        beta1: first-moment decay; None (default) keeps no first moment.
        weight_decay: decoupled decay, ``p -= weight_decay * lr_t * p``.
        scale_parameter: multiply the step size by ``max(eps2, RMS(p))``.
        relative_step: use the step size ``min(1e-2, 1/sqrt(t))`` (``min(1e-6 t, 1/sqrt(t))`` with
            ``warmup_init``) instead of ``lr``.
        warmup_init: the relative step grows linearly from 0; requires ``relative_step``.

    For an external schedule (what the Trainer's ``optim="adafactor"`` builds) use
    ``Adafactor(params, lr=..., scale_parameter=False, relative_step=False)``. Float16/bfloat16 parameters are
    updated in float32 and written back. Sparse gradients are not supported.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ) -> None:
        if lr is not None and relative_step:
            raise ValueError("Adafactor: cannot combine a manual lr with relative_step=True; pass relative_step=False")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: warmup_init=True requires relative_step=True")
        if lr is None and not relative_step:
            raise ValueError("Adafactor: relative_step=False needs an explicit lr")
        defaults = {
            "lr": lr,
            "eps": eps,
            "clip_threshold": clip_threshold,
            "decay_rate": decay_rate,
            "beta1": beta1,
            "weight_decay": weight_decay,
            "scale_parameter": scale_parameter,
            "relative_step": relative_step,
            "warmup_init": warmup_init,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _get_lr(group: dict[str, Any], state: dict[str, Any]) -> float | torch.Tensor:
        """The step size of a parameter at its current ``state["step"]``: a float, or a 0-d tensor when
        ``scale_parameter`` is on (kept on device: no host sync per parameter)."""
        step_size = group["lr"]
        if group["relative_step"]:
            # rho_t = min(1e-2, 1/sqrt(t)), or min(1e-6 t, 1/sqrt(t)) with warmup_init
            ceiling = 1e-6 * state["step"] if group["warmup_init"] else 1e-2
            step_size = min(ceiling, 1.0 / math.sqrt(state["step"]))
        if group["scale_parameter"]:
            # alpha_t = max(eps2, RMS(p_{t-1})) * rho_t
            return torch.clamp(state["RMS"], min=group["eps"][1]) * step_size
        return step_size

    @staticmethod
    def _init_state(state: dict[str, Any], grad: torch.Tensor, factored: bool, first_moment: bool) -> None:
        state["step"] = 0
        if first_moment:
            state["exp_avg"] = torch.zeros_like(grad)
        if factored:
            state["exp_avg_sq_row"] = grad.new_zeros(grad.shape[:-1])
            state["exp_avg_sq_col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])
        else:
            state["exp_avg_sq"] = torch.zeros_like(grad)

    @staticmethod
    def _second_moment_update(state: dict[str, Any], grad: torch.Tensor, beta2: float, eps1: float) -> torch.Tensor:
        # v_t = beta2 v_{t-1} + (1 - beta2)(g^2 + eps1), kept either whole or as row / column means;
        # returns u = g / sqrt(v_t) with v_t ~ R C / mean(R) when factored.
        sq = grad.square().add_(eps1)
        if "exp_avg_sq" in state:
            v = state["exp_avg_sq"].mul_(beta2).add_(sq, alpha=1.0 - beta2)
            return v.rsqrt().mul_(grad)
        row = state["exp_avg_sq_row"].mul_(beta2).add_(sq.mean(dim=-1), alpha=1.0 - beta2)
        col = state["exp_avg_sq_col"].mul_(beta2).add_(sq.mean(dim=-2), alpha=1.0 - beta2)
        row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
        col_factor = col.unsqueeze(-2).rsqrt()
        return (row_factor * col_factor).mul_(grad)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One Adafactor update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        grad = p.grad
        if grad.is_sparse:
            raise RuntimeError("Adafactor does not support sparse gradients")
        if grad.dtype in _LOW_PRECISION:
            grad = grad.float()
        state = self.state[p]
        factored, first_moment = grad.dim() >= 2, group["beta1"] is not None
        if not state:
            self._init_state(state, grad, factored, first_moment)
        else:  # a loaded state may sit on another device or dtype
            for key in ("exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(grad)
        weights = p.float() if p.dtype in _LOW_PRECISION else p
        state["step"] += 1
        if group["scale_parameter"]:  # only the scaled step size needs it: one norm per parameter
            state["RMS"] = _rms(weights)
        lr = self._get_lr(group, state)
        beta2 = 1.0 - math.pow(state["step"], group["decay_rate"])
        update = self._second_moment_update(state, grad, beta2, group["eps"][0])
        # Clip so that RMS(u) <= d, then scale by the step size.
        update.div_((_rms(update) / group["clip_threshold"]).clamp_(min=1.0)).mul_(lr)
        if first_moment:
            update = state["exp_avg"].mul_(group["beta1"]).add_(update, alpha=1.0 - group["beta1"])
        if group["weight_decay"] != 0:
            decay = -group["weight_decay"] * lr
            if isinstance(decay, torch.Tensor):
                weights.add_(weights * decay)
            else:
                weights.add_(weights, alpha=decay)
        weights.sub_(update)
        if weights is not p:
            p.copy_(weights)


def _proxy_factor(step: int, *, value: float) -> float:
    return value


class AdafactorSchedule(LambdaLR):
    """A read-only scheduler for an :class:`Adafactor` that computes its own step size (``lr=None``), for
    loops that expect a scheduler and log ``get_last_lr()``.

    ``get_last_lr()`` reports, per param group, the step size Adafactor used for the group's first parameter
    at its last step (``initial_lr`` before any step). Groups with an external ``lr`` report and keep it:
    stepping this scheduler never changes the LR an optimizer step uses.
    """

    def __init__(self, optimizer: Adafactor, initial_lr: float = 0.0) -> None:
        self.initial_lr = initial_lr
        added = [g for g in optimizer.param_groups if "initial_lr" not in g]
        for group in added:
            group["initial_lr"] = initial_lr
        super().__init__(optimizer, partial(_proxy_factor, value=initial_lr))
        for group in added:  # leave the optimizer's groups as they were
            del group["initial_lr"]

    def get_lr(self) -> list[float]:
        lrs = []
        for group in self.optimizer.param_groups:
            if not group.get("relative_step", False):
                lrs.append(group["lr"])
                continue
            state = self.optimizer.state.get(group["params"][0], {}) if group["params"] else {}
            lrs.append(float(self.optimizer._get_lr(group, state)) if state.get("step") else self.initial_lr)
        return lrs


def get_adafactor_schedule(optimizer: Adafactor, initial_lr: float = 0.0) -> AdafactorSchedule:
    """:class:`AdafactorSchedule` ``(optimizer, initial_lr)``."""
    return AdafactorSchedule(optimizer, initial_lr)
