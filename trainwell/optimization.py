"""The reference's ``transformers.optimization`` names (schedules, Adafactor, GreedyLR), under the same path."""

from __future__ import annotations

from trainwell.optim import SCHEDULER_NAMES
from trainwell.utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys([*SCHEDULER_NAMES, "TYPE_TO_SCHEDULER_FUNCTION"], "trainwell.optim.schedulers"),
    **dict.fromkeys(["Adafactor", "AdafactorSchedule", "get_adafactor_schedule"], "trainwell.optim.adafactor"),
    "GreedyLR": "trainwell.optim.greedy",
    "SchedulerType": "trainwell.outputs",
    "LayerWiseDummyOptimizer": "trainwell.optim.layerwise",
    "LayerWiseDummyScheduler": "trainwell.optim.layerwise",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
