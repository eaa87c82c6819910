"""Hostile files in a checkpoint: nothing a resume opens runs code from it.

Each file kind a resume can read has a crafted twin here (or in test_checkpoint_corruption.py for the plain
``.pt``/``.pth`` files and ``trainer_state.json``), and each test first shows that the crafted file is live
(an unrestricted load runs its code), so that the test can fail:

* the sharded (DCP) folders ``pytorch_model_fsdp_0/`` and ``optimizer_0/``: a ``.metadata`` that names a function,
  a data entry that does, and metadata pointing at a file outside its folder; a one-process run without FSDP
  reads such folders too (a 2-process FSDP checkpoint resumes on one), so these are checked there;
* DeepSpeed's ``global_step{N}/`` files, which DeepSpeed itself loads with ``weights_only=False``;
* a scan of the package for loaders that could unpickle code, and a record of every file a resume opens.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import io
import os
import pickle
import re
import shutil
import signal
from pathlib import Path

import pytest
import torch

from tests.common.hostile import Payload, as_reference, reseal
from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import ROOT, make_args
from trainwell import Trainer, TrainerCallback


def _trainer(out_dir, **kwargs):

    kwargs = {"per_device_train_batch_size": 4, "learning_rate": 0.1, "max_steps": 4, "save_strategy": "steps",
              "save_steps": 1, **kwargs}
    data = RegressionDataset(length=16)
    return Trainer(model=RegressionModel(), args=make_args(out_dir, **kwargs), train_dataset=data)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "out"
    _trainer(str(out)).train()
    return out


@pytest.fixture
def run_dir(finished_run, out_dir):
    shutil.copytree(finished_run, out_dir)
    return Path(out_dir)


# ------------------------------------------------------------------------------------------------- DCP folders
@pytest.mark.parametrize("folder", ["optimizer_0", "pytorch_model_fsdp_0"])
@pytest.mark.parametrize("how", ["true", "path"])
@pytest.mark.parametrize("beside", ["with-normal-files", "alone"])
def test_a_crafted_dcp_metadata_does_not_run_on_resume(run_dir, tmp_path, folder, how, beside):
    marker = tmp_path / "code-ran"
    probe = tmp_path / "probe-ran"
    pickle.loads(pickle.dumps(Payload(probe)))
    assert probe.exists()  # the payload is live: an unrestricted unpickling runs it

    checkpoint = run_dir / "checkpoint-4"
    (checkpoint / folder).mkdir()
    (checkpoint / folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    if beside == "alone":  # the sharded form stands in for the file it replaces
        (checkpoint / ("optimizer.pt" if folder == "optimizer_0" else "model.safetensors")).unlink()
        reseal(checkpoint)  # as the sharded form's checkpoint lists it, without model.safetensors
    resume = True if how == "true" else str(checkpoint)
    with pytest.raises(pickle.UnpicklingError) as err:
        _trainer(str(run_dir), max_steps=5).train(resume_from_checkpoint=resume)
    message = str(err.value)
    assert str(checkpoint / folder / ".metadata") in message and re.search(r"names (io|builtins)\.open", message)
    assert "could run code" in message
    assert not marker.exists()


def _sharded_optimizer(directory: Path, lr: object = 0.1):
    from trainwell.backend import sharded

    model = RegressionModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(input_x=torch.ones(3), labels=torch.zeros(3))["loss"].backward()
    optimizer.step()
    optimizer.param_groups[0]["lr"] = lr
    sharded.save_model_shards(model, directory)
    sharded.save_optimizer_shards(model, optimizer, directory)
    return model, optimizer


def test_sharded_states_round_trip_in_one_process(tmp_path):
    from trainwell.backend import sharded

    model, optimizer = _sharded_optimizer(tmp_path)
    fresh = RegressionModel(a=5.0, b=-3.0)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1.0)
    sharded.load_model_shards(fresh, tmp_path)
    sharded.load_optimizer_shards(fresh, fresh_optimizer, tmp_path)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), fresh.parameters()))
    assert fresh_optimizer.param_groups[0]["lr"] == 0.1
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(saved[i][k], loaded[i][k]) for i in saved for k in saved[i])


def test_a_crafted_entry_in_dcp_data_does_not_run(tmp_path):
    """The metadata is genuine, but a non-tensor entry (the learning rate) is a payload: torch's planner would
    unpickle it with weights_only=False."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from trainwell.backend import sharded

    probe, marker = tmp_path / "probe-ran", tmp_path / "code-ran"
    model, optimizer = _sharded_optimizer(tmp_path / "probe", lr=Payload(probe))
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=tmp_path / "probe" / sharded.OPTIMIZER_DIR)  # torch's own reader
    assert probe.exists()

    model, optimizer = _sharded_optimizer(tmp_path / "ckpt", lr=Payload(marker))
    with pytest.raises(pickle.UnpicklingError, match="optimizer.param_groups.0.lr"):
        sharded.load_optimizer_shards(model, torch.optim.AdamW(model.parameters()), tmp_path / "ckpt")
    assert not marker.exists()


