"""Trained by tests/test_distributed.py under ``accelerate launch --cpu --num_processes N`` (or plainly).

Writes the final parameters, the logged losses and the eval metrics of a seeded run to ``--out`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common.models import RegressionDataset, RegressionModel, TinyTokenLM, VariableLengthTokenDataset  # noqa: E402
from trainwell import Trainer, TrainingArguments  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--ga", type=int, default=1)
    parser.add_argument("--model", choices=["regression", "tokens"], default="regression")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--stateful-iterable", action="store_true",
                        help="train 12 steps on an IterableDataset that saves its position, checkpoint every 5")
    parser.add_argument("--resume", default=None)
    cli = parser.parse_args()

    if cli.stateful_iterable:
        return _stateful_iterable(cli)
    if cli.model == "regression":
        model, data, eval_data = RegressionModel(), RegressionDataset(length=64), RegressionDataset(length=24, seed=5)
        predict_data = RegressionDataset(length=23, seed=6)
    else:
        torch.manual_seed(0)
        model, data = TinyTokenLM(), VariableLengthTokenDataset(n=32)
        eval_data = VariableLengthTokenDataset(n=16, seed=3)
        predict_data = VariableLengthTokenDataset(n=13, seed=4)
    args = TrainingArguments(
        output_dir=cli.workdir, per_device_train_batch_size=cli.batch, gradient_accumulation_steps=cli.ga,
        per_device_eval_batch_size=4, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
        num_train_epochs=2, logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True,
        max_grad_norm=0.0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    result = trainer.train()
    metrics = trainer.evaluate(eval_data)
    preds = trainer.predict(predict_data)
    if trainer.is_world_process_zero():
        with open(cli.out, "w") as fh:
            json.dump({
                "params": {n: p.detach().flatten().tolist() for n, p in trainer.model.named_parameters()},
                "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                "steps": result.global_step,
                "eval_loss": metrics["eval_loss"],
                "predictions": preds.predictions.tolist(),
                "world": trainer.runtime.num_processes,
            }, fh)


def _stateful_iterable(cli: argparse.Namespace) -> None:
    """Train on a stateful IterableDataset (read by rank 0, dispatched by Accelerate), maybe resuming."""
    from tests.checkpointing.data import StatefulIterable

    args = TrainingArguments(
        output_dir=cli.workdir, per_device_train_batch_size=cli.batch, gradient_accumulation_steps=cli.ga,
        learning_rate=0.1, optim="sgd", lr_scheduler_type="constant", max_steps=12, save_strategy="steps",
        save_steps=5, logging_steps=1, report_to="none", disable_tqdm=True, use_cpu=True, max_grad_norm=0.0,
    )
    trainer = Trainer(model=RegressionModel(), args=args,
                      train_dataset=StatefulIterable(RegressionDataset(length=200), seed=1))
    trainer.train(resume_from_checkpoint=cli.resume)
    if trainer.is_world_process_zero():
        with open(cli.out, "w") as fh:
            json.dump({"params": {n: p.detach().flatten().tolist() for n, p in trainer.model.named_parameters()},
                       "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}, fh)


if __name__ == "__main__":
    main()
