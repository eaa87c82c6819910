"""A seeded training run for the resume, kill and signal tests, started in a fresh process.

Trains ``DropoutMLP`` (dropout, AdamW, linear schedule, clipping) on a shuffled dataset and writes to
``--out`` (a ``torch.save`` file, rank 0 only): the final parameters, the optimizer state, every micro-batch
loss at full precision with its step, the logged losses and the global step. Options pick the data
(map-style, plain iterable, iterable with ``state_dict``), workers, accumulation, when to stop, whether to
resume, and fault injection (a self-SIGKILL inside a save, a sleep per step so a signal can land mid-run).
Also runs under ``accelerate launch`` (2 CPU processes).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tests.checkpointing.data import PlainIterable, StatefulIterable  # noqa: E402
from tests.common.models import ClassificationDataset, DropoutMLP  # noqa: E402
from trainwell import Trainer, TrainerCallback, TrainingArguments  # noqa: E402


class RecordingTrainer(Trainer):
    """Records each micro-batch loss (as backpropagated) with the step it belongs to."""

    losses: list[tuple[int, float]]

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.losses.append((self.state.global_step + 1, float(loss)))
        return loss


class StopAt(TrainerCallback):
    """Stop after step ``k`` (the loop saves first when the strategy asks for it), like a job cut short."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.k:
            control.should_save = True
            control.should_training_stop = True


class SlowSteps(TrainerCallback):
    """Sleep after each step (a signal sent at a random time then lands mid-run); announces each step."""

    def __init__(self, seconds: float, ready_file: str | None) -> None:
        self.seconds, self.ready_file = seconds, ready_file

    def on_step_end(self, args, state, control, **kwargs):
        if self.ready_file:
            with open(self.ready_file, "w") as fh:
                fh.write(str(state.global_step))
        time.sleep(self.seconds)


def _die_inside_save(step: int, file_name: str) -> None:
    """SIGKILL this process right after ``file_name`` is written in the save of ``step`` (a crash mid-save)."""
    from trainwell.checkpoint import contents

    original = contents.torch_save

    def torch_save(obj, path):
        original(obj, path)
        folder = os.path.basename(os.path.dirname(str(path)))
        if os.path.basename(str(path)) == file_name and folder.endswith(f"checkpoint-{step}"):
            os.kill(os.getpid(), signal.SIGKILL)

    contents.torch_save = torch_save


def _dataset(kind: str):
    data = ClassificationDataset(n=96)
    if kind == "iterable":
        return PlainIterable(data, seed=3)
    if kind == "stateful":
        return StatefulIterable(data, seed=3)
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", choices=["map", "iterable", "stateful"], default="map")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--ga", type=int, default=3)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--save-steps", type=int, default=0, help="0: save only where --stop-at stops")
    parser.add_argument("--save-strategy", default=None)
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--resume", default=None, help="'true' for the newest complete checkpoint, or a path")
    parser.add_argument("--ignore-data-skip", action="store_true")
    parser.add_argument("--jit", action="store_true", help="enable_jit_checkpoint")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ready-file", default=None)
    parser.add_argument("--die-in-save", default=None, help="STEP:FILE, e.g. 4:optimizer.pt")
    parser.add_argument("--save-async", action="store_true", help="save_async: write checkpoints in the background")
    cli = parser.parse_args()

    if cli.die_in_save:
        step, name = cli.die_in_save.split(":")
        _die_inside_save(int(step), name)
    strategy = cli.save_strategy or ("steps" if cli.save_steps or cli.stop_at else "no")
    args = TrainingArguments(
        output_dir=cli.workdir, per_device_train_batch_size=cli.batch, gradient_accumulation_steps=cli.ga,
        learning_rate=0.01, weight_decay=0.01, optim="adamw_torch", lr_scheduler_type="linear", warmup_steps=2,
        max_grad_norm=1.0, num_train_epochs=cli.epochs, max_steps=cli.max_steps, logging_steps=1,
        save_strategy=strategy, save_steps=cli.save_steps or 10_000, dataloader_num_workers=cli.workers,
        ignore_data_skip=cli.ignore_data_skip, enable_jit_checkpoint=cli.jit, report_to="none",
        disable_tqdm=True, use_cpu=True, seed=7, save_async=cli.save_async,
    )
    torch.manual_seed(0)
    callbacks: list = []
    if cli.stop_at:
        callbacks.append(StopAt(cli.stop_at))
    if cli.sleep or cli.ready_file:
        callbacks.append(SlowSteps(cli.sleep, cli.ready_file))
    trainer = RecordingTrainer(model=DropoutMLP(), args=args, train_dataset=_dataset(cli.data), callbacks=callbacks)
    trainer.losses = []
    resume = {"true": True, None: None}.get(cli.resume, cli.resume)
    trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        torch.save({
            "params": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": trainer.optimizer.state_dict(),
            "losses": trainer.losses,
            "logged": [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h],
            "global_step": trainer.state.global_step,
            "world": trainer.runtime.num_processes,
        }, cli.out)


if __name__ == "__main__":
    main()
