"""The run's checkpointer (``trainwell.checkpoint.checkpointer``): the seams of a save and a resume.

* every restore phase runs through ``CONTENTS``: a row added to the table is restored in its phase, in phase order,
  and a row gated by a flag that is off is not;
* a provider registered with the checkpointer is saved (an entry of the RNG file, or a file of its own) and handed
  its state back on resume; the loop registers one for every row that no Trainer method restores;
* a piece a callback adds (an EMA of the weights) is carried by synchronous and ``save_async`` checkpoints alike
  and resumed bitwise, without editing the table: tests/test_ema.py;
* the resumed checkpoint's RNG file is loaded once, although four readers need it;
* where in the data a checkpoint's step stands is the loop's ``StepPlan.position_at``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys

import pytest
import torch

from tests.checkpointing.data import StatefulIterable
from tests.common.models import ClassificationDataset, DropoutMLP, RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.checkpoint import contents
from trainwell.checkpoint.checkpointer import Provider
from trainwell.checkpoint.contents import Phase, Piece
from trainwell.checkpoint.io import load_rng_file
from trainwell.loop.plan import StepPlan


def noisy_collate(features):
    """A collator drawing random numbers: the batch read ahead of a checkpoint's step must be read again alike."""
    x = torch.stack([f["x"] for f in features])
    return {"x": x + 0.1 * torch.randn_like(x) + random.random() * 0.01,
            "labels": torch.stack([f["labels"] for f in features])}


def _args(out_dir, **kwargs):
    settings = dict(max_steps=6, per_device_train_batch_size=8, logging_steps=2, save_strategy="steps",
                    save_steps=3)
    return make_args(str(out_dir), **{**settings, **kwargs})


def _with_rows(monkeypatch, *rows: Piece) -> None:
    """``CONTENTS`` with ``rows`` added (the checkpointer reads the table as it runs)."""
    table = (*contents.CONTENTS, *rows)
    monkeypatch.setattr(contents, "CONTENTS", table)
    monkeypatch.setattr(contents, "PIECES", {piece.name: piece for piece in table})


def test_the_rng_file_is_loaded_once_per_resume(tmp_path, monkeypatch):
    """Mid-epoch, the loader's seed, the batch read ahead, ``_load_rng_state`` and the log window all come from
    ``rng_state.pth``: one load serves them (the resumed run still equals the uninterrupted one)."""

    def trainer(**kwargs):
        torch.manual_seed(0)
        return Trainer(model=DropoutMLP(), args=_args(tmp_path, **kwargs), train_dataset=ClassificationDataset(),
                       data_collator=noisy_collate)

    full = trainer()
    full.train()  # 12 batches an epoch: checkpoint-3 is mid-epoch, inside a log window
    from trainwell.checkpoint import io

    loads = []
    original = io.CheckpointFiles.read

    def counting_read(self, name, *args, **kwargs):  # each file is read once and loaded from those bytes
        if name.startswith("rng_state"):
            loads.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(io.CheckpointFiles, "read", counting_read)
    resumed = trainer()
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert len(loads) == 1, loads
    saved = load_rng_file(tmp_path / "checkpoint-3" / "rng_state.pth")
    assert {"loader", "read_ahead", "log_window"} <= set(saved)  # the readers had something to read
    for a, b in zip(resumed.model.parameters(), full.model.parameters()):
        assert torch.equal(a, b)
    assert [h for h in resumed.state.log_history if "loss" in h] == [h for h in full.state.log_history if "loss" in h]


class PhaseRecorder(Trainer):
    """Restores added rows of the table, one per phase, noting the order (STATE methods take no argument)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.restored = []

    def _load_test_weights(self, checkpoint):
        self.restored.append(("WEIGHTS", os.path.basename(checkpoint)))

    def _load_test_state(self):
        self.restored.append(("STATE", self.state.global_step))

    def _load_test_optimizer(self, checkpoint):
        self.restored.append(("OPTIMIZER", os.path.basename(checkpoint)))

    def _load_test_data(self, checkpoint):
        self.restored.append(("DATA", os.path.basename(checkpoint)))

    def _load_test_rng(self, checkpoint):
        self.restored.append(("RNG", os.path.basename(checkpoint)))

    def _load_test_gated(self, checkpoint):
        self.restored.append(("GATED", checkpoint))


def test_each_restore_phase_goes_through_the_table(tmp_path, monkeypatch):
    rows = [Piece(f"test_{phase.name.lower()}", "rng_state.pth", True, False, False, phase, "_save_rng_state",
                  f"_load_test_{phase.name.lower()}") for phase in Phase if phase is not Phase.NEVER]
    gated = Piece("test_gated", "rng_state.pth", True, False, False, Phase.OPTIMIZER, "_save_rng_state",
                  "_load_test_gated", restored_if="ignore_data_skip")  # False: never called
    _with_rows(monkeypatch, *rows, gated)
    data = RegressionDataset(length=64)
    PhaseRecorder(model=RegressionModel(), args=_args(tmp_path), train_dataset=data).train()
    trainer = PhaseRecorder(model=RegressionModel(), args=_args(tmp_path), train_dataset=data)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert trainer.restored == [("WEIGHTS", "checkpoint-3"), ("STATE", 3), ("OPTIMIZER", "checkpoint-3"),
                                ("DATA", "checkpoint-3"), ("RNG", "checkpoint-3")]


class WithProviders(Trainer):
    """Registers two providers of added rows as the loop would: an RNG-file entry and a file of its own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.handed_back = {}

    def create_optimizer(self):  # the checkpointer of this train() call exists by now, before any save
        for name in ("test_entry", "test_file"):
            self.checkpointer.register(name, Provider(lambda name=name: {name: self.state.global_step},
                                                      lambda state, name=name: self.handed_back.update({name: state})))
        return super().create_optimizer()


