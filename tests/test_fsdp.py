"""FSDP2 through Accelerate, on CPU processes (gloo): training, sharded checkpoints, resume and resharding.

The processes run tests/distributed/fsdp_script.py under torchrun with its test-only patch that lets Accelerate
run FSDP on a CPU (the script's docstring says why and how). Runs are shared between the tests of this module.
Tolerances: FSDP and DDP reduce the gradient norm in a different order, so weights agree to ~1e-8, not bitwise;
a resume at the same world size is bitwise.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from tests.common.launch import ScriptRuns

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "fsdp_script.py")
pytestmark = pytest.mark.distributed
TOL = 1e-6


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch

    if torch.cuda.is_available():
        pytest.skip("these runs use the CPU-only FSDP patch")
    return ScriptRuns(SCRIPT, tmp_path_factory.mktemp("fsdp"))


FSDP = ("--fsdp", "--fsdp-on-cpu")


def _max_diff(a: dict, b: dict) -> float:
    assert a["params"].keys() == b["params"].keys()
    return max(float(np.abs(np.asarray(a["params"][k]) - np.asarray(b["params"][k])).max()) for k in a["params"])


def _two_ranks(runs):
    return runs("fsdp2", 2, *FSDP, "--save-steps", "3", "--ema")  # with an EMA: its shards are checkpointed too


def _ddp(runs):
    return runs("ddp2", 2, "--save-steps", "3", "--ema")


def test_two_rank_fsdp_shards_and_trains_like_ddp_and_like_one_rank_with_twice_the_batch(runs):
    fsdp = _two_ranks(runs)
    assert fsdp["world"] == 2 and fsdp["engine"] == "fsdp" and fsdp["sharded_params"]  # DTensor parameters
    assert fsdp["is_fsdp_enabled"]  # the reference's attribute, read by library subclasses
    ddp = _ddp(runs)
    assert ddp["engine"] == "data_parallel" and not ddp["sharded_params"]
    assert _max_diff(fsdp, ddp) < TOL and fsdp["losses"] == pytest.approx(ddp["losses"], abs=TOL)
    one = runs("fsdp1", 1, *FSDP, "--batch", "8", "--save-steps", "3")
    assert one["world"] == 1 and one["sharded_params"]
    assert _max_diff(fsdp, one) < TOL and fsdp["losses"] == pytest.approx(one["losses"], abs=TOL)


def test_sharded_checkpoint_layout(runs):
    _two_ranks(runs)
    folder = runs.workdir("fsdp2") / "checkpoint-3"
    names = sorted(os.listdir(folder))
    assert names == ["checkpoint_manifest.json", "ema_0.safetensors", "ema_1.safetensors", "optimizer_0",
                     "pytorch_model_fsdp_0", "rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "trainer_state.json",
                     "training_args.json"]
    for shards in ("optimizer_0", "pytorch_model_fsdp_0"):  # one file per process, and the metadata written last
        assert sorted(os.listdir(folder / shards)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # the manifest covers every process's files, shards included, and they match it
    from trainwell.checkpoint import manifest
    from trainwell.checkpoint.resume import manifest_problem

    assert sorted(manifest.read(folder)) == manifest.local_files(folder)
    assert "optimizer_0/__1_0.distcp" in manifest.read(folder) and manifest_problem(folder) is None


def test_resume_at_the_same_world_size_is_exact(runs):
    full = _two_ranks(runs)
    resumed = runs("fsdp2-resumed", 2, *FSDP, "--ema", "--resume", str(runs.workdir("fsdp2") / "checkpoint-3"))
    assert resumed["params"] == full["params"] and resumed["losses"] == full["losses"]


def test_the_ema_of_the_local_shards_is_saved_per_process_and_resumed_bitwise(runs):
    """EMA under FSDP2 averages each process's shards, writes them as its own file (listed in the manifest) and a
    resume at the same world size continues it bit for bit; under DDP the writer writes the one average."""
    from safetensors.torch import load_file

    from trainwell.checkpoint import manifest
    from trainwell.checkpoint.resume import manifest_problem

    test_resume_at_the_same_world_size_is_exact(runs)  # the runs it compares keep an EMA
    folder = runs.workdir("fsdp2") / "checkpoint-3"
    assert {"ema_0.safetensors", "ema_1.safetensors"} <= set(manifest.read(folder)) and manifest_problem(folder) is None
    for rank in (0, 1):
        ema = load_file(runs.workdir("fsdp2") / f"ema-final-{rank}.safetensors")
        again = load_file(runs.workdir("fsdp2-resumed") / f"ema-final-{rank}.safetensors")
        assert ema.keys() == again.keys() and all(torch.equal(ema[k], again[k]) for k in ema), rank
        assert ema["inp.weight"].shape == (8, 8)  # a shard: half of the (16, 8) weight
    ddp = _ddp(runs)["params"]
    checkpoint = runs.workdir("ddp2") / "checkpoint-6"
    assert not (checkpoint / "ema_1.safetensors").exists()
    saved = load_file(checkpoint / "ema.safetensors")
    for rank in (0, 1):  # every process holds the same average of the full weights
        ema = load_file(runs.workdir("ddp2") / f"ema-final-{rank}.safetensors")
        assert all(torch.equal(ema[k], saved[k]) for k in saved) and saved["inp.weight"].shape == (16, 8)
    assert ddp.keys() == saved.keys()


def test_a_two_rank_checkpoint_resumes_in_one_plain_process(runs):
    full = _two_ranks(runs)
    # the global batch is kept (2 x 4 -> 1 x 8), so the data continues where it stopped
    resumed = runs("reshard-2-1", 0, "--batch", "8", "--resume", str(runs.workdir("fsdp2") / "checkpoint-3"))
    assert resumed["world"] == 1 and resumed["engine"] == "data_parallel"
    assert resumed["losses"][:3] == full["losses"][:3]  # from the checkpoint's log history
    assert _max_diff(full, resumed) < TOL and resumed["losses"] == pytest.approx(full["losses"], abs=TOL)


def test_a_one_rank_checkpoint_resumes_on_two_ranks(runs):
    one = runs("fsdp1", 1, *FSDP, "--batch", "8", "--save-steps", "3")
    resumed = runs("reshard-1-2", 2, *FSDP, "--resume", str(runs.workdir("fsdp1") / "checkpoint-3"))
    assert resumed["world"] == 2 and resumed["sharded_params"]
    assert _max_diff(one, resumed) < TOL and resumed["losses"] == pytest.approx(one["losses"], abs=TOL)


def test_save_model_writes_full_weights_that_load_into_a_fresh_model(runs):
    _two_ranks(runs)
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        from fsdp_script import Net
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    from safetensors.torch import load_file

    model = Net()
    model.load_state_dict(load_file(str(runs.workdir("fsdp2") / "final" / "model.safetensors")))
    assert torch.equal(model.out.bias, torch.tensor(_two_ranks(runs)["params"]["out.bias"]))


def test_full_state_dict_checkpoints_best_model_and_compile(runs):
    result = runs("full", 2, *FSDP, "--state-dict-type", "FULL_STATE_DICT", "--save-steps", "2", "--best",
                  "--compile")
    assert result["sharded_params"] and result["compiled"]  # compiled on top of the sharded modules
    assert result["best_step"] in (2, 4, 6)
    folder = runs.workdir("full") / "checkpoint-2"
    assert {"model.safetensors", "optimizer_0"} <= set(os.listdir(folder))  # full weights, sharded optimizer
    assert "pytorch_model_fsdp_0" not in os.listdir(folder)


def test_a_resume_with_another_global_batch_says_so_when_it_cannot_continue_exactly(runs):
    _two_ranks(runs)
    checkpoint = str(runs.workdir("fsdp2") / "checkpoint-3")  # 3 steps of 2 x 4: 24 samples of the epoch used
    resumed = runs("reshard-other-batch", 0, "--batch", "16", "--resume", checkpoint)  # 24 is not a whole step of 16
    assert "was trained with 8 samples per optimizer step; this run takes 16" in resumed["log"]
    # a batch that 24 samples fill whole steps of continues at the 25th sample, exactly: nothing to warn about
    for name, batch in (("reshard-2-1", "8"), ("reshard-2-1-half", "4")):
        assert "was trained with" not in runs(name, 0, "--batch", batch, "--resume", checkpoint)["log"]


def test_a_sharded_checkpoint_without_its_metadata_is_incomplete(runs, tmp_path):
    import shutil

    from trainwell.checkpoint.resume import get_last_checkpoint, incomplete_reason

    _two_ranks(runs)
    run_dir = tmp_path / "run"
    for step in (3, 6):
        shutil.copytree(runs.workdir("fsdp2") / f"checkpoint-{step}", run_dir / f"checkpoint-{step}")
    assert incomplete_reason(run_dir / "checkpoint-6") is None
    (run_dir / "checkpoint-6" / "optimizer_0" / ".metadata").unlink()  # a save killed before the coordinator finished
    assert incomplete_reason(run_dir / "checkpoint-6") == "optimizer_0/.metadata is missing (the manifest lists it)"
    for step in (3, 6):  # such a save writes no manifest (it comes last): the layout checks alone then
        (run_dir / f"checkpoint-{step}" / "checkpoint_manifest.json").unlink()
    assert incomplete_reason(run_dir / "checkpoint-6") == "optimizer.pt or optimizer_0/.metadata or latest is missing"
    (run_dir / "checkpoint-3" / "pytorch_model_fsdp_0" / ".metadata").unlink()
    assert incomplete_reason(run_dir / "checkpoint-3") == "no model weights file"
    assert get_last_checkpoint(run_dir) is None


@pytest.mark.parametrize("rank,when", [(1, "before"), (0, "after")])
def test_a_kill_during_a_sharded_save_leaves_a_resumable_run(runs, rank, when):
    """Rank 1 dies before its optimizer shards are written (rank 0 is inside the DCP collective), or rank 0 dies
    once every shard and the metadata are written but before the folder is published: checkpoint-6 never
    appears, resume picks checkpoint-3 and ends where the uninterrupted run ended, bitwise."""
    from trainwell.checkpoint.resume import get_last_checkpoint

    full = _two_ranks(runs)
    name = f"killed-{rank}-{when}"
    runs(name, 2, *FSDP, "--save-steps", "3", "--die-in-save", f"6:{rank}:{when}", killed=True)
    workdir = runs.workdir(name)
    assert get_last_checkpoint(str(workdir)) == str(workdir / "checkpoint-3")
    assert not (workdir / "checkpoint-6").exists() and (workdir / ".tmp-checkpoint-6").exists()
    resumed = runs(name + "-resumed", 2, *FSDP, "--save-steps", "3", "--resume", "true", workdir=name)
    assert resumed["params"] == full["params"] and resumed["losses"] == full["losses"]


def test_activation_checkpointing_trains_like_the_plain_run(runs):
    """fsdp_config's activation_checkpointing recomputes each wrapped layer in the backward pass: the arithmetic is
    the plain run's, so the weights agree. (SIZE_BASED_WRAP would pick this model's ModuleList, which FSDP2
    cannot wrap: trainwell refuses that early, see test_fsdp_args.py.)"""
    config = '{"activation_checkpointing": true}'
    checkpointed = runs("checkpointed", 2, *FSDP, "--save-steps", "3", "--fsdp-config", config)
    assert checkpointed["sharded_params"] and checkpointed["checkpointed_layers"] > 0
    full = _two_ranks(runs)
    assert full["checkpointed_layers"] == 0
    assert _max_diff(checkpointed, full) < TOL and checkpointed["losses"] == pytest.approx(full["losses"], abs=TOL)


def test_sigterm_saves_a_jit_checkpoint_that_rotation_keeps_and_that_resumes_exactly(runs):
    """Both processes get SIGTERM as step 5 begins (enable_jit_checkpoint): step 5 ends, checkpoint-5 is saved
    through DCP, save_total_limit=1 removes checkpoint-4, and a rerun resumes from it to the plain run's end."""
    stopped = runs("jit", 2, *FSDP, "--save-steps", "2", "--save-total-limit", "1", "--sigterm-at", "5")
    assert stopped["last_step"] == 5
    workdir = runs.workdir("jit")
    assert sorted(p.name for p in workdir.glob("checkpoint-*")) == ["checkpoint-5"]
    assert {"optimizer_0", "pytorch_model_fsdp_0"} <= {p.name for p in (workdir / "checkpoint-5").iterdir()}
    resumed = runs("jit-resumed", 2, *FSDP, "--save-steps", "2", "--resume", "true", workdir="jit")
    full = _two_ranks(runs)
    assert resumed["last_step"] == 6
    assert resumed["params"] == full["params"] and resumed["losses"] == full["losses"]


def test_bf16_under_fsdp2_casts_the_sharded_parameters_once_per_step(runs):
    """bf16 reaches FSDP2 as its MixedPrecisionPolicy (parameters gathered in bf16, as a hand-written FSDP2 loop
    does), not only as autocast over float32 shards, which would cast every weight at every use."""
    result = runs("fsdp1-bf16", 1, *FSDP, "--bf16")
    assert result["sharded_params"]
    assert result["mp_policy"] == {"param_dtype": "torch.bfloat16", "reduce_dtype": "torch.bfloat16",
                                   "output_dtype": "torch.bfloat16"}
    assert all(loss == float(torch.tensor(loss, dtype=torch.bfloat16)) for loss in result["losses"])
