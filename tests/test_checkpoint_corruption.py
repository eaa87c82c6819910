"""Damaged checkpoints and hostile files (in process).

* ``resume_from_checkpoint=True`` skips, with a warning naming it, a newest checkpoint that is truncated,
  misses a file, or has a ``trainer_state.json`` that is not JSON, and resumes from the one before;
* temporary folders left by an interrupted save are removed and never picked;
* naming a damaged checkpoint explicitly is a clear error (the path and what is wrong);
* a checkpoint file crafted to run code when unpickled is refused, and its code does not run.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from tests.common.hostile import Payload, as_reference
from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args


def _trainer(out_dir, record=None, **kwargs):
    from trainwell import Trainer, TrainerCallback

    class StartStep(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if record is not None:
                record.append(state.global_step)

    kwargs = {"per_device_train_batch_size": 4, "learning_rate": 0.1, "max_steps": 4, "save_strategy": "steps",
              "save_steps": 1, **kwargs}
    return Trainer(model=RegressionModel(), args=make_args(out_dir, **kwargs),
                   train_dataset=RegressionDataset(length=16), callbacks=[StartStep()])


@pytest.fixture(scope="module")
def four_checkpoints(tmp_path_factory):
    """A finished run's output folder with checkpoint-1 ... checkpoint-4 (copied by each test)."""
    out = tmp_path_factory.mktemp("ckpts") / "out"
    _trainer(str(out)).train()
    return out


@pytest.fixture
def run_dir(four_checkpoints, out_dir):
    shutil.copytree(four_checkpoints, out_dir)
    return Path(out_dir)


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


DAMAGES = {
    "truncated-model": lambda c: _truncate(c / "model.safetensors"),
    "truncated-optimizer": lambda c: _truncate(c / "optimizer.pt"),
    "truncated-scheduler": lambda c: _truncate(c / "scheduler.pt", keep=0.9),
    "truncated-rng": lambda c: _truncate(c / "rng_state.pth"),
    "empty-optimizer": lambda c: _truncate(c / "optimizer.pt", keep=0.0),
    "missing-model": lambda c: (c / "model.safetensors").unlink(),
    "missing-optimizer": lambda c: (c / "optimizer.pt").unlink(),
    "missing-scheduler": lambda c: (c / "scheduler.pt").unlink(),
    "missing-rng": lambda c: (c / "rng_state.pth").unlink(),
    "missing-trainer-state": lambda c: (c / "trainer_state.json").unlink(),
    "bad-json-trainer-state": lambda c: (c / "trainer_state.json").write_text('{"global_step": 4, "log_hi'),
    "trainer-state-not-an-object": lambda c: (c / "trainer_state.json").write_text("[]"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_resume_true_skips_a_damaged_newest_checkpoint(run_dir, caplog, damage):
    newest = run_dir / "checkpoint-4"
    DAMAGES[damage](newest)
    started: list[int] = []
    with caplog.at_level(logging.WARNING):
        output = _trainer(str(run_dir), record=started).train(resume_from_checkpoint=True)
    assert started == [3]  # resumed from checkpoint-3
    assert output.global_step == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(newest) in message for message in warnings), warnings
    # step 4 was trained again and its checkpoint replaced the damaged one
    from trainwell.checkpoint.resume import incomplete_reason

    assert incomplete_reason(newest) is None


def test_resume_true_passes_over_several_damaged_checkpoints(run_dir, caplog):
    DAMAGES["truncated-model"](run_dir / "checkpoint-4")
    DAMAGES["bad-json-trainer-state"](run_dir / "checkpoint-3")
    started: list[int] = []
    with caplog.at_level(logging.WARNING):
        _trainer(str(run_dir), record=started).train(resume_from_checkpoint=True)
    assert started == [2]
    assert "checkpoint-4" in caplog.text and "checkpoint-3" in caplog.text


def test_no_complete_checkpoint_is_a_clear_error(run_dir):
    for step in range(1, 5):
        (run_dir / f"checkpoint-{step}" / "trainer_state.json").unlink()
    trainer = _trainer(str(run_dir))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        trainer.train(resume_from_checkpoint=True)
    assert not trainer.is_in_train  # the failed call leaves the Trainer usable (evaluate() as outside training)


@pytest.mark.parametrize("damage", ["truncated-model", "missing-model", "bad-json-trainer-state"])
def test_naming_a_damaged_checkpoint_is_a_clear_error(run_dir, damage):
    newest = run_dir / "checkpoint-4"
    DAMAGES[damage](newest)
    with pytest.raises(ValueError) as err:
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(newest))
    message = str(err.value)
    assert str(newest) in message
    assert {"truncated-model": "model.safetensors", "missing-model": "no model weights file",
            "bad-json-trainer-state": "trainer_state.json"}[damage] in message


