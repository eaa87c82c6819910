"""Optimizers and learning-rate schedulers: the ``optim`` registry, weight-decay parameter groups, the
``lr_scheduler_type`` schedules, Adafactor and GreedyLR.

Names are re-exported lazily, so ``import trainwell.optim`` costs nothing until one is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        [
            "get_scheduler",
            "get_constant_schedule",
            "get_constant_schedule_with_warmup",
            "get_linear_schedule_with_warmup",
            "get_cosine_schedule_with_warmup",
            "get_cosine_with_hard_restarts_schedule_with_warmup",
            "get_polynomial_decay_schedule_with_warmup",
            "get_inverse_sqrt_schedule",
            "get_cosine_with_min_lr_schedule_with_warmup",
            "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
            "get_wsd_schedule",
            "get_reduce_on_plateau_schedule",
            "get_greedy_schedule",
            "TYPE_TO_SCHEDULER_FUNCTION",
        ],
        "trainwell.optim.schedulers",
    ),
    "GreedyLR": "trainwell.optim.greedy",
    "Adafactor": "trainwell.optim.adafactor",
    "AdafactorSchedule": "trainwell.optim.adafactor",
    "get_adafactor_schedule": "trainwell.optim.adafactor",
    "LayerWiseDummyOptimizer": "trainwell.optim.layerwise",
    "LayerWiseDummyScheduler": "trainwell.optim.layerwise",
    "get_parameter_names": "trainwell.optim.param_groups",
    "get_decay_parameter_names": "trainwell.optim.param_groups",
    "build_param_groups": "trainwell.optim.param_groups",
    "OPTIMIZERS": "trainwell.optim.registry",
    "parse_optim_args": "trainwell.optim.registry",
    "get_optimizer_cls_and_kwargs": "trainwell.optim.registry",
    "create_optimizer": "trainwell.optim.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainwell.optim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
