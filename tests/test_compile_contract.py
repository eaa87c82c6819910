"""``torch_compile=True`` costs no graph break and no graph beyond what compiling the bare model costs.

A graph break splits the compiled model into pieces run one after the other (a slower step on a GPU, and
fewer fusions); a recompile pays compilation again. Both come from what reaches the compiled ``forward``: its
inputs (their types, shapes, a Python number that changes each step), hooks, and the wrappers around it.
Each case trains a tiny model with trainwell for a few steps under ``torch_compile_backend="eager"`` (Dynamo
traces, nothing is generated: seconds on a CPU) and runs the same model compiled by hand,
``torch.compile(model, backend="eager")``, forward and backward on the same batches, then compares Dynamo's
own counters: graph breaks (with their reasons) and compiled graphs. A model with a deliberate break shows
that the count is real.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, Dataset

from tests.conftest import make_args
from trainwell import Trainer
from trainwell.data.data_collator import default_data_collator

STEPS, BATCH, D_IN, N_CLASSES = 4, 8, 6, 3


class Points(Dataset):
    def __init__(self, n: int = STEPS * BATCH) -> None:  # whole batches only: one shape, so one graph
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, D_IN, generator=g), torch.randint(0, N_CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Clean(nn.Module):
    """Compiles whole: no graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(D_IN, 16), nn.Linear(16, N_CLASSES)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.first(x))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.second(self.hidden(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Broken(Clean):
    """One deliberate graph break per forward."""

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        torch._dynamo.graph_break()
        return h


class TakesItems(Clean):
    """Accepts ``num_items_in_batch`` (a loss summed, then divided by the window's items), as HF models do."""

    def forward(self, x, labels=None, num_items_in_batch=None):
        logits = self.second(self.hidden(x))
        loss = nn.functional.cross_entropy(logits, labels, reduction="sum") / num_items_in_batch
        return {"loss": loss, "logits": logits}


def _dynamo_counts(run) -> tuple[Counter, int]:
    """The graph breaks (reason -> count) and the graphs Dynamo compiled while ``run()`` ran, from a clean slate."""
    torch._dynamo.reset()
    counters.clear()
    run()
    breaks = Counter(counters["graph_break"])
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return breaks, graphs


def _bare(model_cls: type[nn.Module], precision: str) -> None:
    """The hand-written loop: the model compiled by hand, forward and backward on trainwell's batches."""
    torch.manual_seed(0)
    model = model_cls()
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Points(), batch_size=BATCH, collate_fn=default_data_collator)
    for batch in loader:
        if model_cls is TakesItems:
            batch = {**batch, "num_items_in_batch": batch["labels"].ne(-100).sum()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = compiled(**batch)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _trainwell(model_cls: type[nn.Module], precision: str, out_dir: str, **extra) -> Trainer:
    torch.manual_seed(0)
    args = make_args(
        out_dir,
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        torch_compile=True,
        torch_compile_backend="eager",
        logging_steps=1,
        bf16=precision == "bf16",
        **extra,
    )
    trainer = Trainer(model=model_cls(), args=args, train_dataset=Points())
    trainer.train()
    return trainer


# Under bf16, Accelerate wraps the model's forward in autocast and in a cast of every bf16 output to float32
# (``ConvertOutputsToFp32``). Compiled together with those wrappers (Accelerate's order), a model with a graph break
# is broken in each wrapper's frame too: 4 breaks and 3 graphs where the bare model, under an autocast of the
# caller's, has 2 and 2. trainwell compiles the model first, so the wrappers run around the compiled graphs:
# "broken-bf16" holds that.
CASES = [
    pytest.param(Clean, "fp32", id="clean-fp32"),
    pytest.param(Clean, "bf16", id="clean-bf16"),
    pytest.param(Broken, "fp32", id="broken-fp32"),
    pytest.param(Broken, "bf16", id="broken-bf16"),
    pytest.param(TakesItems, "fp32", id="takes_items-fp32"),
]


@pytest.mark.parametrize(("model_cls", "precision"), CASES)
def test_trainwell_compiles_the_model_as_a_bare_torch_compile_does(model_cls, precision, out_dir):
    bare_breaks, bare_graphs = _dynamo_counts(lambda: _bare(model_cls, precision))
    trainer = None

    def train() -> None:
        nonlocal trainer
        trainer = _trainwell(model_cls, precision, out_dir)

    breaks, graphs = _dynamo_counts(train)
    assert hasattr(trainer.model_wrapped, "_orig_mod")  # the model trainwell trained really was compiled
    assert trainer.state.global_step == STEPS
    if model_cls is Broken:
        assert sum(bare_breaks.values()) > 0 and bare_graphs == 2  # the deliberate break is seen: the count is real
    else:
        assert sum(bare_breaks.values()) == 0 and bare_graphs == 1  # compiles whole, once
    assert breaks == bare_breaks, f"trainwell adds graph breaks: {dict(breaks - bare_breaks)}"
    assert graphs == bare_graphs, f"trainwell compiles {graphs} graphs where the bare model needs {bare_graphs}"


def test_accumulation_and_clipping_add_no_break(out_dir):
    """The loss factors and clipping happen outside the compiled forward: still the bare model's one graph."""
    bare_breaks, bare_graphs = _dynamo_counts(lambda: _bare(TakesItems, "fp32"))

    breaks, graphs = _dynamo_counts(
        lambda: _trainwell(TakesItems, "fp32", out_dir, gradient_accumulation_steps=2, max_grad_norm=1.0)
    )
    assert breaks == bare_breaks and sum(breaks.values()) == 0
    assert graphs == bare_graphs == 1


def _bare_epochs(precision: str) -> None:
    """Two epochs of a loop over data that ends in a partial batch, each followed by a compiled evaluation."""
    torch.manual_seed(0)
    model = Clean()
    compiled = torch.compile(model, backend="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    for _ in range(2):
        model.train()
        for batch in DataLoader(Points(STEPS * BATCH + 3), batch_size=BATCH, collate_fn=default_data_collator):
            with autocast:
                loss = compiled(**batch)["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad(), autocast:
            for batch in DataLoader(Points(STEPS * BATCH + 3), batch_size=BATCH, collate_fn=default_data_collator):
                compiled(**batch)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_partial_last_batch_and_evaluations_recompile_as_a_bare_compile_does(precision, out_dir):
    """The last, smaller batch of an epoch recompiles once (its shape becomes dynamic) and evaluation once
    (``model.training`` and grad mode are guards), in the loop as in trainwell; returning to training between
    evaluations compiles nothing more, and the bf16 wrappers add nothing."""
    bare_breaks, bare_graphs = _dynamo_counts(lambda: _bare_epochs(precision))
    assert bare_graphs == 3 and not bare_breaks  # a static graph, a dynamic one, an evaluation's

    def train() -> None:
        args = make_args(out_dir, num_train_epochs=2, per_device_train_batch_size=BATCH, max_steps=-1,
                         per_device_eval_batch_size=BATCH, torch_compile=True, torch_compile_backend="eager",
                         eval_strategy="epoch", bf16=precision == "bf16")
        torch.manual_seed(0)
        trainer = Trainer(model=Clean(), args=args, train_dataset=Points(STEPS * BATCH + 3),
                          eval_dataset=Points(STEPS * BATCH + 3))
        trainer.train()
        assert trainer.state.global_step == 2 * (STEPS + 1)

    breaks, graphs = _dynamo_counts(train)
    assert (breaks, graphs) == (bare_breaks, bare_graphs)
