"""``DataCollatorForSeq2Seq``: pad encoder inputs and, separately, the target ``labels``.

Owns the label side: the labels are taken out before the inputs are padded (a tokenizer's ``pad()`` does
not know how to pad them), padded to their own length with ``label_pad_token_id`` on the tokenizer's
padding side, and optionally turned into ``decoder_input_ids`` by the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainwell.data.collators.base import (
    LABEL_PAD_ID,
    PaddingCollatorMixin,
    as_mappings,
    as_requested,
    normalize_padding,
    pad_sequence,
    padding_side_of,
    split_labels,
    target_length,
    to_list,
    to_tensor,
)


@dataclass
class DataCollatorForSeq2Seq(PaddingCollatorMixin):
    """Pad sequence-to-sequence examples: inputs with the tokenizer, ``labels`` with ``label_pad_token_id``.

    Args:
        tokenizer: any object with ``pad_token_id`` (``pad()`` is used when present).
        model: optional; when it has ``prepare_decoder_input_ids_from_labels``, the batch also gets
            ``decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])``
            (useful with label smoothing, so the model does not shift the labels a second time).
        padding, max_length, pad_to_multiple_of: as in ``DataCollatorWithPadding``. Labels are padded to
            the longest label (or to ``max_length`` with ``padding="max_length"``), rounded up to
            ``pad_to_multiple_of``; this length is independent of the inputs' length.
        label_pad_token_id: what labels are padded with (-100, ignored by PyTorch losses).
        return_tensors: must be ``"pt"``.

    The labels are read from ``label`` or ``labels`` and returned as int64 ``labels``. When no example has
    labels (the key is missing, or every value is ``None``) the batch has no ``labels`` key.
    """

    tokenizer: Any
    model: Any | None = None
    padding: bool | str | Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = LABEL_PAD_ID
    return_tensors: str = "pt"

    def __call__(self, features: Sequence[Any], return_tensors: str | None = None) -> Any:
        kind = self._return_tensors(return_tensors)
        rows = as_mappings(features)
        label_name, inputs = split_labels(rows)
        labels = [row.get(label_name) for row in rows]
        batch = self._pad_inputs(inputs)
        if all(label is None for label in labels):
            return as_requested(batch, kind)
        batch["labels"] = self._pad_labels(labels)
        prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
        if callable(prepare):
            batch["decoder_input_ids"] = prepare(labels=batch["labels"])
        return as_requested(batch, kind)

    def _pad_labels(self, labels: list[Any]) -> torch.Tensor:
        if any(label is None for label in labels):
            raise ValueError("Some examples have labels and others do not: give every example labels, or none.")
        rows = [to_list(label) for label in labels]
        strategy = normalize_padding(self.padding)
        if strategy == "max_length" and self.max_length is None:
            strategy = "longest"  # the reference pads labels to the longest when max_length is unset
        length = target_length([len(r) for r in rows], strategy, self.max_length, self.pad_to_multiple_of)
        if length is not None:
            side = padding_side_of(self.tokenizer)
            rows = [pad_sequence(r, length, self.label_pad_token_id, side) for r in rows]
        return to_tensor(rows, "labels", torch.int64)
