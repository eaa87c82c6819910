"""DVCLive: parameters in ``params.yaml``, metrics as ``plots/metrics/**.tsv`` plus ``metrics.json``, in files.

The ``dvclive.Live`` is yours (``live=``) or made at the start with ``live_kwargs`` (``dir=``, default
``"dvclive"``, ``save_dvc_exp=``...: DVCLive's own arguments). Each Trainer log is one DVCLive step, numbered by
the Trainer's global step (the reference numbers them 0, 1, 2... whatever the step; trainwell's plots share
the x axis of every other tracker). Metric names follow DVCLive's Hugging Face convention (``loss``,
``eval/loss``). ``log_model`` (or ``HF_DVCLIVE_LOG_MODEL``): ``True`` saves the final model to
``output_dir/last`` (``best`` with ``load_best_model_at_end``) and logs it as a model artifact; ``"all"`` logs
``output_dir`` at every checkpoint. The run is ended (``Live.end()``) at the end of training.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

from trainwell.args.storage import local_output_dir
from trainwell.integrations.base import TrackerCallback
from trainwell.utils.packages import env_flag

logger = logging.getLogger(__name__)


def _log_model_from_env() -> bool | str | None:
    value = os.environ.get("HF_DVCLIVE_LOG_MODEL", "")
    if value.strip().lower() == "all":
        return "all"
    return True if env_flag("HF_DVCLIVE_LOG_MODEL") else None


class DVCLiveCallback(TrackerCallback):
    """Sends the Trainer's logs to DVCLive."""

    name = "dvclive"

    def __init__(self, live: Any = None, log_model: Literal["all"] | bool | None = None, **live_kwargs: Any) -> None:
        super().__init__()
        from dvclive import Live  # imported with the callback, never with trainwell

        if live is not None and not isinstance(live, Live):
            raise TypeError(f"DVCLiveCallback(live=...) takes a dvclive.Live, not {type(live).__name__}.")
        if log_model not in (None, True, False, "all"):
            raise ValueError(f"DVCLiveCallback(log_model={log_model!r}): use True, False or 'all'.")
        self._live_cls = Live
        self._live_kwargs = live_kwargs
        self.live = live
        self._log_model = _log_model_from_env() if log_model is None else log_model

    def start(self, args: Any, state: Any, model: Any) -> None:
        if self.live is None:
            self.live = self._live_cls(**self._live_kwargs)
        self.live.log_params(args.to_dict())

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        from dvclive.plots import Metric
        from dvclive.utils import standardize_metric_name

        self.live.step = step
        for key, value in logs.items():
            if Metric.could_log(value):
                self.live.log_metric(standardize_metric_name(key, "dvclive.huggingface"), value)
            else:
                logger.warning("dvclive: %r=%r cannot be logged as a metric; it was left out.", key, value)
        self.live.next_step()  # writes metrics.json (and the report, when one is asked for)

    def checkpoint_saved(self, checkpoint_dir: str, args: Any, state: Any) -> None:
        if self._log_model == "all":
            self.live.log_artifact(local_output_dir(args))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self._started and self._log_model is True:
            self._guard(
                "logging the model", self._log_final_model, args, kwargs.get("model"), kwargs.get("processing_class")
            )
        super().on_train_end(args, state, control, **kwargs)

    def _log_final_model(self, args: Any, model: Any, processing_class: Any) -> None:
        from trainwell.checkpoint.io import save_model_weights

        name = "best" if args.load_best_model_at_end else "last"
        folder = os.path.join(local_output_dir(args), name)
        save_model_weights(model, folder)
        if callable(getattr(processing_class, "save_pretrained", None)):
            from trainwell.utils.safe_files import staged

            with staged(folder) as stage:  # renamed into place: never written through a planted link
                processing_class.save_pretrained(str(stage))
        self.live.log_artifact(folder, name=name, type="model", copy=True)

    def finish(self, args: Any, state: Any) -> None:
        self.live.end()
