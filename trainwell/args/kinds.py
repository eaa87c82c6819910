"""Values of the wrong kind for their ``TrainingArguments`` field: refused at construction, naming the field.

The reference keeps such values and fails (or misbehaves) later: ``run_name=42`` reaches a tracker as a number,
``fp16_full_eval=3`` is a truthy int, ``deepspeed=42`` and ``fsdp=42`` fail deep inside their engines, and
``ddp_bucket_cap_mb=-5`` only when DDP builds its buckets. Field kinds are read from the declared annotations
(``fields.field_terms``, never the mutable ``Field.type``), so a field added later is covered by its annotation.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from trainwell.args.fields import bool_fields, text_fields

# Fields checked elsewhere with their own wording (output_dir: a path; choices: their enum's values).
_ELSEWHERE = frozenset({"output_dir", "torch_compile_backend", "torch_compile_mode", "fsdp", "optim_args"})


@functools.cache
def _checked(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init and f.name not in _ELSEWHERE)


def check_field_kinds(args: Any) -> None:
    """Raise ``ValueError`` for the first field holding a value of the wrong kind (see the module docstring)."""
    cls = type(args)
    checked = _checked(cls)
    for name, (allows_none, allows_false) in text_fields(cls).items():
        value = getattr(args, name)
        if name not in checked or value is None or isinstance(value, (str, os.PathLike)) or (
                value is False and allows_false):
            continue
        raise ValueError(f"{name}={value!r}: pass a string{' (or None)' if allows_none else ''}.")
    for name in bool_fields(cls):
        if name not in checked:
            continue
        value = getattr(args, name)
        if value is not None and not isinstance(value, bool) and value not in (0, 1):
            raise ValueError(f"{name}={value!r}: pass True or False.")
    bucket = args.ddp_bucket_cap_mb
    if bucket is not None and (isinstance(bucket, bool) or not isinstance(bucket, int) or bucket <= 0):
        raise ValueError(f"ddp_bucket_cap_mb={bucket!r}: pass a positive number of megabytes (DDP's default is "
                         "25), or None for DDP's default.")
    if args.deepspeed is not None and not isinstance(args.deepspeed, (str, os.PathLike, dict)):
        raise ValueError(f"deepspeed={args.deepspeed!r}: pass the path of a DeepSpeed JSON config, a JSON object "
                         "string, or a dict.")
    if args.liger_kernel_config is not None and not isinstance(args.liger_kernel_config, dict):
        raise ValueError(f"liger_kernel_config={args.liger_kernel_config!r}: pass a dict of Liger options such as "
                         "{'rope': True, 'swiglu': True}, or None.")


def check_fsdp_kind(value: Any) -> None:
    """``fsdp``: a bool, an option string ("full_shard auto_wrap"), a list of them, or None."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return
    raise ValueError(f"fsdp={value!r}: pass True, an option string such as 'full_shard auto_wrap', a list of "
                     "option strings, or False.")

