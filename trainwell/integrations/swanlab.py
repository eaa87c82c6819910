"""SwanLab: the arguments and model config as the run config, metrics as ``train/loss``, ``eval/loss``... per step.

SwanLab's own settings apply: ``SWANLAB_MODE`` (``cloud``/``online``, ``local``, ``offline`` — a local file to
upload later with ``swanlab sync`` — or ``disabled``), ``SWANLAB_LOG_DIR`` (default ``./swanlog``),
``SWANLAB_API_KEY``, ``SWANLAB_WEB_HOST``/``SWANLAB_API_HOST``. As with the reference: ``SWANLAB_PROJECT`` names
the project, ``run_name`` (with the trial name in a search) the experiment, ``SWANLAB_RUN_ID`` and
``SWANLAB_RESUME`` (default ``"allow"`` when resuming from a checkpoint) continue a run. A run already open is
used. The end-of-training values are logged as ``single_value/train_runtime``... The run stays open after
``train()`` (SwanLab finishes it at exit, or call ``swanlab.finish()``). ``SWANLAB_LOG_MODEL`` is answered with
a warning: SwanLab cannot store models yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from trainwell.integrations.base import SINGLE_VALUE_KEYS, TrackerCallback, peft_config_dict, rewrite_logs, run_config

logger = logging.getLogger(__name__)


class SwanLabCallback(TrackerCallback):
    """Sends the Trainer's logs to SwanLab."""

    name = "swanlab"

    def __init__(self) -> None:
        super().__init__()
        import swanlab  # imported with the callback, never with trainwell

        self._swanlab = swanlab
        self._log_model = os.environ.get("SWANLAB_LOG_MODEL")

    def _has_run(self) -> bool:
        has_run = getattr(self._swanlab, "has_run", None)  # swanlab >= 0.7; older ones return None from get_run
        return has_run() if callable(has_run) else self._swanlab.get_run() is not None

    def start(self, args: Any, state: Any, model: Any) -> None:
        if not self._has_run():
            kwargs = _init_kwargs(args, state)
            with _project_variable_hidden():
                self._swanlab.init(**kwargs)
        config = run_config(args, model)
        if peft_config_dict(model) is not None:
            config["peft_config"] = peft_config_dict(model)
        if callable(getattr(model, "num_parameters", None)):
            config["model_num_parameters"] = model.num_parameters()
        if callable(getattr(model, "get_nb_trainable_parameters", None)):  # a PEFT model
            config["peft_model_trainable_params"], config["peft_model_all_param"] = model.get_nb_trainable_parameters()
        self._swanlab.config["FRAMEWORK"] = "trainwell"
        self._swanlab.config.update(config)
        if self._log_model is not None:
            logger.warning("SWANLAB_LOG_MODEL is set, but SwanLab cannot store models yet; none is uploaded.")

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        singles = {f"single_value/{k}": v for k, v in logs.items() if k in SINGLE_VALUE_KEYS}
        curves = {k: v for k, v in logs.items() if k not in SINGLE_VALUE_KEYS}
        if singles:
            self._swanlab.log(singles, step=step)
        if curves:
            self._swanlab.log({**rewrite_logs(curves), "train/global_step": step}, step=step)


@contextlib.contextmanager
def _project_variable_hidden() -> Iterator[None]:
    """SwanLab 0.10 reads every ``SWANLAB_<section>`` variable as a settings section and fails on the reference's
    ``SWANLAB_PROJECT`` (its own is ``SWANLAB_PROJECT_NAME``): hide it while ``swanlab.init`` reads the
    environment; its value is passed as ``project=`` instead."""
    value = os.environ.pop("SWANLAB_PROJECT", None)
    try:
        yield
    finally:
        if value is not None:
            os.environ["SWANLAB_PROJECT"] = value


def _init_kwargs(args: Any, state: Any) -> dict[str, Any]:
    """``swanlab.init`` arguments from the run name, the trial and the reference's SWANLAB_* variables."""
    kwargs: dict[str, Any] = {}
    names = [n for n in (args.run_name, state.trial_name) if n is not None]
    if names:
        kwargs["experiment_name"] = "-".join(names)
    if os.environ.get("SWANLAB_PROJECT"):
        kwargs["project"] = os.environ["SWANLAB_PROJECT"]
    if os.environ.get("SWANLAB_RUN_ID"):
        kwargs["id"] = os.environ["SWANLAB_RUN_ID"]
    resume = os.environ.get("SWANLAB_RESUME") or ("allow" if args.resume_from_checkpoint else None)
    if resume:
        kwargs["resume"] = resume
    return kwargs