@pytest.mark.parametrize(("damage", "effect"), [
    ("missing-optimizer", "the optimizer starts with fresh moments"),
    ("missing-scheduler", "the learning-rate schedule restarts"),
    ("missing-rng", "random draws"),
])
def test_a_checkpoint_without_some_training_state_resumes_with_a_precise_warning(run_dir, caplog, damage, effect):
    newest = run_dir / "checkpoint-4"
    DAMAGES[damage](newest)
    started: list[int] = []
    with caplog.at_level(logging.WARNING):
        _trainer(str(run_dir), record=started).train(resume_from_checkpoint=str(newest))
    assert started == [4]  # the named checkpoint, not an older complete one
    assert f"Resuming from {newest} although" in caplog.text and effect in caplog.text


def test_resume_true_takes_a_partial_checkpoint_when_no_complete_one_is_left(run_dir, caplog):
    for step in range(1, 5):
        DAMAGES["missing-rng"](run_dir / f"checkpoint-{step}")
    started: list[int] = []
    with caplog.at_level(logging.WARNING):
        _trainer(str(run_dir), record=started).train(resume_from_checkpoint=True)
    assert started == [4] and "rng_state.pth is missing" in caplog.text


def test_naming_a_missing_folder_is_a_clear_error(run_dir):
    with pytest.raises(ValueError, match="checkpoint-99"):
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(run_dir / "checkpoint-99"))


def test_leftover_temporary_folders_are_never_picked_and_are_cleaned(run_dir):
    from trainwell import get_last_checkpoint

    # what a save killed before its rename leaves: a complete-looking folder under the temporary name, with a
    # higher step, and the trash of a replaced folder
    shutil.copytree(run_dir / "checkpoint-4", run_dir / ".tmp-checkpoint-9")
    shutil.copytree(run_dir / "checkpoint-2", run_dir / ".tmp-checkpoint-2.old")
    (run_dir / ".tmp-checkpoint-5").mkdir()
    (run_dir / ".tmp-checkpoint-5" / "optimizer.pt").write_bytes(b"PK\x03")
    assert get_last_checkpoint(run_dir) == str(run_dir / "checkpoint-4")
    started: list[int] = []
    _trainer(str(run_dir), record=started, max_steps=5).train(resume_from_checkpoint=True)
    assert started == [4]
    assert sorted(p.name for p in run_dir.iterdir()) == [f"checkpoint-{s}" for s in range(1, 6)]


def test_a_folder_that_only_looks_like_a_checkpoint_is_not_picked(run_dir):
    from trainwell import get_last_checkpoint

    shutil.copytree(run_dir / "checkpoint-4", run_dir / "checkpoint-7-backup")
    shutil.copytree(run_dir / "checkpoint-4", run_dir / "checkpoint-x")
    (run_dir / "checkpoint-8").write_text("a file, not a folder")
    assert get_last_checkpoint(run_dir) == str(run_dir / "checkpoint-4")
    # the step number decides, not the modification time
    os.utime(run_dir / "checkpoint-2", (1e10, 1e10))
    assert get_last_checkpoint(run_dir) == str(run_dir / "checkpoint-4")


# ------------------------------------------------------------------------------------------ hostile files
def _craft(path: Path, marker: Path, kind: str) -> None:
    if kind == "optimizer.pt":
        obj = {"state": {}, "param_groups": [{"params": [0, 1], "lr": Payload(marker)}]}
    elif kind == "rng_state.pth":
        obj = {"python": Payload(marker), "numpy": None, "cpu": torch.get_rng_state()}
    else:
        obj = {"last_epoch": 4, "payload": Payload(marker)}
    torch.save(obj, path)


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_a_crafted_pickle_in_a_checkpoint_does_not_run(run_dir, tmp_path, name):
    """Without a manifest (as the reference writes them) the file is opened: weights_only refuses it."""
    marker = tmp_path / "code-ran"
    target = run_dir / "checkpoint-4" / name
    _craft(target, marker, name)
    as_reference(run_dir / "checkpoint-4")

    # the file is live: an unrestricted load would run its code (so this test can fail)
    probe = tmp_path / "probe-ran"
    _craft(tmp_path / "probe.pt", probe, name)
    torch.load(tmp_path / "probe.pt", weights_only=False)
    assert probe.exists()

    with pytest.raises(pickle.UnpicklingError) as err:  # max_steps 5: one more epoch runs, so the RNG is loaded
        _trainer(str(run_dir), max_steps=5).train(resume_from_checkpoint=True)
    assert str(target) in str(err.value)
    assert not marker.exists()


