"""Liger kernels (``use_liger_kernel``, ``liger_kernel_config``): Triton kernels patched into a transformers model.

Owns the checks and the call into the ``liger-kernel`` package (``_apply_liger_kernel_to_instance``, which patches
the model in place, as the reference applies it). Liger's kernels are Triton kernels for CUDA GPUs: without the
package, without a GPU, or with a model that is not a transformers model, training stops with an error naming
what is missing instead of running without the kernels that were asked for (the reference only warns for the
last case).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch


def apply_liger_kernel(model: Any, kernel_config: dict[str, Any] | None) -> None:
    """Patch ``model`` with Liger's kernels; raise naming the missing piece when that cannot be done."""
    if importlib.util.find_spec("liger_kernel") is None:
        raise ImportError("use_liger_kernel=True needs the liger-kernel package: pip install liger-kernel")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "use_liger_kernel=True needs a CUDA GPU (Liger's kernels are Triton GPU kernels) and none is available: "
            "set use_liger_kernel=False on this machine."
        )
    base = model
    while not hasattr(base, "config") and hasattr(base, "base_model"):  # a PEFT wrapper
        base = base.base_model.model if hasattr(base.base_model, "model") else base.base_model
    if not (hasattr(base, "config") and hasattr(base, "save_pretrained")):
        raise TypeError(
            f"use_liger_kernel=True patches transformers models; {type(model).__name__} is not one. Set "
            "use_liger_kernel=False, or apply your own fused kernels to this model."
        )
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=base, **(kernel_config or {}))