def test_dcp_metadata_pointing_outside_its_folder_is_refused(tmp_path):
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    from trainwell.backend import sharded

    _sharded_optimizer(tmp_path)
    meta_file = tmp_path / sharded.MODEL_DIR / sharded.METADATA
    with open(meta_file, "rb") as fh:
        metadata = pickle.load(fh)
    key = next(iter(metadata.storage_data))
    metadata.storage_data[key] = _StorageInfo("../../../etc/passwd", 0, 10)
    meta_file.write_bytes(pickle.dumps(metadata))
    with pytest.raises(pickle.UnpicklingError, match="outside its folder"):
        sharded.load_model_shards(RegressionModel(), tmp_path)


def test_damaged_dcp_metadata_is_named(tmp_path):
    from trainwell.backend import sharded

    model, optimizer = _sharded_optimizer(tmp_path)
    meta_file = tmp_path / sharded.OPTIMIZER_DIR / sharded.METADATA
    meta_file.write_bytes(meta_file.read_bytes()[:40])
    with pytest.raises(pickle.UnpicklingError, match="not a readable DCP metadata file"):
        sharded.load_optimizer_shards(model, optimizer, tmp_path)


# ------------------------------------------------------------------------------------------------- DeepSpeed
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_deepspeed_files_load_weights_only(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from trainwell.backend.deepspeed import weights_only_loads

    marker = tmp_path / "code-ran"
    genuine = {"loss_scaler": LossScaler(1.0), "dynamic": DynamicLossScaler(2.0**16, 2, 1.0, 2, True), "zero_stage":
               ZeroStageEnum.gradients, "state": {"exp_avg": torch.ones(3)}}
    torch.save(genuine, tmp_path / "genuine.pt")
    torch.save({"optimizer_state_dict": {"loss_scaler": Payload(marker)}}, tmp_path / "crafted.pt")
    real = torch.load
    with weights_only_loads():
        loaded = torch.load(tmp_path / "genuine.pt", map_location="cpu")
        assert loaded["zero_stage"] is ZeroStageEnum.gradients
        assert torch.equal(loaded["state"]["exp_avg"], torch.ones(3))
        assert loaded["loss_scaler"].cur_scale == 1.0
        with pytest.raises(pickle.UnpicklingError, match="crafted.pt"):
            torch.load(tmp_path / "crafted.pt", map_location="cpu", weights_only=False)  # asked for, not given
    assert not marker.exists()
    assert torch.load is real
    torch.load(tmp_path / "crafted.pt", weights_only=False)  # outside the block the file is live
    assert marker.exists()


# ------------------------------------------------------------------------------------------------- the package
_ALLOWED_LOADERS = {
    # file: the loads it may make, each of which reads weights_only or through a restricted unpickler
    "trainwell/checkpoint/io.py": ["torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)"],
    "trainwell/backend/sharded.py": ["torch.load(value, weights_only=True)", "dcp.load(state, storage_reader="],
    "trainwell/backend/deepspeed.py": ["engine.load_checkpoint(directory, load_module_strict", "engine.load_checkpoint("
                                       "directory, load_optimizer_states=False"],
}
_LOADER = re.compile(r"\b(torch\.load|pickle\.loads?|dcp\.load|\w+\.load_checkpoint|torch\.serialization\.load|"
                     r"joblib\.load|dill\.load|cloudpickle\.load)\(")


def test_no_loader_in_the_package_can_unpickle_code():
    """Every load of a pickle in trainwell is one of the reviewed, restricted ones above."""
    found = {}
    for path in sorted(Path(ROOT, "trainwell").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if _LOADER.search(code) and not code.strip().startswith(("\"", "'", "``")) and "``" not in code:
                found.setdefault(rel, []).append((number, code.strip()))
    for rel, lines in found.items():
        allowed = _ALLOWED_LOADERS.get(rel, [])
        unreviewed = [(n, c) for n, c in lines if not any(c.startswith(a) or a in c for a in allowed)]
        assert not unreviewed, f"{rel}: a load that may unpickle code: {unreviewed}"
    assert "unpickler" in Path(ROOT, "trainwell/backend/sharded.py").read_text().lower()


def _record_opens(monkeypatch, folder, record):
    """Call ``record(path)`` for each file under the checkpoint ``folder`` opened through ``open`` or ``os.open``
    (trainwell's readers open a descriptor first, to refuse links and FIFOs)."""
    real_open, real_os_open = builtins.open, os.open

    def recording_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and str(folder) in str(file) and not os.path.isdir(file):
            record(file)
        return real_open(file, *args, **kwargs)

    def recording_os_open(file, *args, **kwargs):
        if kwargs.get("dir_fd") is not None:  # opened relative to its folder's descriptor: where that folder is
            file = os.path.join(os.readlink(f"/proc/self/fd/{kwargs['dir_fd']}"), file)
        if isinstance(file, (str, Path)) and str(folder) in str(file) and not os.path.isdir(file):
            record(file)
        return real_os_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", recording_open)
    monkeypatch.setattr(io, "open", recording_open)
    monkeypatch.setattr(os, "open", recording_os_open)


def test_every_file_a_resume_opens_has_a_hostile_test(run_dir, monkeypatch):
    """A resume opens these files and no others; each has a crafted twin in these tests."""
    # model.safetensors: its header is read to check the length; the format holds a JSON header and raw bytes
    covered = {"trainer_state.json", "training_args.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
               "model.safetensors", "checkpoint_manifest.json"}
    opened: list[str] = []
    _record_opens(monkeypatch, run_dir / "checkpoint-4", lambda file: opened.append(Path(file).name))
    trainer = _trainer(str(run_dir), max_steps=5, save_strategy="no")
    trainer.train(resume_from_checkpoint=str(run_dir / "checkpoint-4"))
    assert set(opened) <= covered, sorted(set(opened) - covered)
    assert {"trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(opened)


# ------------------------------------------------------------------------------------------------- PEFT adapters
def _peft_trainer(out_dir, **kwargs):
    """A LoRA Llama with two adapters: "default" (saved in the checkpoint folder) and the active "second" (saved in
    a subfolder of that name), the two places a resume reads adapter weights from."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from trainwell import Trainer

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=32, max_position_embeddings=16)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(config), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    model.add_adapter("second", peft.LoraConfig(r=2, target_modules=["v_proj"]))
    model.set_adapter("second")
    rows = [{"input_ids": torch.arange(i, i + 6) % 32, "labels": torch.arange(i, i + 6) % 32} for i in range(8)]
    kwargs = {"per_device_train_batch_size": 4, "max_steps": 2, "save_strategy": "steps", "save_steps": 1, **kwargs}
    return Trainer(model=model, args=make_args(out_dir, **kwargs), train_dataset=rows)


@pytest.fixture(scope="module")
def finished_peft_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-peft") / "out"
    _peft_trainer(str(out)).train()
    return out


@pytest.fixture
def peft_dir(finished_peft_run, out_dir):
    shutil.copytree(finished_peft_run, out_dir)
    return Path(out_dir)


@pytest.mark.parametrize("where", [".", "second"])
@pytest.mark.parametrize("how", ["true", "path"])
def test_a_crafted_adapter_bin_does_not_run_on_resume(peft_dir, tmp_path, where, how):
    """adapter_model.bin (peft's pickle format) is read weights-only, in the folder and in an adapter's subfolder."""
    marker, probe = tmp_path / "code-ran", tmp_path / "probe-ran"
    torch.save({"weight": Payload(probe)}, tmp_path / "probe.bin")
    torch.load(tmp_path / "probe.bin", weights_only=False)
    assert probe.exists()  # the payload is live: an unrestricted load runs it

    folder = peft_dir / "checkpoint-2" if where == "." else peft_dir / "checkpoint-2" / where
    (folder / "adapter_model.safetensors").unlink()
    as_reference(peft_dir / "checkpoint-2")  # as the reference writes it: the loader guards
    torch.save({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": Payload(marker)},
               folder / "adapter_model.bin")
    resume = True if how == "true" else str(peft_dir / "checkpoint-2")
    with pytest.raises(pickle.UnpicklingError) as err:
        _peft_trainer(str(peft_dir), max_steps=3).train(resume_from_checkpoint=resume)
    assert f"Refusing to load {folder / 'adapter_model.bin'}: " in str(err.value)
    assert "could run code" in str(err.value)
    assert not marker.exists()


def test_an_adapter_bin_that_is_not_a_dict_of_tensors_is_refused(peft_dir):
    folder = peft_dir / "checkpoint-2"
    (folder / "adapter_model.safetensors").unlink()
    as_reference(folder)  # as the reference writes it: the loader guards
    torch.save([torch.ones(2)], folder / "adapter_model.bin")  # loads weights-only, but is no adapter
    with pytest.raises(ValueError, match=r"adapter_model.bin does not hold a dict of tensors \(found list\)"):
        _peft_trainer(str(peft_dir), max_steps=3).train(resume_from_checkpoint=str(folder))


@pytest.mark.parametrize("where", ["adapter_model.safetensors", "second/adapter_model.safetensors",
                                   "second/adapter_model.bin"])
def test_a_truncated_adapter_file_is_named_and_skipped(peft_dir, where, caplog):
    from safetensors.torch import load_file

    folder = peft_dir / "checkpoint-2"
    as_reference(folder)  # as the reference writes it: the loader guards
    if where.endswith(".bin"):
        weights = load_file(str(folder / "second" / "adapter_model.safetensors"))
        (folder / "second" / "adapter_model.safetensors").unlink()
        torch.save(weights, folder / where)
    data = (folder / where).read_bytes()
    (folder / where).write_bytes(data[: len(data) - 40])
    kind = "truncated or not a torch file" if where.endswith(".bin") else "truncated"
    with pytest.raises(ValueError, match=f"Can't resume from .*checkpoint-2: {re.escape(where)} is {kind}"):
        _peft_trainer(str(peft_dir), max_steps=3).train(resume_from_checkpoint=str(folder))
    trainer = _peft_trainer(str(peft_dir), max_steps=3)
    trainer.train(resume_from_checkpoint=True)  # the newest complete checkpoint: checkpoint-1
    assert f"Skipping damaged checkpoint {folder}: {where} is {kind}" in caplog.text
    assert trainer.state.global_step == 3


def test_every_file_a_peft_resume_opens_has_a_hostile_test(peft_dir, monkeypatch):
    """The adapter files join the files a plain resume opens. README.md and adapter_config.json are only read as
    bytes by the manifest's checksum, never parsed."""
    covered = {"trainer_state.json", "training_args.json", "optimizer.pt", "scheduler.pt", "rng_state.pth",
               "adapter_model.safetensors", "checkpoint_manifest.json", "README.md", "adapter_config.json"}
    opened: list[str] = []
    _record_opens(monkeypatch, peft_dir / "checkpoint-2", lambda file: opened.append(
        Path(file).relative_to(peft_dir / "checkpoint-2").as_posix()))
    _peft_trainer(str(peft_dir), max_steps=3, save_strategy="no").train(resume_from_checkpoint=str(peft_dir /
                                                                                                 "checkpoint-2"))
    assert {Path(name).name for name in opened} <= covered, sorted(opened)
    assert {"adapter_model.safetensors", "second/adapter_model.safetensors", "optimizer.pt"} <= set(opened)


# ------------------------------------------------------------------------------------------------- not regular files
@contextlib.contextmanager
def _within(seconds: int):
    """Fail instead of hanging: a resume that blocks on a FIFO or reads /dev/zero without end is interrupted."""
    def hung(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a read that never ends")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _plant(path: Path, kind: str, outside: Path) -> str:
    """Replace ``path`` with a link to /dev/zero, a FIFO, or a link to a copy of it outside the folder; returns how
    the error names what it found."""
    if kind == "outside":
        shutil.copy(path, outside)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO"
    path.symlink_to("/dev/zero" if kind == "dev-zero" else outside)
    return "is a symbolic link"


def _resumed_at(out_dir, resume, **kwargs) -> int:
    """The step a run resumed ``resume`` at (its state when training begins); it saves nothing, so the checkpoints
    stay as they are for the next resume."""
    started: list[int] = []

    class Start(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            started.append(state.global_step)

    trainer = _trainer(str(out_dir), max_steps=5, **{"save_strategy": "no", **kwargs})
    trainer.add_callback(Start())
    trainer.train(resume_from_checkpoint=resume)
    return started[0]


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "outside"])
@pytest.mark.parametrize("name", ["optimizer.pt", "rng_state.pth", "trainer_state.json", "model.safetensors"])
def test_a_checkpoint_file_that_is_not_a_regular_file_never_hangs_resume(run_dir, tmp_path, caplog, kind, name):
    """A link (to /dev/zero, or out of the folder) or a FIFO where a checkpoint file belongs is named, never opened:
    a named checkpoint is an error, resume_from_checkpoint=True falls back to the one before it."""
    folder = run_dir / "checkpoint-4"
    found = _plant(folder / name, kind, tmp_path / "outside")
    with _within(120):
        with pytest.raises(ValueError) as err:
            _trainer(str(run_dir), max_steps=5).train(resume_from_checkpoint=str(folder))
        assert f"Can't resume from {folder}: {name} {found}" in str(err.value)
        assert _resumed_at(run_dir, True) == 3
    assert f"Skipping damaged checkpoint {folder}: {name} {found}" in caplog.text
    if kind == "outside":
        assert (tmp_path / "outside").stat().st_size > 0  # what the link points to is untouched


@pytest.mark.parametrize("kind", ["folder", "file", "dangling"])
def test_a_link_at_a_saves_temporary_name_is_removed_never_followed(tmp_path, caplog, kind):
    """``.tmp-checkpoint-N`` is where a save writes before it publishes: a link planted there (before the run, or
    while it trains) is removed as a link, and what it points to is untouched."""
    out, target = tmp_path / "out", tmp_path / "precious"
    out.mkdir()
    if kind == "folder":
        target.mkdir()
        (target / "keep.txt").write_text("keep")
    elif kind == "file":
        target.write_text("keep")
    (out / ".tmp-checkpoint-1").symlink_to(target)

    class PlantAgain(TrainerCallback):  # the next save's temporary name, planted while training runs
        def on_step_end(self, args, state, control, **kwargs):
            link = out / f".tmp-checkpoint-{state.global_step}"
            if state.global_step == 3 and not os.path.lexists(link):
                link.symlink_to(target)

    trainer = _trainer(str(out), max_steps=3)
    trainer.add_callback(PlantAgain())
    trainer.train()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert not any(p.name.startswith(".tmp-") for p in out.iterdir())
    if kind == "folder":
        assert sorted(os.listdir(target)) == ["keep.txt"] and (target / "keep.txt").read_text() == "keep"
    elif kind == "file":
        assert target.read_text() == "keep"
    assert f"Removing {out / '.tmp-checkpoint-3'}, a symbolic link where trainwell writes" in caplog.text


# ------------------------------------------------------------------------------------------------- the manifest
def test_a_checkpoint_that_lost_its_manifest_is_refused_or_passed_over(run_dir, caplog):
    """Deleting the manifest used to turn every check off: flipped weight bytes resumed again. A checkpoint trainwell
    wrote (its training_args.json says so) without its manifest is refused by name; True falls back past it;
    verify_checkpoint_checksums=False resumes it with a warning; the reference's checkpoints (no manifest, no
    training_args.json) still resume."""
    folder = run_dir / "checkpoint-4"
    weights = bytearray((folder / "model.safetensors").read_bytes())
    weights[-1] ^= 0xFF  # a flipped byte in the weights, which only the manifest could tell
    (folder / "model.safetensors").write_bytes(bytes(weights))
    (folder / "checkpoint_manifest.json").unlink()
    with pytest.raises(ValueError, match=r"checkpoint-4: checkpoint_manifest.json is missing, though every checkpoint "
                                         r"trainwell writes holds one .* verify_checkpoint_checksums=False"):
        _trainer(str(run_dir), max_steps=5).train(resume_from_checkpoint=str(folder))
    assert _resumed_at(run_dir, True) == 3
    assert f"Skipping damaged checkpoint {folder}: checkpoint_manifest.json is missing" in caplog.text
    assert _resumed_at(run_dir, str(folder), verify_checkpoint_checksums=False) == 4
    assert f"{folder} has no checkpoint_manifest.json (verify_checkpoint_checksums=False)" in caplog.text
    as_reference(folder)
    assert _resumed_at(run_dir, True) == 4  # unchecked, as the reference's checkpoints are


@pytest.mark.parametrize("content", ["[" * 200_000 + "]" * 200_000, '{"files": ' * 100_000 + "1" + "}" * 100_000],
                         ids=["list", "object"])
def test_a_manifest_nested_200000_deep_is_named(run_dir, caplog, content):
    folder = run_dir / "checkpoint-4"
    (folder / "checkpoint_manifest.json").write_text(content)
    with pytest.raises(ValueError, match=r"checkpoint-4: checkpoint_manifest.json is damaged \(is nested too deeply"):
        _trainer(str(run_dir), max_steps=5).train(resume_from_checkpoint=str(folder))
    assert _resumed_at(run_dir, True) == 3
    assert f"Skipping damaged checkpoint {folder}: checkpoint_manifest.json is damaged" in caplog.text


# ------------------------------------------------------------------------------------------------- what the files hold
def _mlp_trainer(out_dir, **kwargs):
    from tests.common.models import ClassificationDataset, DropoutMLP

    kwargs = {"per_device_train_batch_size": 8, "max_steps": 4, "save_strategy": "steps", "save_steps": 4, **kwargs}
    return Trainer(model=DropoutMLP(), args=make_args(out_dir, **kwargs), train_dataset=ClassificationDataset())


@pytest.fixture(scope="module")
def finished_mlp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-mlp") / "out"
    _mlp_trainer(str(out)).train()
    return out


@pytest.fixture
def mlp_checkpoint(finished_mlp_run, tmp_path):
    shutil.copytree(finished_mlp_run, tmp_path / "run")
    return tmp_path / "run" / "checkpoint-4"


def _edit(folder: Path, name: str, change) -> Path:
    """Load ``name`` of ``folder``, let ``change`` edit (or replace) it, save it and reseal the manifest (an edit made
    with the manifest: only the checks behind it can tell)."""
    path = folder / name
    state = torch.load(path, weights_only=False)
    changed = change(state)
    torch.save(state if changed is None else changed, path)
    reseal(folder)
    return path


def _first_state(state):
    return state["state"][0]  # net.0.weight, a (16, 8) matrix


_OPTIMIZER_EDITS = {
    "0-dim exp_avg_sq": (lambda s: _first_state(s).update(exp_avg_sq=torch.tensor(1.0)), r"exp_avg_sq of shape \(\)"),
    "step of 3 values": (lambda s: _first_state(s).update(step=torch.ones(3)), r"step of shape \(3,\)"),
    "step not finite": (lambda s: _first_state(s).update(step=torch.tensor(float("nan"))), r"step=nan"),
    "step negative": (lambda s: _first_state(s).update(step=-2), r"step=-2"),
    "no exp_avg": (lambda s: _first_state(s).__delitem__("exp_avg"), r"no exp_avg \(which AdamW reads\)"),
    "lr a string": (lambda s: s["param_groups"][0].update(lr="fast"), r"lr='fast' where a number is kept"),
    "betas short": (lambda s: s["param_groups"][0].update(betas=(0.9,)), r"betas=\(0.9,\) where 2 numbers are kept"),
    "not a state": (lambda s: [1, 2, 3], r"is not an optimizer state: it needs a 'state' dictionary"),
    "params not numbers": (lambda s: s["param_groups"][0].update(params=["a"]),
                           r"group 0's 'params' is not a list of parameter numbers"),
}


@pytest.mark.parametrize("case", list(_OPTIMIZER_EDITS))
def test_a_damaged_optimizer_state_is_named_before_any_kernel_sees_it(mlp_checkpoint, case):
    """Shapes (a 0-dim ``exp_avg_sq`` would overrun the fused kernel), ``step``, the entries AdamW reads, the groups'
    settings and the structure are checked before anything is loaded; the error names the file."""
    change, expected = _OPTIMIZER_EDITS[case]
    path = _edit(mlp_checkpoint, "optimizer.pt", change)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r" .*" + expected):
        _mlp_trainer(str(mlp_checkpoint.parent), max_steps=6).train(resume_from_checkpoint=str(mlp_checkpoint))


@pytest.mark.parametrize(("change", "expected"), [
    (lambda s: s.update(cpu=torch.zeros(10, dtype=torch.uint8)), r"'cpu' is Tensor of 10 uint8, not torch's CPU"),
    (lambda s: s.update(python=(3, (1, 2), None)), r"'python' is \(3, \(1, 2\), None\), not python's random state"),
    (lambda s: s.update(numpy=("MT19937", [0] * 10, 0, 0, 0.0)), r"'numpy' is .*, not numpy's MT19937 state"),
    (lambda s: ["not", "a", "dict"], r"rng_state.pth holds a list, not the dictionary of RNG states"),
], ids=["cpu", "python", "numpy", "list"])
def test_a_bad_rng_state_is_named_before_any_generator_is_set(mlp_checkpoint, change, expected):
    _edit(mlp_checkpoint, "rng_state.pth", change)
    before = torch.get_rng_state()
    with pytest.raises(ValueError, match=re.escape(str(mlp_checkpoint)) + r".*" + expected):
        _mlp_trainer(str(mlp_checkpoint.parent), max_steps=6).train(resume_from_checkpoint=str(mlp_checkpoint))
    assert torch.get_rng_state().numel() == before.numel()


@pytest.mark.parametrize(("change", "expected"), [
    (lambda s: s.update(last_epoch="four"), r"last_epoch='four' where a int is kept"),
    (lambda s: s.update(base_lrs=[0.1, 0.2, 0.3]), r"base_lrs=\[0.1, 0.2, 0.3\] where 2 numbers are kept"),
    (lambda s: s.update(_last_lr=[float("nan")] * 2), r"_last_lr=\[nan, nan\] where 2 numbers are kept"),
    (lambda s: s.update(last_epoch=-7), r"last_epoch=-7 \(a step count: -1 or more\)"),
    (lambda s: 12, r"it holds a int, not a scheduler's state dictionary"),
], ids=["epoch-text", "lrs-length", "lr-nan", "epoch-negative", "not-a-dict"])
def test_a_bad_scheduler_state_is_named(mlp_checkpoint, change, expected):
    path = _edit(mlp_checkpoint, "scheduler.pt", change)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r" does not fit this run's learning-rate schedule: "
                                          + expected):
        _mlp_trainer(str(mlp_checkpoint.parent), max_steps=6).train(resume_from_checkpoint=str(mlp_checkpoint))


def test_weights_of_another_dtype_are_cast_with_a_warning_naming_them(mlp_checkpoint, caplog):
    """The reference casts them silently; trainwell casts them too, and says which file held which dtype."""
    from safetensors.torch import load_file, save_file

    weights = load_file(mlp_checkpoint / "model.safetensors")
    save_file({k: v.half() for k, v in weights.items()}, mlp_checkpoint / "model.safetensors")
    reseal(mlp_checkpoint)
    trainer = _mlp_trainer(str(mlp_checkpoint.parent), max_steps=6, save_strategy="no")
    trainer.train(resume_from_checkpoint=str(mlp_checkpoint))
    assert f"The weights in {mlp_checkpoint} hold float16 where the model has float32 (net.0.bias, net.0.weight, " \
           "net.3.bias and 1 more): they are cast to float32" in caplog.text
    assert trainer.model.net[0].weight.dtype == torch.float32
