"""``parallelism_config``: data, sharded-data and tensor parallelism through Accelerate's device mesh, on CPUs.

The processes run tests/distributed/parallelism_script.py under torchrun with its test-only patch that lets
Accelerate accept a mesh over CPU processes (the script's docstring says why and how). Compared with the same
training without a mesh: DDP for ``dp_replicate_size`` (bitwise), DDP for ``dp_shard_size`` with FSDP2 (a
reduction-order difference), one process for ``tp_size`` (the same batches: equal losses, weights within Adam's
amplification of 1e-7 noise).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.common.launch import ScriptRuns

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "parallelism_script.py")
pytestmark = pytest.mark.distributed
MESH = "--mesh-on-cpu"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch

    if torch.cuda.is_available():
        pytest.skip("these runs use the CPU-only mesh patch")
    return ScriptRuns(SCRIPT, tmp_path_factory.mktemp("mesh"))


@pytest.fixture(scope="module")
def llama(runs):
    """A tiny Llama saved where every process loads it (tensor-parallel loading reads from a folder)."""
    transformers = pytest.importorskip("transformers")
    import torch

    folder = runs.root / "llama"
    if not folder.is_dir():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                                          max_position_embeddings=64)
        transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return ["--model", "llama", "--model-dir", str(folder)]


def _max_diff(a: dict, b: dict) -> float:
    assert a["params"].keys() == b["params"].keys()
    return max(float(np.abs(np.asarray(a["params"][k]) - np.asarray(b["params"][k])).max()) for k in a["params"])


def _ddp(runs):
    return runs("ddp", 2, "--evaluate")


def test_dp_replicate_is_ddp_bit_for_bit(runs):
    mesh = runs("replicate", 2, "--mesh", '{"dp_replicate_size": 2}', MESH, "--evaluate")
    ddp = _ddp(runs)
    assert _max_diff(mesh, ddp) == 0.0
    assert mesh["losses"] == ddp["losses"] and mesh["metrics"]["eval_loss"] == ddp["metrics"]["eval_loss"]
    assert (mesh["data_parallel"], mesh["total_batch"], mesh["sizes"]) == (2, 8, [1, 1, 1])
    assert mesh["predictions"] == [37, 3]  # every evaluation sample once


def test_dp_shard_runs_fsdp2_over_the_mesh_like_ddp(runs):
    mesh = runs("shard", 2, "--mesh", '{"dp_shard_size": 2}', MESH, "--fsdp", "Block", "--save-steps", "3",
                "--evaluate")
    ddp = _ddp(runs)
    assert mesh["is_fsdp_enabled"] and mesh["dtensor_params"] > 0
    assert _max_diff(mesh, ddp) < 1e-6
    np.testing.assert_allclose(mesh["losses"], ddp["losses"], rtol=1e-6)
    assert abs(mesh["metrics"]["eval_loss"] - ddp["metrics"]["eval_loss"]) < 1e-6
    assert {"optimizer_0", "model.safetensors"} <= set(mesh["checkpoint"])


def _tensor_parallel(runs, llama):
    return runs("tp", 2, *llama, "--load-tp", "2", "--mesh", '{"tp_size": 2}', MESH, "--save-steps", "3",
                "--evaluate")


def test_tensor_parallel_trains_and_evaluates_like_one_process(runs, llama):
    tp = _tensor_parallel(runs, llama)
    one = runs("one", 0, *llama, "--evaluate")
    assert tp["sizes"] == [2, 1, 1] and tp["data_parallel"] == 1 and tp["dtensor_params"] > 0
    # both processes of the group read the same batches: one step is one process's batch, counted once
    assert tp["total_batch"] == one["total_batch"] == 4 and tp["tokens"] == one["tokens"]
    np.testing.assert_allclose(tp["losses"], one["losses"], rtol=1e-5)
    assert abs(tp["metrics"]["eval_loss"] - one["metrics"]["eval_loss"]) < 1e-5
    assert tp["predictions"] == one["predictions"] == [13, 16, 128]  # not once per process of the group
    assert _max_diff(tp, one) < 1e-4
    assert not tp["is_fsdp_enabled"]


def test_tensor_parallel_checkpoints_resume_bitwise_and_load_anywhere(runs, llama):
    tp = _tensor_parallel(runs, llama)
    assert {"model.safetensors", "optimizer_0", "scheduler.pt", "rng_state_0.pth"} <= set(tp["checkpoint"])
    # no parallelism_config this time: the mesh comes from the model loaded tensor-parallel, as in the reference
    resumed = runs("tp_resume", 2, *llama, "--load-tp", "2", MESH, "--save-steps", "3",
                   "--resume", str(runs.root / "tp" / "checkpoint-3"))
    assert resumed["sizes"] == [2, 1, 1]
    assert resumed["losses"][-3:] == tp["losses"][-3:] and _max_diff(resumed, tp) == 0.0
    # the full weights load in one process: config.json carries no tensor-parallel settings
    from transformers import LlamaForCausalLM

    final = runs.root / "tp" / "final"
    assert json.loads((final / "config.json").read_text()).get("distributed_config") is None
    model = LlamaForCausalLM.from_pretrained(final)
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (32, 32)


def test_a_mesh_over_cpu_processes_without_the_patch_says_what_accelerate_refused(runs):
    failed = runs("refused", 2, "--mesh", '{"dp_replicate_size": 2}', fails=True)
    assert "A device mesh over several CPU processes (parallelism_config={'dp_replicate_size': 2" in failed["log"]
    assert "Train on GPUs, or without the mesh" in failed["log"]


def test_a_model_loaded_with_another_tp_size_is_refused(tmp_path):
    from torch import nn

    from trainwell import TrainingArguments
    from trainwell.backend.engines import _parallelism

    class Sharded(nn.Linear):
        tp_size = 2

    args = TrainingArguments(str(tmp_path), parallelism_config={"tp_size": 4}, report_to="none")
    with pytest.raises(ValueError, match=r"parallelism_config.tp_size=4 but the model was loaded tensor-parallel "
                                         r"over 2 processes"):
        _parallelism(args, Sharded(2, 2))
    config = _parallelism(TrainingArguments(str(tmp_path), report_to="none"), Sharded(2, 2))["parallelism_config"]
    assert (config.tp_size, config.dp_shard_size) == (2, 1)
    assert _parallelism(TrainingArguments(str(tmp_path), report_to="none"), nn.Linear(2, 2)) == {}
