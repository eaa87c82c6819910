"""The reference's ``transformers.trainer_utils`` names, under the same path (re-exported from their owners).

``from trainwell.trainer_utils import get_last_checkpoint, speed_metrics, PredictionOutput`` works as it does with
the reference; each name lives in the module listed here. docs/compat.md lists what is offered and what is not.
"""

from __future__ import annotations

from trainwell.utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["EvalPrediction", "EvalLoopOutput", "PredictionOutput", "TrainOutput", "BestRun",
                     "PREFIX_CHECKPOINT_DIR", "IntervalStrategy", "SaveStrategy", "HubStrategy", "SchedulerType",
                     "ExplicitEnum"], "trainwell.outputs"),
    **dict.fromkeys(["set_seed", "enable_full_determinism", "seed_worker"], "trainwell.utils.seed"),
    **dict.fromkeys(["speed_metrics", "denumpify_detensorize"], "trainwell.utils.metrics"),
    "get_last_checkpoint": "trainwell.checkpoint.resume",
    "has_length": "trainwell.data.loaders",
    "find_executable_batch_size": "trainwell.utils.batch_size",
    **dict.fromkeys(["HPSearchBackend", "default_compute_objective", "default_hp_space_optuna",
                     "default_hp_space_ray"], "trainwell.search"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