def test_a_registered_provider_is_saved_and_handed_back_on_resume(tmp_path, monkeypatch):
    _with_rows(
        monkeypatch,
        Piece("test_entry", "rng_state.pth", True, True, False, Phase.RNG, "_save_rng_state", None, entry="test"),
        Piece("test_file", "test_state.pth", True, True, False, Phase.DATA, "_save_rng_state", None),
    )
    data = RegressionDataset(length=64)
    WithProviders(model=RegressionModel(), args=_args(tmp_path), train_dataset=data).train()
    checkpoint = tmp_path / "checkpoint-3"
    assert load_rng_file(checkpoint / "rng_state.pth")["test"] == {"test_entry": 3}
    assert torch.load(checkpoint / "test_state.pth", weights_only=True) == {"test_file": 3}
    trainer = WithProviders(model=RegressionModel(), args=_args(tmp_path), train_dataset=data)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.handed_back == {"test_entry": {"test_entry": 3}, "test_file": {"test_file": 3}}


def test_the_loop_registers_a_provider_for_every_row_no_method_restores(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path, save_strategy="no"),
                      train_dataset=StatefulIterable(RegressionDataset(length=64)))
    trainer.train()
    open_rows = {p.name for p in contents.CONTENTS if p.restored_by is None and p.restored is not Phase.NEVER}
    assert set(trainer.checkpointer.registered) == open_rows


def test_a_provider_for_a_piece_a_method_restores_is_refused(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path), train_dataset=RegressionDataset())
    provider = Provider(dict, lambda state: None)
    for name in ("optimizer", "no_such_piece"):
        with pytest.raises(ValueError, match=rf"'{name}'.*restored by a provider are \[.*'log_window'"):
            trainer.checkpointer.register(name, provider)


def test_the_position_of_a_checkpoint_is_the_plans_arithmetic():
    sized = StepPlan(3, 4, 64, 192.0, 8, 8, 12, accumulation=2)  # 8 batches an epoch: 4 windows of 2
    assert sized.position_at(10, 2.5, 12) == (2, 2)
    assert sized.position_at(8, 2.0, None) == (2, 0)
    unsized = dataclasses.replace(sized, num_train_epochs=sys.maxsize, max_steps=6, steps_in_epoch=12)
    # a pass counts as the writing run's max_steps windows: 1.5 passes of 6 windows of 2 -> pass 1, 3 windows
    assert unsized.position_at(9, 1.5, 6) == (1, 3)
    assert unsized.position_at(9, 1 + 5 / 12, None) == (1, 3)  # a pass ended by a short window rounds up
    assert unsized.position_at(0, None, None) == (0, 0)


def test_a_resume_is_found_once_per_train_call_and_each_file_parsed_once(tmp_path, monkeypatch):
    """Under auto_find_batch_size too (the batch search used to find the checkpoint again, every file hashed a
    second time), and training_args.json is parsed once (it was up to four times)."""
    from trainwell.checkpoint import io, resume

    def trainer(**kwargs):
        torch.manual_seed(0)
        return Trainer(model=RegressionModel(), args=_args(tmp_path, auto_find_batch_size=True, **kwargs),
                       train_dataset=RegressionDataset(length=64))

    trainer().train()
    finds, parsed = [], []
    real_find, real_read = resume.Resume.find.__func__, io.parse_json
    monkeypatch.setattr(resume.Resume, "find", classmethod(lambda cls, *a, **k: finds.append(a[0]) or
                                                           real_find(cls, *a, **k)))
    monkeypatch.setattr(io, "parse_json", lambda data, path: parsed.append(os.path.basename(path)) or
                        real_read(data, path))
    trainer(max_steps=8).train(resume_from_checkpoint=True)
    assert finds == [True]
    assert sorted(parsed) == ["checkpoint_manifest.json", "trainer_state.json", "training_args.json"]
