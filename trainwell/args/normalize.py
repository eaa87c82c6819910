"""Turn what a user passed to ``TrainingArguments`` into the one canonical form the rest of trainwell reads.

Owns: JSON-string dict fields, enum coercion (with did-you-mean), ``report_to`` resolution, bools and numbers
given as strings, derived defaults and the mixed-precision choice.
Cross-field checks live in :mod:`trainwell.args.validate`; the list of fields trainwell does not act on yet
lives in :mod:`trainwell.args.support`; the 4.x aliases in :mod:`trainwell.args.aliases`. Nothing here imports
torch or accelerate.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import numbers
import os
import warnings
from typing import Any

from trainwell.args.fields import check_known_keys, coerce_bools, numeric_fields
from trainwell.args.fsdp import normalize_fsdp
from trainwell.args.storage import normalize_storage
from trainwell.args.trackers import SWITCHES, TRACKERS, kubeflow_enabled
from trainwell.outputs import HubStrategy, IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType, enum_value
from trainwell.utils.errors import choice_error, did_you_mean

# Fields that accept a dict, or a JSON object string (parsed only when it starts with "{": any other string
# is a file path for the fields that take one).
DICT_FIELDS: tuple[str, ...] = (
    "accelerator_config",
    "fsdp_config",
    "deepspeed",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
    "lr_scheduler_kwargs",
    "parallelism_config",
)
# Of those, the ones where a non-JSON string cannot be a path and is therefore a mistake.
_DICT_ONLY_FIELDS = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs", "lr_scheduler_kwargs",
                     "parallelism_config")
# What a ParallelismConfig is made of (its device mesh, built later from these, is not an argument).
PARALLELISM_FIELDS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size",
                      "sp_backend")

ENUM_FIELDS: dict[str, type] = {
    "eval_strategy": IntervalStrategy,
    "logging_strategy": IntervalStrategy,
    "save_strategy": SaveStrategy,
    "hub_strategy": HubStrategy,
    "lr_scheduler_type": SchedulerType,
    "optim": OptimizerNames,
}

# Tracker names trainwell knows: the keys of the integrations registry (a light module: importing it
# imports no tracker), so a tracker added there is accepted here with no second list to keep in step.
KNOWN_REPORT_TO: tuple[str, ...] = (*TRACKERS, *SWITCHES)
_REPORT_TO_PACKAGES: dict[str, tuple[str, ...]] = {name: t.packages for name, t in TRACKERS.items()}

DEBUG_OPTIONS: tuple[str, ...] = ("underflow_overflow", "tpu_metrics_debug")
INCLUDE_TOKENS_CHOICES: tuple[str, ...] = ("all", "non_padding", "no")
MIXED_PRECISION_CHOICES: tuple[str, ...] = ("no", "fp16", "bf16", "fp8")

# Declared defaults that normalization rewrites; check_supported must compare against the rewritten form.
_NORMALIZED_DEFAULTS: dict[str, Any] = {"debug": []}


def coerce_enum(name: str, value: Any, enum_cls: type) -> Any:
    """``enum_cls(value)``, with an error that names the field and suggests the closest member."""
    try:
        return enum_cls(enum_value(value))
    except ValueError:
        raise choice_error(name, value, [m.value for m in enum_cls]) from None


def load_json_object(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """Read a JSON file that must hold one object; errors name ``what`` (the argument) and the path."""
    shown = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}={shown!r}: no such file; pass a dict or the path of a JSON file.") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}={shown!r}: the file is not valid JSON ({err}).") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what}={shown!r}: the file must hold a JSON object, not {type(data).__name__}.")
    return data


def to_plain(value: Any) -> Any:
    """JSON-friendly copy: enums → values, containers copied, objects with ``to_dict`` → dicts,
    torch dtypes → their short name (``"bfloat16"``), without importing torch."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if callable(getattr(value, "to_dict", None)):
        return to_plain(value.to_dict())
    if type(value).__name__ == "ParallelismConfig":  # its own to_json returns None (accelerate 1.15)
        return {name: getattr(value, name, None) for name in PARALLELISM_FIELDS}
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value).split(".")[-1]
    return value


# --- JSON-string dict fields ---------------------------------------------------------------------------


def _coerce_json_strings(mapping: dict[str, Any]) -> dict[str, Any]:
    # Command lines make people quote everything, and the reference turns "true"/"3"/"0.5" inside a JSON
    # string into bool/int/float. Matching it keeps '{"use_reentrant": "false"}' from becoming a truthy str.
    for key, value in mapping.items():
        if isinstance(value, dict):
            _coerce_json_strings(value)
        elif isinstance(value, str):
            if value.lower() in ("true", "false"):
                mapping[key] = value.lower() == "true"
            elif value.isdigit():
                mapping[key] = int(value)
            elif value.replace(".", "", 1).isdigit():
                mapping[key] = float(value)
    return mapping


