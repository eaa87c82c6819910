"""Config files for ``trainwell train``: reading, command-line overrides, and checking every key.

A config is one YAML or JSON mapping. Its keys are ``TrainingArguments`` fields (any of them) plus the
sections in ``SECTIONS`` (model, data, ...). Overrides ``--key value`` from the command line win over the
file; ``--a.b.c value`` sets a nested key. Every error names the key and what is allowed (with a
did-you-mean). Relative file paths resolve against the config's folder, or the current directory for
overrides (``resolve_paths``); ``TEMPLATE`` is what ``--print-config`` prints without a config. Building models
and datasets from a checked config belongs to ``trainwell.cli.build``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import stat
from pathlib import Path
from typing import Any

from trainwell.cli import CliError
from trainwell.utils.errors import choice_error, did_you_mean

# Config keys that are not TrainingArguments fields, with what they hold.
SECTIONS: dict[str, str] = {
    "model": "'package.module:factory' or {factory: ..., kwargs: {...}} returning a torch.nn.Module; with a task "
             "also builtin, {builtin: NAME, kwargs: {...}}, {config: config.json} or {pretrained: FOLDER}",
    "data": "{train: FILE, eval: FILE} (JSONL, CSV or plain text) or 'package.module:factory'",
    "task": "text-classification or causal-lm, or {name: ..., text_column: ..., label_column: ..., max_length: ..., "
            "block_size: ...}: tokenize the data's text with the tokenizer",
    "tokenizer": "a tokenizer.json file or a saved tokenizer folder (local), or {path: ..., pad_token: ..., "
                 "eos_token: ...}",
    "data_collator": "'package.module:collator' or {factory: ..., kwargs: {...}}",
    "compute_metrics": "'package.module:function' taking an EvalPrediction",
    "resume_from_checkpoint": "a checkpoint path, true (newest complete one; an error if none) or 'auto' "
                              "(newest if any)",
    "report": "true (default) writes OUTPUT_DIR/report/ at the end; false skips it",
}


@functools.lru_cache(maxsize=1)
def _args_parser() -> Any:
    from trainwell.args.parser import TrainwellArgumentParser
    from trainwell.training_args import TrainingArguments

    return TrainwellArgumentParser(TrainingArguments, add_help=False)


def training_fields() -> set[str]:
    from trainwell.training_args import TrainingArguments

    return {f.name for f in dataclasses.fields(TrainingArguments) if f.init}


def read_config(path: str) -> dict[str, Any]:
    """The mapping in a ``.yaml``/``.yml``/``.json`` file; errors say what is wrong with the file. YAML aliases
    are bounded before anything expands them, and a circular one is named (``trainwell.utils.safe_yaml``)."""
    from trainwell.utils.safe_yaml import YamlError, load_yaml

    file = Path(path)
    if not file.is_file():
        raise CliError(f"config file {path!r} does not exist.")
    text = _read_text(path)
    try:
        data = json.loads(text) if file.suffix.lower() == ".json" else load_yaml(text, path)
    except YamlError as err:
        raise CliError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - yaml and json raise different classes; the message is what counts
        raise CliError(f"{path}: cannot be parsed ({err}).") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise CliError(f"{path}: the config must be a mapping of keys to values, got {type(data).__name__}.")
    return data


#: the most bytes read of a config file (a config is a few kilobytes)
CONFIG_LIMIT = 16 << 20


def _read_text(path: str) -> str:
    """The config file's text: opened once (as the user named it, a link followed), a regular file (never a FIFO,
    which would block), at most :data:`CONFIG_LIMIT` bytes, UTF-8; ``CliError`` naming it otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise CliError(f"config file {path!r} cannot be read ({err.strerror}).") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CliError(f"config file {path!r} is not a regular file: pass a .yaml or .json file.")
        if info.st_size > CONFIG_LIMIT:
            raise CliError(f"config file {path!r} is larger than the {CONFIG_LIMIT:,} bytes a config may be: it is "
                           "not a config file.")
        os.set_blocking(fd, True)
        data = fh.read(CONFIG_LIMIT + 1)
    if len(data) > CONFIG_LIMIT:
        raise CliError(f"config file {path!r} is larger than the {CONFIG_LIMIT:,} bytes a config may be.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{path}: is not UTF-8 text ({err}).") from None


