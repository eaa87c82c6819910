"""Experiment trackers, one module per tracker, behind a lazy registry keyed by ``report_to`` names.

Owns the registry (``TRACKERS``: name -> module, class, required packages) and ``reporting_callbacks``,
which the Trainer calls with the normalized ``args.report_to``. No tracker module or package is imported
until a run names it, so ``import trainwell`` never pays for one. What each tracker does lives in its module;
the behaviour they share (main process only, lazy start, failures reported once) in ``base``.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from trainwell.search import is_optuna_available, is_ray_available, is_ray_tune_available  # noqa: F401
from trainwell.utils.errors import did_you_mean
from trainwell.utils.lazy import lazy_exports


@dataclass(frozen=True)
class Tracker:
    """A registry entry: where the callback class lives and which importable packages it needs."""

    module: str
    cls: str
    packages: tuple[str, ...] = ()  # any one of them suffices (tensorboard or tensorboardX)
    pip: str = ""  # what to pip install when none is present

    def installed(self) -> bool:
        return not self.packages or any(_installed(p) for p in self.packages)


TRACKERS: dict[str, Tracker] = {
    "tensorboard": Tracker("trainwell.integrations.tensorboard", "TensorBoardCallback",
                           ("tensorboard", "tensorboardX"), "tensorboard"),
    "mlflow": Tracker("trainwell.integrations.mlflow", "MLflowCallback", ("mlflow",), "mlflow"),
    "wandb": Tracker("trainwell.integrations.wandb", "WandbCallback", ("wandb",), "wandb"),
    "trackio": Tracker("trainwell.integrations.trackio", "TrackioCallback", ("trackio",), "trackio"),
    "jsonl": Tracker("trainwell.integrations.filelog", "JsonlLoggerCallback"),
    "csv": Tracker("trainwell.integrations.filelog", "CsvLoggerCallback"),
}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a half-installed package, or a module with no __spec__
        return False


def tracker_class(name: str) -> type:
    """The callback class for ``name``; ``ValueError`` for an unknown name, ``ImportError`` naming what to
    ``pip install`` when the tracker's package is missing."""
    entry = TRACKERS.get(name)
    if entry is None:
        raise ValueError(
            f"report_to: {name!r} is not a tracker trainwell knows. Use any of "
            f"{', '.join(map(repr, TRACKERS))}, 'all' (the installed ones) or 'none'." + did_you_mean(name, TRACKERS)
        )
    if not entry.installed():
        raise ImportError(
            f"report_to={name!r} needs the {entry.pip!r} package, which is not installed: "
            f"pip install {entry.pip}  (or pip install 'trainwell[trackers]' for all of them)."
        )
    return getattr(importlib.import_module(entry.module), entry.cls)


def reporting_callbacks(report_to: list[str] | None) -> list[Any]:
    """Callback instances for the trackers named in ``report_to`` (an empty list for none), checked all at
    once so a missing package is reported before any work starts."""
    return [tracker_class(name)() for name in dict.fromkeys(report_to or [])]


def get_reporting_integration_callbacks(report_to: list[str] | None) -> list[type]:
    """The reference's function of that name: the callback *classes* for ``report_to``."""
    return [tracker_class(name) for name in dict.fromkeys(report_to or [])]


def is_tensorboard_available() -> bool:
    return TRACKERS["tensorboard"].installed()


def is_mlflow_available() -> bool:
    return TRACKERS["mlflow"].installed()


def is_wandb_available() -> bool:
    return TRACKERS["wandb"].installed()


def is_trackio_available() -> bool:
    return TRACKERS["trackio"].installed()


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
