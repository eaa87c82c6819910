"""End-to-end example: train, evaluate, save and predict a small classifier with trainwell.

Runs on a CPU in a few seconds. The only line that differs from a transformers script is the import.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from trainwell import Trainer, TrainingArguments


class Blobs(Dataset):
    """Points around 4 centres in 16-D; the label is the centre."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        centres = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 2
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.x = centres[self.y] + torch.randn(n, 16, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def accuracy(eval_pred) -> dict[str, float]:
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, -1) == labels).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output-dir", default=None, help="where checkpoints and the model go (default: a temp dir)")
    parser.add_argument("--epochs", type=float, default=3.0)
    cli = parser.parse_args()
    output_dir = cli.output_dir or tempfile.mkdtemp(prefix="trainwell-quickstart-")

    args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=cli.epochs,
        per_device_train_batch_size=32,
        learning_rate=3e-3,
        eval_strategy="epoch",
        save_strategy="epoch",
        logging_steps=10,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        save_total_limit=2,
        report_to="none",
    )
    trainer = Trainer(
        model=Classifier(),
        args=args,
        train_dataset=Blobs(2048, seed=1),
        eval_dataset=Blobs(512, seed=2),
        compute_metrics=accuracy,
    )
    before = trainer.evaluate()
    result = trainer.train()
    after = trainer.evaluate()
    trainer.save_model()
    trainer.save_state()
    predictions = trainer.predict(Blobs(8, seed=3))
    print(f"\nvalidation loss: {before['eval_loss']:.4f} before training -> {after['eval_loss']:.4f} after")
    print(f"validation accuracy: {before['eval_accuracy']:.3f} -> {after['eval_accuracy']:.3f}")
    print(f"train loss {result.training_loss:.4f} over {result.global_step} steps "
          f"({result.metrics['train_samples_per_second']:.0f} samples/s)")
    print(f"predicted classes: {predictions.predictions.argmax(-1).tolist()} (true: {predictions.label_ids.tolist()})")
    print(f"model, checkpoints and trainer_state.json are in {output_dir}")


if __name__ == "__main__":
    main()
