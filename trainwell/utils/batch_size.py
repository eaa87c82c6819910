"""Out-of-memory errors and batch sizes: recognising an out-of-memory error (CUDA, MPS, the CPU allocator, HPU,
XPU; ``torch.OutOfMemoryError``), and ``find_executable_batch_size``, the reference's decorator that retries a
function with a smaller batch size.

With ``auto_find_batch_size=True`` the function runs under Accelerate's decorator of that name (on an
out-of-memory error it is called again with a smaller batch size); otherwise it is simply called with
``batch_size=starting_batch_size``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

_MESSAGES = (
    "CUDA out of memory.", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.", "DefaultCPUAllocator: can't allocate memory",
    "MPS backend out of memory", "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed", "XPU out of memory.",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says a device (or the host allocator) ran out of memory."""
    if isinstance(error, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(error, RuntimeError) and len(error.args) == 1 and any(m in str(error.args[0]) for m in _MESSAGES)


def eval_out_of_memory(error: BaseException) -> RuntimeError:
    """The error to raise for an out-of-memory evaluation during an ``auto_find_batch_size`` run."""
    return RuntimeError(
        "Evaluation ran out of memory during training. auto_find_batch_size only shrinks the training micro-batch: "
        "lower per_device_eval_batch_size (or set eval_accumulation_steps) instead."
    )


def find_executable_batch_size(
    function: Callable[..., Any] | None = None, starting_batch_size: int = 128, auto_find_batch_size: bool = False
) -> Any:
    """Decorate ``function(batch_size, ...)``; usable bare or with arguments, as in the reference."""
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 auto_find_batch_size=auto_find_batch_size)
    if auto_find_batch_size:
        from accelerate.utils import find_executable_batch_size as accelerate_search

        return accelerate_search(function=function, starting_batch_size=starting_batch_size)
    return functools.partial(function, batch_size=starting_batch_size)
