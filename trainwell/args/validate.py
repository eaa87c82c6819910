"""Cross-field checks on normalized ``TrainingArguments``.

Owns: every ``ValueError`` raised at construction for a value or combination that cannot work. Each message
starts with ``name=value`` and ends with the fix. Runs after :mod:`trainwell.args.normalize` (so strategies
are enums and derived defaults are filled) and before :func:`trainwell.args.support.check_supported`.

The one rewrite done here: an interval given as an integral float (``save_steps=500.0``, what argparse
produces for a ``float`` field) becomes an ``int``, because that is only known to be safe once checked.

Deliberate differences from the reference:
* ``bf16=True`` on a machine without a GPU is accepted: Accelerate runs CPU autocast in bf16. Whether a
  GPU supports bf16 is checked when the Trainer builds its runtime, not here, so that constructing the
  arguments never imports torch or touches a device.
* ``tf32=True`` is applied (and checked) by the runtime, not by flipping global torch flags here.
* Batch sizes, ``gradient_accumulation_steps``, ``learning_rate``, ``num_train_epochs``, worker counts and
  non-positive save/eval/logging intervals are checked too (the reference fails later, or never).
* Single values the reference accepts and then fails on, or silently misreads, are refused here: NaN or
  infinite floats, Adam betas outside [0, 1), negative ``adam_epsilon``/``weight_decay``, label smoothing
  outside [0, 1], seeds numpy or torch would refuse, ``label_names`` given as one string, an ``output_dir``
  that is (or lies under) a file. Values that still do something are kept, with a ``UserWarning`` naming
  what they do: ``max_steps`` below -1 and a negative ``max_grad_norm``, ``eval_delay`` or
  ``save_total_limit`` (each the same as its "off" value), ``num_train_epochs=0`` (trains nothing),
  ``label_smoothing_factor=1`` (ignores the labels), an ``output_dir`` this process cannot write to.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from trainwell.args.fields import coerce_bools, numeric_fields
from trainwell.args.resilience import check_resilience
from trainwell.args.storage import check_storage_args, is_url
from trainwell.outputs import IntervalStrategy, SaveStrategy, SchedulerType
from trainwell.utils.errors import choice_error

INCLUDE_FOR_METRICS_CHOICES: tuple[str, ...] = ("inputs", "loss")
# What Accelerate's dynamo plugin accepts (accelerate.utils.DynamoBackend), written out so that constructing the
# arguments imports neither accelerate nor torch; and torch.compile's modes.
COMPILE_BACKENDS: tuple[str, ...] = (
    "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser", "cudagraphs", "ofi", "fx2trt", "onnxrt",
    "tensorrt", "aot_torchxla_trace_once", "torchxla_trace_once", "tvm", "hpu_backend", "neuron",
)
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_sizes(args: Any) -> None:
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
        value = getattr(args, name)
        if not _positive_int(value):
            raise ValueError(f"{name}={value!r}: pass a positive integer (the batch size on each device).")
    if not _positive_int(args.gradient_accumulation_steps):
        raise ValueError(
            f"gradient_accumulation_steps={args.gradient_accumulation_steps!r}: pass an integer >= 1 "
            "(1 means one optimizer step per batch)."
        )
    if not isinstance(args.dataloader_num_workers, int) or args.dataloader_num_workers < 0:
        raise ValueError(
            f"dataloader_num_workers={args.dataloader_num_workers!r}: pass 0 (load in the main process) "
            "or a positive number of worker processes."
        )
    if args.eval_accumulation_steps is not None and not _positive_int(args.eval_accumulation_steps):
        raise ValueError(
            f"eval_accumulation_steps={args.eval_accumulation_steps!r}: pass a positive number of evaluation "
            "steps after which predictions move off the device, or None to keep them there until the end."
        )
    if args.torch_empty_cache_steps is not None and not _positive_int(args.torch_empty_cache_steps):
        raise ValueError(
            f"torch_empty_cache_steps={args.torch_empty_cache_steps!r}: pass a positive integer (an int such "
            "as 10, not a float: the reference refuses 1.0 too), or None to never empty the device cache."
        )


# --- single values: finite, in range, of the right kind ---------------------------------------------------------------

# Float fields where infinity means something, as with the reference: max_grad_norm=inf measures the gradient norm
# and never clips; num_train_epochs=inf is fine when max_steps > 0 ends the run (see _check_numbers).
_INF_MEANS_SOMETHING = frozenset({"max_grad_norm", "num_train_epochs"})
# The seeds the reference's Trainer() accepts (numpy's legacy np.random.seed), and torch.manual_seed's range.
_NUMPY_SEEDS, _TORCH_SEEDS = (0, 2**32), (-(2**63), 2**64)

# field -> (whether a value is usable, the fix). Runs on finite numbers; None (where allowed) is skipped.
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "adam_beta1": (lambda v: 0 <= v < 1, "pass a decay rate in [0, 1), such as 0.9 (torch's Adam refuses others)"),
    "adam_beta2": (lambda v: 0 <= v < 1, "pass a decay rate in [0, 1), such as 0.999 (torch's Adam refuses others)"),
    "adam_epsilon": (lambda v: v >= 0, "pass a small number >= 0, such as 1e-8"),
    "weight_decay": (lambda v: v >= 0, "pass 0 (no weight decay) or a positive rate, such as 0.01"),
    "label_smoothing_factor": (lambda v: 0 <= v <= 1, "pass a factor in [0, 1): 0 disables smoothing, 0.1 is typical"),
    "seed": (lambda v: _NUMPY_SEEDS[0] <= v < _NUMPY_SEEDS[1],
             "pass an integer from 0 to 2**32 - 1, the range numpy's seeding accepts"),
    "data_seed": (lambda v: _TORCH_SEEDS[0] <= v < _TORCH_SEEDS[1],
                  "pass an integer torch.Generator.manual_seed accepts (-2**63 to 2**64 - 1), or None to use seed"),
    "neftune_noise_alpha": (lambda v: v > 0, "pass a positive noise scale, such as 5.0, or None to turn NEFTune off"),
    "dataloader_prefetch_factor": (lambda v: v >= 1, "pass a positive number of batches each worker loads ahead, "
                                   "or None for torch's default (2)"),
    "ddp_timeout": (lambda v: v > 0, "pass a positive number of seconds (the default is 1800; 0 does not "
                    "disable the timeout)"),
}


@functools.cache
def _float_fields(cls: type) -> dict[str, Any]:
    """The float fields ``TrainingArguments`` declares (not those a subclass ``cls`` adds) -> their declared default.

    The class is found in ``cls``'s bases by name: ``trainwell.training_args`` imports this module, so this one
    does not import it back."""
    declared = next((c for c in cls.__mro__ if c.__module__ == "trainwell.training_args"
                     and c.__name__ == "TrainingArguments"), cls)
    defaults = {f.name: f.default for f in dataclasses.fields(declared)}
    return {name: defaults[name] for name, (kind, _) in numeric_fields(declared).items() if kind is float}


def _check_finite(args: Any) -> None:
    """NaN passes every comparison-based range check (``nan < 0`` is False), so non-finite floats go first."""
    for name, default in _float_fields(type(args)).items():
        value = getattr(args, name, None)
        if value is None or math.isfinite(value) or (math.isinf(value) and name in _INF_MEANS_SOMETHING):
            continue
        if math.isnan(value) and name == "max_grad_norm":
            raise ValueError(f"max_grad_norm={value!r} turns gradient clipping off silently: pass a positive norm "
                             "such as 1.0, 0 to disable clipping, or inf to log the norm without clipping.")
        unset = "None, the default" if default is None else f"the default is {default!r}"
        raise ValueError(f"{name}={value!r}: pass a finite number ({unset}).")


def _check_ranges(args: Any) -> None:
    for name, (usable, fix) in _RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not usable(value):
            raise ValueError(f"{name}={value!r}: {fix}.")


def _warn(message: str) -> None:
    # user -> AliasInitMeta's __init__ wrapper -> dataclass __init__ -> __post_init__ -> validate_args -> check -> here
    warnings.warn(message, UserWarning, stacklevel=7)


def _check_odd_values(args: Any) -> None:
    """Values the reference runs with, but that read like a mistake: warn, naming what they do."""
    if args.max_steps < -1:
        _warn(f"max_steps={args.max_steps!r} is the same as max_steps=-1: the run length comes from "
              "num_train_epochs. Pass max_steps > 0 to train that many steps, or -1 to train by epochs.")
    if args.max_steps <= 0 and args.num_train_epochs == 0:
        _warn(f"num_train_epochs={args.num_train_epochs!r} with max_steps={args.max_steps!r}: train() would run no "
              "optimizer step. Pass num_train_epochs > 0 or max_steps > 0 (nothing to fix if you only evaluate).")
    if args.max_grad_norm < 0:
        _warn(f"max_grad_norm={args.max_grad_norm!r} disables gradient clipping, as 0 does. Pass 0 to disable it, "
              "or a positive norm such as 1.0 to clip.")
    if args.label_smoothing_factor == 1:
        _warn(f"label_smoothing_factor={args.label_smoothing_factor!r} makes every target uniform, so the loss "
              "ignores the labels. Pass a factor below 1, such as 0.1.")
    if args.eval_delay < 0:
        _warn(f"eval_delay={args.eval_delay!r} is the same as eval_delay=0 (no delay). Pass 0, or a positive "
              "number of steps or epochs (per eval_strategy) to wait before the first evaluation.")
    limit = args.save_total_limit
    if limit is not None and limit <= 0:
        _warn(f"save_total_limit={limit!r} keeps every checkpoint (a limit <= 0 means no limit). Pass None for "
              "no limit, a positive number of checkpoints to keep, or save_strategy='no' to save none.")


def _check_kinds(args: Any) -> None:
    """Container fields whose wrong kind the reference accepts and later misreads (a str iterated per letter)."""
    for name, example in (("label_names", "['labels']"), ("optim_target_modules", "['attn', 'mlp']")):
        value = getattr(args, name)
        if value is None or (name == "optim_target_modules" and isinstance(value, str)):
            continue
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
            isinstance(item, str) for item in value
        ):
            also = " or one name/regex string" if name == "optim_target_modules" else ""
            raise ValueError(f"{name}={value!r}: pass a list of names such as {example}{also}.")


def _check_output_dir(args: Any) -> None:
    """What can be known without creating anything; the Trainer creates the directory."""
    path = args.output_dir
    check_storage_args(args)
    if is_url(path):  # an object store: its bucket is checked when the Trainer first reaches it
        return
    if not isinstance(path, str):  # bytes: os.fspath accepts them; leave them to the filesystem
        return
    if path == "":
        raise ValueError("output_dir='': pass the directory to write checkpoints into, or leave output_dir unset "
                         "(None) to use 'trainer_output'.")
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            _warn(f"output_dir={path!r} is not writable by this process: saving a checkpoint or the model will "
                  "fail. Pass a directory you can write to (evaluate() and predict() alone write nothing).")
        return
    if os.path.lexists(path):
        what = "a file" if os.path.isfile(path) else "not a directory"
        raise ValueError(f"output_dir={path!r} is {what}: pass a directory path (the Trainer writes checkpoints "
                         "into it), or move what is there.")
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if os.path.lexists(parent) and not os.path.isdir(parent):
        raise ValueError(f"output_dir={path!r} lies under {parent!r}, which is a file, so the directory cannot be "
                         "created: pass a path whose parent folders are directories.")
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        _warn(f"output_dir={path!r} cannot be created: {parent!r} is not writable by this process, so the Trainer "
              "will fail to save. Pass a path under a directory you can write to.")


def _check_numbers(args: Any) -> None:
    if args.learning_rate < 0:
        raise ValueError(f"learning_rate={args.learning_rate!r}: pass a learning rate >= 0, such as 5e-5.")
    if math.isinf(args.num_train_epochs) and args.max_steps <= 0:
        raise ValueError(
            f"num_train_epochs={args.num_train_epochs!r} with max_steps={args.max_steps!r} never ends: pass a "
            "finite number of epochs, or max_steps > 0 to stop after that many optimizer steps."
        )
    if args.num_train_epochs < 0:
        raise ValueError(
            f"num_train_epochs={args.num_train_epochs!r}: pass a number of epochs >= 0 "
            "(or set max_steps > 0, which takes precedence)."
        )
    warmup = args.warmup_steps
    if warmup < 0:
        raise ValueError(
            f"warmup_steps={warmup!r}: pass 0 (no warmup), a ratio of the total steps in (0, 1), "
            "or a whole number of steps."
        )
    if warmup > 1 and warmup != int(warmup):
        raise ValueError(
            f"warmup_steps={warmup!r}: values >= 1 count steps and must be whole; "
            f"pass warmup_steps={int(warmup)}, or a ratio below 1."
        )


def _check_interval(args: Any, what: str, no_value: str) -> None:
    """``{what}_steps`` under ``{what}_strategy='steps'``: positive; whole when >= 1 (then cast to int)."""
    strategy_name, steps_name = f"{what}_strategy", f"{what}_steps"
    if getattr(args, strategy_name) != IntervalStrategy.STEPS:
        return
    steps = getattr(args, steps_name)
    if steps is None or isinstance(steps, bool) or steps <= 0:
        raise ValueError(
            f"{steps_name}={steps!r}: pass a positive integer (or a ratio of the total steps in (0, 1)), "
            f"or {strategy_name}={no_value!r}."
        )
    if steps > 1:
        if steps != int(steps):
            raise ValueError(
                f"{steps_name}={steps!r}: values >= 1 count steps and must be whole; "
                f"pass {steps_name}={int(steps)}, or a ratio below 1."
            )
        setattr(args, steps_name, int(steps))


def _check_intervals(args: Any) -> None:
    _check_interval(args, "logging", "no")
    _check_interval(args, "eval", "no")
    _check_interval(args, "save", "no")


def _check_best_model(args: Any) -> None:
    if not args.load_best_model_at_end or args.save_strategy == SaveStrategy.BEST:
        return
    if args.eval_strategy.value != args.save_strategy.value:
        raise ValueError(
            f"load_best_model_at_end=True with eval_strategy={args.eval_strategy.value!r} and "
            f"save_strategy={args.save_strategy.value!r}: the best model can only be reloaded from a checkpoint "
            "saved when it was evaluated. Use the same strategy for both, or save_strategy='best'."
        )
    if args.eval_strategy != IntervalStrategy.STEPS:
        return
    save, every = args.save_steps, args.eval_steps
    if (save < 1) != (every < 1):
        raise ValueError(
            f"save_steps={save!r} with eval_steps={every!r}: load_best_model_at_end=True needs save_steps to be "
            "a multiple of eval_steps, which a mix of a ratio and a step count cannot guarantee. "
            "Give both as step counts, or both as ratios."
        )
    # Ratios compare on a fixed-point grid so that 0.2 % 0.1 is not thrown off by float rounding.
    scale = 1 if save >= 1 else 1_000_000
    if round(save * scale) % round(every * scale) != 0:
        lower = int(save // every * every)
        near = " or ".join(str(m) for m in (lower, lower + int(every)) if m > 0)
        hint = f"e.g. save_steps={near}" if scale == 1 else "a save ratio that is a multiple of it"
        raise ValueError(
            f"save_steps={save!r} is not a multiple of eval_steps={every!r}: load_best_model_at_end=True "
            f"reloads a checkpoint saved right after an evaluation. Pass {hint}."
        )


def _check_precision(args: Any) -> None:
    if args.fp16 and args.bf16:
        raise ValueError("fp16=True and bf16=True: choose one mixed precision (set the other to False).")
    if args.fp16_full_eval and args.bf16_full_eval:
        raise ValueError(
            "fp16_full_eval=True and bf16_full_eval=True: choose one evaluation precision (set the other to False)."
        )


def _check_compile(args: Any) -> None:
    if args.torch_compile_backend is not None and args.torch_compile_backend not in COMPILE_BACKENDS:
        raise choice_error("torch_compile_backend", args.torch_compile_backend, COMPILE_BACKENDS)
    if args.torch_compile_mode is not None and args.torch_compile_mode not in COMPILE_MODES:
        raise choice_error("torch_compile_mode", args.torch_compile_mode, COMPILE_MODES)


def _check_scheduler(args: Any) -> None:
    if args.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY):
        if args.eval_strategy == IntervalStrategy.NO:
            raise ValueError(
                f"lr_scheduler_type={args.lr_scheduler_type.value!r} adjusts the learning rate from evaluation "
                "metrics, but eval_strategy='no': set eval_strategy='steps' or 'epoch', or pick another scheduler."
            )
    for name in ("lr_scheduler_kwargs", "activation_checkpointing_kwargs"):
        value = getattr(args, name)
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{name}={value!r}: pass a dict, or a JSON object string such as '{{\"key\": 1}}'.")


def _check_optim_args(args: Any) -> None:
    value = args.optim_args
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(
            f"optim_args={value!r}: pass a 'key=value,key2=value2' string (e.g. 'momentum=0.9,nesterov=true') "
            "or a dict of option names to values."
        )
    for key, item in value.items():
        if not isinstance(item, (str, int, float, bool)):
            raise ValueError(f"optim_args[{key!r}]={item!r}: each optimizer option must be a number, a bool or a "
                             "string.")


def _check_dataloader(args: Any) -> None:
    if args.dataloader_prefetch_factor is not None and args.dataloader_num_workers == 0:
        raise ValueError(
            f"dataloader_prefetch_factor={args.dataloader_prefetch_factor!r} with dataloader_num_workers=0: "
            "prefetching needs worker processes. Set dataloader_num_workers > 0, "
            "or leave dataloader_prefetch_factor=None."
        )
    if args.dataloader_persistent_workers and args.dataloader_num_workers == 0:
        raise ValueError(
            "dataloader_persistent_workers=True with dataloader_num_workers=0: there are no worker processes to "
            "keep alive. Set dataloader_num_workers > 0, or dataloader_persistent_workers=False."
        )


def _check_choices(args: Any) -> None:
    """Fields whose metadata lists ``choices`` (what argparse enforces) are checked for Python callers too."""
    for f in dataclasses.fields(args):
        choices = f.metadata.get("choices")
        value = getattr(args, f.name)
        if choices is not None and value is not None and value not in choices:
            raise choice_error(f.name, value, choices)
    for item in args.include_for_metrics or []:
        if item not in INCLUDE_FOR_METRICS_CHOICES:
            raise choice_error("include_for_metrics", item, INCLUDE_FOR_METRICS_CHOICES)


_CHECKS: tuple[Callable[[Any], None], ...] = (
    _check_finite,
    check_resilience,
    _check_sizes,
    _check_numbers,
    _check_ranges,
    _check_odd_values,
    _check_kinds,
    _check_output_dir,
    _check_intervals,
    _check_best_model,
    _check_precision,
    _check_compile,
    _check_scheduler,
    _check_dataloader,
    _check_optim_args,
    _check_choices,
)


def checked_values(args: Any) -> Any:
    """``args`` after the single-value checks (finite floats, ranges, kinds): what a ``set_*`` method ends with.
    Cross-field checks wait for construction, as a script may pass through a mixed state between two setters."""
    coerce_bools(args)  # "no" for a bool field means False, as at construction
    for check in (_check_finite, _check_ranges, _check_kinds):
        check(args)
    return args


def validate_args(args: Any) -> None:
    """Raise ``ValueError`` for the first impossible value or combination (see the module docstring)."""
    from trainwell.args.kinds import check_field_kinds

    for check in (check_field_kinds, *_CHECKS):
        check(args)


def require_steps(strategy: Any, steps: Any, what: str) -> None:
    """``set_evaluate``/``set_save``/``set_logging``: a ``"steps"`` strategy needs a positive number of steps."""
    if strategy == "steps" and not steps:
        raise ValueError(f"steps={steps!r} with {what}_strategy='steps': pass a positive number of steps.")
