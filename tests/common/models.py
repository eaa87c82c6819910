"""Tiny models and datasets for the tests: built in code, deterministic, fast on a CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset


class RegressionDataset(Dataset):
    """y = a·x + b + noise, with ``length`` samples (seeded)."""

    def __init__(self, a: float = 2.0, b: float = 3.0, length: int = 64, seed: int = 42, label_names=("labels",)):
        rng = np.random.default_rng(seed)
        self.length = length
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.ys = [a * self.x + b + rng.normal(scale=0.1, size=(length,)).astype(np.float32) for _ in label_names]
        self.label_names = label_names

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = {"input_x": self.x[i]}
        for name, y in zip(self.label_names, self.ys):
            item[name] = y[i]
        return item


class RegressionModel(nn.Module):
    """y = a·x + b with an MSE loss (a per-batch mean), returning a dict (or a tuple with ``as_tuple``)."""

    def __init__(self, a: float = 0.0, b: float = 0.0, double_output: bool = False, as_tuple: bool = False):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a).float())
        self.b = nn.Parameter(torch.tensor(b).float())
        self.double_output = double_output
        self.as_tuple = as_tuple

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        if labels is None:
            return (y, y) if self.double_output else (y,) if self.as_tuple else {"logits": y}
        loss = nn.functional.mse_loss(y, labels)
        if self.as_tuple:
            return (loss, y, y) if self.double_output else (loss, y)
        return {"loss": loss, "logits": y}


class DropoutMLP(nn.Module):
    """A small MLP classifier with dropout (randomness that resume must reproduce)."""

    def __init__(self, d_in: int = 8, hidden: int = 16, n_classes: int = 3, p: float = 0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, n_classes))

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class ClassificationDataset(Dataset):
    def __init__(self, n: int = 96, d_in: int = 8, n_classes: int = 3, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d_in, generator=g)
        w = torch.randn(d_in, n_classes, generator=g)
        self.y = (self.x @ w).argmax(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class TinyTokenLM(nn.Module):
    """Embedding + linear head predicting each position's label; mean CE over labels != -100."""

    def __init__(self, vocab: int = 17, dim: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return out


class VariableLengthTokenDataset(Dataset):
    """Token sequences of varying length, already padded to ``max_len`` with labels -100 on the padding."""

    def __init__(self, n: int = 32, max_len: int = 10, vocab: int = 17, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(2, max_len + 1, (1,), generator=g))
            ids = torch.randint(1, vocab, (max_len,), generator=g)
            labels = torch.randint(0, vocab, (max_len,), generator=g)
            ids[length:] = 0
            labels[length:] = -100
            self.items.append({"input_ids": ids, "labels": labels})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


class CountingIterable(IterableDataset):
    """An IterableDataset of ``n`` regression samples."""

    def __init__(self, n: int = 64, seed: int = 0):
        self.inner = RegressionDataset(length=n, seed=seed)

    def __iter__(self):
        for i in range(len(self.inner)):
            yield self.inner[i]


@dataclass
class DataclassOutput:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class DataclassOutputModel(RegressionModel):
    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        loss = nn.functional.mse_loss(y, labels) if labels is not None else None
        return DataclassOutput(loss=loss, logits=y)
