"""What every tracker callback shares: main process only, lazy start, logs in tracker form, failure isolation.

A tracker implements four hooks (``start``, ``log_metrics``, ``checkpoint_saved``, ``finish``); this base
maps the Trainer's events onto them. The contract it enforces: trackers run on the world main process only;
a tracker starts at ``on_train_begin`` or at its first log (so ``evaluate()`` alone is tracked too); any
exception a tracker raises (disk full, server gone, bad value) is reported once, disables that tracker for
the rest of the run, and never reaches the training loop.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime
from typing import Any

from trainwell.args.storage import local_output_dir
from trainwell.events.callback import TrainerCallback
from trainwell.state import TrainerControl, TrainerState

logger = logging.getLogger("trainwell.integrations")

# Values the reference logs once at the end of train(); trackers with per-step charts skip them there.
SINGLE_VALUE_KEYS = frozenset({
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos",
})


def rewrite_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """Tracker names for Trainer logs: ``eval_x`` -> ``eval/x``, ``test_x`` -> ``test/x``, else ``train/x``."""
    out = {}
    for key, value in logs.items():
        if key.startswith("eval_"):
            out["eval/" + key[5:]] = value
        elif key.startswith("test_"):
            out["test/" + key[5:]] = value
        else:
            out["train/" + key] = value
    return out


def numeric_logs(logs: dict[str, Any]) -> dict[str, float]:
    """The entries of ``logs`` that are plain numbers (bools and strings left out)."""
    return {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def default_run_folder() -> str:
    """``Mon12_15-04-05_hostname``: the folder name torch's SummaryWriter (and the reference) use by default."""
    return f"{datetime.now():%b%d_%H-%M-%S}_{socket.gethostname()}"


def resolve_logging_dir(args: Any, env_var: str | None = None) -> str:
    """Where file-based trackers write: ``$env_var`` if set, else ``args.logging_dir`` (the 4.x argument),
    else ``{output_dir}/runs/{run_name or date_host}`` (the reference's 4.x default)."""
    chosen = (os.environ.get(env_var) if env_var else None) or getattr(args, "logging_dir", None)
    if not chosen:
        folder = (args.run_name or default_run_folder()).replace(os.sep, "_")
        chosen = os.path.join(local_output_dir(args) or "trainer_output", "runs", folder)
    return os.path.expanduser(chosen)


def model_config_dict(model: Any) -> dict[str, Any] | None:
    """The model's config as a dict (``transformers`` configs, dataclasses with ``to_dict``, plain dicts)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    if isinstance(config, dict):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    return to_dict() if callable(to_dict) else None


def peft_config_dict(model: Any) -> dict[str, Any] | None:
    """A PEFT model's adapter configs as ``{adapter name: dict}``; ``None`` for any other model."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict):
        return None
    return {name: cfg.to_dict() if callable(getattr(cfg, "to_dict", None)) else cfg for name, cfg in configs.items()}


def run_config(args: Any, model: Any) -> dict[str, Any]:
    """What most trackers record as the run's configuration: the model config, then the arguments (which win)."""
    return {**(model_config_dict(model) or {}), **args.to_dict()}


class TrackerCallback(TrainerCallback):
    """Base of the tracker callbacks. Subclasses set ``name`` and implement the hooks below."""

    name = "tracker"

    def __init__(self) -> None:
        self._started = False
        self._failed = False

    # --- hooks for subclasses -----------------------------------------------------------------------
    def start(self, args: Any, state: TrainerState, model: Any) -> None:
        """Open the run (create files, connect). Called once before the first ``log_metrics``."""

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: TrainerState) -> None:
        """Record one Trainer log (the Trainer's own key names) at ``step``."""
        raise NotImplementedError

    def checkpoint_saved(self, checkpoint_dir: str, args: Any, state: TrainerState) -> None:
        """A checkpoint was just written (most trackers do nothing)."""

    def finish(self, args: Any, state: TrainerState) -> None:
        """Close the run (flush, close files). The tracker may be started again by a later log."""

    # --- failure isolation --------------------------------------------------------------------------
    @property
    def failed(self) -> bool:
        """True once the tracker raised: it is then silent for the rest of the run."""
        return self._failed

    def _guard(self, what: str, fn: Callable[..., Any], *fn_args: Any) -> None:
        if self._failed:
            return
        try:
            fn(*fn_args)
        except Exception as err:  # noqa: BLE001 - a tracker must never stop training, whatever it raises
            self._failed = True
            logger.error(
                "The %s tracker failed while %s (%s: %s). It is disabled for the rest of this run; training "
                "continues.", self.name, what, type(err).__name__, err,
            )

    def _ensure_started(self, args: Any, state: TrainerState, model: Any) -> None:
        if not self._started:
            self._guard("starting", self.start, args, state, model)
            self._started = not self._failed

    # --- events -------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._ensure_started(args, state, kwargs.get("model"))

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        logs = kwargs.get("logs")
        if not state.is_world_process_zero or not logs:
            return
        self._ensure_started(args, state, kwargs.get("model"))
        if self._started:
            self._guard("logging", self.log_metrics, dict(logs), state.global_step, args, state)

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        metrics = kwargs.get("metrics")
        if not state.is_world_process_zero or not metrics:
            return
        self._ensure_started(args, state, kwargs.get("model"))
        if self._started:
            self._guard("logging prediction metrics", self.log_metrics, dict(metrics), state.global_step, args, state)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero and self._started:
            path = os.path.join(local_output_dir(args), f"checkpoint-{state.global_step}")
            self._guard("recording a checkpoint", self.checkpoint_saved, path, args, state)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero and self._started:
            self._started = False
            self._guard("finishing", self.finish, args, state)
