"""Experiment trackers, one module per tracker, behind a lazy registry keyed by ``report_to`` names.

Owns ``reporting_callbacks`` and the reference's ``is_*_available`` functions over the registry (``TRACKERS``:
name -> module, class, required packages), which lives with the arguments (``trainwell.args.trackers``) that
check ``report_to`` against it, and
which the Trainer calls with the normalized ``args.report_to``. No tracker module or package is imported
until a run names it, so ``import trainwell`` never pays for one. What each tracker does lives in its module;
the behaviour they share (main process only, lazy start, failures reported once) in ``base``.
"""

from __future__ import annotations

from typing import Any

from trainwell.args.trackers import TRACKERS, Tracker, kubeflow_enabled  # noqa: F401  (the registry, re-exported)
from trainwell.args.trackers import comet_in_all as _comet_in_all
from trainwell.args.trackers import mlflow_enabled as _mlflow_enabled
from trainwell.integrations.registry import (  # noqa: F401  (the reference's names, re-exported)
    get_reporting_integration_callbacks,
    reporting_callbacks,
    tracker_class,
)
from trainwell.utils.lazy import lazy_exports
from trainwell.utils.packages import installed as _installed
from trainwell.utils.packages import is_optuna_available, is_ray_available, is_ray_tune_available  # noqa: F401


def get_available_reporting_integrations() -> list[str]:
    """The reference's function of that name: what ``report_to="all"`` resolves to here (nothing imported)."""
    return [name for name, tracker in TRACKERS.items() if tracker.picked_by_all()]


# The reference's is_<tracker>_available() functions: package presence only (nothing imported).
def is_tensorboard_available() -> bool:
    return TRACKERS["tensorboard"].installed()


def is_mlflow_available() -> bool:
    return _mlflow_enabled()


def is_wandb_available() -> bool:
    return TRACKERS["wandb"].installed()


def is_trackio_available() -> bool:
    return TRACKERS["trackio"].installed()


def is_comet_available() -> bool:
    return _comet_in_all()


def is_clearml_available() -> bool:
    return TRACKERS["clearml"].installed()


def is_neptune_available() -> bool:
    return TRACKERS["neptune"].installed()


def is_dvclive_available() -> bool:
    return TRACKERS["dvclive"].installed()


def is_codecarbon_available() -> bool:
    return TRACKERS["codecarbon"].installed()


def is_swanlab_available() -> bool:
    return TRACKERS["swanlab"].installed()


def is_azureml_available() -> bool:
    return TRACKERS["azure_ml"].installed()


def is_dagshub_available() -> bool:
    return TRACKERS["dagshub"].installed()


def is_flytekit_available() -> bool:
    return TRACKERS["flyte"].installed()


def is_kubeflow_available() -> bool:
    return kubeflow_enabled()


def is_deepspeed_available() -> bool:
    return _installed("deepspeed")


def is_deepspeed_zero3_enabled() -> bool:
    """True while a DeepSpeed ZeRO-3 configuration is active in this process (a Trainer built with one)."""
    from trainwell.backend.deepspeed import active_zero_stage

    return active_zero_stage() == 3


def hp_params(trial: Any) -> dict[str, Any]:
    """The hyperparameters of a search trial (an Optuna trial's ``params``, or Ray Tune's config dict)."""
    from trainwell.state import trial_params

    return trial_params(trial)


def run_hp_search_optuna(trainer: Any, n_trials: int, direction: str | list[str], **kwargs: Any) -> Any:
    """Run an Optuna search with the search settings already on ``trainer`` (``hyperparameter_search`` does this)."""
    from trainwell.search import optuna_backend

    return optuna_backend.run(trainer, n_trials, direction, **kwargs)


# ``from trainwell.integrations import TensorBoardCallback`` (the reference's import path), loaded on first use
__getattr__, __dir__ = lazy_exports(__name__, {entry.cls: entry.module for entry in TRACKERS.values()},
                                    extra_dir=[name for name in globals() if not name.startswith("_")])
