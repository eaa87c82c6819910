"""ClearML: the arguments as hyperparameters, the model config as a configuration object, scalars per step.

A task already running in the process (yours, or a ClearML pipeline's) is used; otherwise one is created from
``CLEARML_PROJECT`` (default ``"HuggingFace Transformers"``) and ``CLEARML_TASK`` (default ``"Trainer"``) and
closed at the end of training. ClearML's own settings apply (``clearml.conf``, ``CLEARML_*``; offline mode with
``Task.set_offline(True)`` or ``CLEARML_OFFLINE_MODE=1`` keeps the session in a local folder for a later
``clearml-task --import-offline-session``). Scalars: ``train``/``eval``/``test`` plots with one series per metric
at the global step; the end-of-training values (``train_runtime``...) and ``epoch`` as single values.
``CLEARML_LOG_MODEL`` uploads each checkpoint as an output model (default on for a task this callback created,
off for yours, as the reference's code does), keeping at most ``save_total_limit`` of them (not in offline
mode: ClearML cannot store models there). A second ``train()``
in the same process logs under suffixed names (``Transformers_2``, ``train_2``). Unlike the reference, a task
run remotely by a ClearML agent does not apply hyperparameter overrides made in the UI to the arguments.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trainwell.integrations.base import TrackerCallback, model_config_dict, numeric_logs
from trainwell.utils.packages import env_flag

logger = logging.getLogger(__name__)

_HPARAMS = "Transformers"  # the reference's section names, so dashboards built for it keep working
_MODEL_CONFIG = "Model Configuration"
_SINGLE_VALUES = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos", "epoch"}
)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


class ClearMLCallback(TrackerCallback):
    """Sends the Trainer's logs (and optionally checkpoints) to ClearML."""

    name = "clearml"
    _train_runs = 0  # per process: the reference suffixes the names of every train() after the first

    def __init__(self) -> None:
        super().__init__()
        import clearml  # imported with the callback, never with trainwell

        self._clearml = clearml
        self._task: Any = None
        self._close_at_end = False
        self._log_model = False
        self._suffix = ""
        self._models: list[Any] = []
        self._offline_warned = False

    def start(self, args: Any, state: Any, model: Any) -> None:
        task_cls = self._clearml.Task
        ClearMLCallback._train_runs += 1
        self._suffix = "" if ClearMLCallback._train_runs == 1 else f"_{ClearMLCallback._train_runs}"
        self._models = []
        if self._task is None:
            current = task_cls.current_task()
            if current is not None:
                self._task, self._log_model = current, env_flag("CLEARML_LOG_MODEL", default=False)
            else:
                self._task = task_cls.init(
                    project_name=os.environ.get("CLEARML_PROJECT", "HuggingFace Transformers"),
                    task_name=os.environ.get("CLEARML_TASK", "Trainer"),
                    auto_connect_frameworks={"tensorboard": False, "pytorch": False},
                    output_uri=True,
                )
                self._log_model = env_flag("CLEARML_LOG_MODEL", default=True)
                self._close_at_end = task_cls.running_locally()
        hparams = {k: v for k, v in _flatten(args.to_dict()).items() if not k.endswith("_token")}
        self._task.update_parameters({f"{_HPARAMS}{self._suffix}/{k}": v for k, v in hparams.items()})
        config = model_config_dict(model)
        if config is not None:
            self._task.set_configuration_object(
                name=_MODEL_CONFIG + self._suffix,
                config_dict=config,
                description="The configuration of the model trained.",
            )

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        report = self._task.get_logger()
        for key in logs.keys() - numeric_logs(logs).keys():
            logger.warning("clearml: %r=%r is not a number; it was not logged.", key, logs[key])
        for key, value in numeric_logs(logs).items():
            if key in _SINGLE_VALUES:
                report.report_single_value(name=key + self._suffix, value=value)
                continue
            title, series = "train", key
            for prefix in ("eval", "test"):
                if key.startswith(prefix + "_"):
                    title, series = prefix, key[len(prefix) + 1 :]
            report.report_scalar(title=title + self._suffix, series=series, value=value, iteration=step)

    def checkpoint_saved(self, checkpoint_dir: str, args: Any, state: Any) -> None:
        if not self._log_model:
            return
        if self._clearml.Task.is_offline():  # ClearML's OutputModel fails in offline mode (it has no model store)
            if not self._offline_warned:
                logger.warning("clearml: offline mode cannot store models; checkpoints are not logged as models.")
                self._offline_warned = True
            return
        folder = os.path.basename(checkpoint_dir)
        output_model = self._clearml.OutputModel(task=self._task, name=folder + self._suffix)
        output_model.connect(task=self._task, name=folder + self._suffix)
        output_model.update_weights_package(
            weights_path=checkpoint_dir, target_filename=folder, iteration=state.global_step, auto_delete_file=False
        )
        self._models.append(output_model)
        while args.save_total_limit and len(self._models) > args.save_total_limit:
            oldest = self._models[0]
            try:
                self._clearml.Model.remove(oldest, delete_weights_file=True, force=True, raise_on_errors=True)
            except Exception as err:  # noqa: BLE001 - keeping one model too many must not stop the tracker
                logger.warning("clearml: could not remove the model %r beyond save_total_limit: %s", oldest.name, err)
                break
            self._models.pop(0)

    def finish(self, args: Any, state: Any) -> None:
        if self._close_at_end and self._task is not None:
            self._task.close()
            self._task, self._close_at_end = None, False
            ClearMLCallback._train_runs = 0
