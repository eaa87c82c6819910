"""DeepSpeed ZeRO through Accelerate on CPU processes (gloo): training, DeepSpeed checkpoints, resume, full weights.

The processes run tests/distributed/deepspeed_script.py under torchrun; its docstring says what it does to keep
DeepSpeed from compiling ops on a CPU. Runs are shared between the tests of this module (each start of
DeepSpeed costs ~15 s here). ZeRO and DDP reduce in a different order: weights agree to ~1e-8, not bitwise;
a resume is bitwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.common.timing import hang_timeout
from tests.conftest import make_args

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "deepspeed_script.py")
TOL = 1e-6
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")


class Runs:
    def __init__(self, root: Path) -> None:
        self.root, self.results = root, {}

    def workdir(self, name: str) -> Path:
        return self.root / name

    def launch(self, name: str, *flags: str, workdir: str | None = None) -> subprocess.CompletedProcess:
        out = self.root / f"{name}.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", SCRIPT, "--out", str(out),
               "--workdir", str(self.workdir(workdir or name)), *flags]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=hang_timeout(600))

    def __call__(self, name: str, *flags: str, workdir: str | None = None) -> dict:
        if name not in self.results:
            proc = self.launch(name, *flags, workdir=workdir)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
            self.results[name] = json.loads((self.root / f"{name}.json").read_text())
        return self.results[name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    if torch.cuda.is_available():
        pytest.skip("these runs are the CPU (gloo) recipes")
    return Runs(tmp_path_factory.mktemp("deepspeed"))


def _max_diff(a: dict, b: dict) -> float:
    assert a["params"].keys() == b["params"].keys()
    return max(float(np.abs(np.asarray(a["params"][k]) - np.asarray(b["params"][k])).max()) for k in a["params"])


def _zero2(runs):
    # without transformers importable: trainwell's DeepSpeed path must not need it (Accelerate's plugin would)
    return runs("zero2", "--stage", "2", "--save-steps", "3", "--no-transformers")


def _zero3(runs):
    return runs("zero3", "--stage", "3", "--save-steps", "3")


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_trains_like_ddp_and_saves_full_weights(runs, stage):
    result = _zero2(runs) if stage == 2 else _zero3(runs)
    ddp = runs("ddp", "--plain")
    assert result["deepspeed"] and result["engine"] == "DeepSpeedEngine" and not ddp["deepspeed"]
    assert result["deepspeed_attribute"]  # trainer.deepspeed is the engine, is_deepspeed_enabled is set
    # "final" holds the weights save_model() gathered: compared with DDP's, they are the full model
    assert _max_diff(result, ddp) < TOL and result["losses"] == pytest.approx(ddp["losses"], abs=TOL)


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_resumes_exactly_from_its_own_checkpoint(runs, stage):
    full = _zero2(runs) if stage == 2 else _zero3(runs)
    name = f"zero{stage}"
    folder = runs.workdir(name) / "checkpoint-3"
    files = set(os.listdir(folder))
    assert {"latest", "global_step3", "scheduler.pt", "trainer_state.json", "rng_state_0.pth"} <= files
    assert ("model.safetensors" in files) == (stage == 2)  # ZeRO-3 keeps the model in DeepSpeed's partitions
    from trainwell.checkpoint import manifest
    from trainwell.checkpoint.resume import manifest_problem

    listed = manifest.read(folder)  # every process's partitions are in the manifest, and match it
    assert sorted(listed) == manifest.local_files(folder) and manifest_problem(folder) is None
    assert "global_step3/zero_pp_rank_1_mp_rank_00_optim_states.pt" in listed
    resumed = runs(f"{name}-resumed", "--stage", str(stage), "--resume", str(folder), workdir=f"{name}-resumed")
    assert resumed["params"] == full["params"] and resumed["losses"] == full["losses"]


@pytest.mark.distributed
def test_bf16_with_deepspeeds_own_optimizer_and_scheduler_and_the_best_model(runs):
    result = runs("bf16", "--stage", "3", "--bf16", "--ds-optimizer", "--best", "--save-steps", "2")
    assert result["precision"] == "bf16"
    assert result["lrs"][:3] == pytest.approx([0.0, 0.01, 0.01])  # WarmupDecayLR from the config: 1 warmup step
    assert result["best_step"] in (2, 4, 6)


@pytest.mark.distributed
def test_a_deepspeed_checkpoint_needs_deepspeed_to_resume(runs, tmp_path):
    from tests.common.models import ClassificationDataset
    from tests.distributed.fsdp_script import Net
    from trainwell import Trainer

    _zero3(runs)
    trainer = Trainer(model=Net(), args=make_args(str(tmp_path), max_steps=6, per_device_train_batch_size=8),
                      train_dataset=ClassificationDataset())
    with pytest.raises(ValueError, match="written with DeepSpeed and this run does not use it"):
        trainer.train(resume_from_checkpoint=str(runs.workdir("zero3") / "checkpoint-3"))


@pytest.mark.distributed
def test_a_deepspeed_checkpoint_without_latest_is_incomplete(runs, tmp_path):
    import shutil

    from trainwell.checkpoint.resume import incomplete_reason

    _zero3(runs)
    copy = tmp_path / "checkpoint-3"
    shutil.copytree(runs.workdir("zero3") / "checkpoint-3", copy)
    assert incomplete_reason(copy) is None
    (copy / "latest").unlink()  # killed before DeepSpeed named the finished checkpoint
    assert incomplete_reason(copy) == "no model weights file"


@pytest.mark.distributed
def test_a_crafted_file_in_a_deepspeed_checkpoint_does_not_run(runs, tmp_path):
    """DeepSpeed loads its files with weights_only=False; under trainwell a payload in one is refused, naming it."""
    import shutil

    from tests.common.hostile import Payload, reseal
    from trainwell.backend.deepspeed import weights_only_loads

    _zero2(runs)
    copy = runs.workdir("crafted") / "checkpoint-3"
    shutil.copytree(runs.workdir("zero2") / "checkpoint-3", copy)
    target = copy / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    marker = tmp_path / "code-ran"
    with weights_only_loads():
        state = torch.load(target, map_location="cpu")
    state["optimizer_state_dict"]["loss_scaler"] = Payload(marker)
    torch.save(state, target)
    reseal(copy)  # else the manifest refuses the changed file before it is read
    proc = runs.launch("crafted-resumed", "--stage", "2", "--save-steps", "3", "--resume", str(copy),
                       workdir="crafted")
    assert proc.returncode != 0
    assert f"Refusing to load {target}" in proc.stdout + proc.stderr
    assert not marker.exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 needs a GPU: DeepSpeed has no fp16 on the CPU")
@needs_deepspeed
def test_fp16_zero2_on_a_gpu(tmp_path):
    from tests.common.models import ClassificationDataset
    from tests.distributed.fsdp_script import Net
    from trainwell import Trainer, TrainingArguments

    args = TrainingArguments(str(tmp_path), fp16=True, max_steps=3, report_to="none",
                             deepspeed={"zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto"},
                                        "train_micro_batch_size_per_gpu": "auto"})
    assert Trainer(model=Net(), args=args, train_dataset=ClassificationDataset()).train().global_step == 3


# ------------------------------------------------------------------------------------------ the config, no processes
def test_auto_values_come_from_the_arguments(tmp_path):
    from trainwell.backend.deepspeed import fill_for_run, fill_from_arguments

    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                         "weight_decay": "auto"}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                "warmup_num_steps": "auto", "total_num_steps": "auto"}},
              "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}
    args = make_args(str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2, bf16=True,
                     learning_rate=3e-4, weight_decay=0.1, max_grad_norm=0.5, warmup_steps=5)
    fill_from_arguments(config, args)
    model = torch.nn.Linear(2, 2)
    model.config = type("Config", (), {"hidden_size": 16})()
    fill_for_run(config, args, model, num_processes=4, num_training_steps=100)
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 32 and config["gradient_clipping"] == 0.5 and config["bf16"]["enabled"]
    assert config["optimizer"]["params"] == {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1}
    assert config["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 5,
                                             "total_num_steps": 100}
    assert config["zero_optimization"]["reduce_bucket_size"] == 256


def test_values_that_contradict_the_arguments_are_listed(tmp_path):
    from trainwell.backend.deepspeed import fill_from_arguments

    config = {"train_micro_batch_size_per_gpu": 16, "gradient_clipping": 2.0, "zero_optimization": {"stage": 2}}
    with pytest.raises(ValueError) as err:
        fill_from_arguments(config, make_args(str(tmp_path), per_device_train_batch_size=4, max_grad_norm=1.0))
    assert "train_micro_batch_size_per_gpu=16, but per_device_train_batch_size=4" in str(err.value)
    assert "gradient_clipping=2.0, but max_grad_norm=1.0" in str(err.value)


def test_config_from_a_file_or_json_and_clear_errors(tmp_path):
    from trainwell.backend.deepspeed import fill_for_run, load_config

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    expected = {"zero_optimization": {"stage": 1}}
    assert load_config(str(path)) == load_config('{"zero_optimization": {"stage": 1}}') == expected
    with pytest.raises(ValueError, match="no such file"):
        load_config("missing.json")
    with pytest.raises(ValueError, match="hidden size"):
        fill_for_run({"zero_optimization": {"reduce_bucket_size": "auto"}}, make_args(str(tmp_path)),
                     torch.nn.Linear(2, 2), 1, 10)


@needs_deepspeed
def test_the_plugin_does_not_need_transformers(monkeypatch):
    from trainwell.backend.deepspeed import make_plugin

    plugin = make_plugin({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1})
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    plugin.set_deepspeed_weakref()  # Accelerate's own plugin raises an ImportError here


@pytest.mark.distributed
def test_sigterm_with_rotation_and_save_only_model_under_zero3(runs):
    """SIGTERM on both processes as step 3 begins (enable_jit_checkpoint): checkpoint-3 is saved and rotation
    (save_total_limit=1) removes checkpoint-2; with save_only_model it holds the full weights (gathered from the
    ZeRO-3 partitions), not DeepSpeed's checkpoint."""
    from safetensors.torch import load_file

    stopped = runs("jit", "--stage", "3", "--save-steps", "2", "--save-total-limit", "1", "--save-only-model",
                   "--sigterm-at", "3")
    assert stopped["last_step"] == 3 and stopped["losses"] == pytest.approx(_zero3(runs)["losses"][:3], abs=TOL)
    workdir = runs.workdir("jit")
    assert sorted(p.name for p in workdir.glob("checkpoint-*")) == ["checkpoint-3"]
    files = sorted(p.name for p in (workdir / "checkpoint-3").iterdir())
    assert files == ["checkpoint_manifest.json", "model.safetensors", "trainer_state.json", "training_args.json"]
    saved, final = load_file(str(workdir / "checkpoint-3" / "model.safetensors")), load_file(
        str(workdir / "final" / "model.safetensors"))
    assert saved.keys() == final.keys() and all(torch.equal(saved[k], final[k]) for k in saved)