def parse_json_fields(args: Any) -> None:
    """Parse each dict field given as a JSON object string; a non-JSON string stays (a file path).

    The fields are ``DICT_FIELDS`` and those a subclass adds to its ``_VALID_DICT_FIELDS`` (as TRL's configs do).
    """
    extra = [name for name in getattr(type(args), "_VALID_DICT_FIELDS", ()) if name not in DICT_FIELDS]
    for name in (*DICT_FIELDS, *extra):
        value = getattr(args, name, None)
        if not isinstance(value, str):
            continue
        if value.lstrip().startswith("{"):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{name}={value!r} is not valid JSON ({err.msg} at character {err.pos}). "
                    f"Pass a dict, or a JSON object string such as '{{\"key\": 1}}'."
                ) from None
            setattr(args, name, _coerce_json_strings(parsed))
        elif name in _DICT_ONLY_FIELDS:
            raise ValueError(f"{name}={value!r}: pass a dict, or a JSON object string such as '{{\"key\": 1}}'.")


def resolve_checkpointing(args: Any) -> None:
    """Fold the deprecated ``gradient_checkpointing*`` names into ``activation_checkpointing*``.

    The old names then mirror the new ones, so code reading either agrees, and a copy of the args
    (``dataclasses.replace``) that changes only the new name is not overridden by the stale old one.
    """
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if getattr(args, new) is None and getattr(args, old) is not None:
            if new.endswith("_kwargs") and not isinstance(getattr(args, old), dict):  # name what was passed
                raise ValueError(f"{old}={getattr(args, old)!r}: pass a dict, or a JSON object string such as "
                                 "'{\"key\": 1}'.")
            warnings.warn(f"{old} is deprecated, use {new} instead.", FutureWarning, stacklevel=6)
            setattr(args, new, getattr(args, old))
        setattr(args, old, getattr(args, new))
    if args.activation_checkpointing is None:
        args.activation_checkpointing = args.gradient_checkpointing = False


# --- report_to -----------------------------------------------------------------------------------------


def available_report_to() -> list[str]:
    """The trackers ``"all"`` stands for: as with the reference, the installed integrations, with its exceptions
    (see ``Tracker.in_all``); the built-in jsonl/csv loggers are asked for by name. Nothing is imported."""
    return [name for name, tracker in TRACKERS.items() if tracker.picked_by_all()]


def normalize_report_to(value: Any) -> list[str]:
    """``"all"`` → installed trackers; ``None``/``"none"`` → ``[]``; a name or names → a checked list.

    The reference turns ``None`` into ``[None]`` and then fails in the Trainer; here it simply means none.
    """
    try:
        names = [value] if value is None or isinstance(value, str) else list(value)
    except TypeError:
        raise ValueError(
            f"report_to={value!r}: pass a tracker name such as 'tensorboard', a list of names, 'all' (the installed "
            "ones) or 'none'."
        ) from None
    if names in ([None], ["none"], []):
        return _with_kubeflow([])
    if "none" in names:
        raise ValueError(f"report_to={value!r} asks for 'none' and for trackers: pass 'none' alone, or the trackers.")
    if "all" in names:  # "all" next to names: the installed trackers plus those (e.g. ["all", "jsonl"])
        names = available_report_to() + [name for name in names if name != "all"]
    for name in names:
        if name not in KNOWN_REPORT_TO:
            raise ValueError(
                f"report_to={value!r}: {name!r} is not a tracker trainwell knows. Use any of "
                f"{', '.join(map(repr, KNOWN_REPORT_TO))}, 'all' (the installed ones) or 'none'."
                + did_you_mean(name, KNOWN_REPORT_TO)
            )
    return _with_kubeflow(list(dict.fromkeys(names)))


def _with_kubeflow(names: list[str]) -> list[str]:
    """Inside a Kubeflow TrainJob the reference always reports progress to its controller, whatever report_to
    says (``DISABLE_KUBEFLOW_INTEGRATION=true`` turns that off); so does trainwell."""
    return names + ["kubeflow"] if kubeflow_enabled() and "kubeflow" not in names else names


# --- numbers given as strings -----------------------------------------------------------------------------------


def _to_number(name: str, given: Any, kind: type) -> int | float:
    value = given
    if isinstance(given, str):
        try:
            value = float(given) if kind is float or not given.strip().lstrip("+-").isdigit() else int(given)
        except ValueError:
            raise ValueError(f"{name}={given!r}: pass a number ({kind.__name__}).") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}={given!r}: pass a number ({kind.__name__}).")
    if kind is int:
        if not float(value).is_integer():
            raise ValueError(f"{name}={given!r}: pass a whole number.")
        return int(value)
    return value


