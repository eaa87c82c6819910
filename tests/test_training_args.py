"""Tests for ``trainwell.training_args``: the 114 fields, normalization, validation, 4.x aliases, views.

Expected names and defaults are written out here (transformers 5.23), never read from transformers.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import logging
import math
import os
import pickle
import subprocess
import sys
import typing
import warnings
from types import SimpleNamespace

import pytest

import trainwell.training_args as ta
from trainwell.args import aliases, normalize, support
from trainwell.outputs import (
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
)
from trainwell.training_args import AcceleratorConfig, TrainingArguments

EXPECTED_FIELDS: list[tuple[str, object]] = [
    ('output_dir', None),
    ('per_device_train_batch_size', 8),
    ('num_train_epochs', 3.0),
    ('max_steps', -1),
    ('learning_rate', 5e-05),
    ('lr_scheduler_type', 'linear'),
    ('lr_scheduler_kwargs', None),
    ('warmup_steps', 0),
    ('optim', 'adamw_torch_fused'),
    ('optim_args', None),
    ('weight_decay', 0.0),
    ('adam_beta1', 0.9),
    ('adam_beta2', 0.999),
    ('adam_epsilon', 1e-08),
    ('optim_target_modules', None),
    ('gradient_accumulation_steps', 1),
    ('average_tokens_across_devices', True),
    ('max_grad_norm', 1.0),
    ('label_smoothing_factor', 0.0),
    ('bf16', False),
    ('fp16', False),
    ('bf16_full_eval', False),
    ('fp16_full_eval', False),
    ('tf32', None),
    ('activation_checkpointing', None),
    ('activation_checkpointing_kwargs', None),
    ('gradient_checkpointing', None),
    ('gradient_checkpointing_kwargs', None),
    ('torch_compile', False),
    ('torch_compile_backend', None),
    ('torch_compile_mode', None),
    ('use_liger_kernel', False),
    ('liger_kernel_config', None),
    ('use_cache', False),
    ('neftune_noise_alpha', None),
    ('torch_empty_cache_steps', None),
    ('auto_find_batch_size', False),
    ('logging_strategy', 'steps'),
    ('logging_steps', 500),
    ('logging_first_step', False),
    ('log_on_each_node', True),
    ('logging_nan_inf_filter', True),
    ('include_num_input_tokens_seen', 'no'),
    ('log_level', 'passive'),
    ('log_level_replica', 'warning'),
    ('disable_tqdm', None),
    ('report_to', 'none'),
    ('run_name', None),
    ('project', 'huggingface'),
    ('trackio_space_id', None),
    ('trackio_bucket_id', None),
    ('trackio_static_space_id', None),
    ('eval_strategy', 'no'),
    ('eval_steps', None),
    ('eval_delay', 0),
    ('per_device_eval_batch_size', 8),
    ('prediction_loss_only', False),
    ('eval_on_start', False),
    ('eval_do_concat_batches', True),
    ('eval_use_gather_object', False),
    ('eval_accumulation_steps', None),
    ('include_for_metrics', []),
    ('batch_eval_metrics', False),
    ('save_only_model', False),
    ('save_strategy', 'steps'),
    ('save_steps', 500),
    ('save_on_each_node', False),
    ('save_total_limit', None),
    ('enable_jit_checkpoint', False),
    ('push_to_hub', False),
    ('hub_token', None),
    ('hub_private_repo', None),
    ('hub_model_id', None),
    ('hub_strategy', 'every_save'),
    ('hub_always_push', False),
    ('hub_revision', None),
    ('load_best_model_at_end', False),
    ('metric_for_best_model', None),
    ('greater_is_better', None),
    ('ignore_data_skip', False),
    ('restore_callback_states_from_checkpoint', False),
    ('full_determinism', False),
    ('seed', 42),
    ('data_seed', None),
    ('use_cpu', False),
    ('accelerator_config', None),
    ('parallelism_config', None),
    ('dataloader_drop_last', False),
    ('dataloader_num_workers', 0),
    ('dataloader_pin_memory', True),
    ('dataloader_persistent_workers', False),
    ('dataloader_prefetch_factor', None),
    ('dataloader_multiprocessing_context', None),
    ('dataloader_in_order', True),
    ('remove_unused_columns', True),
    ('label_names', None),
    ('train_sampling_strategy', 'random'),
    ('length_column_name', 'length'),
    ('ddp_find_unused_parameters', None),
    ('ddp_bucket_cap_mb', None),
    ('ddp_broadcast_buffers', None),
    ('ddp_static_graph', None),
    ('ddp_backend', None),
    ('ddp_timeout', 1800),
    ('fsdp', None),
    ('fsdp_config', None),
    ('deepspeed', None),
    ('debug', ''),
    ('skip_memory_metrics', True),
    ('do_train', False),
    ('do_eval', False),
    ('do_predict', False),
    ('resume_from_checkpoint', None),
    ('local_rank', -1),
]

_ENV_VARS = ("ACCELERATE_MIXED_PRECISION", "WORLD_SIZE", "RANK", "LOCAL_RANK")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_support_check(monkeypatch):
    """For mapping tests whose target field trainwell does not act on yet (so construction would refuse it)."""
    monkeypatch.setattr(support, "check_supported", lambda args, defaults: None)


def make(**kwargs) -> TrainingArguments:
    return TrainingArguments(**kwargs)


# --- the field list ---------------------------------------------------------------------------------------


# after the reference's, trainwell's own
TRAINWELL_FIELDS: list[tuple[str, object]] = [("save_async", False), ("verify_checkpoint_checksums", True),
                                               ("log_throughput", False), ("skip_nonfinite_steps", None),
                                               ("rollback_on_spike", None), ("step_timeout", None)]


def test_field_names_and_defaults_match_transformers_5_23():
    fields = dataclasses.fields(TrainingArguments)
    assert len(fields) == 114 + len(TRAINWELL_FIELDS)
    assert [f.name for f in fields] == [name for name, _ in EXPECTED_FIELDS + TRAINWELL_FIELDS]
    for f, (name, expected) in zip(fields, EXPECTED_FIELDS + TRAINWELL_FIELDS):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert default == expected and type(default) is type(expected), name
        assert f.init, name


def test_every_field_has_help_text():
    for f in dataclasses.fields(TrainingArguments):
        assert len(f.metadata.get("help", "")) > 5, f.name


def test_field_types_follow_the_reference():
    hints = typing.get_type_hints(TrainingArguments)
    assert hints["eval_strategy"] == IntervalStrategy | str
    assert hints["save_strategy"] == SaveStrategy | str
    assert hints["hub_strategy"] == HubStrategy | str
    assert hints["lr_scheduler_type"] == SchedulerType | str
    assert hints["optim"] == OptimizerNames | str
    assert hints["per_device_train_batch_size"] is int
    assert hints["warmup_steps"] is float
    assert hints["tf32"] == bool | None
    assert hints["report_to"] == None | str | list[str]  # noqa: E711
    assert hints["lr_scheduler_kwargs"] == dict | str | None


def test_default_optim_and_output_dir(monkeypatch):
    args = make()
    assert args.optim is OptimizerNames.ADAMW_TORCH_FUSED
    assert TrainingArguments.default_optim == "adamw_torch_fused"
    assert args.output_dir == "trainer_output"
    monkeypatch.setenv("HOME", "/home/someone")
    assert make(output_dir="~/runs/a").output_dir == "/home/someone/runs/a"


def test_signature_lists_fields_and_no_aliases():
    params = inspect.signature(TrainingArguments).parameters
    assert list(params)[:3] == ["output_dir", "per_device_train_batch_size", "num_train_epochs"]
    assert "evaluation_strategy" not in params and len(params) == 114 + len(TRAINWELL_FIELDS)


def test_positional_output_dir():
    assert TrainingArguments("out").output_dir == "out"


# --- JSON-string dict fields --------------------------------------------------------------------------------


def test_json_string_fields_are_parsed_and_coerced():
    args = make(lr_scheduler_kwargs='{"num_cycles": "2", "power": "0.5", "flag": "true", "name": "x", "n": {"k": "3"}}')
    assert args.lr_scheduler_kwargs == {"num_cycles": 2, "power": 0.5, "flag": True, "name": "x", "n": {"k": 3}}
    args = make(activation_checkpointing_kwargs='{"use_reentrant": "false"}')
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}
    args = make(accelerator_config='{"split_batches": "true"}')
    assert isinstance(args.accelerator_config, AcceleratorConfig) and args.accelerator_config.split_batches is True


def test_json_string_for_path_fields(no_support_check):
    args = make(deepspeed='{"stage": 2}')
    assert args.deepspeed == {"stage": 2}
    assert make(deepspeed="config.json").deepspeed == "config.json"  # any other string is a path


@pytest.mark.parametrize("name", normalize.DICT_FIELDS)
def test_bad_json_names_the_field(name, no_support_check):
    with pytest.raises(ValueError, match=rf"^{name}=.*not valid JSON"):
        make(**{name: '{"a": 1,'})


@pytest.mark.parametrize("name", ["lr_scheduler_kwargs", "activation_checkpointing_kwargs"])
def test_dict_only_fields_reject_plain_strings(name):
    with pytest.raises(ValueError, match=rf"^{name}='num_cycles=2': pass a dict"):
        make(**{name: "num_cycles=2"})
    with pytest.raises(ValueError, match=rf"^{name}=\[1\]: pass a dict"):
        make(**{name: [1]})


def test_lr_scheduler_kwargs_default_becomes_empty_dict():
    assert make().lr_scheduler_kwargs == {}


# --- accelerator_config ------------------------------------------------------------------------------------------


def test_accelerator_config_forms(tmp_path):
    assert make().accelerator_config == AcceleratorConfig()
    assert make(accelerator_config={"even_batches": False}).accelerator_config.even_batches is False
    given = AcceleratorConfig(non_blocking=True)
    assert make(accelerator_config=given).accelerator_config is given
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"dispatch_batches": True}))
    assert make(accelerator_config=str(path)).accelerator_config.dispatch_batches is True
    foreign = SimpleNamespace(to_dict=lambda: {"use_seedable_sampler": False})
    assert make(accelerator_config=foreign).accelerator_config.use_seedable_sampler is False


def test_accelerator_config_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'split_batch'.*Did you mean 'split_batches'"):
        make(accelerator_config={"split_batch": True})
    with pytest.raises(TypeError, match=r"accelerator_config=AcceleratorConfig: pass an instance"):
        make(accelerator_config=AcceleratorConfig)
    with pytest.raises(FileNotFoundError, match="accelerator_config='missing.json': no such file"):
        make(accelerator_config="missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        make(accelerator_config=str(bad))


def test_accelerator_config_fields_and_to_dict():
    config = AcceleratorConfig(gradient_accumulation_kwargs={"sync_each_batch": True})
    assert config.to_dict() == {
        "split_batches": False,
        "dispatch_batches": None,
        "even_batches": True,
        "use_seedable_sampler": True,
        "non_blocking": False,
        "gradient_accumulation_kwargs": {"sync_each_batch": True},
        "use_configured_state": False,
    }
    assert config.to_dict()["gradient_accumulation_kwargs"] is not config.gradient_accumulation_kwargs


# --- activation checkpointing aliases, tqdm, token counting ------------------------------------------------------


def test_gradient_checkpointing_maps_to_activation_checkpointing():
    with pytest.warns(FutureWarning) as record:
        args = make(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    assert [str(w.message) for w in record] == [
        "gradient_checkpointing is deprecated, use activation_checkpointing instead.",
        "gradient_checkpointing_kwargs is deprecated, use activation_checkpointing_kwargs instead.",
    ]
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}


def test_activation_checkpointing_defaults_to_false_and_old_name_mirrors():
    args = make()
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False
    args = make(activation_checkpointing=True)
    assert args.gradient_checkpointing is True
    copy_ = dataclasses.replace(args, activation_checkpointing=False)
    assert copy_.activation_checkpointing is False and copy_.gradient_checkpointing is False


def test_disable_tqdm_follows_the_log_level():
    assert make().disable_tqdm is False
    assert make(disable_tqdm=True).disable_tqdm is True
    package_logger = logging.getLogger("trainwell")
    previous = package_logger.level
    package_logger.setLevel(logging.ERROR)
    try:
        assert make().disable_tqdm is True
    finally:
        package_logger.setLevel(previous)


@pytest.mark.parametrize(
    "given, expected", [(True, "all"), (False, "no"), ("non_padding", "non_padding"), ("all", "all"), ("true", "all")]
)
def test_include_num_input_tokens_seen(given, expected):
    assert make(include_num_input_tokens_seen=given).include_num_input_tokens_seen == expected


def test_include_num_input_tokens_seen_rejects_unknown():
    with pytest.raises(ValueError, match=r"include_num_input_tokens_seen='non-padding'.*Did you mean 'non_padding'"):
        make(include_num_input_tokens_seen="non-padding")


# --- enums --------------------------------------------------------------------------------------------------------


def test_enum_fields_are_coerced():
    args = make(eval_strategy="epoch", save_strategy="best", logging_strategy="no", hub_strategy="end",
                lr_scheduler_type="cosine", optim="sgd")
    assert args.eval_strategy is IntervalStrategy.EPOCH
    assert args.save_strategy is SaveStrategy.BEST
    assert args.logging_strategy is IntervalStrategy.NO
    assert args.hub_strategy is HubStrategy.END
    assert args.lr_scheduler_type is SchedulerType.COSINE
    assert args.optim is OptimizerNames.SGD
    assert make(eval_strategy=IntervalStrategy.STEPS).eval_strategy is IntervalStrategy.STEPS


@pytest.mark.parametrize(
    "name, bad, guess",
    [
        ("eval_strategy", "epochs", "epoch"),
        ("logging_strategy", "step", "steps"),
        ("save_strategy", "bset", "best"),
        ("hub_strategy", "every-save", "every_save"),
        ("lr_scheduler_type", "cosin", "cosine"),
        ("optim", "adamw_torch_fuse", "adamw_torch_fused"),
    ],
)
def test_invalid_enum_value_names_field_lists_values_and_guesses(name, bad, guess):
    with pytest.raises(ValueError) as err:
        make(**{name: bad})
    message = str(err.value)
    assert message.startswith(f"{name}={bad!r}")
    assert "choose one of" in message and f"Did you mean {guess!r}?" in message


def test_debug_string_becomes_list(no_support_check):
    assert make().debug == []
    assert make(debug="underflow_overflow tpu_metrics_debug").debug == ["underflow_overflow", "tpu_metrics_debug"]
    with pytest.raises(ValueError, match=r"debug='underflow'.*Did you mean 'underflow_overflow'"):
        make(debug="underflow")


def test_numeric_strings_become_numbers():
    args = make(learning_rate="5e-5", per_device_train_batch_size="4", save_steps="100", data_seed="7")
    assert (args.learning_rate, args.per_device_train_batch_size, args.save_steps, args.data_seed) == (5e-5, 4, 100, 7)
    assert type(args.per_device_train_batch_size) is int and type(args.learning_rate) is float
    with pytest.raises(ValueError, match=r"^learning_rate='fast': pass a number \(float\)"):
        make(learning_rate="fast")
    with pytest.raises(ValueError, match=r"^seed='1.5': pass a whole number"):
        make(seed="1.5")
    with pytest.raises(ValueError, match=r"^learning_rate=None: pass a number"):
        make(learning_rate=None)
    with pytest.raises(ValueError, match=r"^max_steps=True: pass a number"):
        make(max_steps=True)
    assert make(max_steps=10.0).max_steps == 10 and type(make(max_steps=10.0).max_steps) is int
    assert make(data_seed=None).data_seed is None and make(logging_steps=500).logging_steps == 500


# --- derived defaults -------------------------------------------------------------------------------------------


def test_do_eval_and_eval_steps_follow_the_strategy():
    args = make(eval_strategy="steps", logging_steps=50)
    assert args.do_eval is True and args.eval_steps == 50
    assert make(eval_strategy="steps", eval_steps=7).eval_steps == 7
    assert make(eval_strategy="steps", eval_steps=0).eval_steps == 500  # 0 means unset, as in the reference
    args = make()
    assert args.do_eval is False and args.eval_steps is None


def test_metric_for_best_model_and_greater_is_better():
    args = make(load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch")
    assert args.metric_for_best_model == "loss" and args.greater_is_better is False
    assert make(metric_for_best_model="accuracy").greater_is_better is True
    assert make(metric_for_best_model="eval_loss").greater_is_better is False
    assert make(metric_for_best_model="accuracy", greater_is_better=False).greater_is_better is False
    assert make().metric_for_best_model is None and make().greater_is_better is None
    for scheduler in ("reduce_lr_on_plateau", "greedy"):
        assert make(lr_scheduler_type=scheduler, eval_strategy="epoch").metric_for_best_model == "loss"


def test_use_cpu_disables_pin_memory():
    assert make().dataloader_pin_memory is True
    assert make(use_cpu=True).dataloader_pin_memory is False


def test_mixed_precision_from_flags_and_env(monkeypatch):
    assert make().mixed_precision == "no"
    assert make(fp16=True).mixed_precision == "fp16"
    assert make(bf16=True).mixed_precision == "bf16"  # accepted without a GPU: CPU autocast runs bf16
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert make().mixed_precision == "bf16"
    with pytest.warns(UserWarning, match="ACCELERATE_MIXED_PRECISION='bf16' overrides fp16=True"):
        assert make(fp16=True).mixed_precision == "bf16"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp17")
    with pytest.raises(ValueError, match="ACCELERATE_MIXED_PRECISION='fp17'"):
        make()


def test_naming_a_compile_backend_turns_compile_on(no_support_check):
    args = make(torch_compile_mode="reduce-overhead")
    assert args.torch_compile is True and args.torch_compile_backend == "inductor"


# --- report_to ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, expected",
    [
        (None, []),
        ("none", []),
        (["none"], []),
        ([], []),
        ("tensorboard", ["tensorboard"]),
        (["wandb", "mlflow", "wandb"], ["wandb", "mlflow"]),
        (("trackio",), ["trackio"]),
    ],
)
def test_report_to_becomes_a_list(given, expected):
    assert make(report_to=given).report_to == expected


def test_report_to_all_lists_installed_trackers_without_importing(monkeypatch):
    installed = {"wandb", "tensorboardX"}
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name in installed else None)
    assert make(report_to="all").report_to == ["tensorboard", "wandb"]
    assert make(report_to=["all"]).report_to == ["tensorboard", "wandb"]


def test_report_to_all_next_to_names_adds_them(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name == "mlflow" else None)
    assert make(report_to=["all", "jsonl"]).report_to == ["mlflow", "jsonl"]
    assert make(report_to=["mlflow", "all"]).report_to == ["mlflow"]


def test_report_to_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as err:
        make(report_to=["tensorboard", "wandbb"])
    message = str(err.value)
    assert "'wandbb' is not a tracker" in message and "Did you mean 'wandb'?" in message
    assert all(repr(name) in message for name in normalize.KNOWN_REPORT_TO)


def test_known_report_to_is_the_one_list():
    assert normalize.KNOWN_REPORT_TO == (  # the reference's names, in its report_to="all" order, then trainwell's
        "azure_ml", "comet_ml", "dagshub", "dvclive", "mlflow", "neptune", "tensorboard", "wandb", "codecarbon",
        "clearml", "swanlab", "trackio", "kubeflow", "flyte", "jsonl", "csv",
    )
    assert tuple(normalize._REPORT_TO_PACKAGES) == normalize.KNOWN_REPORT_TO


# --- validation -----------------------------------------------------------------------------------------------------

_STEPS_EVAL = {"eval_strategy": "steps", "save_strategy": "steps", "load_best_model_at_end": True}


@pytest.mark.parametrize(
    "kwargs, parts",
    [
        ({"torch_empty_cache_steps": 0}, ["torch_empty_cache_steps=0", "positive integer"]),
        ({"torch_empty_cache_steps": 1.5}, ["torch_empty_cache_steps=1.5"]),
        ({"logging_steps": 0}, ["logging_steps=0", "logging_strategy='no'"]),
        ({"logging_steps": 2.5}, ["logging_steps=2.5", "logging_steps=2"]),
        ({"eval_strategy": "steps", "eval_steps": 10.5}, ["eval_steps=10.5", "must be whole"]),
        ({"eval_strategy": "steps", "eval_steps": -5}, ["eval_steps=-5", "eval_strategy='no'"]),
        ({"eval_strategy": "steps", "logging_steps": 0, "logging_strategy": "no"}, ["eval_steps=None"]),
        ({"save_steps": 12.5}, ["save_steps=12.5"]),
        ({"save_steps": 0}, ["save_steps=0: pass a positive integer", "or save_strategy='no'"]),
        ({"load_best_model_at_end": True, "eval_strategy": "epoch"},
         ["load_best_model_at_end=True", "eval_strategy='epoch'", "save_strategy='steps'", "save_strategy='best'"]),
        ({**_STEPS_EVAL, "save_steps": 250, "eval_steps": 100},
         ["save_steps=250 is not a multiple of eval_steps=100", "save_steps=200 or 300"]),
        ({**_STEPS_EVAL, "save_steps": 50, "eval_steps": 100}, ["save_steps=50", "save_steps=100"]),
        ({**_STEPS_EVAL, "save_steps": 0.5, "eval_steps": 10}, ["save_steps=0.5 with eval_steps=10", "ratio"]),
        ({**_STEPS_EVAL, "save_steps": 0.25, "eval_steps": 0.1}, ["save_steps=0.25 is not a multiple"]),
        ({"fp16": True, "bf16": True}, ["fp16=True and bf16=True"]),
        ({"fp16_full_eval": True, "bf16_full_eval": True}, ["fp16_full_eval=True and bf16_full_eval=True"]),
        ({"lr_scheduler_type": "reduce_lr_on_plateau"}, ["lr_scheduler_type='reduce_lr_on_plateau'", "eval_strategy"]),
        ({"lr_scheduler_type": "greedy"}, ["lr_scheduler_type='greedy'", "eval_strategy='no'"]),
        ({"warmup_steps": -1}, ["warmup_steps=-1", "ratio"]),
        ({"warmup_steps": 2.5}, ["warmup_steps=2.5", "warmup_steps=2"]),
        ({"dataloader_prefetch_factor": 2}, ["dataloader_prefetch_factor=2", "dataloader_num_workers > 0"]),
        ({"per_device_train_batch_size": 0}, ["per_device_train_batch_size=0", "positive integer"]),
        ({"per_device_eval_batch_size": -1}, ["per_device_eval_batch_size=-1"]),
        ({"gradient_accumulation_steps": 0}, ["gradient_accumulation_steps=0", ">= 1"]),
        ({"learning_rate": -1e-3}, ["learning_rate=-0.001"]),
        ({"num_train_epochs": -1}, ["num_train_epochs=-1", "max_steps"]),
        ({"dataloader_num_workers": -2}, ["dataloader_num_workers=-2"]),
        ({"log_level": "loud"}, ["log_level='loud'", "'warning'"]),
        ({"train_sampling_strategy": "sequental"},
         ["train_sampling_strategy='sequental'", "Did you mean 'sequential'"]),
        ({"ddp_backend": "ncl"}, ["ddp_backend='ncl'", "Did you mean 'nccl'"]),
        ({"include_for_metrics": ["input"]}, ["include_for_metrics='input'", "Did you mean 'inputs'"]),
        ({"eval_accumulation_steps": 0}, ["eval_accumulation_steps=0", "positive number"]),
        ({"dataloader_persistent_workers": True}, ["dataloader_persistent_workers=True", "num_workers > 0"]),
        ({"optim_args": ["momentum=0.9"]}, ["optim_args=['momentum=0.9']", "'key=value,key2=value2'"]),
        ({"optim_args": {"betas": [0.9, 0.99]}}, ["optim_args['betas']=[0.9, 0.99]", "number, a bool"]),
        ({"report_to": ["none", "jsonl"]}, ["report_to=['none', 'jsonl']", "'none' alone"]),
    ],
)
def test_validation_errors_name_argument_value_and_fix(kwargs, parts):
    with pytest.raises(ValueError) as err:
        make(**kwargs)
    for part in parts:
        assert part in str(err.value), (part, str(err.value))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "best"},
        {**_STEPS_EVAL, "save_steps": 200, "eval_steps": 100},
        {**_STEPS_EVAL, "save_steps": 0.2, "eval_steps": 0.1},
        {"bf16": True},
        {"fp16": True},
        {"bf16": True, "fp16_full_eval": True},
        {"warmup_steps": 0.25},
        {"lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "epoch"},
        {"dataloader_prefetch_factor": 2, "dataloader_num_workers": 1},
        {"eval_strategy": "epoch", "logging_steps": 0, "logging_strategy": "no"},
        {"save_strategy": "no", "save_steps": 0},
        {"max_steps": 10, "num_train_epochs": 0},
    ],
)
def test_valid_combinations_pass(kwargs):
    make(**kwargs)


def test_integral_float_intervals_become_ints():
    args = make(logging_steps=10.0, save_steps=20.0, eval_strategy="steps", eval_steps=5.0)
    assert (args.logging_steps, args.save_steps, args.eval_steps) == (10, 20, 5)
    assert all(type(v) is int for v in (args.logging_steps, args.save_steps, args.eval_steps))
    assert make(logging_steps=0.5).logging_steps == 0.5


# --- 4.x aliases ------------------------------------------------------------------------------------------------------

# (kwargs, expected attributes, warning text or None, needs the support check disabled)
MAPPED_ALIASES = [
    ({"evaluation_strategy": "epoch"}, {"eval_strategy": IntervalStrategy.EPOCH, "do_eval": True},
     "evaluation_strategy is deprecated, use eval_strategy", False),
    ({"warmup_ratio": 0.1}, {"warmup_steps": 0.1}, "warmup_ratio is deprecated, use warmup_steps", False),
    ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"},
     "group_by_length is deprecated, use train_sampling_strategy='group_by_length'", True),
    ({"overwrite_output_dir": True}, {"output_dir": "trainer_output"}, "no effect", False),
    ({"logging_dir": "runs/a"}, {"logging_dir": "runs/a"}, "logging_dir is deprecated", False),
    ({"no_cuda": True}, {"use_cpu": True, "dataloader_pin_memory": False}, "no_cuda is deprecated, use use_cpu", False),
    ({"per_gpu_train_batch_size": 4}, {"per_device_train_batch_size": 4},
     "per_gpu_train_batch_size is deprecated, use per_device_train_batch_size", False),
    ({"per_gpu_eval_batch_size": 3}, {"per_device_eval_batch_size": 3},
     "per_gpu_eval_batch_size is deprecated, use per_device_eval_batch_size", False),
    ({"save_safetensors": True}, {}, "always writes safetensors", False),
    ({"include_inputs_for_metrics": True}, {"include_for_metrics": ["inputs"]},
     "include_inputs_for_metrics is deprecated, use include_for_metrics", True),
    ({"include_inputs_for_metrics": True, "include_for_metrics": ["loss"]}, {"include_for_metrics": ["loss", "inputs"]},
     "include_inputs_for_metrics is deprecated", True),
    ({"include_tokens_per_second": True}, {"include_num_input_tokens_seen": "all"},
     "include_tokens_per_second is deprecated, use include_num_input_tokens_seen='all'", False),
    ({"adafactor": True}, {"optim": OptimizerNames.ADAFACTOR}, "adafactor is deprecated, use optim='adafactor'", False),
    ({"push_to_hub_model_id": "me/model"}, {"hub_model_id": "me/model"},
     "push_to_hub_model_id is deprecated, use hub_model_id", True),
    ({"push_to_hub_token": "hf_abc"}, {"hub_token": "hf_abc"}, "push_to_hub_token is deprecated, use hub_token", True),
    ({"fp16_backend": "amp"}, {}, "fp16_backend is deprecated", False),
    ({"half_precision_backend": "amp"}, {}, "half_precision_backend is deprecated", False),
    ({"use_mps_device": True}, {}, "MPS device is picked automatically", False),
]


@pytest.mark.parametrize("kwargs, expected, warning, needs_bypass", MAPPED_ALIASES)
def test_alias_is_mapped_with_a_future_warning(kwargs, expected, warning, needs_bypass, monkeypatch):
    if needs_bypass:
        monkeypatch.setattr(support, "check_supported", lambda args, defaults: None)
    with pytest.warns(FutureWarning, match=warning):
        args = make(**kwargs)
    for name, value in expected.items():
        assert getattr(args, name) == value, name
    assert len(dataclasses.fields(args)) == 114 + len(TRAINWELL_FIELDS)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"overwrite_output_dir": False},
        {"warmup_ratio": 0.0},
        {"no_cuda": False},
        {"group_by_length": False},
        {"fp16_backend": "auto"},
        {"half_precision_backend": "auto"},
        {"past_index": -1},
        {"ray_scope": "last"},
        {"jit_mode_eval": False},
        {"evaluation_strategy": None},
        {"push_to_hub_token": "<PUSH_TO_HUB_TOKEN>"},
    ],
)
def test_alias_at_its_4x_default_is_dropped_silently(kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = make(**kwargs)
    assert args == make()


def test_alias_targets_and_batch_rebalance_are_accepted():
    with pytest.warns(FutureWarning):
        assert make(group_by_length=True).train_sampling_strategy == "group_by_length"
    assert make(train_sampling_strategy="batch_rebalance").train_sampling_strategy == "batch_rebalance"


@pytest.mark.parametrize(
    "kwargs, parts",
    [
        ({"save_safetensors": False}, ["save_safetensors=False", "always writes safetensors"]),
        ({"fp16_backend": "apex"}, ["fp16_backend='apex'", "torch.amp"]),
        ({"half_precision_backend": "cpu_amp"}, ["half_precision_backend='cpu_amp'"]),
        ({"warmup_ratio": 1.0}, ["warmup_ratio=1.0", "warmup_steps=<number of steps>"]),
        ({"evaluation_strategy": "epoch", "eval_strategy": "steps"}, ["evaluation_strategy='epoch'", "disagree"]),
    ],
)
def test_alias_errors(kwargs, parts):
    with pytest.raises(ValueError) as err:
        make(**kwargs)
    for part in parts:
        assert part in str(err.value)


REMOVED = [
    ("tpu_num_cores", 8, "TPU"),
    ("jit_mode_eval", True, "Compile or trace"),
    ("use_ipex", True, "Intel Extension"),
    ("past_index", 0, "mems"),
    ("use_legacy_prediction_loop", True, "evaluation loop"),
    ("torchdynamo", "inductor", "torch_compile_backend"),
    ("ray_scope", "all", "Ray"),
    ("mp_parameters", "--x", "SageMaker"),
    ("tpu_metrics_debug", True, "TPU"),
    ("fsdp_min_num_params", 1000, "fsdp_config"),
    ("fsdp_transformer_layer_cls_to_wrap", "Block", "fsdp_config"),
    ("push_to_hub_organization", "org", "hub_model_id"),
    ("fp16_opt_level", "O2", "torch.amp"),
    ("split_batches", True, "accelerator_config"),
    ("dispatch_batches", True, "accelerator_config"),
]


@pytest.mark.parametrize("name, value, hint", REMOVED)
def test_removed_4x_argument_raises_with_replacement(name, value, hint):
    with pytest.raises(ValueError) as err:
        make(**{name: value})
    message = str(err.value)
    assert message.startswith(f"{name}={value!r}") and "removed in transformers 5" in message and hint in message


def test_every_alias_in_the_table_is_tested():
    tested = {name for kwargs, *_ in MAPPED_ALIASES for name in kwargs} | {name for name, *_ in REMOVED}
    assert set(aliases.ALIASES_BY_NAME) <= tested


def test_same_value_through_alias_and_name_is_fine():
    with pytest.warns(FutureWarning):
        assert make(evaluation_strategy="epoch", eval_strategy="epoch").eval_strategy is IntervalStrategy.EPOCH


def test_logging_dir_defaults_to_none():
    assert make().logging_dir is None


def test_aliases_work_for_dataclass_subclasses():
    @dataclasses.dataclass
    class MyArgs(TrainingArguments):
        extra: int = 1

    with pytest.warns(FutureWarning) as record:
        args = MyArgs(extra=3, evaluation_strategy="epoch", logging_dir="tb")
    assert [str(w.message).split(" is deprecated")[0] for w in record] == ["evaluation_strategy", "logging_dir"]
    assert (args.extra, args.eval_strategy, args.logging_dir) == (3, IntervalStrategy.EPOCH, "tb")
    assert "extra" in inspect.signature(MyArgs).parameters
    assert dataclasses.replace(args, extra=4).extra == 4


def test_aliases_work_through_a_hand_written_subclass_init():
    class Custom(TrainingArguments):
        def __init__(self, tag: str = "x", **kwargs):
            self.tag = tag
            super().__init__(**kwargs)

    with pytest.warns(FutureWarning):
        args = Custom(tag="t", no_cuda=True)
    assert args.tag == "t" and args.use_cpu is True


def test_subclass_field_named_like_an_alias_wins():
    @dataclasses.dataclass
    class Legacy(TrainingArguments):
        logging_dir: str = "mine"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Legacy(logging_dir="given").logging_dir == "given"
        assert Legacy().logging_dir == "mine"


# --- fields trainwell does not act on yet -----------------------------------------------------------------------------

UNSUPPORTED_SAMPLES = {
    "push_to_hub": True,
    "hub_model_id": "me/model",
    "hub_token": "hf_secret",
    "hub_private_repo": True,
    "hub_always_push": True,
    "hub_revision": "main",
    "parallelism_config": object(),
    "use_liger_kernel": True,
    "liger_kernel_config": {"rope": True},
    "neftune_noise_alpha": 5.0,
    "auto_find_batch_size": True,
    "debug": "underflow_overflow",
    "enable_jit_checkpoint": True,
    "eval_accumulation_steps": 4,
    "batch_eval_metrics": True,
    "include_for_metrics": ["loss"],
    "eval_use_gather_object": True,
    "save_on_each_node": True,
    "restore_callback_states_from_checkpoint": True,
    "project": "elsewhere",
    "trackio_space_id": "me/space",
    "trackio_bucket_id": "bucket",
    "trackio_static_space_id": "me/static",
    "skip_memory_metrics": False,
    "eval_do_concat_batches": False,
}


# Every value trainwell refuses: the rows of support.py, TPU metrics, and the mesh dimensions it does not run.
REFUSED = [(name, UNSUPPORTED_SAMPLES.get(name), f"TrainingArguments.{name}=")
           for name in sorted(set(support.UNSUPPORTED) | set(support._ALLOWED_VALUES))] + [
    ("debug", "tpu_metrics_debug", "TrainingArguments.debug='tpu_metrics_debug'"),
    ("parallelism_config", {"cp_size": 2}, "TrainingArguments.parallelism_config.cp_size=2"),
    ("parallelism_config", {"sp_size": 2}, "TrainingArguments.parallelism_config.sp_size=2"),
]


@pytest.mark.parametrize(("name", "value", "named"), REFUSED)
def test_unsupported_value_raises_when_set(name, value, named):
    assert value is not None, f"add a sample value for {name}"
    with pytest.raises(NotImplementedError) as err:
        make(**{name: value})
    assert named in str(err.value)


def test_parallelism_config_from_a_dict_or_json_and_back():
    from accelerate import ParallelismConfig

    for given in ({"dp_shard_size": 2, "tp_size": 2}, '{"dp_shard_size": 2, "tp_size": 2}'):
        config = make(parallelism_config=given).parallelism_config
        assert isinstance(config, ParallelismConfig) and (config.dp_shard_size, config.tp_size) == (2, 2)
    saved = make(parallelism_config={"tp_size": 2}).to_dict()["parallelism_config"]
    assert saved["tp_size"] == 2 and saved["dp_shard_size"] == 1
    given = ParallelismConfig(tp_size=2)
    assert make(parallelism_config=given).parallelism_config is given
    with pytest.raises(ValueError, match="parallelism_config got unknown key.*'tp_sise'.*tp_size"):
        make(parallelism_config={"tp_sise": 2})
    with pytest.raises(TypeError, match="parallelism_config=2: pass an accelerate.ParallelismConfig"):
        make(parallelism_config=2)


def test_unsupported_fields_at_their_defaults_are_fine():
    defaults = {name: default for name, default in EXPECTED_FIELDS if name in support.UNSUPPORTED}
    make(**defaults)


def test_supported_sampling_strategy_passes():
    assert make(train_sampling_strategy="sequential").train_sampling_strategy == "sequential"


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
