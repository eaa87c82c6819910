"""The tracker registry: every ``report_to`` name trainwell knows, where its callback lives and what it needs.

A table of names, module paths and package names, with the reference's rules for which trackers
``report_to="all"`` picks. It sits with the arguments, which check ``report_to`` against it when they are
built, and imports nothing of the trackers themselves (``trainwell.integrations`` turns an entry into a
callback). Every check here looks for files only.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Callable
from dataclasses import dataclass

from trainwell.utils.packages import env_flag
from trainwell.utils.packages import installed as _installed


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


def _never() -> bool:
    return False


def mlflow_enabled() -> bool:  # the reference's DISABLE_MLFLOW_INTEGRATION switch
    return not env_flag("DISABLE_MLFLOW_INTEGRATION") and _installed("mlflow")


def _azureml_in_all() -> bool:  # as in the reference: with MLflow installed, Azure ML runs are logged through it
    return _installed("azureml.core") and not mlflow_enabled()


def comet_configured() -> bool:
    """Whether Comet can log without asking for a key: an API key in the environment or a ``.comet.config``
    file (where comet_ml looks: ``$COMET_CONFIG``, ``./``, ``~/``), or an offline run asked for. Reads files only."""
    if os.environ.get("COMET_API_KEY"):
        return True
    mode = os.environ.get("COMET_MODE", "").strip().lower()
    if mode == "offline" or not env_flag("COMET_START_ONLINE", default=True):
        return True
    override = os.environ.get("COMET_CONFIG")
    if override and os.path.isdir(override):
        override = os.path.join(override, ".comet.config")
    for path in (override, "./.comet.config", "~/.comet.config"):
        if not path or not os.path.isfile(os.path.expanduser(path)):
            continue
        parser = configparser.ConfigParser()
        try:
            parser.read(os.path.expanduser(path))
        except configparser.Error:
            continue
        if parser.get("comet", "api_key", fallback=None):
            return True
    return False


def comet_in_all() -> bool:
    """Comet needs an API key to log online; as in the reference, "all" leaves it out until one is configured
    (``COMET_API_KEY`` or a ``.comet.config`` file). A run asked to stay offline needs none."""
    return _installed("comet_ml") and comet_configured()


def kubeflow_enabled() -> bool:
    """Inside a Kubeflow TrainJob (the controller sets ``KUBEFLOW_TRAINER_SERVER_URL``), progress is reported
    to it unless ``DISABLE_KUBEFLOW_INTEGRATION`` is true: the reference adds ``kubeflow`` to every ``report_to``."""
    return bool(os.environ.get("KUBEFLOW_TRAINER_SERVER_URL")) and not env_flag("DISABLE_KUBEFLOW_INTEGRATION")


_I = "trainwell.integrations."
# In the order the reference lists them for report_to="all", then the ones "all" never picks.
TRACKERS: dict[str, Tracker] = {
    "azure_ml": Tracker(_I + "azureml", "AzureMLCallback", ("azureml.core",), "azureml-core", in_all=_azureml_in_all),
    "comet_ml": Tracker(_I + "comet", "CometCallback", ("comet_ml",), "comet_ml", in_all=comet_in_all),
    "dagshub": Tracker(_I + "dagshub", "DagsHubCallback", ("dagshub",), "dagshub mlflow", also=("mlflow",)),
    "dvclive": Tracker(_I + "dvclive", "DVCLiveCallback", ("dvclive",), "dvclive"),
    "mlflow": Tracker(_I + "mlflow", "MLflowCallback", ("mlflow",), "mlflow", in_all=mlflow_enabled),
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

#: ``report_to`` names that are no tracker but a file trainwell writes itself, asked for by name ("all" never
#: picks one): ``"live"`` appends each log to ``OUTPUT_DIR/live_log.jsonl`` as it happens, for
#: ``trainwell report --watch`` (``trainwell.loop.live_log``); ``trainwell demo`` and ``trainwell train`` add it.
#: Without it the run folder holds what the reference's holds.
SWITCHES: dict[str, str] = {"live": "OUTPUT_DIR/live_log.jsonl, each log as it happens (trainwell report --watch)"}


def wants_live_log(report_to: list[str] | None) -> bool:
    """Whether a run's normalized ``report_to`` asks for the live log (``report_to`` containing ``"live"``)."""
    return "live" in (report_to or ())


def with_live_log(report_to: list[str]) -> list[str]:
    """A normalized ``report_to`` with the live log added (what ``trainwell demo`` and ``trainwell train`` run)."""
    return report_to if wants_live_log(report_to) else [*report_to, "live"]
