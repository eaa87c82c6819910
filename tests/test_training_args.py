"""Tests for ``trainwell.training_args``: the 114 fields, normalization, validation, 4.x aliases, views.

Expected names and defaults are written out here (transformers 5.23), never read from transformers.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import typing
from types import SimpleNamespace

import pytest

from tests.common.args_testing import EXPECTED_FIELDS, TRAINWELL_FIELDS, make
from trainwell.args import normalize
from trainwell.outputs import (
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    SaveStrategy,
    SchedulerType,
)
from trainwell.training_args import AcceleratorConfig, TrainingArguments

pytestmark = pytest.mark.usefixtures("clean_launcher_env")


# --- the field list ---------------------------------------------------------------------------------------


# after the reference's, trainwell's own


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
        "clearml", "swanlab", "trackio", "kubeflow", "flyte", "jsonl", "csv", "live",
    )
    assert (*normalize._REPORT_TO_PACKAGES, "live") == normalize.KNOWN_REPORT_TO  # "live" needs no package
