"""The checkpoint manifest: every file's size and checksum (XXH3-64), written with the checkpoint and checked on resume.

* a checkpoint lists each of its files, and the files trainwell writes itself are checksummed as they are
  written (never read back);
* a changed byte, a changed size or a damaged manifest: ``resume_from_checkpoint=True`` falls back to the newest
  checkpoint that verifies, with a warning naming the file; a named checkpoint is an error naming it;
* ``verify_checkpoint_checksums=False`` compares sizes only; a checkpoint without a manifest (the reference's)
  resumes; files added after the save (a callback's) are not checked; a deleted optimizer is a partial resume;
* sharded (DCP) files are checksummed as DCP writes them.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from tests.common.hostile import as_reference
from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell.checkpoint import manifest
from trainwell.utils import filehash


def _trainer(out_dir, record=None, callbacks=(), **kwargs):
    from trainwell import Trainer, TrainerCallback

    class StartStep(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if record is not None:
                record.append(state.global_step)

    kwargs = {"per_device_train_batch_size": 4, "learning_rate": 0.1, "max_steps": 4, "save_strategy": "steps",
              "save_steps": 1, **kwargs}
    return Trainer(model=RegressionModel(), args=make_args(out_dir, **kwargs),
                   train_dataset=RegressionDataset(length=16), callbacks=[StartStep(), *callbacks])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("manifest") / "out"
    _trainer(str(out)).train()
    return out


@pytest.fixture
def run_dir(finished_run, out_dir):
    shutil.copytree(finished_run, out_dir)
    return Path(out_dir)


def _flip(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_file_is_listed_with_its_size_and_checksum(run_dir):
    folder = run_dir / "checkpoint-4"
    records = manifest.read(folder)
    assert sorted(records) == manifest.local_files(folder)
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
            "training_args.json"} <= set(records)
    for name, record in records.items():
        assert filehash.hash_file(folder / name) == record, name
    assert manifest.problem(folder) is None


def test_trainwells_own_files_are_checksummed_as_they_are_written(tmp_path, monkeypatch):
    read_back: list[str] = []
    real = filehash.hash_file

    def spy(path):
        read_back.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(filehash, "hash_file", spy)
    monkeypatch.setattr(manifest, "hash_file", spy)
    _trainer(str(tmp_path), max_steps=1).train()
    assert read_back  # the model (written by safetensors) and the JSON files are read back
    assert not {"optimizer.pt", "scheduler.pt", "rng_state.pth"} & set(read_back), read_back


@pytest.mark.parametrize("damage", ["flipped-model-byte", "flipped-optimizer-byte", "edited-state"])
def test_resume_true_falls_back_past_a_checkpoint_whose_bytes_changed(run_dir, caplog, damage):
    newest = run_dir / "checkpoint-4"
    if damage == "flipped-model-byte":
        _flip(newest / "model.safetensors")  # data bytes: length and header intact
        name = "model.safetensors"
    elif damage == "flipped-optimizer-byte":
        _flip(newest / "optimizer.pt", offset=200)
        name = "optimizer.pt"
    else:
        state = newest / "trainer_state.json"  # a valid state, same length: only the checksum can tell
        state.write_text(state.read_text().replace('"is_hyper_param_search": false', '"is_hyper_param_search": true '))
        name = "trainer_state.json"
    started: list[int] = []
    with caplog.at_level(logging.WARNING):
        _trainer(str(run_dir), record=started).train(resume_from_checkpoint=True)
    assert started == [3]
    warning = next(r.getMessage() for r in caplog.records if str(newest) in r.getMessage())
    assert name in warning and "checksum" in warning


def test_a_named_checkpoint_whose_bytes_changed_is_an_error(run_dir):
    newest = run_dir / "checkpoint-4"
    _flip(newest / "model.safetensors")
    trainer = _trainer(str(run_dir))
    with pytest.raises(ValueError) as err:
        trainer.train(resume_from_checkpoint=str(newest))
    message = str(err.value)
    assert str(newest) in message and "model.safetensors does not match its checksum" in message


def test_without_checksums_only_sizes_are_compared(run_dir, caplog):
    newest = run_dir / "checkpoint-4"
    _flip(newest / "model.safetensors")
    started: list[int] = []
    _trainer(str(run_dir), record=started, verify_checkpoint_checksums=False, max_steps=5).train(
        resume_from_checkpoint=True)
    assert started == [4]  # not read: the changed byte goes unnoticed, as documented
    with (newest / "scheduler.pt").open("ab") as fh:
        fh.write(b"\0")  # a changed size is still seen (a stat, no read)
    with pytest.raises(ValueError, match="scheduler.pt is .* bytes where the manifest says"):
        _trainer(str(run_dir), verify_checkpoint_checksums=False).train(resume_from_checkpoint=str(newest))


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "something else"}),
                                     json.dumps({"format": manifest.FORMAT, "checksum": "xxh3_64",
                                                 "files": {"../../etc/passwd": {"size": 1, "xxh3_64": "0"}}})])
def test_a_damaged_manifest_is_named(run_dir, caplog, content):
    newest = run_dir / "checkpoint-4"
    (newest / manifest.MANIFEST_NAME).write_text(content)
    with pytest.raises(ValueError, match=f"{manifest.MANIFEST_NAME} is damaged"):
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(newest))
    started: list[int] = []
    with caplog.at_level(logging.WARNING):
        _trainer(str(run_dir), record=started).train(resume_from_checkpoint=True)
    assert started == [3] and f"{manifest.MANIFEST_NAME} is damaged" in caplog.text


def test_a_listed_file_that_is_gone_is_named(run_dir):
    newest = run_dir / "checkpoint-4"
    (newest / "training_args.json").unlink()
    with pytest.raises(ValueError, match="training_args.json is missing"):
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(newest))


def test_checkpoints_without_a_manifest_and_added_files_still_resume(run_dir):
    """The reference writes no manifest; a callback may add files in on_save: neither is checked."""
    as_reference(run_dir / "checkpoint-4")
    (run_dir / "checkpoint-3" / "notes.txt").write_text("added by a callback")
    started: list[int] = []
    _trainer(str(run_dir), record=started, max_steps=5).train(resume_from_checkpoint=True)
    assert started == [4]
    assert manifest.problem(run_dir / "checkpoint-3") is None


def test_a_callback_writing_into_the_checkpoint_on_save_is_not_a_damage(tmp_path):
    from trainwell import TrainerCallback

    class WritesOnSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (folder / "extra.json").write_text("{}")

    _trainer(str(tmp_path), callbacks=[WritesOnSave()]).train()
    started: list[int] = []
    _trainer(str(tmp_path), record=started, max_steps=5).train(resume_from_checkpoint=True)
    assert started == [4]


def test_async_saves_write_the_same_manifest(tmp_path):
    _trainer(str(tmp_path / "sync"), max_steps=2).train()
    _trainer(str(tmp_path / "async"), max_steps=2, save_async=True).train()
    for step in (1, 2):
        sync = manifest.read(tmp_path / "sync" / f"checkpoint-{step}")
        done = manifest.read(tmp_path / "async" / f"checkpoint-{step}")
        assert sorted(sync) == sorted(done)
        same = ("model.safetensors", "scheduler.pt")  # the optimizer comes from a host snapshot: other bytes
        assert [sync[n] for n in same] == [done[n] for n in same]
        assert manifest.problem(tmp_path / "async" / f"checkpoint-{step}") is None


def test_sharded_files_are_checksummed_as_dcp_writes_them(tmp_path, monkeypatch):
    from trainwell.backend import sharded

    model = RegressionModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(input_x=torch.ones(3), labels=torch.zeros(3))["loss"].backward()
    optimizer.step()
    with filehash.recording(tmp_path) as recorder:
        sharded.save_model_shards(model, tmp_path)
        sharded.save_optimizer_shards(model, optimizer, tmp_path)
        recorded = recorder.snapshot()
    shards = [n for n in manifest.local_files(tmp_path) if n.endswith(".distcp")]
    assert len(shards) == 2 and set(shards) <= set(recorded)
    for name in shards:
        assert recorded[name] == filehash.hash_file(tmp_path / name)
    manifest.write(tmp_path, manifest.build(tmp_path, [recorded]))
    assert manifest.problem(tmp_path) is None
    _flip(tmp_path / shards[0], offset=100)
    assert f"{shards[0]} does not match its checksum" in manifest.problem(tmp_path)


def test_hashing_files_match_a_read_back(tmp_path):
    payload = {"a": torch.arange(1000.0), "b": [1, 2, 3]}
    with filehash.recording(tmp_path) as recorder:
        from trainwell.checkpoint.io import torch_save

        torch_save(payload, tmp_path / "x.pt")
    assert recorder.snapshot()["x.pt"] == filehash.hash_file(tmp_path / "x.pt")
    assert torch.equal(torch.load(tmp_path / "x.pt", weights_only=True)["a"], payload["a"])
    torch_save(payload, tmp_path / "y.pt")  # outside a recording: written, not recorded
    assert "y.pt" not in recorder.snapshot()


def test_large_writes_are_hashed_beside_the_write_in_order(tmp_path, monkeypatch):
    """Writes of at least ``_OVERLAP`` bytes are hashed on a thread while they are written; small and large
    writes interleaved still give the read-back digest, and no hashing thread outlives a write."""
    import threading

    monkeypatch.setattr(filehash, "_OVERLAP", 1024)
    pieces = [b"x" * 10, bytes(range(256)) * 40, b"y" * 3, bytes(5000), torch.arange(3000.0).numpy().tobytes()]
    hashed_on = []
    real = filehash.xxhash

    class Spy:  # an XXH3 state that notes the thread each update runs on
        def __init__(self):
            self.inner = real.xxh3_64()

        def update(self, data):
            hashed_on.append(threading.current_thread().name)
            self.inner.update(data)

        def intdigest(self):
            return self.inner.intdigest()

    monkeypatch.setattr(filehash, "xxhash", type("M", (), {"xxh3_64": Spy}))
    with open(tmp_path / "f", "wb") as raw:
        sink = filehash.HashingFile(raw)
        for piece in pieces:
            assert sink.write(piece) == len(piece)
        sink.close()
    monkeypatch.setattr(filehash, "xxhash", real)
    assert sink.record() == filehash.hash_file(tmp_path / "f")
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)
    assert hashed_on == ["MainThread", "trainwell-hash", "MainThread", "trainwell-hash", "trainwell-hash"]
    assert not [t for t in threading.enumerate() if t.name == "trainwell-hash"]


def test_a_failed_large_write_raises_and_leaves_no_hashing_thread(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(filehash, "_OVERLAP", 16)

    class FullDisk:
        def write(self, data):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        filehash.HashingFile(FullDisk()).write(b"z" * 64)
    assert not [t for t in threading.enumerate() if t.name == "trainwell-hash"]


# ------------------------------------------------------------------------------------------------ weights re-sharded
def _reshard(folder: Path) -> list[str]:
    """Store ``model.safetensors`` again as one shard per tensor with an index, as the reference's own resume tests
    convert a checkpoint (``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    shards = [f"model-{i + 1:05d}-of-{len(weights):05d}.safetensors" for i in range(len(weights))]
    index = {"metadata": {}, "weight_map": dict(zip(weights, shards))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for (name, tensor), shard in zip(weights.items(), shards):
        save_file({name: tensor}, folder / shard)
    return shards


@pytest.mark.parametrize("how", ["named", "true"])
def test_weights_resharded_after_saving_resume_with_a_warning(run_dir, tmp_path, caplog, how):
    """Complete, loadable weights in another form the loader accepts are not damage: the run resumes from them
    (exactly: the same weights), and a warning says the manifest no longer covers them."""
    folder = run_dir / "checkpoint-3"
    for newer in ("checkpoint-4",):
        shutil.rmtree(run_dir / newer)
    shards = _reshard(folder)
    started: list[int] = []
    resumed = _trainer(str(run_dir), record=started)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=str(folder) if how == "named" else True)
    assert started == [3]
    assert f"{folder}: the manifest lists model.safetensors, now replaced by model.safetensors.index.json and its " \
           f"{len(shards)} shards" in caplog.text and "no longer covers them" in caplog.text
    assert "Skipping" not in caplog.text
    full = _trainer(str(tmp_path / "full"))
    full.train()
    assert torch.equal(resumed.model.a, full.model.a) and torch.equal(resumed.model.b, full.model.b)


def test_resharded_weights_that_are_incomplete_are_still_refused(run_dir):
    folder = run_dir / "checkpoint-4"
    shards = _reshard(folder)
    (folder / shards[-1]).unlink()
    with pytest.raises(ValueError, match="model.safetensors is missing"):
        _trainer(str(run_dir)).train(resume_from_checkpoint=str(folder))
