"""A checkpoint that is wrong is named before a single step runs: its trainer state and its optimizer state.

These checkpoints have no manifest (removed, as in one the reference wrote, or one edited together with its
manifest), so the checks here are the ones behind it:

* every field of ``trainer_state.json`` read on resume has its kind and range, ``global_step`` equals the
  folder's step and does not pass ``max_steps`` (the file's, and this run's);
* the optimizer state matches the parameters (per-parameter shapes and kinds of every state tensor) before it
  is loaded, so no mismatched state reaches a fused kernel; an optimizer of another kind is named.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.common.hostile import as_reference
from tests.conftest import make_args


class TwoLayer(nn.Module):
    """Parameters of shapes (4, 6), (4,), (2, 4), (2,): 24 + 4 + 8 + 2 = 38."""

    def __init__(self, hidden: int = 4):
        super().__init__()
        self.first = nn.Linear(6, hidden)
        self.second = nn.Linear(hidden, 2)

    def forward(self, x, labels=None):
        out = self.second(torch.relu(self.first(x)))
        return {"logits": out, "loss": nn.functional.cross_entropy(out, labels)} if labels is not None else out


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(6, generator=g), "labels": torch.tensor(i % 2)}


def _trainer(out_dir, model=None, record=None, **kwargs):
    from trainwell import Trainer, TrainerCallback

    class StartStep(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if record is not None:
                record.append(state.global_step)

    kwargs = {"per_device_train_batch_size": 4, "learning_rate": 0.01, "max_steps": 8, "save_strategy": "steps",
              "save_steps": 2, **kwargs}
    torch.manual_seed(0)  # the same initial weights in every run
    return Trainer(model=model or TwoLayer(), args=make_args(out_dir, **kwargs), train_dataset=Data(),
                   callbacks=[StartStep()])


@pytest.fixture(scope="module")
def eight_steps(tmp_path_factory):
    out = tmp_path_factory.mktemp("validation") / "out"
    _trainer(str(out)).train()
    for folder in out.glob("checkpoint-*"):
        as_reference(folder)
    return out


@pytest.fixture
def run_dir(eight_steps, out_dir):
    shutil.copytree(eight_steps, out_dir)
    return Path(out_dir)


def _edit_state(folder: Path, **fields) -> None:
    path = folder / "trainer_state.json"
    state = json.loads(path.read_text())
    state.update(fields)
    path.write_text(json.dumps(state))


# ------------------------------------------------------------------------------------------ trainer state
STATE_CASES = {
    "past-max-steps": ({"global_step": 100}, "global_step=100 is past the run's max_steps=8"),
    "behind-the-weights": ({"global_step": 2}, "says global_step=2, but the folder is the checkpoint of step 4"),
    "ahead-of-the-weights": ({"global_step": 6}, "says global_step=6, but the folder is the checkpoint of step 4"),
    "negative": ({"global_step": -3}, "global_step=-3 is not a whole number >= 0"),
    "a-string": ({"global_step": "4"}, "global_step='4' is not a whole number >= 0"),
    "a-float": ({"global_step": 4.0}, "global_step=4.0 is not a whole number >= 0"),
    "null": ({"global_step": None}, "global_step=None is not a whole number >= 0"),
    "huge": ({"global_step": 1e300}, "global_step=1e+300 is not a whole number >= 0"),
    "log-history-a-string": ({"log_history": "lost"}, "log_history='lost' is not a list of objects"),
    "epoch-a-list": ({"epoch": [1]}, "epoch=[1] is not a number >= 0"),
    "callbacks-a-string": ({"stateful_callbacks": "x"}, "stateful_callbacks='x' is not an object or null"),
}


@pytest.mark.parametrize("case", sorted(STATE_CASES))
def test_a_wrong_trainer_state_is_named_and_true_falls_back(run_dir, caplog, case):
    fields, expected = STATE_CASES[case]
    folder = run_dir / "checkpoint-4"
    _edit_state(folder, **fields)
    with pytest.raises(ValueError) as err:
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(folder))
    assert str(folder) in str(err.value) and expected in str(err.value)
    # the same damage in the newest checkpoint: True passes over it, naming it
    newest = run_dir / "checkpoint-8"
    shutil.rmtree(newest)
    for name in ("checkpoint-6",):
        shutil.rmtree(run_dir / name)
    started: list[int] = []
    with caplog.at_level(logging.WARNING):
        _trainer(str(run_dir), record=started).train(resume_from_checkpoint=True)
    assert started == [2]
    assert any(str(folder) in r.getMessage() and expected in r.getMessage() for r in caplog.records)


def test_load_from_json_names_the_field(tmp_path):
    from trainwell import TrainerState

    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"epoch": 1.0, "global_step": "ten", "max_steps": 8, "log_history": []}))
    with pytest.raises(ValueError, match=r"trainer_state.json is damaged: global_step='ten' is not a whole number"):
        TrainerState.load_from_json(path)


def test_the_reference_trainer_state_passes():
    from trainwell import TrainerState
    from trainwell.state import state_problems

    fixture = Path(__file__).parent / "fixtures" / "reference_trainer_state.json"
    assert state_problems(json.loads(fixture.read_text())) == []
    assert TrainerState.load_from_json(fixture).global_step == 20


def test_a_checkpoint_past_this_runs_max_steps_is_an_error_before_any_step(run_dir):
    trainer = _trainer(str(run_dir), max_steps=3)
    with pytest.raises(ValueError, match=r"at step 4, past this run's 3 steps.*max_steps .* beyond 4"):
        trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-4"))
    assert trainer.state.global_step == 0 or trainer.state.global_step == 4  # nothing trained
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (2, 4, 6, 8)]


# ------------------------------------------------------------------------------------------ optimizer state
def _optimizer_of(model: nn.Module, tmp_path: Path) -> dict:
    """The optimizer state a trainer of ``model`` saves (same parameter count as TwoLayer, other shapes)."""
    out = tmp_path / "other"
    _trainer(str(out), model=model, max_steps=2, save_steps=2).train()
    return torch.load(out / "checkpoint-2" / "optimizer.pt", weights_only=True)


class Transposed(TwoLayer):
    """TwoLayer's parameter count and order, with the first layer's weight of shape (6, 4) instead of (4, 6)."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 6)
        self.second = nn.Linear(6, 2)

    def forward(self, x, labels=None):
        x = x[:, :4]
        return super().forward(x, labels)


