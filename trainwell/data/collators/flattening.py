"""``DataCollatorWithFlattening``: padding-free packing of a batch into a single row.

Owns the packed layout: examples are concatenated into one ``(1, total_tokens)`` row; ``position_ids``
restart at every example so a model can tell where one ends and the next begins, and the first label of
each example is replaced by ``separator_id`` so no token is trained to predict across a boundary. The
attention implementation must honour those boundaries (e.g. FlashAttention's varlen kernels, fed by
``cu_seq_lens_*`` / ``max_length_*``); this module does not check that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainwell.data.collators.base import (
    LABEL_PAD_ID,
    DefaultDataCollator,
    as_mappings,
    as_requested,
    check_return_tensors,
    to_list,
)


class DataCollatorWithFlattening(DefaultDataCollator):
    """Concatenate a batch of examples into one row, without padding.

    Returns, all with a leading batch dimension of 1:

    * ``input_ids`` (int64): the examples' ``input_ids`` back to back;
    * ``labels`` (int64): each example's ``labels`` (or its ``input_ids`` when there are no labels) with the
      first token replaced by ``separator_id``;
    * ``position_ids`` (int64, when ``return_position_ids``): ``position_ids_start, +1, ...`` per example;
    * ``seq_idx`` (int32, when ``return_seq_idx``): the index of the example each token comes from;
    * ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (int32, shape ``(n + 1,)``) and ``max_length_q`` /
      ``max_length_k`` (Python ints), when ``return_flash_attn_kwargs``.

    Other feature keys (e.g. ``attention_mask``) are not returned: a packed row has no padding to mask.
    ``position_ids_start`` exists for models whose positions do not start at 0 (RoBERTa-style models
    count from ``padding_idx + 1``, usually 2).
    """

    def __init__(
        self,
        *args: Any,
        return_position_ids: bool = True,
        separator_id: int = LABEL_PAD_ID,
        return_flash_attn_kwargs: bool = False,
        return_seq_idx: bool = False,
        position_ids_start: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.return_position_ids = return_position_ids
        self.separator_id = separator_id
        self.return_flash_attn_kwargs = return_flash_attn_kwargs
        self.return_seq_idx = return_seq_idx
        self.position_ids_start = position_ids_start

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(return_tensors={self.return_tensors!r}, "
            f"return_position_ids={self.return_position_ids}, separator_id={self.separator_id}, "
            f"return_flash_attn_kwargs={self.return_flash_attn_kwargs}, return_seq_idx={self.return_seq_idx}, "
            f"position_ids_start={self.position_ids_start})"
        )

    def __call__(
        self, features: Sequence[Any], return_tensors: str | None = None, separator_id: int | None = None
    ) -> dict[str, Any]:
        kind = return_tensors or self.return_tensors
        check_return_tensors(kind)
        separator = self.separator_id if separator_id is None else separator_id
        rows = as_mappings(features)
        has_labels = "labels" in rows[0]
        input_ids: list[int] = []
        labels: list[int] = []
        lengths: list[int] = []
        for row in rows:
            ids = to_list(row["input_ids"])
            targets = to_list(row["labels"]) if has_labels else ids
            input_ids += ids
            labels += [separator] + targets[1:]
            lengths.append(len(ids))
        batch: dict[str, Any] = {
            "input_ids": torch.tensor([input_ids], dtype=torch.int64),
            "labels": torch.tensor([labels], dtype=torch.int64),
        }
        if self.return_position_ids:
            positions = [self.position_ids_start + i for n in lengths for i in range(n)]
            batch["position_ids"] = torch.tensor([positions], dtype=torch.int64)
        if self.return_seq_idx:
            seq_idx = [index for index, n in enumerate(lengths) for _ in range(n)]
            batch["seq_idx"] = torch.tensor([seq_idx], dtype=torch.int32)
        if self.return_flash_attn_kwargs:
            # FlashAttention's varlen kernels want int32 cumulative lengths and plain-int maxima.
            cu_seq_lens = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = cu_seq_lens
            batch["max_length_q"] = batch["max_length_k"] = max(lengths, default=0)
        return as_requested(batch, kind)
