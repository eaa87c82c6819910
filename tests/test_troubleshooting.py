"""docs/troubleshooting.md quotes each error as trainwell prints it. Each quote is made here again, by the mistake its
entry describes, and must be the message trainwell prints now: ``...`` in a quote stands for text that varies (a
process id, a time), and line breaks and runs of spaces count as one space (the page wraps long messages)."""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.common.models import RegressionDataset, RegressionModel

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "troubleshooting.md"
QUOTE = re.compile(r"^```text\n(.*?)^```$", re.S | re.M)


def _args(**kwargs):
    from trainwell import TrainingArguments

    defaults = dict(output_dir="out", report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no")
    return TrainingArguments(**{**defaults, **kwargs})


def _train(model=None, dataset=None, resume=None, **kwargs) -> None:
    from trainwell import Trainer

    args = _args(**{"max_steps": 1, **kwargs})
    dataset = RegressionDataset(length=8) if dataset is None else dataset
    Trainer(model=model or RegressionModel(), args=args, train_dataset=dataset).train(resume_from_checkpoint=resume)


class _LogitsOnly(nn.Module):
    """A model called without labels: it returns no loss."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2)

    def forward(self, x):
        return {"logits": self.linear(x)}


class _Tokens(nn.Module):
    """A model of token ids, as the tokenized datasets feed it."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(16, 2)

    def forward(self, input_ids, labels=None):
        logits = self.embedding(input_ids)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


class _Samples(torch.utils.data.Dataset):
    def __init__(self, make):
        self.make = make

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return self.make(i)


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from (RegressionDataset(length=8)[i] for i in range(8))


def _held_output_dir() -> None:
    """Another run's lock on ``out``: a second open file of the lock, held as that run holds it."""
    from trainwell import Trainer

    os.makedirs("out", exist_ok=True)
    with open("out/.trainwell.lock", "w") as fh:
        json.dump({"pid": 4242, "host": "node7", "started": "2026-11-28T10:00:00", "command": "python train.py"}, fh)
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_EX)
        # a run that writes checkpoints (one that saves nothing takes no lock, as it writes nothing there)
        Trainer(model=RegressionModel(), args=_args(save_strategy="steps"), train_dataset=RegressionDataset(length=8))


def _tracker_not_installed() -> None:
    """``report_to="wandb"`` where wandb is not installed (the registry told that it is not)."""
    from unittest import mock

    from trainwell.args.trackers import Tracker

    with mock.patch.object(Tracker, "installed", lambda self: False):
        _train(report_to="wandb")


def _metric_without_compute_metrics() -> None:
    from trainwell import Trainer

    args = _args(eval_strategy="steps", save_strategy="steps", load_best_model_at_end=True,
                 metric_for_best_model="accuracy")  # fmt: skip
    Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=8),
            eval_dataset=RegressionDataset(length=8))  # fmt: skip


# In the page's order: the mistake each entry describes.
MISTAKES = [
    lambda: _args(learning_rat=1e-4),
    lambda: _train(model=_LogitsOnly(), dataset=_Samples(lambda i: {"x": torch.randn(2)})),
    lambda: _train(model=_Tokens(), dataset=_Samples(lambda i: {"input_ids": list(range(i + 1)), "labels": 0})),
    lambda: _train(model=_Tokens(), dataset=_Samples(lambda i: {"tokens": [1, 2, 3], "target": 0})),
    lambda: _train(eval_strategy="steps", eval_steps=1),
    lambda: _args(load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch"),
    _metric_without_compute_metrics,
    _tracker_not_installed,
    lambda: _train(dataset=_Stream(), max_steps=-1),
    lambda: _train(resume=True),
    _held_output_dir,
]


def printed(error: BaseException) -> str:
    """The last line of the traceback Python prints for ``error``."""
    kind = type(error)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{name}: {error}"


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def matches(quote: str, message: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in _flat(quote).split("..."))
    return re.fullmatch(pattern, _flat(message), re.S) is not None


def test_the_page_quotes_one_message_per_mistake():
    assert len(QUOTE.findall(PAGE.read_text("utf-8"))) == len(MISTAKES) >= 10


@pytest.mark.parametrize("number", range(len(MISTAKES)), ids=lambda n: f"entry{n + 1}")
def test_each_quoted_message_is_what_trainwell_prints(number, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    quote = QUOTE.findall(PAGE.read_text("utf-8"))[number]
    with pytest.raises(Exception) as caught:
        MISTAKES[number]()
    message = printed(caught.value)
    assert matches(quote, message), f"docs/troubleshooting.md's quote {number + 1} is now printed as:\n{message}"


def test_the_matching_allows_elisions_and_wrapping_only():
    assert matches("ValueError: a ... c\n  d", "ValueError: a b b c d")
    assert not matches("ValueError: a c", "ValueError: a b c")
    assert not matches("ValueError: a", "ValueError: a b")
