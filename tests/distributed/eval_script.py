"""Evaluated by tests/test_eval_distributed.py under ``accelerate launch`` with 2 CPU processes, or plainly.

Runs several evaluations of an untrained seeded model on datasets whose size does not divide evenly by
(batch size × processes) and writes their metrics and predictions to ``--out`` (rank 0). The test compares
the 2-process results with the 1-process ones: they must be equal to float tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch
from torch.utils.data import IterableDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common.models import (
    RegressionDataset,
    RegressionModel,
    TinyTokenLM,
    VariableLengthTokenDataset,
)
from trainwell import Trainer, TrainingArguments


class Stream(IterableDataset):
    """The same stream on every process (an iterable eval set of 19 samples)."""

    def __init__(self, n: int = 19):
        self.inner = RegressionDataset(length=n, seed=9)

    def __iter__(self):
        return (self.inner[i] for i in range(len(self.inner)))


def trim_collate(features):
    """Pad token samples only to the longest of the batch, so batches differ in length across processes."""
    width = max(int((f["labels"] != -100).sum()) for f in features)
    return {k: torch.stack([f[k][:width] for f in features]) for k in ("input_ids", "labels")}


def token_metrics(pred):
    logits, labels = pred.predictions, pred.label_ids
    mask = labels != -100
    return {"accuracy": float((logits.argmax(-1)[mask] == labels[mask]).mean()), "n": len(labels),
            "loss_sum": float(np.sum(pred.losses)),
            "inputs_sum": int(np.sum(np.where(pred.inputs >= 0, pred.inputs, 0)))}


class BatchMAE:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def __call__(self, pred, compute_result):
        self.total += float((pred.predictions - pred.label_ids).abs().sum())
        self.count += len(pred.label_ids)
        if compute_result:
            result = {"mae": self.total / self.count, "n": self.count}
            self.total, self.count = 0.0, 0
            return result
        return None


class EpochStream(Stream):
    """A training stream whose content follows ``set_epoch``."""

    def __init__(self):
        super().__init__(n=16)
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)
        self.inner = RegressionDataset(length=16, seed=epoch)


def train_on_stream(workdir: str) -> dict:
    """Train 6 steps on an iterable dataset: 2 processes with batch 4 must equal 1 process with batch 8."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    stream = EpochStream()
    args = TrainingArguments(output_dir=workdir, report_to="none", disable_tqdm=True, use_cpu=True, max_steps=6,
                             per_device_train_batch_size=8 // world, learning_rate=0.1, optim="sgd",
                             lr_scheduler_type="constant", save_strategy="no", max_grad_norm=0.0)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=stream)
    trainer.train()
    return {"a": float(trainer.model.a), "b": float(trainer.model.b), "epochs": _distinct_in_order(stream.epochs)[:3]}


def _distinct_in_order(values: list) -> list:
    """``values`` without consecutive repeats (Accelerate's loader repeats ``set_epoch`` when iteration starts)."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def run(workdir: str) -> dict:
    results = {}
    common = dict(output_dir=workdir, report_to="none", disable_tqdm=True, use_cpu=True, per_device_eval_batch_size=4)
    torch.manual_seed(0)
    lm = TinyTokenLM()
    trainer = Trainer(model=lm, args=TrainingArguments(**common, include_for_metrics=["inputs", "loss"]),
                      data_collator=trim_collate, compute_metrics=token_metrics)
    tokens = VariableLengthTokenDataset(n=23, seed=4)
    results["tokens"] = trainer.evaluate(tokens)
    out = trainer.predict(tokens)
    results["tokens_pred_shape"] = list(out.predictions.shape)
    results["tokens_labels"] = out.label_ids.tolist()

    regression = RegressionModel(a=1.5, b=0.5)
    mae = lambda p: {"mae": float(np.abs(p.predictions - p.label_ids).mean()), "n": len(p.label_ids)}
    trainer = Trainer(model=regression, args=TrainingArguments(**common), compute_metrics=mae)
    results["regression"] = trainer.evaluate(RegressionDataset(length=23, seed=5))
    results["regression_pred"] = trainer.predict(RegressionDataset(length=13, seed=6)).predictions.tolist()
    results["tiny"] = trainer.evaluate(RegressionDataset(length=3, seed=7))  # fewer samples than one batch per rank
    results["stream"] = trainer.evaluate(Stream())
    results["stream_pred"] = trainer.predict(Stream()).predictions.tolist()

    trainer = Trainer(model=regression, args=TrainingArguments(**common, batch_eval_metrics=True),
                      compute_metrics=BatchMAE())
    results["batch_metrics"] = trainer.evaluate(RegressionDataset(length=23, seed=5))
    trainer = Trainer(model=regression, args=TrainingArguments(**common, eval_use_gather_object=True),
                      compute_metrics=mae)
    results["gather_object"] = trainer.evaluate(RegressionDataset(length=23, seed=5))
    trainer = Trainer(model=regression, args=TrainingArguments(**common, dataloader_drop_last=True),
                      compute_metrics=mae)
    results["drop_last"] = trainer.evaluate(RegressionDataset(length=23, seed=5))
    results["iterable_train"] = train_on_stream(workdir)
    for value in results.values():
        if isinstance(value, dict):
            for key in [k for k in value if k.endswith(("_runtime", "_per_second"))]:
                del value[key]
    results["world"] = trainer.runtime.num_processes
    results["is_main"] = trainer.is_world_process_zero()
    trainer.runtime.wait_for_everyone()
    trainer.end()  # destroy the process group before exit (gloo may abort at interpreter exit otherwise)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    cli = parser.parse_args()
    results = run(cli.workdir)
    if results["is_main"]:
        with open(cli.out, "w") as fh:
            json.dump(results, fh)


if __name__ == "__main__":
    main()
