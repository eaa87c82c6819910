"""``trainwell.techniques.EMA`` and the open checkpoint table it goes through (``trainwell.checkpoint.pieces``).

* the average follows the weights after every optimizer step, and ``state_dict()`` holds it by parameter name;
* it is a piece of every checkpoint, synchronous and ``save_async`` alike (listed in the manifest, checked), and an
  interrupted and resumed run's average equals the uninterrupted run's bit for bit;
* evaluation during training and the final model can use the average;
* any callback with a ``checkpoint_piece`` and ``state_dict``/``load_state_dict`` is saved and resumed the same way,
  without editing trainwell; a piece that cannot be added, or read back, is named.
(Under FSDP2 and DDP on two processes: tests/test_fsdp.py.)
"""

from __future__ import annotations

import collections
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.common.models import ClassificationDataset, DropoutMLP
from tests.conftest import make_args
from tests.test_speed_contracts import MLP, HostReads, Kernels, PerStep
from trainwell import Trainer, TrainerCallback
from trainwell.checkpoint import manifest
from trainwell.checkpoint.contents import Phase
from trainwell.checkpoint.pieces import checkpoint_piece
from trainwell.checkpoint.resume import manifest_problem
from trainwell.loop import progress
from trainwell.techniques import EMA


def _args(out_dir, **kwargs):
    settings = dict(max_steps=6, per_device_train_batch_size=8, logging_steps=2, save_strategy="steps", save_steps=3,
                    learning_rate=0.05)
    return make_args(str(out_dir), **{**settings, **kwargs})


def _run(out_dir, callbacks=None, **kwargs):
    torch.manual_seed(0)
    data = ClassificationDataset()
    callbacks = [EMA(decay=0.75)] if callbacks is None else callbacks
    return Trainer(model=DropoutMLP(), args=_args(out_dir, **kwargs), train_dataset=data, eval_dataset=data,
                   callbacks=callbacks)


def _ema(trainer) -> EMA:
    return next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EMA))


