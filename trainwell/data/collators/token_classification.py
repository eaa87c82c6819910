"""``DataCollatorForTokenClassification``: pad inputs and per-token labels to the same length.

Owns the label side: labels are taken out, the inputs are padded, then each label row is padded with
``label_pad_token_id`` to the padded ``input_ids`` length on the tokenizer's padding side, so label ``i``
still lines up with token ``i``.
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
    pad_sequence,
    padding_side_of,
    split_labels,
    to_list,
    to_tensor,
)


@dataclass
class DataCollatorForTokenClassification(PaddingCollatorMixin):
    """Pad token-classification examples (NER, POS, ...): inputs with the tokenizer, labels with -100.

    Args:
        tokenizer: any object with ``pad_token_id`` (``pad()`` is used when present).
        padding, max_length, pad_to_multiple_of: as in ``DataCollatorWithPadding``.
        label_pad_token_id: what label rows are padded with (-100, ignored by PyTorch losses).
        return_tensors: must be ``"pt"``.

    Labels are read from ``label`` or ``labels`` and returned under the same key, as int64, padded to the
    padded ``input_ids`` length. Examples without labels are padded like ``DataCollatorWithPadding``.
    """

    tokenizer: Any
    padding: bool | str | Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = LABEL_PAD_ID
    return_tensors: str = "pt"

    def __call__(self, features: Sequence[Any], return_tensors: str | None = None) -> Any:
        kind = self._return_tensors(return_tensors)
        rows = as_mappings(features)
        label_name, inputs = split_labels(rows)
        has_labels = label_name in rows[0]
        batch = self._pad_inputs(inputs)
        if not has_labels:
            return as_requested(batch, kind)
        length = batch["input_ids"].shape[1]
        side = padding_side_of(self.tokenizer)
        labels = [pad_sequence(to_list(row[label_name]), length, self.label_pad_token_id, side) for row in rows]
        batch[label_name] = to_tensor(labels, label_name, torch.int64)
        return as_requested(batch, kind)
