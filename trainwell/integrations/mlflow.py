"""MLflow: params, per-step metrics and (optionally) checkpoints as artifacts, in any MLflow tracking store.

Environment, as with the reference: ``MLFLOW_TRACKING_URI`` (e.g. ``sqlite:///mlflow.db`` or a server; unset:
MLflow's own default), ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID`` (continue that run), ``MLFLOW_NESTED_RUN``,
``MLFLOW_TAGS`` (a JSON object), ``MLFLOW_FLATTEN_PARAMS``, and ``HF_MLFLOW_LOG_ARTIFACTS`` (upload each
checkpoint folder when it is saved). Metrics keep the Trainer's names (``loss``, ``eval_loss``) at the
global step. A run this callback opened is ended at the end of training; a run you opened is left open.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from trainwell.integrations.base import TrackerCallback, model_config_dict, numeric_logs

# MLflow's limits: a param value is at most 6000 characters, and a batch at most 100 params.
_MAX_PARAM_LENGTH = 6000
_PARAM_BATCH = 100
_BAD_NAME = re.compile(r"[^\w\-. /]")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def mlflow_params(args: Any, model: Any) -> dict[str, str]:
    """The params to log: model config then arguments (arguments win), as strings within MLflow's limits."""
    combined = {**(model_config_dict(model) or {}), **args.to_dict()}
    if _truthy("MLFLOW_FLATTEN_PARAMS"):
        combined = _flatten(combined)
    params = {}
    for key, value in combined.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        params[_BAD_NAME.sub("_", key)] = text[:_MAX_PARAM_LENGTH]
    return params


class MLflowCallback(TrackerCallback):
    """Sends the Trainer's logs to MLflow."""

    name = "mlflow"

    def __init__(self) -> None:
        super().__init__()
        import mlflow  # imported with the callback, never with trainwell

        self._ml = mlflow
        self._own_run = False
        self.run_id: str | None = None

    def start(self, args: Any, state: Any, model: Any) -> None:
        ml = self._ml
        if os.environ.get("MLFLOW_TRACKING_URI"):
            ml.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
        if os.environ.get("MLFLOW_EXPERIMENT_NAME"):
            ml.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
        nested = _truthy("MLFLOW_NESTED_RUN")
        run_id = os.environ.get("MLFLOW_RUN_ID") or None
        if ml.active_run() is None or nested or run_id:
            run = ml.start_run(run_id=run_id, run_name=args.run_name, nested=nested)
            self._own_run = True
        else:
            run = ml.active_run()
        self.run_id = run.info.run_id
        if os.environ.get("MLFLOW_TAGS"):
            ml.set_tags(json.loads(os.environ["MLFLOW_TAGS"]))
        params = mlflow_params(args, model)
        if run_id:  # continuing a run: params it already has cannot be changed, so only add new ones
            existing = ml.get_run(run_id).data.params
            params = {k: v for k, v in params.items() if k not in existing}
        items = list(params.items())
        for i in range(0, len(items), _PARAM_BATCH):
            ml.log_params(dict(items[i:i + _PARAM_BATCH]))

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        metrics = {_BAD_NAME.sub("_", k): float(v) for k, v in numeric_logs(logs).items()}
        if metrics:
            self._ml.log_metrics(metrics, step=step)

    def checkpoint_saved(self, checkpoint_dir: str, args: Any, state: Any) -> None:
        if _truthy("HF_MLFLOW_LOG_ARTIFACTS") and os.path.isdir(checkpoint_dir):
            self._ml.log_artifacts(checkpoint_dir, artifact_path=os.path.basename(checkpoint_dir))

    def finish(self, args: Any, state: Any) -> None:
        if self._own_run and self._ml.active_run() is not None:
            self._ml.end_run()
        self._own_run = False