class Smaller(nn.Module):
    """Four parameters, like TwoLayer, each smaller: a fused kernel reading TwoLayer's moments from it overruns."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(6, 1)
        self.second = nn.Linear(1, 2)

    def forward(self, x, labels=None):
        out = self.second(self.first(x))
        return {"logits": out, "loss": nn.functional.cross_entropy(out, labels)} if labels is not None else out


@pytest.mark.parametrize("other", [Transposed, Smaller], ids=["same-count-other-shapes", "smaller-model"])
def test_an_optimizer_state_of_another_model_is_refused_naming_the_parameter(run_dir, tmp_path, other):
    state = _optimizer_of(other(), tmp_path)
    folder = run_dir / "checkpoint-4"
    torch.save(state, folder / "optimizer.pt")
    trainer = _trainer(str(run_dir))
    with pytest.raises(ValueError) as err:
        trainer.train(resume_from_checkpoint=str(folder))
    message = str(err.value)
    assert "optimizer.pt" in message and "first.weight" in message and "(4, 6)" in message
    assert re.search(r"delete \S*checkpoint-4/optimizer.pt", message)


def test_an_optimizer_state_of_another_kind_is_named(run_dir):
    """AdamW's state resumed with optim='sgd': the reference fails with KeyError: 'momentum'."""
    trainer = _trainer(str(run_dir), optim="sgd")
    with pytest.raises(ValueError) as err:
        trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-4"))
    message = str(err.value)
    assert "exp_avg" in message and "SGD" in message and "optim" in message


def test_a_state_tensor_of_the_wrong_kind_is_refused(run_dir):
    folder = run_dir / "checkpoint-4"
    state = torch.load(folder / "optimizer.pt", weights_only=True)
    first = next(iter(state["state"].values()))
    first["exp_avg"] = first["exp_avg"].to(torch.int64)
    torch.save(state, folder / "optimizer.pt")
    with pytest.raises(ValueError, match=r"exp_avg .*int64"):
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(folder))


def test_a_matching_optimizer_state_still_resumes_exactly(run_dir, tmp_path):
    started: list[int] = []
    resumed = _trainer(str(run_dir), record=started)
    resumed.train(resume_from_checkpoint=str(run_dir / "checkpoint-4"))
    full = _trainer(str(tmp_path / "full"))
    full.train()
    assert started == [4]
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), full.model.parameters()))
