"""Gradient accumulation arithmetic, as pure functions.

Owns: how many micro-batches each optimizer step of an epoch takes (the last window may be shorter), how
many loss "items" a micro-batch holds, and the factor each micro-batch's loss is multiplied by before
``backward``. Nothing here touches the model, the optimizer or the process group; the fit loop passes in
the counts (already summed over processes where needed).

The maths. A window (one optimizer step) has micro-batches j = 1..k on each of W processes. Let n_j be the
items of micro-batch j (non ``-100`` labels, or samples when there are no labels) and N the items of the
whole window, summed over the k micro-batches and, with ``average_tokens_across_devices``, over the W
processes. One big batch would optimize

    L = (1/N) * sum_j sum_{i in j} l_i.

* A model that averages its own loss over its items returns m_j = (1/n_j) sum_{i in j} l_i, so each
  micro-batch contributes m_j * n_j / N. DDP then *averages* gradients over the W processes, so multiply by
  W to turn that average back into the sum over processes:  factor_j = W * n_j / N.
* A model (or ``compute_loss_func``) that receives ``num_items_in_batch = N`` already returns
  (1/N) sum_{i in j} l_i, so only the DDP average needs undoing:  factor_j = W.

With equal n_j and W = 1 the first factor is the familiar 1/k. The logged loss is the sum of the scaled
micro-batch losses, i.e. exactly L, the quantity whose gradient was applied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch


def window_sizes(batches_in_epoch: int, accumulation_steps: int) -> list[int]:
    """Micro-batches per optimizer step over one epoch of ``batches_in_epoch`` micro-batches.

    >>> window_sizes(10, 4)
    [4, 4, 2]
    """
    if batches_in_epoch <= 0:
        return []
    full, rest = divmod(batches_in_epoch, accumulation_steps)
    return [accumulation_steps] * full + ([rest] if rest else [])


def updates_per_epoch(batches_in_epoch: int, accumulation_steps: int) -> int:
    """Optimizer steps in one epoch (at least 1, as in the reference)."""
    return max(math.ceil(batches_in_epoch / accumulation_steps), 1)


def count_items(batch: Any, label_names: Sequence[str], shift_labels: bool = False) -> torch.Tensor | int | None:
    """Loss items in one micro-batch: a 0-d tensor on the labels' device, or a Python int (no host sync).

    Integer labels count their entries that are not ``-100`` (over ``labels[..., 1:]`` when the model shifts
    labels, or over a collator-provided ``shift_labels``); float labels count every entry; a batch without
    labels counts its samples. None when the batch holds no tensor at all (TRL's GRPO batches are lists of
    prompts): there is nothing to count, and the reference passes ``num_items_in_batch=None`` then.
    """
    if isinstance(batch, Mapping):
        if "shift_labels" in batch and isinstance(batch["shift_labels"], torch.Tensor):
            return batch["shift_labels"].ne(-100).sum()
        for name in label_names:
            labels = batch.get(name)
            if isinstance(labels, torch.Tensor):
                if labels.is_floating_point():
                    return labels.numel()
                if shift_labels and labels.dim() >= 2:
                    labels = labels[..., 1:]
                return labels.ne(-100).sum()
    # Python ints, not new CPU tensors: copying a pageable CPU tensor to a GPU synchronizes the stream.
    return find_batch_size(batch)


def find_batch_size(batch: Any) -> int | None:
    """The first dimension of the first tensor found in a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() > 0 else None
    if isinstance(batch, Mapping):
        values = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return None
    for value in values:
        size = find_batch_size(value)
        if size is not None:
            return size
    return None


def loss_factors(
    micro_items: Sequence[torch.Tensor | int],
    window_items: torch.Tensor | int,
    world_size: int,
    loss_normalized_by_window: bool,
) -> list[torch.Tensor | float]:
    """The factor for each micro-batch's loss (see the module docstring for the derivation).

    ``window_items`` is N: the window's item count, summed over processes when the loss is averaged across
    devices. A window with no items at all (every label ``-100``) gets factor 0 rather than a division by 0.
    """
    if loss_normalized_by_window:
        return [float(world_size)] * len(micro_items)
    if isinstance(window_items, torch.Tensor):
        denominator: torch.Tensor | int = window_items.clamp(min=1)
    else:
        denominator = max(int(window_items), 1)
    return [n * world_size / denominator for n in micro_items]


def loss_scaling(loss_is_scaled_for_ga: bool | None, model_accepts_loss_kwargs: bool, has_loss_func: bool
                 ) -> tuple[bool, bool]:
    """``(normalized_by_window, scaled_without_counts)``: whether the loss a micro-batch returns is already
    normalized over its accumulation window (``loss_is_scaled_for_ga`` when set; else when the model takes
    ``num_items_in_batch`` or a ``compute_loss_func`` is used), and whether it is when the window has no count
    (only an explicit ``loss_is_scaled_for_ga`` or a ``compute_loss_func`` says so then: the model has nothing to
    normalize by)."""
    if loss_is_scaled_for_ga is not None:
        return loss_is_scaled_for_ga, loss_is_scaled_for_ga
    return model_accepts_loss_kwargs or has_loss_func, has_loss_func


def uncounted_factors(window_length: int, loss_scaled_for_ga: bool) -> list[float]:
    """The factors of a window whose batches hold nothing to count (``num_items_in_batch`` is None), as the
    reference scales such a loss: as is when the loss says it is already scaled for the accumulation
    (``loss_is_scaled_for_ga``, or a ``compute_loss_func``), else divided by the window's micro-batches."""
    return [1.0 if loss_scaled_for_ga else 1.0 / window_length] * window_length
