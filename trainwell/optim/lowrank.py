"""Parameter setup shared by the low-rank-projection optimizers (GaLore, APOLLO), including their layer-wise
(one optimizer per parameter, stepped from gradient hooks) variants.

Owns :func:`match_target_module` and :func:`setup_low_rank_optimizer`. Which classes and default projection
settings each optimizer uses is decided in :mod:`trainwell.optim.registry`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from torch import nn

from trainwell.optim.layerwise import LayerWiseDummyOptimizer
from trainwell.outputs import enum_value

logger = logging.getLogger(__name__)


def match_target_module(targets: str | list[str], module_name: str) -> tuple[bool, bool]:
    """Whether ``module_name`` is selected by ``optim_target_modules``, and whether it was selected by a regex.

    A string is a regex that must match the whole name. In a list, an entry selects a module when it equals
    the name, is a substring of it, or (as a regex) matches the whole name.
    """
    if isinstance(targets, str):
        return bool(re.fullmatch(targets, module_name)), targets != module_name
    if module_name in targets or any(t in module_name for t in targets):
        return True, False
    if any(re.fullmatch(t, module_name) for t in targets):
        return True, True
    return False, False


def _target_weight_names(model: nn.Module, targets: str | list[str], optim: str) -> list[str]:
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    names = []
    for module_name, module in model.named_modules():
        selected, by_regex = match_target_module(targets, module_name)
        if not isinstance(module, nn.Linear):
            if selected and not by_regex:
                logger.warning("%s matches optim_target_modules but is not nn.Linear: %s skips it", module_name, optim)
            continue
        if selected or all_linear:
            names.append(f"{module_name}.weight")
    return names


def setup_low_rank_optimizer(
    args: Any,
    model: nn.Module | None,
    optim: str,
    optimizer_cls: type[torch.optim.Optimizer],
    projection_kwargs: dict[str, Any],
    optimizer_kwargs: dict[str, Any],
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """Split ``model``'s parameters into the weights of the targeted ``nn.Linear`` modules (which get
    ``projection_kwargs``) and the rest, and return ``(cls, kwargs)`` with the two groups under ``"params"``.

    For a ``*_layerwise`` optim, one ``optimizer_cls`` per parameter is built and stepped (then zeroed) by a
    post-accumulate-grad hook registered here, and the returned class is the no-op
    :class:`~trainwell.optim.layerwise.LayerWiseDummyOptimizer` with the per-parameter optimizers under
    ``"optimizer_dict"``. Layer-wise mode forbids distributed training and gradient accumulation.
    """
    layerwise = optim.endswith("layerwise")
    targets = _checked_targets(args, optim, layerwise)
    if model is None:
        raise ValueError(f"optim={optim!r} needs the model to find its target modules; pass model=")
    target_names = set(_target_weight_names(model, targets, optim))
    if not target_names:
        raise ValueError(f"optim={optim!r}: no nn.Linear module matches optim_target_modules={targets!r}")
    named = list(model.named_parameters())
    target_params = [p for n, p in named if n in target_names]
    other_params = [p for n, p in named if n not in target_names]
    kwargs = dict(optimizer_kwargs)
    kwargs["params"] = [{"params": other_params}, {"params": target_params, **projection_kwargs}]
    if not layerwise:
        return optimizer_cls, kwargs
    if getattr(args, "gradient_accumulation_steps", 1) != 1:
        raise ValueError(f"optim={optim!r}: layer-wise optimizers do not support gradient_accumulation_steps > 1")
    per_param: dict[torch.Tensor, torch.optim.Optimizer] = {}
    for p in other_params:
        per_param[p] = optimizer_cls([{"params": [p]}], **optimizer_kwargs)
    for p in target_params:
        per_param[p] = optimizer_cls([{"params": [p], **projection_kwargs}], **optimizer_kwargs)
    _register_step_hooks(model, per_param)
    kwargs["optimizer_dict"] = per_param
    return LayerWiseDummyOptimizer, kwargs


def _checked_targets(args: Any, optim: str, layerwise: bool) -> str | list[str]:
    parallel_mode = getattr(args, "parallel_mode", None)
    if layerwise and enum_value(parallel_mode) == "distributed":
        raise NotImplementedError(f"optim={optim!r}: layer-wise optimizers do not support distributed training")
    targets = getattr(args, "optim_target_modules", None)
    if targets is None:
        raise ValueError(f"optim={optim!r} needs optim_target_modules (module names, a regex, or 'all-linear')")
    if not isinstance(targets, (list, str)):
        raise TypeError(
            f"optim_target_modules must be a list of strings, a regex string or 'all-linear', got {targets!r}"
        )
    return targets


def _register_step_hooks(model: nn.Module, per_param: dict[torch.Tensor, torch.optim.Optimizer]) -> None:
    def step_one(param: torch.Tensor) -> None:
        if param.grad is not None:
            per_param[param].step()
            per_param[param].zero_grad()

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(step_one)