# int fields where the reference refuses a float, even a whole one (its check is ``isinstance(value, int)``), so a
# config that passes here passes there: ``torch_empty_cache_steps=1.0`` is an error in both.
_INT_ONLY_FIELDS = frozenset({"torch_empty_cache_steps"})


def coerce_numbers(args: Any) -> None:
    """Check int/float fields hold numbers; numeric strings become numbers, whole floats in int fields ints
    (except in the fields of ``_INT_ONLY_FIELDS``, where validation refuses a float as the reference does).

    YAML 1.1 reads ``learning_rate: 5e-5`` as the *string* "5e-5" (it wants ``5.0e-5``), and JSON writers
    may turn 8 into 8.0. A value that is not a number is an error here rather than a ``TypeError`` deep
    inside the optimizer.
    """
    for name, (kind, optional) in numeric_fields(type(args)).items():
        value = getattr(args, name)
        if name in _INT_ONLY_FIELDS and isinstance(value, float):
            continue  # left a float, for validation to refuse
        if value is not None or not optional:
            setattr(args, name, _to_number(name, value, kind))


# --- the whole pass --------------------------------------------------------------------------------------


def _unmask_tokens(args: Any) -> None:
    # to_dict() writes "<HUB_TOKEN>" in place of the token; reading such a dump back must not turn the
    # placeholder into a real (and unsupported) token.
    for f in dataclasses.fields(args):
        if f.name.endswith("_token") and getattr(args, f.name) == f"<{f.name.upper()}>":
            setattr(args, f.name, None)


# What transformers 4.x wrote into every to_dict() dump even with FSDP off.
_FSDP_CONFIG_4X_STUB = {"min_num_params": 0, "xla": False, "xla_fsdp_v2": False, "xla_fsdp_grad_ckpt": False}


def _drop_inert_4x_values(args: Any) -> None:
    # A saved 4.x training_args.json carries these values although they did nothing in that run; treating
    # them as unset lets such a file load instead of tripping the "not supported yet" check.
    config = args.fsdp_config
    if not args.fsdp and isinstance(config, dict) and config.items() <= _FSDP_CONFIG_4X_STUB.items():
        args.fsdp_config = None
    if not args.push_to_hub and args.hub_private_repo is False:
        args.hub_private_repo = None


def _normalize_debug(value: Any) -> list[str]:
    if value is None:
        return []
    items = value.split() if isinstance(value, str) else [enum_value(v) for v in value]
    for item in items:
        if item not in DEBUG_OPTIONS:
            raise choice_error("debug", item, DEBUG_OPTIONS)
    return items


def _normalize_include_tokens(value: Any) -> str:
    if isinstance(value, bool):
        return "all" if value else "no"
    text = str(value).lower()
    if text in ("true", "yes", "1"):
        return "all"
    if text in ("false", "none", "0"):
        return "no"
    if text not in INCLUDE_TOKENS_CHOICES:
        raise choice_error("include_num_input_tokens_seen", value, INCLUDE_TOKENS_CHOICES + (True, False))
    return text


def _default_disable_tqdm() -> bool:
    # The trainwell logger inherits the root level unless set on its own, so a user who quiets either one
    # (e.g. logging.basicConfig(level=ERROR)) also loses the progress bars, as with the reference.
    return logging.getLogger("trainwell").getEffectiveLevel() > logging.WARN


def derive_defaults(args: Any) -> None:
    """Fill the values the reference derives from others: ``do_eval`` when evaluating; ``eval_steps`` from
    ``logging_steps``; ``metric_for_best_model="loss"`` when a best model or a metric-driven schedule needs
    one; ``greater_is_better`` from the metric name; ``lr_scheduler_kwargs={}``; the compile switch and
    backend; no pinned memory on CPU."""
    if args.eval_strategy != IntervalStrategy.NO:
        args.do_eval = True
    if args.eval_strategy == IntervalStrategy.STEPS and not args.eval_steps and args.logging_steps:
        args.eval_steps = args.logging_steps
    metric = args.metric_for_best_model
    if metric is not None and not isinstance(metric, str):
        raise ValueError(f"metric_for_best_model={metric!r}: pass the name of a metric, such as 'loss' or 'accuracy'.")
    needs_metric = args.load_best_model_at_end or args.lr_scheduler_type in (
        SchedulerType.REDUCE_ON_PLATEAU,
        SchedulerType.GREEDY,
    )
    if needs_metric and args.metric_for_best_model is None:
        args.metric_for_best_model = "loss"
    if args.greater_is_better is None and args.metric_for_best_model is not None:
        args.greater_is_better = not args.metric_for_best_model.endswith("loss")
    if args.lr_scheduler_kwargs is None:  # the reference keeps None; a dict spares every reader the check
        args.lr_scheduler_kwargs = {}
    # Naming a compile mode or backend means "compile": the reference turns the switch on for you.
    if args.torch_compile_mode is not None or args.torch_compile_backend is not None:
        args.torch_compile = True
    if args.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"
    if args.use_cpu:
        args.dataloader_pin_memory = False


