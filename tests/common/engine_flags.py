"""Command-line flags shared by the engine scripts in tests/distributed (FSDP, DeepSpeed): where to write, the
batch and run length, saving, the best model, resuming, checkpoint rotation, model-only checkpoints and a
SIGTERM on every process at a given step (with ``enable_jit_checkpoint``)."""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

from trainwell import TrainerCallback


class SigtermAt(TrainerCallback):
    """Sends SIGTERM to this process when ``step`` begins, as a scheduler preempting the job would (every rank)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def add_flags(parser: argparse.ArgumentParser, ga: int = 1) -> None:
    """The shared flags; ``ga`` is the script's default gradient accumulation."""
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--ga", type=int, default=ga)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--best", action="store_true", help="evaluate and load the best model at the end")
    parser.add_argument("--resume", default=None, help="a checkpoint folder, or 'true' for the newest complete one")
    parser.add_argument("--save-total-limit", type=int, default=None)
    parser.add_argument("--save-only-model", action="store_true")
    parser.add_argument("--sigterm-at", type=int, default=0, help="enable_jit_checkpoint, then SIGTERM at this step")


def arguments(cli: argparse.Namespace) -> dict[str, Any]:
    """The TrainingArguments both scripts run with, as the flags ask."""
    run = {"output_dir": cli.workdir, "per_device_train_batch_size": cli.batch,
           "gradient_accumulation_steps": cli.ga, "learning_rate": 1e-2, "weight_decay": 0.1,
           "max_steps": cli.max_steps, "logging_steps": 1, "report_to": "none", "disable_tqdm": True}
    best = {"eval_strategy": "steps", "eval_steps": cli.save_steps, "load_best_model_at_end": True,
            "metric_for_best_model": "loss"} if cli.best else {}
    return {**run, "save_strategy": "steps" if cli.save_steps else "no", "save_steps": cli.save_steps or 500, **best,
            "save_total_limit": cli.save_total_limit, "save_only_model": cli.save_only_model,
            "enable_jit_checkpoint": bool(cli.sigterm_at)}


def resume(cli: argparse.Namespace) -> str | bool | None:
    """``resume_from_checkpoint`` for ``--resume``."""
    return True if cli.resume == "true" else cli.resume


def callbacks(cli: argparse.Namespace) -> list[TrainerCallback]:
    return [SigtermAt(cli.sigterm_at)] if cli.sigterm_at else []
