"""Comet: the arguments, model config and graph as the experiment's parameters, metrics at the global step.

Comet's own settings apply (``COMET_API_KEY``, ``COMET_PROJECT_NAME``, ``COMET_WORKSPACE``, ``COMET_START_ONLINE``,
``COMET_OFFLINE_DIRECTORY``, ``.comet.config`` files). ``COMET_MODE`` is read as the reference reads it
(``get``, ``get_or_create`` — the default — or ``create``) plus the 4.x values ``offline`` (an offline experiment:
an archive in ``COMET_OFFLINE_DIRECTORY`` to upload later with ``comet upload``, no account needed), ``online``
and ``disabled``; any other value is refused when the Trainer is built. ``run_name`` names the experiment;
metrics are logged as ``train/loss``, ``eval/loss``... with the epoch. ``COMET_LOG_ASSETS=true`` uploads
``output_dir`` at the end of training. As with the reference, the experiment stays open after ``train()`` so a
following ``evaluate()`` is logged to it; Comet ends it at exit (or call ``callback.experiment.end()``), except
during a hyperparameter search, where each trial's experiment is ended with the trial.
"""

from __future__ import annotations

import os
from typing import Any

from trainwell.args.storage import local_output_dir
from trainwell.integrations.base import (
    TrackerCallback,
    model_config_dict,
    numeric_logs,
    peft_config_dict,
    rewrite_logs,
)
from trainwell.utils.packages import env_flag

# COMET_MODE -> (comet_ml.start's mode, its online flag); None leaves the choice to Comet's own settings.
_MODES: dict[str, tuple[str | None, bool | None]] = {
    "get": ("get", None),
    "get_or_create": ("get_or_create", None),
    "create": ("create", None),
    "offline": (None, False),
    "online": (None, True),
}


def comet_mode() -> tuple[str | None, bool | None] | None:
    """``COMET_MODE`` as ``(mode, online)``; ``None`` when it is ``disabled``. A ValueError names the choices."""
    value = os.environ.get("COMET_MODE", "").strip().lower()
    if not value:
        return None, None
    if value == "disabled":
        return None
    if value not in _MODES:
        raise ValueError(
            f"COMET_MODE={os.environ['COMET_MODE']!r} is not a Comet mode: use one of "
            f"{', '.join(map(repr, [*_MODES, 'disabled']))}, or unset it."
        )
    return _MODES[value]


class CometCallback(TrackerCallback):
    """Sends the Trainer's logs to Comet."""

    name = "comet_ml"

    def __init__(self) -> None:
        super().__init__()
        self._mode = comet_mode()  # checked here, so a wrong COMET_MODE stops the run before training
        import comet_ml  # imported with the callback, never with trainwell

        self._comet = comet_ml
        self._log_assets = env_flag("COMET_LOG_ASSETS")
        self.experiment: Any = None

    def start(self, args: Any, state: Any, model: Any) -> None:
        if self._mode is None or (self.experiment is not None and self.experiment.alive):
            return  # disabled, or continuing the experiment a previous train() opened
        mode, online = self._mode
        if state.is_hyper_param_search:
            mode = "create"  # one experiment per trial
        self.experiment = self._comet.start(
            mode=mode,
            online=online,
            experiment_config=self._comet.ExperimentConfig(name=args.run_name),
        )
        if model is not None:
            self.experiment.set_model_graph(model)
        params: dict[str, Any] = {"args": args.to_dict()}
        config = model_config_dict(model)
        if config is not None:
            params["config"] = config
        if peft_config_dict(model) is not None:
            params["peft_config"] = peft_config_dict(model)
        self.experiment.log_parameters(params)  # nested dicts become "args|learning_rate", as with the reference
        if state.is_hyper_param_search:
            self.experiment.log_optimization(optimization_id=state.trial_name, parameters=state.trial_params)

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        if self.experiment is not None:
            self.experiment.log_metrics(rewrite_logs(numeric_logs(logs)), step=step, epoch=state.epoch)

    def finish(self, args: Any, state: Any) -> None:
        if self.experiment is None:
            return
        if self._log_assets:
            self.experiment.log_asset_folder(
                local_output_dir(args), recursive=True, log_file_name=True, step=state.global_step
            )
        if state.is_hyper_param_search:
            self.experiment.end()
            self.experiment = None