def test_crafted_legacy_weights_do_not_run(run_dir, tmp_path):
    """pytorch_model.bin (the pre-safetensors weights file) is a pickle too: loaded with weights_only."""
    marker = tmp_path / "code-ran"
    folder = run_dir / "checkpoint-4"
    (folder / "model.safetensors").unlink()
    as_reference(folder)  # a reference checkpoint: it has no manifest
    torch.save({"a": torch.tensor(1.0), "b": Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(pickle.UnpicklingError, match="pytorch_model.bin"):
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(folder))
    assert not marker.exists()


def test_trainer_state_json_is_data_only(run_dir):
    """trainer_state.json names callback classes, but a stored class that is not attached is never built."""
    path = run_dir / "checkpoint-4" / "trainer_state.json"
    state = json.loads(path.read_text())
    state["stateful_callbacks"] = {"os.system": {"args": {"command": "touch x"}, "attributes": {}}}
    path.write_text(json.dumps(state))
    trainer = _trainer(str(run_dir), max_steps=5, restore_callback_states_from_checkpoint=True)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 5
    assert not (Path.cwd() / "x").exists()


def test_optimizer_state_loads_onto_an_indexed_cpu_device(tmp_path):
    """A multi-process CPU run has device ``cpu:0``; loading the optimizer state there must work."""
    from trainwell.checkpoint.io import safe_torch_load

    torch.save({"state": {0: {"exp_avg": torch.ones(2)}}}, tmp_path / "optimizer.pt")
    loaded = safe_torch_load(tmp_path / "optimizer.pt", map_location=torch.device("cpu", 0))
    assert torch.equal(loaded["state"][0]["exp_avg"], torch.ones(2))


def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_run_resumable(tmp_path, monkeypatch):
    import torch

    from trainwell.checkpoint.io import CheckpointWriteError
    from trainwell.checkpoint.resume import incomplete_reason

    real_save, calls = torch.save, []

    def fills_up(obj, file, *args, **kwargs):
        path = getattr(file, "name", file)  # torch_save hands torch.save an open file (named as its final path)
        calls.append(str(path))
        if "checkpoint-3" in str(path) and str(path).endswith("optimizer.pt"):
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1318528 vs 1318416")
        return real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fills_up)
    with pytest.raises(CheckpointWriteError) as err:
        _trainer(str(tmp_path)).train()
    message = str(err.value)
    assert "optimizer.pt failed: the disk is full" in message and "checkpoint-3" in message
    assert "not published" in message and "resume_from_checkpoint=True" in message
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert incomplete_reason(tmp_path / "checkpoint-2") is None
    monkeypatch.setattr(torch, "save", real_save)  # space freed
    started: list[int] = []
    assert _trainer(str(tmp_path), record=started).train(resume_from_checkpoint=True).global_step == 4
    assert started == [2]


@pytest.mark.parametrize("file", ["model.safetensors", "trainer_state.json"])
def test_a_full_disk_in_any_checkpoint_file_is_named_the_same_way(tmp_path, monkeypatch, file):
    # safetensors raises its own SafetensorError, a plain write an OSError: both read as the disk being full
    import errno

    from safetensors import SafetensorError

    from trainwell.checkpoint import io
    from trainwell.checkpoint.io import CheckpointWriteError
    from trainwell.state import TrainerState

    real_weights, real_state = io._write_weights, TrainerState.save_to_json

    def weights(model, directory, state_dict):
        if "checkpoint-3" in str(directory):
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        return real_weights(model, directory, state_dict)

    def state(self, path):
        if "checkpoint-3" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_state(self, path)

    if file == "model.safetensors":
        monkeypatch.setattr(io, "_write_weights", weights)
    else:
        monkeypatch.setattr(TrainerState, "save_to_json", state)
    with pytest.raises(CheckpointWriteError) as err:
        _trainer(str(tmp_path)).train()
    assert f"{file} failed: the disk is full" in str(err.value) and "not published" in str(err.value)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