def _equal(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


class Weights(TrainerCallback):
    """Records the trainable weights after every optimizer step (before the EMA, which comes after it)."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.seen.append({n: p.detach().clone() for n, p in model.named_parameters()})


def test_the_average_follows_the_weights_after_every_step(tmp_path):
    weights = Weights()
    trainer = _run(tmp_path, callbacks=[weights, EMA(decay=0.75)], save_strategy="no")
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    expected = start
    for seen in weights.seen:
        expected = {n: 0.75 * expected[n] + 0.25 * seen[n] for n in expected}
    average = _ema(trainer).state_dict()
    assert set(average) == {n for n, _ in trainer.model.named_parameters()} and len(weights.seen) == 6
    for name, tensor in average.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-6, atol=1e-7)
        assert not torch.equal(tensor, dict(trainer.model.named_parameters())[name].detach())


def test_the_average_is_saved_sync_and_async_and_resumed_bitwise(tmp_path):
    sync = _run(tmp_path / "sync")
    sync.train()
    _run(tmp_path / "async", save_async=True).train()
    for step in (3, 6):
        saved = load_file(tmp_path / "sync" / f"checkpoint-{step}" / "ema.safetensors")
        assert set(saved) == {n for n, _ in sync.model.named_parameters()}
        folder = tmp_path / "async" / f"checkpoint-{step}"
        assert _equal(load_file(folder / "ema.safetensors"), saved), "the async checkpoint's EMA differs"
        assert "ema.safetensors" in manifest.read(folder) and manifest_problem(folder) is None
    assert _equal(load_file(tmp_path / "sync" / "checkpoint-6" / "ema.safetensors"), _ema(sync).state_dict())
    assert not _equal(load_file(tmp_path / "sync" / "checkpoint-3" / "ema.safetensors"), _ema(sync).state_dict())
    for source in ("sync", "async"):
        resumed = _run(tmp_path / f"resumed-{source}", save_async=source == "async")
        resumed.train(resume_from_checkpoint=str(tmp_path / source / "checkpoint-3"))
        assert _equal(_ema(resumed).state_dict(), _ema(sync).state_dict()), source
        assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), sync.model.parameters()))


def test_a_damaged_average_is_caught_by_the_manifest(tmp_path, caplog):
    _run(tmp_path).train()
    path = tmp_path / "checkpoint-6" / "ema.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert "ema.safetensors" in manifest_problem(tmp_path / "checkpoint-6")
    with caplog.at_level(logging.WARNING):
        resumed = _run(tmp_path, max_steps=7)
        resumed.train(resume_from_checkpoint=True)  # falls back to checkpoint-3
    assert "checkpoint-6" in caplog.text and resumed.state.global_step == 7


@pytest.mark.parametrize("when", [dict(eval_strategy="steps", eval_steps=6), dict(eval_strategy="epoch", max_steps=12)],
                         ids=["steps", "epoch"])
def test_evaluation_can_use_the_average_and_the_training_weights_come_back(tmp_path, when):
    plain = _run(tmp_path / "plain", save_strategy="no", **when)
    plain.train()
    averaged = _run(tmp_path / "averaged", [EMA(decay=0.75, use_for_eval=True)], save_strategy=when["eval_strategy"],
                    save_steps=6, **when)
    averaged.train()
    assert all(torch.equal(a, b) for a, b in zip(averaged.model.parameters(), plain.model.parameters()))
    last = load_file(tmp_path / "averaged" / f"checkpoint-{averaged.state.global_step}" / "model.safetensors")
    assert _equal(last, {n: p.detach() for n, p in plain.model.named_parameters()})  # saved after the swap back
    logged = [h["eval_loss"] for h in averaged.state.log_history if "eval_loss" in h]
    with _ema(averaged).averaged_weights():
        again = averaged.evaluate()["eval_loss"]
    assert logged == [again]
    assert logged != [h["eval_loss"] for h in plain.state.log_history if "eval_loss" in h]
    assert all(torch.equal(a, b) for a, b in zip(averaged.model.parameters(), plain.model.parameters()))


def test_the_final_model_can_be_the_average(tmp_path):
    trainer = _run(tmp_path, [EMA(decay=0.75, use_for_final_model=True)])
    trainer.train()
    assert _equal(dict(trainer.model.named_parameters()), _ema(trainer).state_dict())
    saved = load_file(tmp_path / "checkpoint-6" / "model.safetensors")  # the checkpoint keeps the training weights
    assert not _equal(saved, {n: p.detach() for n, p in trainer.model.named_parameters()})
    trainer.save_model(str(tmp_path / "final"))
    assert _equal(load_file(tmp_path / "final" / "model.safetensors"), _ema(trainer).state_dict())
    with pytest.raises(ValueError, match="use_for_final_model=True.*load_best_model_at_end"):
        _run(tmp_path / "best", [EMA(use_for_final_model=True)], eval_strategy="steps", eval_steps=3,
             load_best_model_at_end=True).train()


@pytest.mark.parametrize("kwargs, match", [({"decay": 1.5}, "decay=1.5"), ({"decay": "0.9"}, "decay='0.9'"),
                                           ({"use_for_eval": 1}, "use_for_eval=1")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        EMA(**kwargs)


# ------------------------------------------------------------------------------------------ any callback's piece
class Counter(TrainerCallback):
    """A callback with its own state (tensors and numbers, in a .pt file), restored before the first step."""

    checkpoint_piece = checkpoint_piece("counter", "counter.pt", Phase.STATE)

    def __init__(self):
        self.steps, self.total, self.handed_back = 0, torch.zeros(2), None

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1
        self.total += torch.tensor([1.0, state.global_step])

    def state_dict(self):
        return {"steps": self.steps, "total": self.total}

    def load_state_dict(self, state):
        self.handed_back = state
        self.steps, self.total = state["steps"], state["total"].clone()


def test_any_callback_with_a_checkpoint_piece_is_saved_and_resumed(tmp_path):
    full = Counter()
    _run(tmp_path / "full", [full], save_async=True).train()
    saved = torch.load(tmp_path / "full" / "checkpoint-3" / "counter.pt", weights_only=True)
    assert saved["steps"] == 3 and torch.equal(saved["total"], torch.tensor([3.0, 6.0]))  # copied at save time
    assert "counter.pt" in manifest.read(tmp_path / "full" / "checkpoint-3")
    resumed = Counter()
    _run(tmp_path / "resumed", [resumed]).train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert resumed.handed_back["steps"] == 3
    assert resumed.steps == full.steps == 6 and torch.equal(resumed.total, full.total)


def test_a_checkpoint_without_the_piece_starts_it_afresh_and_another_form_is_refused(tmp_path, caplog):
    _run(tmp_path, callbacks=[]).train()
    with caplog.at_level(logging.WARNING):
        _run(tmp_path / "with", max_steps=7).train(resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    assert "has no ema.safetensors: the checkpoint piece 'ema' starts afresh" in caplog.text
    folder = tmp_path / "checkpoint-6"
    for rank in (0, 1):  # as if two processes under FSDP wrote it
        save_file({"w": torch.zeros(1)}, folder / f"ema_{rank}.safetensors")
    with pytest.raises(ValueError, match=r"'ema' as ema_0.safetensors, ema_1.safetensors.*reads ema.safetensors"):
        _run(tmp_path / "other", max_steps=7).train(resume_from_checkpoint=str(folder))


class Clashing(Counter):
    checkpoint_piece = checkpoint_piece("optimizer_copy", "optimizer.safetensors")


def test_a_piece_that_cannot_be_added_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"checkpoint_piece\(file='../ema.pt'\)"):
        checkpoint_piece("ema", "../ema.pt")
    for phase in (Phase.NEVER, Phase.DATA):
        with pytest.raises(ValueError, match=rf"checkpoint_piece\(restored=<Phase.{phase.name}"):
            checkpoint_piece("ema", "ema.pt", phase)
    with pytest.raises(ValueError, match=r"Clashing adds the checkpoint piece 'optimizer_copy'.*'optimizer'"):
        _run(tmp_path, [Clashing()]).train()
    with pytest.raises(ValueError, match=r"EMA adds the checkpoint piece 'ema'.*already holds 'ema'"):
        _run(tmp_path, [EMA(), EMA()]).train()


# ------------------------------------------------------------------------------------------ the step's cost
@pytest.fixture
def accelerator_path(monkeypatch):
    """The path trainwell takes on an accelerator, where a host read is a sync (as tests/test_speed_contracts.py)."""
    monkeypatch.setattr(progress, "reads_are_free", lambda device: False)
    syncs = []
    for module in (torch.cuda, torch.accelerator):
        monkeypatch.setattr(module, "synchronize", lambda *a, **k: syncs.append(1))
    return syncs


def test_the_update_is_one_foreach_kernel_per_step_with_no_host_read(tmp_path, accelerator_path):
    """On the accelerator path (tests/test_speed_contracts.py): an EMA adds one ``_foreach_lerp_`` to each optimizer
    step, no other kernel, and no host read."""
    def per_step(mode, *callbacks):
        counter = PerStep(mode)
        torch.manual_seed(0)
        args = make_args(str(tmp_path), max_steps=9, per_device_train_batch_size=4, logging_steps=4)
        Trainer(MLP(), args, train_dataset=ClassificationDataset(), callbacks=[counter, *callbacks]).train()
        return counter.steps

    plain, averaged = per_step(Kernels), per_step(Kernels, EMA())
    assert len(plain) == len(averaged) == 7
    for before, after in zip(plain, averaged):
        added = collections.Counter(after)
        added.subtract(before)
        assert +added == {"aten._foreach_lerp_": 1} and -added == {}, added
    assert per_step(HostReads, EMA()) == per_step(HostReads)
    assert accelerator_path == []  # no synchronize either
