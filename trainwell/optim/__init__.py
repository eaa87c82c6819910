"""Optimizers and learning-rate schedulers: the ``optim`` registry, weight-decay parameter groups, the
``lr_scheduler_type`` schedules, Adafactor and GreedyLR.

Names are re-exported lazily, so ``import trainwell.optim`` costs nothing until one is used.
"""

from __future__ import annotations

from trainwell.utils.lazy import lazy_exports

# The public scheduler builders of trainwell.optim.schedulers. Kept here, not there: this module must not
# import torch, and schedulers.py takes its ``__all__`` from this tuple, so the two lists cannot drift.
SCHEDULER_NAMES: tuple[str, ...] = (
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
)

_EXPORTS: dict[str, str] = {
    **dict.fromkeys([*SCHEDULER_NAMES, "TYPE_TO_SCHEDULER_FUNCTION"], "trainwell.optim.schedulers"),
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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
