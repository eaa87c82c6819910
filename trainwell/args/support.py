"""Which ``TrainingArguments`` fields trainwell does not act on yet.

Owns the one list of such fields. ``TrainingArguments.__post_init__`` calls :func:`check_supported`, so a
script that sets one of them fails at construction with a message naming the field, its value and what to
do, instead of training while silently ignoring it. When a feature lands, its row leaves this table (and a
test that sets the field starts passing instead of expecting the error).
"""

from __future__ import annotations

from typing import Any

from trainwell.outputs import enum_value

# field -> why it is not honoured yet. A field is only an error when set to something other than its default
# (or, for the entries in _ALLOWED_VALUES, to a value outside the supported ones).
UNSUPPORTED: dict[str, str] = {}

# ParallelismConfig dimensions trainwell does not run, with why (checked by _check_parallelism).
_MESH_DIMENSIONS_NOT_RUN: dict[str, str] = {
    "cp_size": "context parallelism shards attention over the sequence with torch's CUDA-only SDPA context-parallel "
               "kernels, and trainwell has not wired the sequence sharding of batches it needs (no GPU here to "
               "verify it on)",
    "sp_size": "sequence parallelism runs DeepSpeed's Ulysses attention on GPUs, which trainwell has not wired "
               "(no GPU here to verify it on)",
}

# Fields where some values are supported and others are not (none today: the mechanism stays for the next).
_ALLOWED_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {}


def check_supported(args: Any, defaults: dict[str, Any]) -> None:
    """Raise ``NotImplementedError`` for the first field set to a value trainwell would ignore.

    ``defaults`` maps field name -> declared default, so a field left at its default is never an error.
    """
    for name, why in UNSUPPORTED.items():
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if _is_default(value, defaults.get(name)):
            continue
        raise NotImplementedError(
            f"TrainingArguments.{name}={value!r} is not supported by trainwell yet ({why}). "
            f"Leave {name} at its default ({defaults.get(name)!r}) to train without it."
        )
    _check_debug(args)
    _check_parallelism(getattr(args, "parallelism_config", None))
    for name, (allowed, why) in _ALLOWED_VALUES.items():
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        plain = enum_value(value)
        if plain not in allowed:
            raise NotImplementedError(
                f"TrainingArguments.{name}={plain!r} is not supported by trainwell yet ({why}). "
                f"Use one of {', '.join(repr(a) for a in allowed)}."
            )


def _check_parallelism(config: Any) -> None:
    """``parallelism_config``: data (``dp_replicate_size``), sharded data (``dp_shard_size``, with ``fsdp``) and
    tensor (``tp_size``) parallelism run; a dimension of ``_MESH_DIMENSIONS_NOT_RUN`` above 1 is refused."""
    if config is None:
        return
    for name, why in _MESH_DIMENSIONS_NOT_RUN.items():
        size = getattr(config, name, 1) or 1
        if size > 1:
            raise NotImplementedError(
                f"TrainingArguments.parallelism_config.{name}={size} is not supported by trainwell yet: {why}. "
                f"Set {name}=1; dp_replicate_size, dp_shard_size (with fsdp) and tp_size are supported."
            )


def _check_debug(args: Any) -> None:
    if "tpu_metrics_debug" in (getattr(args, "debug", None) or []):
        raise NotImplementedError(
            "TrainingArguments.debug='tpu_metrics_debug' is not supported by trainwell: it reports XLA metrics of a "
            "TPU run, and trainwell runs on CPUs and GPUs. Use debug='underflow_overflow', or leave debug empty."
        )


def _is_default(value: Any, default: Any) -> bool:
    plain = enum_value(value)
    if plain == default:
        return True
    # Empty containers and "" count as unset for list/dict/str fields declared with a None default.
    return default is None and plain in ("", [], {}, ())