def split_overrides(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """``["--a", "1", "--b=x", "--flag", "--c", "p", "q"]`` -> ``[("a", ["1"]), ("b", ["x"]), ("flag", []),
    ("c", ["p", "q"])]``. Dashes in names become underscores (``--learning-rate`` = ``--learning_rate``)."""
    out: list[tuple[str, list[str]]] = []
    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token[2:].partition("=")
            out.append((name.replace("-", "_"), [value] if eq else []))
        elif out:
            out[-1][1].append(token)
        else:
            raise CliError(f"unexpected argument {token!r}: overrides look like --key value.")
    return out


def _typed_field_value(name: str, values: list[str]) -> Any:
    """Convert command-line strings for the TrainingArguments field ``name`` as its parser option would."""
    action = _args_parser()._option_string_actions[f"--{name}"]
    convert = action.type or str
    try:
        if action.nargs in ("+", "*"):
            if not values:
                raise CliError(f"--{name} needs at least one value.")
            converted = [convert(v) for v in values]
            # A `str | list[str]` field keeps one value as a str, as the parser's own option does.
            one_or_many = type(action).__name__ == "_OneOrMany"
            return converted[0] if one_or_many and len(converted) == 1 else converted
        if action.nargs == "?" and not values:
            return action.const
        if len(values) != 1:
            raise CliError(f"--{name} takes one value, got {len(values)}: {values}.")
        value = convert(values[0])
    except (argparse.ArgumentTypeError, ValueError, TypeError) as err:
        if isinstance(err, CliError):
            raise
        expected = {int: "an integer", float: "a number"}.get(convert)
        reason = f"expected {expected}" if expected else str(err)
        raise CliError(f"--{name} {' '.join(values)}: {reason}.") from None
    if action.choices is not None and value not in action.choices:
        raise choice_error(name, value, action.choices)
    return value


def _yaml_value(values: list[str], name: str) -> Any:
    """The command-line values of ``--name`` read as YAML (``3`` a number, ``[a, b]`` a list), aliases bounded."""
    from trainwell.utils.safe_yaml import YamlError, load_yaml

    try:
        parsed = [load_yaml(v, f"--{name}") for v in values]
    except YamlError as err:
        raise CliError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - yaml's parse errors: the message is what counts
        raise CliError(f"--{name}: {' '.join(values)!r} cannot be parsed ({err}).") from None
    if not parsed:
        return True
    return parsed[0] if len(parsed) == 1 else parsed


# A string that stands for a mapping, by where it sits, and the key it is in that mapping: a dotted override below
# it turns it into the mapping (`data.train: f.csv` with `--data.train.format csv` -> {path: f.csv, format: csv}).
_STRING_STANDS_FOR: dict[tuple[str, ...], str] = {
    ("model",): "factory", ("data",): "factory", ("data_collator",): "factory", ("compute_metrics",): "factory",
    ("data", "train"): "path", ("data", "eval"): "path", ("tokenizer",): "path", ("task",): "name",
}


def _as_mapping(where: tuple[str, ...], value: Any, dotted: str) -> dict[str, Any]:
    """The mapping a config value stands for, so that the override ``--{dotted}`` can set a key inside it."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if where == ("model",) and value == "builtin":
        return {"builtin": True}
    if isinstance(value, str) and where in _STRING_STANDS_FOR:
        return {_STRING_STANDS_FOR[where]: value}
    name = ".".join(where)
    raise CliError(f"--{dotted}: '{name}' is {value!r} in the config, not a mapping, so there is no key inside it "
                   f"to set. Override the whole value (--{name} VALUE), or write '{name}' as a mapping in the config.")


def _set_nested(config: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = config
    for depth, key in enumerate(keys[:-1], 1):
        child = _as_mapping(tuple(keys[:depth]), node.get(key), dotted)
        node[key] = child
        node = child
    node[keys[-1]] = value


def apply_overrides(config: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    """A copy of ``config`` with the command-line overrides applied (they win); keys are checked."""
    merged = json.loads(json.dumps(config, default=str)) if config else {}
    fields = training_fields()
    for name, values in split_overrides(tokens):
        top = name.split(".")[0]
        check_key(top, fields, where="--")
        if name in fields:
            merged[name] = _typed_field_value(name, values)
        else:
            _set_nested(merged, name, _yaml_value(values, name))
    return merged


def check_key(key: str, fields: set[str] | None = None, where: str = "") -> None:
    """``CliError`` unless ``key`` is a TrainingArguments field or a config section (with a did-you-mean)."""
    fields = training_fields() if fields is None else fields
    if key in fields or key in SECTIONS:
        return
    from trainwell.args.aliases import ALIASES_BY_NAME

    if key in ALIASES_BY_NAME:  # a 4.x name: TrainingArguments maps it, with its own FutureWarning
        return
    raise CliError(
        f"unknown config key '{where}{key}': use a TrainingArguments field (see `python -c \"import trainwell; "
        f"help(trainwell.TrainingArguments)\"`) or one of the sections {', '.join(map(repr, SECTIONS))}."
        + did_you_mean(key, sorted(fields | set(SECTIONS)))
    )


def _check_bool_fields(values: dict[str, Any]) -> None:
    from typing import get_type_hints

    from trainwell.training_args import TrainingArguments

    hints = get_type_hints(TrainingArguments)
    for key, value in values.items():
        if hints.get(key) in (bool, bool | None) and value is not None and not isinstance(value, bool):
            raise CliError(f"{key}={value!r}: pass true or false.")


def split_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(sections, training)``: the config's own sections, and the TrainingArguments keyword arguments."""
    fields = training_fields()
    for key in config:
        check_key(key, fields)
    sections = {k: v for k, v in config.items() if k in SECTIONS}
    training = {k: v for k, v in config.items() if k not in SECTIONS}
    _check_bool_fields(training)
    if not isinstance(sections.get("report", True), bool):
        raise CliError(f"report={sections['report']!r}: pass true (write OUTPUT_DIR/report/) or false.")
    return sections, training


# --- paths -----------------------------------------------------------------------------------------------------------

# TrainingArguments fields that may name a JSON file to read (they also take a dict or a JSON object string).
INPUT_FILE_FIELDS = ("accelerator_config", "deepspeed", "fsdp_config")


class ConfigPath(str):
    """An absolute path resolved from a relative one; remembers what was written and against which folder."""

    given: str
    base: str
    origin: str  # "config" (relative to the config's folder) or "command line" (relative to the current directory)

    def __new__(cls, given: str, base: str, origin: str) -> ConfigPath:
        path = super().__new__(cls, os.path.normpath(os.path.join(base, os.path.expanduser(given))))
        path.given, path.base, path.origin = given, base, origin
        return path

    def explain(self) -> str:
        """Where a missing file was looked for, and why there."""
        if os.path.isabs(os.path.expanduser(self.given)):
            return f"{self.given!r}"
        rule = ("relative paths in a config file are relative to the config's folder" if self.origin == "config"
                else "relative paths given on the command line are relative to the current directory")
        return f"{self.given!r}: looked for {str(self)} ({rule}, {self.base})"


def _path_keys(config: dict[str, Any]) -> list[tuple[str, ...]]:
    """The keys (as tuples) of the config's file paths: data files, the tokenizer, a transformers model's config
    file or folder, and JSON config files of TrainingArguments."""
    keys: list[tuple[str, ...]] = []
    tokenizer = config.get("tokenizer")
    if isinstance(tokenizer, (str, os.PathLike)):
        keys.append(("tokenizer",))
    elif isinstance(tokenizer, dict) and isinstance(tokenizer.get("path"), (str, os.PathLike)):
        keys.append(("tokenizer", "path"))
    model = config.get("model")
    if isinstance(model, dict):
        keys += [("model", key) for key in ("config", "pretrained") if isinstance(model.get(key), (str, os.PathLike))]
    data = config.get("data")
    if isinstance(data, dict) and "factory" not in data:
        for split in ("train", "eval"):
            value = data.get(split)
            if isinstance(value, (str, os.PathLike)):
                keys.append(("data", split))
            elif isinstance(value, dict) and isinstance(value.get("path"), (str, os.PathLike)):
                keys.append(("data", split, "path"))
    for field in INPUT_FILE_FIELDS:
        value = config.get(field)
        if isinstance(value, str) and not value.lstrip().startswith("{"):
            keys.append((field,))
    return keys


def resolve_paths(config: dict[str, Any], config_path: str, overridden: list[str]) -> None:
    """Make the config's relative file paths absolute, in place: against the config's folder, or against the
    current directory for a value set by a command-line override (a name in ``overridden``, dotted)."""
    config_dir = os.path.dirname(os.path.abspath(config_path))
    for keys in _path_keys(config):
        dotted = ".".join(keys)
        from_cli = any(dotted == name or dotted.startswith(name + ".") for name in overridden)
        node = config
        for key in keys[:-1]:
            node = node[key]
        base, origin = (os.getcwd(), "command line") if from_cli else (config_dir, "config")
        node[keys[-1]] = ConfigPath(os.fspath(node[keys[-1]]), base, origin)


# --- template --------------------------------------------------------------------------------------------------------

TEMPLATE = """\
# A trainwell train config. Run it with: trainwell train CONFIG.yaml [--key value ...]
# Fill in the model factory and the data files. The TrainingArguments below show their defaults.
# Relative data paths are relative to this file's folder; output_dir is relative to the current directory.
# Every key is checked before training starts. See docs/cli.md.

# model: a factory returning a torch.nn.Module: 'package.module:function' (called with no arguments),
# a file beside this config ('./my_model.py:build'), or a factory with keyword arguments:
model:
  factory: mypackage.models:build_model   # FILL IN
  kwargs: {}                              # checked against the factory's parameters, e.g. {hidden_size: 256}

# data: files (JSONL, CSV or plain text, by suffix), or a factory returning {train: ..., eval: ...},
# (train, eval) or one training dataset, e.g. data: mypackage.data:load
data:
  train: data/train.jsonl                 # FILL IN; or {path: ..., format: csv, columns: [...], eval_fraction: 0.1}
  # eval: data/eval.jsonl                 # optional evaluation set

# task and tokenizer (optional): train on text columns with a local tokenizer, no Python needed. The task is
# {name: text-classification, text_column: text, label_column: label, max_length: 128} or
# {name: causal-lm, text_column: text, block_size: 128}; the model may then also be `builtin` (a small torch model
# sized from the tokenizer), {config: path/to/config.json} or {pretrained: path/to/folder} (transformers).
# task: text-classification
# tokenizer: tokenizer.json               # a tokenizers tokenizer.json, or a folder holding a saved tokenizer

# data_collator: trainwell:default_data_collator   # optional: a callable, or {factory: ..., kwargs: {...}}
# compute_metrics: mypackage.metrics:accuracy      # optional: a function taking an EvalPrediction

resume_from_checkpoint: auto   # a checkpoint path, true, false, or auto (the newest checkpoint if any)
report: true                   # write OUTPUT_DIR/report/ (plots and a summary) at the end

# TrainingArguments: any field may be set here, or on the command line as --key value.
output_dir: trainer_output
num_train_epochs: 3.0
max_steps: -1                  # a positive number overrides num_train_epochs
per_device_train_batch_size: 8
per_device_eval_batch_size: 8
gradient_accumulation_steps: 1
learning_rate: 5.0e-05
weight_decay: 0.0
lr_scheduler_type: linear
warmup_steps: 0
eval_strategy: 'no'            # no, steps or epoch (with steps, set eval_steps)
logging_steps: 500
save_strategy: steps           # no, steps, epoch or best
save_steps: 500
save_total_limit: null         # keep only the newest N checkpoints
seed: 42
bf16: false
report_to: none                # or trackers: [tensorboard, wandb, csv, jsonl, ...]; "live" is always added
"""
