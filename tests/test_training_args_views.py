"""TrainingArguments' views: batch sizes, device and process topology, serialization (to_dict, JSON, a 4.x
dump), the fluent setters."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import os
import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest

import trainwell.training_args as ta
from tests.common.args_testing import EXPECTED_FIELDS, make
from trainwell.args import support
from trainwell.outputs import (
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
)
from trainwell.training_args import TrainingArguments

pytestmark = pytest.mark.usefixtures("clean_launcher_env")

# --- sizes, devices and processes -------------------------------------------------------------------------------------


def test_batch_sizes_device_and_gpu_count():
    args = make(per_device_train_batch_size=4, per_device_eval_batch_size=6, use_cpu=True)
    assert str(args.device) == "cpu" and args.n_gpu == 0
    assert (args.train_batch_size, args.eval_batch_size) == (4, 6)
    args._n_gpu = 2  # what reference-era scripts do to pretend
    assert (args.train_batch_size, args.eval_batch_size) == (8, 12)
    assert make().place_model_on_device is None


def test_device_without_use_cpu_matches_the_machine():
    import torch

    device = make().device
    assert device.type == ("cuda" if torch.cuda.is_available() else device.type)
    assert make().n_gpu == (0 if device.type == "cpu" else 1)


def test_single_process_topology():
    args = make()
    assert (args.world_size, args.process_index, args.local_process_index) == (1, 0, 0)
    assert args.parallel_mode is ParallelMode.NOT_PARALLEL
    assert args.should_log and args.should_save
    assert make(local_rank=2).local_process_index == 2


def test_topology_from_launcher_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = make()
    assert (args.world_size, args.process_index, args.local_process_index) == (4, 2, 0)
    assert args.parallel_mode is ParallelMode.DISTRIBUTED
    assert args.should_log is True  # log_on_each_node: local rank 0 of its node logs
    assert make(log_on_each_node=False).should_log is False
    assert args.should_save is False  # only global rank 0 saves by default
    monkeypatch.setattr(support, "check_supported", lambda args, defaults: None)
    assert make(save_on_each_node=True).should_save is True


def test_topology_prefers_an_initialized_process_group(monkeypatch):
    fake = SimpleNamespace(get_world_size=lambda: 8, get_rank=lambda: 5)
    monkeypatch.setattr(ta, "_initialized_dist", lambda: fake)
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = make()
    assert (args.world_size, args.process_index) == (8, 5)


def test_ddp_timeout_delta():
    assert make(ddp_timeout=90).ddp_timeout_delta.total_seconds() == 90


def test_process_log_level(monkeypatch):
    assert make(log_level="info").get_process_log_level() == logging.INFO
    assert make(log_level="passive").get_process_log_level() == logging.getLogger("trainwell").getEffectiveLevel()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert make(log_level="info", log_level_replica="error").get_process_log_level() == logging.ERROR


def test_main_process_first_without_distributed_just_runs():
    ran = []
    with make().main_process_first(desc="tokenize"):
        ran.append(1)
    assert ran == [1]


@pytest.mark.parametrize("local_rank, expected", [("0", ["body", "barrier"]), ("1", ["barrier", "body"])])
def test_main_process_first_orders_main_before_replicas(monkeypatch, local_rank, expected):
    events = []
    fake = SimpleNamespace(get_world_size=lambda: 2, get_rank=lambda: int(local_rank),
                           barrier=lambda: events.append("barrier"))
    monkeypatch.setattr(ta, "_initialized_dist", lambda: fake)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    with make().main_process_first():
        events.append("body")
    assert events == expected


@pytest.mark.parametrize("warmup, total, expected", [(0, 100, 0), (10, 100, 10), (0.1, 95, 10), (1.0, 100, 1),
                                                     (0.5, 3, 2)])
def test_get_warmup_steps(warmup, total, expected):
    assert make(warmup_steps=warmup).get_warmup_steps(total) == expected
    assert expected == (int(warmup) if warmup >= 1 else math.ceil(total * warmup))


def test_construction_imports_neither_torch_nor_accelerate():
    code = (
        "import sys\n"
        "from trainwell.training_args import TrainingArguments\n"
        "a = TrainingArguments(eval_strategy='steps', bf16=True, report_to='all')\n"
        "a.to_dict(); a.to_json_string(); a.world_size; a.should_save\n"
        "bad = [m for m in ('torch', 'accelerate', 'yaml', 'argparse') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


# --- serialization ---------------------------------------------------------------------------------------------------


def _rich_args() -> TrainingArguments:
    return make(output_dir="out", eval_strategy="steps", eval_steps=10, save_steps=20, load_best_model_at_end=True,
                metric_for_best_model="accuracy", lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 2},
                report_to=["tensorboard"], accelerator_config={"even_batches": False}, warmup_steps=0.1)


def test_to_dict_is_plain_and_masks_tokens():
    data = _rich_args().to_dict()
    assert list(data) == [name for name, _ in EXPECTED_FIELDS]  # trainwell's own fields only when set
    assert data["eval_strategy"] == "steps" and type(data["eval_strategy"]) is str
    assert data["optim"] == "adamw_torch_fused" and data["lr_scheduler_type"] == "cosine"
    assert data["hub_token"] == "<HUB_TOKEN>"
    assert data["accelerator_config"]["even_batches"] is False
    assert json.loads(json.dumps(data)) == data


def test_trainwell_fields_reach_the_dict_only_when_set_and_round_trip(tmp_path):
    args = make(save_async=True)
    assert args.to_dict()["save_async"] is True
    assert TrainingArguments.from_dict(args.to_dict()).save_async is True
    assert "save_async" not in make().to_dict()
    assert "verify_checkpoint_checksums" not in make().to_dict()  # written only when it differs from the default
    assert make(verify_checkpoint_checksums=False).to_dict()["verify_checkpoint_checksums"] is False


def test_to_dict_copies_containers():
    args = _rich_args()
    args.to_dict()["lr_scheduler_kwargs"]["num_cycles"] = 99
    assert args.lr_scheduler_kwargs == {"num_cycles": 2}


def test_to_json_string_is_sorted_and_indented():
    text = _rich_args().to_json_string()
    assert text.startswith('{\n  "accelerator_config"')
    assert list(json.loads(text)) == sorted(json.loads(text))


def test_round_trip_through_dict_and_json(tmp_path):
    args = _rich_args()
    assert TrainingArguments.from_dict(args.to_dict()) == args
    path = tmp_path / "args.json"
    path.write_text(args.to_json_string())
    assert TrainingArguments.from_json_file(path) == args


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'learning_rte'.*Did you mean 'learning_rate'"):
        TrainingArguments.from_dict({"learning_rte": 1.0})


def test_a_transformers_4_dump_loads():
    dump = {
        "output_dir": "out", "overwrite_output_dir": False, "evaluation_strategy": None, "eval_strategy": "epoch",
        "warmup_ratio": 0.0, "warmup_steps": 0, "logging_dir": "out/runs", "save_safetensors": True,
        "no_cuda": False, "use_mps_device": False, "jit_mode_eval": False, "use_ipex": False, "past_index": -1,
        "fp16_opt_level": "O1", "half_precision_backend": "auto", "fp16_backend": "auto", "tpu_num_cores": None,
        "tpu_metrics_debug": False, "ray_scope": "last", "mp_parameters": "", "torchdynamo": None,
        "fsdp": [], "fsdp_min_num_params": 0, "fsdp_transformer_layer_cls_to_wrap": None,
        "fsdp_config": {"min_num_params": 0, "xla": False, "xla_fsdp_v2": False, "xla_fsdp_grad_ckpt": False},
        "hub_token": "<HUB_TOKEN>", "hub_private_repo": False, "push_to_hub_token": "<PUSH_TO_HUB_TOKEN>",
        "push_to_hub_model_id": None, "push_to_hub_organization": None, "adafactor": False, "group_by_length": False,
        "include_inputs_for_metrics": False, "include_tokens_per_second": False, "split_batches": None,
        "dispatch_batches": None, "per_gpu_train_batch_size": None, "per_gpu_eval_batch_size": None, "debug": [],
        "include_num_input_tokens_seen": False, "use_legacy_prediction_loop": False,
    }
    with pytest.warns(FutureWarning):
        args = TrainingArguments.from_dict(dump)
    assert args.eval_strategy is IntervalStrategy.EPOCH and args.logging_dir == "out/runs"
    assert args.hub_token is None and args.fsdp_config is None


def test_sanitized_dict_has_only_scalars():
    data = _rich_args().to_sanitized_dict()
    assert data["train_batch_size"] == 8 and data["eval_batch_size"] == 8
    assert all(type(v) in (bool, int, float, str) for v in data.values())
    assert data["report_to"] == "['tensorboard']"


def test_str_and_repr_list_fields_with_masked_token(no_support_check):
    text = str(make(hub_token="hf_secret", learning_rate=0.25))
    assert text.startswith("TrainingArguments(\n") and "learning_rate=0.25,\n" in text
    assert "hf_secret" not in text and "hub_token=<HUB_TOKEN>" in text
    assert repr(make()) == str(make())


def test_replace_copy_and_pickle():
    args = _rich_args()
    assert dataclasses.replace(args, learning_rate=1e-3).learning_rate == 1e-3
    with pytest.raises(ValueError, match="save_steps=25 is not a multiple"):
        dataclasses.replace(args, save_steps=25)
    assert copy.deepcopy(args) == args
    assert pickle.loads(pickle.dumps(args)) == args


# --- fluent setters ---------------------------------------------------------------------------------------------------


def test_setters_set_fields_and_chain():
    args = make()
    same = (
        args.set_training(learning_rate=1e-4, batch_size=4, num_epochs=2, gradient_accumulation_steps=2, seed=7)
        .set_evaluate(strategy="steps", steps=50, batch_size=16)
        .set_testing(batch_size=32, loss_only=True)
        .set_save(strategy="epoch", total_limit=2)
        .set_logging(strategy="steps", steps=10, report_to="tensorboard", level="info")
        .set_optimizer(name="sgd", learning_rate=0.1, beta1=0.8)
        .set_lr_scheduler(name="cosine", warmup_steps=0.05)
        .set_dataloader(train_batch_size=2, num_workers=1, sampler_seed=3)
    )
    assert same is args
    assert args.do_train and args.do_eval and args.do_predict
    assert (args.learning_rate, args.per_device_train_batch_size, args.seed) == (0.1, 2, 7)
    assert args.eval_strategy is IntervalStrategy.STEPS and args.eval_steps == 50
    assert args.per_device_eval_batch_size == 8 and args.prediction_loss_only is True
    assert args.save_strategy is SaveStrategy.EPOCH and args.save_total_limit == 2
    assert args.report_to == ["tensorboard"] and args.log_level == "info" and args.logging_steps == 10
    assert args.optim is OptimizerNames.SGD and args.adam_beta1 == 0.8
    assert args.lr_scheduler_type is SchedulerType.COSINE and args.warmup_steps == 0.05
    assert args.dataloader_num_workers == 1 and args.data_seed == 3


def test_setter_errors():
    args = make()
    with pytest.raises(ValueError, match="eval_strategy='stepz'.*Did you mean 'steps'"):
        args.set_evaluate(strategy="stepz")
    with pytest.raises(ValueError, match="steps=0 with save_strategy='steps'"):
        args.set_save(strategy="steps", steps=0)
    with pytest.raises(ValueError, match="log_level='verbose'"):
        args.set_logging(level="verbose")
    with pytest.raises(ValueError, match="hub_strategy='every-checkpoint'"):
        args.set_push_to_hub("me/model", strategy="every-checkpoint")
    with pytest.warns(FutureWarning, match="gradient_checkpointing is deprecated"):
        args.set_training(gradient_checkpointing=True)
    assert args.activation_checkpointing is True


def test_set_push_to_hub():
    args = make().set_push_to_hub("me/model", strategy="checkpoint", token="hf_x", private_repo=True)
    assert args.push_to_hub and args.hub_model_id == "me/model" and args.hub_strategy is HubStrategy.CHECKPOINT
    assert args.hub_token == "hf_x" and args.hub_private_repo is True and args.to_dict()["hub_token"] == "<HUB_TOKEN>"


def test_set_evaluate_keeps_a_numeric_delay():
    assert make().set_evaluate(strategy="epoch").eval_delay == 0


def test_distributed_state_is_created_on_first_access_only():
    from accelerate.state import PartialState

    PartialState._reset_state()
    args = make(use_cpu=True)
    assert not PartialState._shared_state  # constructing the arguments set nothing up
    assert args.distributed_state.distributed_type.value == "NO"  # what TRL reads
    assert PartialState._shared_state
