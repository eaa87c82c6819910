"""Weights & Biases: per-step charts against ``train/global_step``, arguments as the run config.

Honours wandb's own settings (``WANDB_MODE=offline`` writes locally and needs no account; ``WANDB_DIR``,
``WANDB_PROJECT`` — default ``"huggingface"`` as with the reference — ``WANDB_ENTITY``). ``run_name`` names
the run. A run already open (yours, or the one a previous ``train()`` opened) is reused. As with the reference,
the run stays open after ``train()``, so a following ``evaluate()`` or ``predict()`` is logged to the same run;
wandb closes it when the program exits (or call ``wandb.finish()``). The end-of-training values
(``train_runtime``, ...) go to the run summary, not the charts.
"""

from __future__ import annotations

import os
from typing import Any

from trainwell.integrations.base import SINGLE_VALUE_KEYS, TrackerCallback, model_config_dict, rewrite_logs


class WandbCallback(TrackerCallback):
    """Sends the Trainer's logs to Weights & Biases."""

    name = "wandb"

    def __init__(self) -> None:
        super().__init__()
        import wandb  # imported with the callback, never with trainwell

        self._wandb = wandb
        self._run: Any = None

    def start(self, args: Any, state: Any, model: Any) -> None:
        config = {**(model_config_dict(model) or {}), **args.to_dict()}
        if self._wandb.run is None:
            self._run = self._wandb.init(
                project=os.environ.get("WANDB_PROJECT", "huggingface"), name=args.run_name, config=config,
            )
        else:
            self._run = self._wandb.run
            self._run.config.update(config, allow_val_change=True)
        # Chart every metric against the Trainer's step, not wandb's own call counter.
        self._run.define_metric("train/global_step")
        self._run.define_metric("*", step_metric="train/global_step", step_sync=True)

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        curves = {k: v for k, v in logs.items() if k not in SINGLE_VALUE_KEYS}
        for key in logs.keys() & SINGLE_VALUE_KEYS:
            self._run.summary[key] = logs[key]
        if curves:
            self._run.log({**rewrite_logs(curves), "train/global_step": step})

    def finish(self, args: Any, state: Any) -> None:
        self._run = None  # left open on purpose (see the module docstring); the next start reuses it
