"""Experiment trackers, one module per tracker, behind a lazy registry keyed by ``report_to`` names.

Owns the registry (``TRACKERS``: name -> module, class, required packages) and ``reporting_callbacks``,
which the Trainer calls with the normalized ``args.report_to``. No tracker module or package is imported
until a run names it, so ``import trainwell`` never pays for one. What each tracker does lives in its module;
the behaviour they share (main process only, lazy start, failures reported once) in ``base``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwell.search import is_optuna_available, is_ray_available, is_ray_tune_available  # noqa: F401
from trainwell.utils.errors import did_you_mean
from trainwell.utils.lazy import lazy_exports


@dataclass(frozen=True)
class Tracker:
    """A registry entry: where the callback class lives and what it needs.

    ``packages``: importable modules, any one of which suffices (tensorboard or tensorboardX); ``also``: modules
    needed as well (DagsHub logs through MLflow); ``pip``: what to install when they are missing. ``in_all``
    decides whether ``report_to="all"`` picks the tracker (default: its packages are installed), so the
    reference's exceptions live here: Flyte never, Azure ML only without MLflow, Comet only once configured.
    """

    module: str
    cls: str
    packages: tuple[str, ...] = ()
    pip: str = ""
    also: tuple[str, ...] = ()
    in_all: Callable[[], bool] | None = None

    def installed(self) -> bool:
        return (not self.packages or any(_installed(p) for p in self.packages)) and all(map(_installed, self.also))

    def picked_by_all(self) -> bool:
        """Whether ``report_to="all"`` includes this tracker (looks for files only: nothing is imported)."""
        return self.in_all() if self.in_all is not None else self.installed()


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "TRUE", "YES", "ON")


def _never() -> bool:
    return False


def _mlflow_enabled() -> bool:  # the reference's DISABLE_MLFLOW_INTEGRATION switch
    return not _env_true("DISABLE_MLFLOW_INTEGRATION") and _installed("mlflow")


def _azureml_in_all() -> bool:  # as in the reference: with MLflow installed, Azure ML runs are logged through it
    return _installed("azureml.core") and not _mlflow_enabled()


def _comet_in_all() -> bool:
    """Comet needs an API key to log online; as in the reference, "all" leaves it out until one is configured
    (``COMET_API_KEY`` or a ``.comet.config`` file). A run asked to stay offline needs none."""
    from trainwell.integrations.comet import comet_configured

    return _installed("comet_ml") and comet_configured()


def kubeflow_enabled() -> bool:
    """Inside a Kubeflow TrainJob (the controller sets ``KUBEFLOW_TRAINER_SERVER_URL``), progress is reported
    to it unless ``DISABLE_KUBEFLOW_INTEGRATION`` is true: the reference adds ``kubeflow`` to every ``report_to``."""
    return bool(os.environ.get("KUBEFLOW_TRAINER_SERVER_URL")) and not _env_true("DISABLE_KUBEFLOW_INTEGRATION")


_I = "trainwell.integrations."
# In the order the reference lists them for report_to="all", then the ones "all" never picks.
TRACKERS: dict[str, Tracker] = {
    "azure_ml": Tracker(_I + "azureml", "AzureMLCallback", ("azureml.core",), "azureml-core", in_all=_azureml_in_all),
    "comet_ml": Tracker(_I + "comet", "CometCallback", ("comet_ml",), "comet_ml", in_all=_comet_in_all),
    "dagshub": Tracker(_I + "dagshub", "DagsHubCallback", ("dagshub",), "dagshub mlflow", also=("mlflow",)),
    "dvclive": Tracker(_I + "dvclive", "DVCLiveCallback", ("dvclive",), "dvclive"),
    "mlflow": Tracker(_I + "mlflow", "MLflowCallback", ("mlflow",), "mlflow", in_all=_mlflow_enabled),
    "neptune": Tracker(_I + "neptune", "NeptuneCallback", ("neptune",), "neptune"),
    "tensorboard": Tracker(_I + "tensorboard", "TensorBoardCallback", ("tensorboard", "tensorboardX"), "tensorboard"),
    "wandb": Tracker(_I + "wandb", "WandbCallback", ("wandb",), "wandb"),
    "codecarbon": Tracker(_I + "codecarbon", "CodeCarbonCallback", ("codecarbon",), "codecarbon"),
    "clearml": Tracker(_I + "clearml", "ClearMLCallback", ("clearml",), "clearml"),
    "swanlab": Tracker(_I + "swanlab", "SwanLabCallback", ("swanlab",), "swanlab"),
    "trackio": Tracker(_I + "trackio", "TrackioCallback", ("trackio",), "trackio"),
    "kubeflow": Tracker(_I + "kubeflow", "KubeflowCallback", in_all=kubeflow_enabled),
    "flyte": Tracker(_I + "flyte", "FlyteCallback", ("flytekit",), "flytekit", in_all=_never),
    "jsonl": Tracker(_I + "filelog", "JsonlLoggerCallback", in_all=_never),
    "csv": Tracker(_I + "filelog", "CsvLoggerCallback", in_all=_never),
}


def _installed(package: str) -> bool:
    """Whether ``package`` (a dotted name: its parents are imported, so name a light one) can be imported."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a half-installed package, a missing parent, or a module with no __spec__
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
            f"report_to={name!r} needs {' and '.join(entry.pip.split())}, not installed here: pip install {entry.pip}"
        )
    return getattr(importlib.import_module(entry.module), entry.cls)


def reporting_callbacks(report_to: list[str] | None) -> list[Any]:
    """Callback instances for the trackers named in ``report_to`` (an empty list for none), checked all at
    once so a missing package is reported before any work starts."""
    return [tracker_class(name)() for name in dict.fromkeys(report_to or [])]


def get_reporting_integration_callbacks(report_to: list[str] | None) -> list[type]:
    """The reference's function of that name: the callback *classes* for ``report_to``."""
    return [tracker_class(name) for name in dict.fromkeys(report_to or [])]


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
