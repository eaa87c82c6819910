"""save_async: checkpoints written by a background thread are the checkpoints a synchronous save writes, the loop
does not wait for the disk, a failure or a crash during the background write never publishes a broken folder."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from tests.checkpointing import harness as h
from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from tests.conftest import make_args
from trainwell import Trainer, TrainerCallback
from trainwell.checkpoint import contents
from trainwell.checkpoint.io import safe_torch_load
from trainwell.checkpoint.resume import get_last_checkpoint, incomplete_reason


def _trainer(out_dir, **kwargs):
    torch.manual_seed(0)
    args = make_args(out_dir, max_steps=6, per_device_train_batch_size=8, logging_steps=1, save_strategy="steps",
                     save_steps=2, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())


def _load(folder):
    from safetensors.torch import load_file

    return {
        "model": load_file(os.path.join(folder, "model.safetensors")),
        "optimizer": safe_torch_load(os.path.join(folder, "optimizer.pt")),
        "scheduler": safe_torch_load(os.path.join(folder, "scheduler.pt")),
    }


def test_background_checkpoints_equal_synchronous_ones_and_resume_exactly(tmp_path):
    sync_dir, async_dir = str(tmp_path / "sync"), str(tmp_path / "async")
    _trainer(sync_dir).train()
    background = _trainer(async_dir, save_async=True)
    background.train()
    assert background.checkpointer.writer.busy is False  # train() returned after the last write
    for step in (2, 4, 6):
        name = f"checkpoint-{step}"
        h.assert_tensors_equal(_load(os.path.join(async_dir, name)), _load(os.path.join(sync_dir, name)), name)
        assert sorted(os.listdir(os.path.join(async_dir, name))) == sorted(os.listdir(os.path.join(sync_dir, name)))
    resumed = _trainer(async_dir, save_async=True)
    resumed.args.max_steps = 6
    resumed.train(resume_from_checkpoint=os.path.join(async_dir, "checkpoint-2"))
    assert torch.equal(resumed.model.a, background.model.a) and torch.equal(resumed.model.b, background.model.b)


def test_the_loop_does_not_wait_for_the_disk(tmp_path, monkeypatch):
    """The write of checkpoint-2 blocks until step 3 has ended: a synchronous save would never get there."""
    step3_ended = threading.Event()
    original = contents.torch_save

    def slow_torch_save(obj, path):
        if "checkpoint-2" in str(path) and str(path).endswith("optimizer.pt"):
            assert step3_ended.wait(timeout=hang_timeout(60)), "training did not go on while the checkpoint was written"
        original(obj, path)

    class Mark(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                step3_ended.set()

    monkeypatch.setattr(contents, "torch_save", slow_torch_save)
    trainer = _trainer(str(tmp_path), save_async=True)
    trainer.add_callback(Mark())
    trainer.train()
    assert get_last_checkpoint(str(tmp_path)) == os.path.join(str(tmp_path), "checkpoint-6")


def test_a_failed_background_write_is_reported_and_publishes_nothing(tmp_path, monkeypatch):
    original = contents.torch_save

    def failing(obj, path):
        if "checkpoint-4" in str(path) and str(path).endswith("optimizer.pt"):  # written in the background
            raise OSError(28, "No space left on device")
        original(obj, path)

    monkeypatch.setattr(contents, "torch_save", failing)
    with pytest.raises(RuntimeError, match="background save of checkpoint-4 failed .*No space left"):
        _trainer(str(tmp_path), save_async=True).train()
    assert get_last_checkpoint(str(tmp_path)) == os.path.join(str(tmp_path), "checkpoint-2")
    assert not os.path.exists(os.path.join(str(tmp_path), "checkpoint-4"))


def test_a_save_after_train_is_synchronous(tmp_path, monkeypatch):
    """Outside train() nobody waits for a background write: a save there is published (or fails) before it
    returns, as the checkpointer's contract says, not left to a thread whose error no one would see."""
    trainer = _trainer(str(tmp_path), save_async=True)
    trainer.train()
    original = contents.torch_save

    def failing(obj, path):
        if "checkpoint-5" in str(path) and str(path).endswith("optimizer.pt"):
            raise OSError(28, "No space left on device")
        original(obj, path)

    monkeypatch.setattr(contents, "torch_save", failing)
    trainer.state.global_step = 5
    with pytest.raises(OSError, match="No space left"):
        trainer._save_checkpoint(trainer.model, None)
    assert not os.path.exists(os.path.join(str(tmp_path), "checkpoint-5"))
    trainer.state.global_step = 3
    trainer._save_checkpoint(trainer.model, None)
    assert incomplete_reason(os.path.join(str(tmp_path), "checkpoint-3")) is None  # published on return


def test_an_overridden_save_method_is_refused_not_skipped(tmp_path):
    class Custom(Trainer):
        def save_model(self, output_dir=None, _internal_call=False):
            super().save_model(output_dir, _internal_call)

    torch.manual_seed(0)
    args = make_args(str(tmp_path), max_steps=2, save_strategy="steps", save_steps=2, save_async=True)
    with pytest.raises(ValueError, match=r"save_async=True .* overridden \['save_model'\]"):
        Custom(model=RegressionModel(), args=args, train_dataset=RegressionDataset()).train()


@pytest.mark.parametrize("file", ["model.safetensors", "optimizer.pt", "scheduler.pt"])
def test_a_kill_during_the_background_write_leaves_a_resumable_run(tmp_path_factory, tmp_path, file):
    full = h.baseline(tmp_path_factory, [*h.MAP_EPOCHS, "--save-steps", "4"])
    workdir, out = tmp_path / "run", tmp_path / "result.pt"
    base = [*h.MAP_EPOCHS, "--save-steps", "4", "--save-async"]
    proc = h.run([*base, "--die-in-save", f"8:{file}"], workdir, out, script=h.DIE_IN_SAVE_SCRIPT, expect_rc=None)
    assert proc.returncode == -signal.SIGKILL, h.describe(proc)
    assert 8 not in h.checkpoint_steps(workdir) and 4 in h.checkpoint_steps(workdir)
    assert get_last_checkpoint(workdir) == str(workdir / "checkpoint-4")
    h.run([*base, "--resume", "true"], workdir, out)
    h.assert_same_training(h.load_result(out), full, resumed_from=4)
    assert h.temporary_folders(workdir) == []
