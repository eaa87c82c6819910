"""Command-line flags shared by the engine scripts in tests/distributed (FSDP, DeepSpeed): checkpoint rotation,
model-only checkpoints and a SIGTERM on every process at a given step (with ``enable_jit_checkpoint``)."""

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


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--save-total-limit", type=int, default=None)
    parser.add_argument("--save-only-model", action="store_true")
    parser.add_argument("--sigterm-at", type=int, default=0, help="enable_jit_checkpoint, then SIGTERM at this step")


def arguments(cli: argparse.Namespace) -> dict[str, Any]:
    """The TrainingArguments the flags ask for."""
    return {"save_total_limit": cli.save_total_limit, "save_only_model": cli.save_only_model,
            "enable_jit_checkpoint": bool(cli.sigterm_at)}


def callbacks(cli: argparse.Namespace) -> list[TrainerCallback]:
    return [SigtermAt(cli.sigterm_at)] if cli.sigterm_at else []
