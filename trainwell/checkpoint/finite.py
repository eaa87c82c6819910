"""No checkpoint of non-finite weights is ever published, whatever ``skip_nonfinite_steps`` says.

Owns the check the checkpointer runs before it creates a checkpoint's folder (``Checkpointer.save_checkpoint``):
every floating parameter and buffer of the model is reduced to its minimum and maximum (NaN propagates, an
infinity is one of them), all of them are read in one host transfer (a save reads far more than that), and with
several processes each one checks its own tensors (its shards under FSDP) and the verdicts are gathered, so every
process raises the same error. A checkpoint of NaN weights resumes happily and trains NaN forever: the error stops
the run while the previous checkpoint is still the newest one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch


class NonFiniteWeightsError(RuntimeError):
    """The model's weights hold NaN or infinity: the checkpoint was not written."""


def nonfinite_tensor(model: torch.nn.Module) -> str | None:
    """The name of the first floating parameter or buffer of ``model`` holding NaN or infinity on this process
    (its local shard for a sharded tensor); None when every one is finite. One host read."""
    named = []
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor: this process's shard
        # float8 (one byte) has no aminmax kernel; such weights are frozen (fp8 training keeps wider master weights)
        if local.is_floating_point() and local.element_size() > 1 and local.numel() and local.device.type != "meta":
            named.append((name, local.detach()))
    if not named:
        return None
    extremes = torch.stack([torch.stack(torch.aminmax(t)).float().to(named[0][1].device) for _, t in named])
    finite = torch.isfinite(extremes).all(dim=1).tolist()
    return next((name for (name, _), ok in zip(named, finite, strict=True) if not ok), None)


def check_finite_weights(model: torch.nn.Module, checkpoint: str, gather: Callable[[Any], list[Any]] | None = None,
                         rank: int = 0) -> None:
    """Raise :class:`NonFiniteWeightsError` (on every process) when a weight of ``model`` is not finite, before
    ``checkpoint`` is created. ``gather``: the runtime's ``all_gather_object`` when several processes save."""
    bad = nonfinite_tensor(model)
    verdicts = gather((rank, bad)) if gather is not None else [(rank, bad)]
    found = [(r, name) for r, name in verdicts if name is not None]
    if not found:
        return
    where = ", ".join(f"{name!r}" + (f" on process {r}" if gather is not None else "") for r, name in found[:3])
    raise NonFiniteWeightsError(
        f"{checkpoint} was not saved: the model's weights are not finite (NaN or inf in {where}). A checkpoint of "
        "such weights would resume into NaN training, so the newest checkpoint stays the one before it. The run "
        "diverged: set skip_nonfinite_steps=True (non-finite steps are then never applied), set max_grad_norm "
        "(e.g. 1.0), lower learning_rate, try rollback_on_spike, and check the data."
    )
