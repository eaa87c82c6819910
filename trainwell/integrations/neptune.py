"""Neptune (the ``neptune`` 1.x client): metrics as series under a base namespace, arguments and model config.

The run is created from the callback's arguments and Neptune's environment (``NEPTUNE_API_TOKEN``,
``NEPTUNE_PROJECT``, ``NEPTUNE_MODE``: ``offline`` keeps the run in ``.neptune/`` for a later ``neptune sync``,
``debug`` keeps it in memory), or pass ``run=`` to log to a run you opened. Everything goes under
``base_namespace`` (default ``"finetuning"``): ``train/loss``, ``eval/loss``... as series at the global step,
``train/epoch`` as a single value, ``trainer_parameters`` (the arguments), ``model_parameters`` (the model
config) and, in a hyperparameter search, ``trial`` and ``trial_params``. ``log_checkpoints`` uploads
checkpoints: ``"same"`` every one, ``"last"`` only the newest, ``"best"`` only the best (needs
``load_best_model_at_end``). The run is stopped at the end of training; a later ``evaluate()`` reopens it
(online only: an offline run cannot be reopened, so a new one is made). ``NeptuneCallback.get_run(trainer)``
returns the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from trainwell.integrations.base import TrackerCallback, model_config_dict, numeric_logs, rewrite_logs

_CHECKPOINT_CHOICES = (None, "same", "last", "best")
_SINGLE_VALUE_METRICS = frozenset({"train/epoch"})


class NeptuneCallback(TrackerCallback):
    """Sends the Trainer's logs (and optionally checkpoints) to Neptune."""

    name = "neptune"

    def __init__(
        self,
        *,
        api_token: str | None = None,
        project: str | None = None,
        name: str | None = None,
        base_namespace: str = "finetuning",
        run: Any = None,
        log_parameters: bool = True,
        log_checkpoints: str | None = None,
        **neptune_run_kwargs: Any,
    ) -> None:
        super().__init__()
        if log_checkpoints not in _CHECKPOINT_CHOICES:
            raise ValueError(
                f"NeptuneCallback(log_checkpoints={log_checkpoints!r}): use one of "
                f"{', '.join(map(repr, _CHECKPOINT_CHOICES))}."
            )
        import neptune  # imported with the callback, never with trainwell

        self._neptune = neptune
        self._run_kwargs = {"api_token": api_token, "project": project, "name": name, **neptune_run_kwargs}
        self._base_namespace = base_namespace
        self._given_run = run
        self._log_parameters = log_parameters
        self._log_checkpoints = log_checkpoints
        self._upload_next_checkpoint = log_checkpoints is not None
        self._uploaded: str | None = None  # the checkpoint last uploaded ("last"/"best" delete it for the next)
        self._copies: str | None = None  # a temporary folder of checkpoint copies (see checkpoint_saved)
        self._run: Any = None
        self._run_id: str | None = None

    # --- the run -------------------------------------------------------------------------------------------------
    @property
    def run(self) -> Any:
        """The Neptune run (``None`` before the first log)."""
        return self._run

    @classmethod
    def get_run(cls, trainer: Any) -> Any:
        """The run of the ``NeptuneCallback`` among ``trainer``'s callbacks."""
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, cls):
                return callback.run
        raise ValueError("This trainer has no NeptuneCallback: pass report_to='neptune' or add one to callbacks.")

    def _offline(self) -> bool:
        return (self._run_kwargs.get("mode") or os.environ.get("NEPTUNE_MODE")) in ("offline", "debug")

    def start(self, args: Any, state: Any, model: Any) -> None:
        if self._log_checkpoints == "best" and not args.load_best_model_at_end:
            raise ValueError(
                "NeptuneCallback(log_checkpoints='best') uploads the best checkpoint, which needs "
                "load_best_model_at_end=True (or choose log_checkpoints='last' or 'same')."
            )
        if self._given_run is not None:
            self._run, self._given_run = self._given_run, None
        else:
            reopen = {"with_id": self._run_id} if self._run_id and not self._offline() else {}
            self._run = self._neptune.init_run(**{k: v for k, v in self._run_kwargs.items() if v is not None}, **reopen)
        self._run_id = getattr(self._run, "_sys_id", None)
        self._run["source_code/integrations/trainwell"] = _trainwell_version()
        space = self._run[self._base_namespace]
        if self._log_parameters:
            space["trainer_parameters"] = args.to_sanitized_dict()
            config = model_config_dict(model)
            if config is not None:
                from neptune.utils import stringify_unsupported

                space["model_parameters"] = stringify_unsupported(config)
        if state.is_hyper_param_search:
            space["trial"] = state.trial_name
            if state.trial_params is not None:
                space["trial_params"] = state.trial_params

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        space = self._run[self._base_namespace]
        for key, value in rewrite_logs(numeric_logs(logs)).items():
            if key in _SINGLE_VALUE_METRICS:
                space[key] = value
            else:
                space[key].append(value, step=step)

    def finish(self, args: Any, state: Any) -> None:
        if self._run is not None:
            self._run.stop()  # waits for the queued operations, uploads included
            self._run = None
        if self._copies is not None:
            shutil.rmtree(self._copies, ignore_errors=True)
            self._copies = None

    # --- checkpoints ---------------------------------------------------------------------------------------------
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics = kwargs.get("metrics") or {}
        if self._log_checkpoints != "best" or not args.metric_for_best_model:
            return
        name = args.metric_for_best_model
        value = metrics.get(name if name.startswith("eval_") else f"eval_{name}")
        if value is None:
            return
        # on_evaluate runs before the best metric is updated: upload the checkpoint saved next if it improved
        best = state.best_metric
        self._upload_next_checkpoint = best is None or (value > best if args.greater_is_better else value < best)

    def checkpoint_saved(self, checkpoint_dir: str, args: Any, state: Any) -> None:
        if not self._upload_next_checkpoint:
            return
        target = "checkpoints" if self._log_checkpoints == "same" else f"checkpoints/{self._log_checkpoints}"
        files = self._run[self._base_namespace][target]
        source = checkpoint_dir
        if args.save_total_limit is not None:
            # Uploads run in the background; rotation may delete the folder first, so upload a copy of it.
            self._copies = self._copies or tempfile.mkdtemp(prefix="trainwell-neptune-")
            source = os.path.join(self._copies, os.path.basename(checkpoint_dir))
            shutil.copytree(checkpoint_dir, source, dirs_exist_ok=True)
        files.upload_files(source)
        if self._log_checkpoints in ("last", "best") and self._uploaded is not None:
            files.delete_files(self._uploaded)
        self._uploaded = source


def _trainwell_version() -> str:
    from trainwell.utils.version import __version__

    return __version__
