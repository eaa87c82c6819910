"""Collecting evaluation outputs: detach, move to host, pad and concatenate nested tensors.

Owns the ``-100`` padding rule for outputs of different sequence lengths and the accumulator that keeps
per-batch results on the host and concatenates them *once* at the end. The reference re-concatenates the
growing result at every batch, which makes evaluation quadratic in the number of samples; here each batch
is copied once into a list and once into the final array, so time is linear.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

PAD_INDEX = -100


def nested_detach(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.detach()
    if isinstance(data, (list, tuple)):
        return type(data)(nested_detach(d) for d in data)
    if isinstance(data, dict):
        return {k: nested_detach(v) for k, v in data.items()}
    return data


def to_numpy(data: Any) -> Any:
    """Tensors to numpy (bf16/fp16 become float32, which numpy can hold exactly), recursively."""
    if isinstance(data, torch.Tensor):
        data = data.detach()
        if data.dtype in (torch.bfloat16, torch.float16):
            data = data.float()
        return data.cpu().numpy()
    if isinstance(data, (list, tuple)):
        return type(data)(to_numpy(d) for d in data)
    if isinstance(data, dict):
        return {k: to_numpy(v) for k, v in data.items()}
    return data


def pad_and_concatenate(arrays: list[np.ndarray], pad_index: int = PAD_INDEX) -> np.ndarray:
    """Concatenate along dim 0; arrays whose later dims differ are padded with ``pad_index`` to the largest.

    0-d arrays (a scalar per batch) become 1-d first.
    """
    arrays = [a.reshape(1) if a.ndim == 0 else a for a in arrays]
    if len(arrays) == 1:
        return arrays[0]
    trailing = arrays[0].shape[1:]
    if all(a.shape[1:] == trailing for a in arrays):
        return np.concatenate(arrays, axis=0)
    ndim = arrays[0].ndim
    if any(a.ndim != ndim for a in arrays):
        raise ValueError(
            f"Cannot concatenate evaluation outputs with different numbers of dimensions: "
            f"{sorted({a.shape for a in arrays})}"
        )
    max_shape = [max(a.shape[d] for a in arrays) for d in range(1, ndim)]
    total = sum(a.shape[0] for a in arrays)
    dtype = np.result_type(*arrays)
    out = np.full((total, *max_shape), pad_index, dtype=dtype)
    row = 0
    for a in arrays:
        out[(slice(row, row + a.shape[0]), *(slice(0, s) for s in a.shape[1:]))] = a
        row += a.shape[0]
    return out


class OutputAccumulator:
    """Keeps one nested structure per batch; ``result()`` concatenates each leaf once.

    A batch may be an array or a (nested) tuple/list/dict of arrays; every batch must share the structure.
    """

    def __init__(self, pad_index: int = PAD_INDEX) -> None:
        self.pad_index = pad_index
        self._batches: list[Any] = []

    def add(self, batch: Any) -> None:
        if batch is not None:
            self._batches.append(batch)

    def __len__(self) -> int:
        return len(self._batches)

    def result(self) -> Any:
        if not self._batches:
            return None
        return self._merge(self._batches)

    def _merge(self, items: list[Any]) -> Any:
        first = items[0]
        if isinstance(first, (list, tuple)):
            merged = [self._merge([it[i] for it in items]) for i in range(len(first))]
            return type(first)(merged)
        if isinstance(first, dict):
            return {k: self._merge([it[k] for it in items]) for k in first}
        return pad_and_concatenate([np.asarray(it) for it in items], self.pad_index)


def pad_to_length(tensor: torch.Tensor, length: int, pad_index: int = PAD_INDEX, dim: int = 1) -> torch.Tensor:
    """Pad ``tensor`` along ``dim`` to ``length`` with ``pad_index`` (no-op when it is long enough)."""
    if tensor.dim() <= dim or tensor.shape[dim] >= length:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = length - tensor.shape[dim]
    return torch.cat([tensor, tensor.new_full(shape, pad_index)], dim=dim)
