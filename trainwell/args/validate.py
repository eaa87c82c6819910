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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from trainwell.outputs import IntervalStrategy, SaveStrategy, SchedulerType
from trainwell.utils.errors import choice_error, did_you_mean

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
            f"torch_empty_cache_steps={args.torch_empty_cache_steps!r}: pass a positive integer, "
            "or None to never empty the device cache."
        )


def _check_numbers(args: Any) -> None:
    if args.learning_rate < 0:
        raise ValueError(f"learning_rate={args.learning_rate!r}: pass a learning rate >= 0, such as 5e-5.")
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
    _check_sizes,
    _check_numbers,
    _check_intervals,
    _check_best_model,
    _check_precision,
    _check_compile,
    _check_scheduler,
    _check_dataloader,
    _check_optim_args,
    _check_choices,
)


def check_known_keys(data: Mapping[str, Any], known: set[str], what: str) -> None:
    """Raise ``ValueError`` naming every key of ``data`` not in ``known``, with a guess for the first."""
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise ValueError(
            f"{what} got unknown key(s) {', '.join(map(repr, unknown))}.{did_you_mean(unknown[0], known)}"
        )


def validate_args(args: Any) -> None:
    """Raise ``ValueError`` for the first impossible value or combination (see the module docstring)."""
    for check in _CHECKS:
        check(args)
