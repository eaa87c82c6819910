"""Tests for ``trainwell.args.parser``: command line, dict, JSON and YAML into dataclasses."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Literal, Optional

import pytest

from trainwell.args import support
from trainwell.args.parser import HfArgumentParser, TrainwellArgumentParser, string_to_bool
from trainwell.outputs import IntervalStrategy, OptimizerNames, SaveStrategy
from trainwell.training_args import TrainingArguments


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("ACCELERATE_MIXED_PRECISION", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_support_check(monkeypatch):
    monkeypatch.setattr(support, "check_supported", lambda args, defaults: None)


@dataclasses.dataclass
class ModelArgs:
    model_name: str = dataclasses.field(metadata={"help": "Model to load."})
    dropout: float = 0.1
    layers: Optional[int] = None  # noqa: UP045 -- the parser must also read typing.Optional, not only X | None
    freeze: bool = False
    tie: bool = True
    mode: Literal["fast", "slow"] = "fast"
    tags: list[str] = dataclasses.field(default_factory=lambda: ["a"])
    sizes: list[int] = dataclasses.field(default_factory=list)


def parse(*argv: str) -> TrainingArguments:
    parser = TrainwellArgumentParser(TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(list(argv), look_for_args_file=False)
    return args


def parse_model(*argv: str) -> ModelArgs:
    (args,) = TrainwellArgumentParser(ModelArgs).parse_args_into_dataclasses(list(argv), look_for_args_file=False)
    return args


def test_names_and_exports():
    import trainwell.args as args_pkg

    assert HfArgumentParser is TrainwellArgumentParser
    assert issubclass(TrainwellArgumentParser, argparse.ArgumentParser)
    assert args_pkg.HfArgumentParser is TrainwellArgumentParser
    assert args_pkg.TrainwellArgumentParser is TrainwellArgumentParser


def test_no_arguments_gives_the_defaults():
    assert parse() == TrainingArguments()


def test_scalar_enum_and_optional_fields():
    args = parse("--output_dir", "out", "--learning_rate", "3e-4", "--num_train_epochs", "2", "--max_steps", "10",
                 "--eval_strategy", "steps", "--eval_steps", "5", "--save_total_limit", "2", "--optim", "sgd",
                 "--save_strategy", "epoch", "--log_level", "info")
    assert args.output_dir == "out" and args.learning_rate == 3e-4 and args.max_steps == 10
    assert args.eval_strategy is IntervalStrategy.STEPS and args.eval_steps == 5
    assert args.save_total_limit == 2 and args.optim is OptimizerNames.SGD
    assert args.save_strategy is SaveStrategy.EPOCH and args.log_level == "info"
    assert args.data_seed is None


def test_kebab_case_and_equals_forms():
    args = parse("--per-device-train-batch-size=4", "--gradient_accumulation_steps=2")
    assert args.per_device_train_batch_size == 4 and args.gradient_accumulation_steps == 2


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], False),
        (["--do_train"], True),
        (["--do_train", "true"], True),
        (["--do_train", "yes"], True),
        (["--do_train", "False"], False),
        (["--do-train", "0"], False),
    ],
)
def test_bool_flag_forms(argv, expected):
    assert parse(*argv).do_train is expected


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], True),
        (["--no_remove_unused_columns"], False),
        (["--no-remove-unused-columns"], False),
        (["--remove_unused_columns", "false"], False),
        (["--remove_unused_columns"], True),
    ],
)
def test_true_default_bools_get_a_no_flag(argv, expected):
    assert parse(*argv).remove_unused_columns is expected


def test_optional_bools_stay_none_unless_given():
    assert parse().tf32 is None and parse("--tf32").tf32 is True and parse("--tf32", "false").tf32 is False
    assert parse("--activation_checkpointing").activation_checkpointing is True
    assert parse("--ddp_find_unused_parameters", "no").ddp_find_unused_parameters is False


def test_bad_bool_value_exits_with_message(capsys):
    with pytest.raises(SystemExit):
        parse("--do_train", "maybe")
    assert "expected a boolean" in capsys.readouterr().err


def test_invalid_choice_exits_with_did_you_mean(capsys):
    with pytest.raises(SystemExit):
        parse("--eval_strategy", "stepz")
    err = capsys.readouterr().err
    assert "eval_strategy='stepz'" in err and "Did you mean 'steps'?" in err
    with pytest.raises(SystemExit):
        parse("--log_level", "loud")
    assert "log_level='loud'" in capsys.readouterr().err


def test_list_fields_take_several_values():
    args = parse("--report_to", "tensorboard", "mlflow", "--label_names", "labels", "aux")
    assert args.report_to == ["tensorboard", "mlflow"] and args.label_names == ["labels", "aux"]
    assert parse("--report_to", "none").report_to == []
    assert parse("--optim_target_modules", "all-linear").optim_target_modules == "all-linear"
    assert parse("--optim_target_modules", "q", "v").optim_target_modules == ["q", "v"]


def test_list_field_of_unsupported_target(no_support_check):
    assert parse("--include_for_metrics", "inputs", "loss").include_for_metrics == ["inputs", "loss"]
    assert parse("--debug", "underflow_overflow").debug == ["underflow_overflow"]


def test_str_or_bool_and_literal_unions(no_support_check):
    assert parse("--include_num_input_tokens_seen", "non_padding").include_num_input_tokens_seen == "non_padding"
    assert parse("--include_num_input_tokens_seen", "true").include_num_input_tokens_seen == "all"
    assert parse("--trackio_static_space_id", "false").trackio_static_space_id is False
    assert parse("--trackio_static_space_id", "me/space").trackio_static_space_id == "me/space"


def test_dict_fields_take_json(no_support_check):
    args = parse("--lr_scheduler_kwargs", '{"num_cycles": 2}', "--accelerator_config", '{"even_batches": false}')
    assert args.lr_scheduler_kwargs == {"num_cycles": 2} and args.accelerator_config.even_batches is False
    assert parse("--liger_kernel_config", '{"rope": true}').liger_kernel_config == {"rope": True}


def test_dict_field_without_str_rejects_bad_json(capsys):
    with pytest.raises(SystemExit):
        parse("--liger_kernel_config", "rope=true")
    assert "expected a JSON object" in capsys.readouterr().err


def test_help_shows_field_help_defaults_and_choices():
    text = TrainwellArgumentParser(TrainingArguments).format_help()
    assert "Peak learning rate of the optimizer." in text and "(default: 5e-05)" in text
    assert "{no,steps,epoch}" in text and "--no_remove_unused_columns" in text
    assert "--evaluation_strategy" not in text  # the 4.x names work but stay out of --help


def test_own_dataclass_types_defaults_and_required(capsys):
    args = parse_model("--model_name", "tiny", "--layers", "3", "--freeze", "--no_tie", "--mode", "slow",
                       "--tags", "x", "y", "--sizes", "1", "2")
    assert args == ModelArgs("tiny", 0.1, 3, True, False, "slow", ["x", "y"], [1, 2])
    assert parse_model("--model_name", "m").tags == ["a"]
    with pytest.raises(SystemExit):
        parse_model()
    assert "--model_name" in capsys.readouterr().err


def test_several_dataclasses_in_order():
    parser = TrainwellArgumentParser((ModelArgs, TrainingArguments))
    model, train = parser.parse_args_into_dataclasses(["--model_name", "m", "--seed", "3"], look_for_args_file=False)
    assert model.model_name == "m" and train.seed == 3


def test_argument_group_name_is_used():
    @dataclasses.dataclass
    class Grouped:
        _argument_group_name = "data options"
        path: str = "x"

    assert "data options" in TrainwellArgumentParser(Grouped).format_help()


def test_non_dataclass_is_rejected():
    with pytest.raises(TypeError, match="not a dataclass"):
        TrainwellArgumentParser(int)


def test_remaining_strings_and_unknown_options():
    parser = TrainwellArgumentParser(TrainingArguments)
    args, rest = parser.parse_args_into_dataclasses(["--seed", "1", "--extra", "2"], return_remaining_strings=True,
                                                    look_for_args_file=False)
    assert args.seed == 1 and rest == ["--extra", "2"]
    with pytest.raises(ValueError, match=r"not recognized.*'--lerning_rate'.*Did you mean '--learning_rate'"):
        parser.parse_args_into_dataclasses(["--lerning_rate", "1"], look_for_args_file=False)


def test_extra_parser_arguments_come_back_as_a_namespace():
    parser = TrainwellArgumentParser(TrainingArguments)
    parser.add_argument("--my_flag", type=int, default=0)
    args, extra = parser.parse_args_into_dataclasses(["--my_flag", "4"], look_for_args_file=False)
    assert isinstance(args, TrainingArguments) and extra.my_flag == 4


def test_args_files_come_first_and_the_command_line_wins(tmp_path):
    base = tmp_path / "base.args"
    base.write_text("--seed 5 --learning_rate 0.5")
    extra = tmp_path / "extra.args"
    extra.write_text("--max_steps 7")
    parser = TrainwellArgumentParser(TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses(["--seed", "9", "--config", str(extra)], args_filename=base,
                                                 args_file_flag="--config", look_for_args_file=False)
    assert (args.seed, args.learning_rate, args.max_steps) == (9, 0.5, 7)


def test_script_args_file_is_found(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.with_suffix(".args").write_text("--seed 11")
    monkeypatch.setattr(sys, "argv", [str(script), "--max_steps", "3"])
    (args,) = TrainwellArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    assert (args.seed, args.max_steps) == (11, 3)


# --- 4.x names on the command line ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, name, expected",
    [
        (["--evaluation_strategy", "epoch"], "eval_strategy", IntervalStrategy.EPOCH),
        (["--warmup_ratio", "0.1"], "warmup_steps", 0.1),
        (["--no_cuda"], "use_cpu", True),
        (["--per_gpu_train_batch_size", "4"], "per_device_train_batch_size", 4),
        (["--per-gpu-eval-batch-size", "2"], "per_device_eval_batch_size", 2),
        (["--adafactor"], "optim", OptimizerNames.ADAFACTOR),
        (["--include_tokens_per_second"], "include_num_input_tokens_seen", "all"),
        (["--logging_dir", "tb"], "logging_dir", "tb"),
        (["--overwrite_output_dir"], "output_dir", "trainer_output"),
        (["--save_safetensors"], "output_dir", "trainer_output"),
        (["--fp16_backend", "amp"], "output_dir", "trainer_output"),
        (["--use_mps_device"], "output_dir", "trainer_output"),
    ],
)
def test_4x_options_are_accepted(argv, name, expected):
    with pytest.warns(FutureWarning, match="is deprecated"):
        args = parse(*argv)
    assert getattr(args, name) == expected


def test_4x_flag_set_false_does_nothing():
    assert parse("--no_cuda", "false").use_cpu is False
    assert parse("--group_by_length", "false").train_sampling_strategy == "random"


def test_removed_4x_option_fails_clearly():
    with pytest.raises(ValueError, match="past_index=1: this argument was removed in transformers 5"):
        parse("--past_index", "1")


def test_subclass_gets_aliases_and_its_own_fields():
    @dataclasses.dataclass
    class MyArgs(TrainingArguments):
        extra: int = 1

    parser = TrainwellArgumentParser(MyArgs)
    with pytest.warns(FutureWarning):
        (args,) = parser.parse_args_into_dataclasses(["--extra", "3", "--evaluation_strategy", "steps"],
                                                     look_for_args_file=False)
    assert args.extra == 3 and args.eval_strategy is IntervalStrategy.STEPS


def test_subclass_field_named_like_an_alias_is_a_plain_option():
    @dataclasses.dataclass
    class Legacy(TrainingArguments):
        logging_dir: str = "mine"

    (args,) = TrainwellArgumentParser(Legacy).parse_args_into_dataclasses(["--logging_dir", "x"],
                                                                          look_for_args_file=False)
    assert args.logging_dir == "x"


# --- dicts, JSON and YAML ---------------------------------------------------------------------------------------------


def test_parse_dict_and_round_trip():
    parser = TrainwellArgumentParser(TrainingArguments)
    (args,) = parser.parse_dict({"output_dir": "o", "eval_strategy": "epoch", "save_strategy": "epoch",
                                 "load_best_model_at_end": True})
    assert args.metric_for_best_model == "loss"
    assert parser.parse_dict(args.to_dict())[0] == args


def test_parse_dict_accepts_4x_keys():
    with pytest.warns(FutureWarning, match="evaluation_strategy is deprecated"):
        (args,) = TrainwellArgumentParser(TrainingArguments).parse_dict({"evaluation_strategy": "epoch"})
    assert args.eval_strategy is IntervalStrategy.EPOCH


def test_parse_dict_unknown_key_suggests_the_field():
    parser = TrainwellArgumentParser((ModelArgs, TrainingArguments))
    with pytest.raises(ValueError, match=r"unknown argument\(s\) 'learnig_rate'.*Did you mean 'learning_rate'\?"):
        parser.parse_dict({"model_name": "m", "learnig_rate": 1.0})
    model, train = parser.parse_dict({"model_name": "m", "junk": 1}, allow_extra_keys=True)
    assert model.model_name == "m" and train == TrainingArguments()


def test_parse_dict_rejects_non_mappings():
    with pytest.raises(ValueError, match="expected a mapping"):
        TrainwellArgumentParser(TrainingArguments).parse_dict(["seed", 1])


def test_parse_json_file(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"seed": 3, "report_to": ["tensorboard"]}))
    (args,) = TrainwellArgumentParser(TrainingArguments).parse_json_file(path)
    assert args.seed == 3 and args.report_to == ["tensorboard"]
    path.write_text("{seed: 3}")
    with pytest.raises(ValueError, match="is not valid JSON"):
        TrainwellArgumentParser(TrainingArguments).parse_json_file(path)


def test_parse_yaml_file(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text("seed: 4\nlr_scheduler_kwargs:\n  num_cycles: 3\nbf16: true\nlearning_rate: 5e-5\n")
    (args,) = TrainwellArgumentParser(TrainingArguments).parse_yaml_file(path)
    assert args.seed == 4 and args.lr_scheduler_kwargs == {"num_cycles": 3} and args.mixed_precision == "bf16"
    assert args.learning_rate == 5e-5  # YAML 1.1 reads 5e-5 as a string; the arguments turn it into a float
    empty = tmp_path / "empty.yml"
    empty.write_text("")
    assert TrainwellArgumentParser(TrainingArguments).parse_yaml_file(empty)[0] == TrainingArguments()
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        TrainwellArgumentParser(TrainingArguments).parse_yaml_file(listing)
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("sed: 1\n")
    with pytest.raises(ValueError, match="'sed'.*Did you mean 'seed'"):
        TrainwellArgumentParser(TrainingArguments).parse_yaml_file(unknown)


@pytest.mark.parametrize("suffix, text", [(".json", '{"seed": 8}'), (".yaml", "seed: 8\n"), (".yml", "seed: 8\n")])
def test_a_single_config_path_on_the_command_line(tmp_path, suffix, text):
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    parser = TrainwellArgumentParser(TrainingArguments)
    (args,) = parser.parse_args_into_dataclasses([str(path)])
    assert args.seed == 8
    args, rest = parser.parse_args_into_dataclasses([str(path)], return_remaining_strings=True)
    assert args.seed == 8 and rest == []


def test_string_to_bool():
    assert string_to_bool("Y") is True and string_to_bool("n") is False and string_to_bool(" FALSE ") is False
    assert string_to_bool(True) is True
    with pytest.raises(argparse.ArgumentTypeError):
        string_to_bool("maybe")


def test_parser_module_imports_no_torch_and_yaml_lazily():
    code = (
        "import sys\n"
        "from trainwell.args.parser import TrainwellArgumentParser\n"
        "from trainwell.training_args import TrainingArguments\n"
        "TrainwellArgumentParser(TrainingArguments).parse_args_into_dataclasses(['--seed', '2'])\n"
        "bad = [m for m in ('torch', 'accelerate', 'yaml') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