def resolve_mixed_precision(args: Any) -> str:
    """``"no"``/``"fp16"``/``"bf16"`` from the flags; ``ACCELERATE_MIXED_PRECISION`` wins when set.

    Difference from the reference (flags beat the env var): ``accelerate launch --mixed_precision`` sets
    the variable, and the launcher's choice is the one the whole job was configured for.
    """
    from_flags = "fp16" if args.fp16 else "bf16" if args.bf16 else "no"
    env = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if not env:
        return from_flags
    env = env.lower()
    if env not in MIXED_PRECISION_CHOICES:
        raise ValueError(
            f"ACCELERATE_MIXED_PRECISION={env!r} is not a precision: set it to one of "
            f"{', '.join(map(repr, MIXED_PRECISION_CHOICES))}, or unset it and use fp16=True / bf16=True."
        )
    if from_flags != "no" and env != from_flags:
        warnings.warn(
            f"ACCELERATE_MIXED_PRECISION={env!r} overrides {from_flags}=True; unset the variable to use the flag.",
            UserWarning,
            stacklevel=6,
        )
    return env


def to_accelerator_config(value: Any, config_cls: type) -> Any:
    """None, a dict, a JSON file path, or a config object → an instance of ``config_cls``."""
    if isinstance(value, config_cls):
        return value
    if value is None:
        return config_cls()
    if isinstance(value, type):
        raise TypeError(
            f"accelerator_config={value.__name__}: pass an instance such as {value.__name__}(), not the class."
        )
    if isinstance(value, str):
        return config_cls.from_json_file(value)
    if hasattr(value, "to_dict") and not isinstance(value, dict):
        value = value.to_dict()  # e.g. transformers' own AcceleratorConfig during a migration
    if not isinstance(value, dict):
        raise TypeError(f"accelerator_config={value!r}: pass a dict, a JSON file path or an AcceleratorConfig.")
    return config_cls.from_dict(value)


def to_parallelism_config(value: Any) -> Any:
    """None or a ``ParallelismConfig`` as given; a dict (or JSON object string) of its sizes → Accelerate's
    ``ParallelismConfig``, so a config file or the command line can set it too."""
    if value is None or type(value).__name__ == "ParallelismConfig":
        return value
    if not isinstance(value, dict):
        raise TypeError(
            f"parallelism_config={value!r}: pass an accelerate.ParallelismConfig, or a dict of its sizes such as "
            "{'dp_shard_size': 2, 'tp_size': 2}."
        )

    check_known_keys(value, set(PARALLELISM_FIELDS), "parallelism_config")
    from accelerate import ParallelismConfig

    return ParallelismConfig(**value)


def normalize_args(args: Any, accelerator_config_cls: type) -> None:
    """Every rewrite ``__post_init__`` performs before validation, in dependency order."""
    if args.output_dir is None:
        args.output_dir = "trainer_output"
    try:
        args.output_dir = os.path.expanduser(os.fspath(args.output_dir))
    except TypeError:
        raise TypeError(
            f"output_dir={args.output_dir!r}: pass a directory path (a str or os.PathLike), or None to use "
            "'trainer_output'."
        ) from None
    normalize_storage(args)
    _unmask_tokens(args)
    coerce_numbers(args)
    coerce_bools(args)
    if isinstance(args.include_for_metrics, str):  # the reference's `"inputs" in args.include_for_metrics` works too
        args.include_for_metrics = args.include_for_metrics.replace(",", " ").split()
    parse_json_fields(args)
    _drop_inert_4x_values(args)
    normalize_fsdp(args)
    resolve_checkpointing(args)
    if args.disable_tqdm is None:
        args.disable_tqdm = _default_disable_tqdm()
    args.include_num_input_tokens_seen = _normalize_include_tokens(args.include_num_input_tokens_seen)
    for name, enum_cls in ENUM_FIELDS.items():
        setattr(args, name, coerce_enum(name, getattr(args, name), enum_cls))
    args.debug = _normalize_debug(args.debug)
    args.report_to = normalize_report_to(args.report_to)
    derive_defaults(args)
    args.mixed_precision = resolve_mixed_precision(args)
    args.accelerator_config = to_accelerator_config(args.accelerator_config, accelerator_config_cls)
    args.parallelism_config = to_parallelism_config(args.parallelism_config)


@functools.cache
def declared_defaults(cls: type) -> dict[str, Any]:
    """Field name → declared default (factories called), in the form normalization leaves it in."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    out.update({k: v for k, v in _NORMALIZED_DEFAULTS.items() if k in out})
    return out
