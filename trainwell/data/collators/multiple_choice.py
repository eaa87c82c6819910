"""``DataCollatorForMultipleChoice``: pad every choice of every example to one ``(batch, choices, length)`` batch.

Owns the reshaping: examples hold one sequence per choice; they are flattened to ``batch * choices``
single-sequence features, padded together (so all choices share one length), and viewed back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainwell.data.collators.base import (
    PaddingCollatorMixin,
    as_mappings,
    as_requested,
    label_key,
    to_tensor,
)


@dataclass
class DataCollatorForMultipleChoice(PaddingCollatorMixin):
    """Pad multiple-choice examples into tensors of shape ``(batch, num_choices, length)``.

    Each example maps every input key (``input_ids``, ``attention_mask``, ...) to a list with one sequence
    per choice, plus an optional scalar ``label`` or ``labels`` (the index of the right choice), returned as
    int64 ``labels`` of shape ``(batch,)``. Every example must have the same number of choices.

    Args:
        tokenizer: any object with ``pad_token_id`` (``pad()`` is used when present).
        padding, max_length, pad_to_multiple_of: as in ``DataCollatorWithPadding``; they apply across all
            choices of all examples.
        return_tensors: must be ``"pt"``.
    """

    tokenizer: Any
    padding: bool | str | Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, examples: Sequence[Any], return_tensors: str | None = None) -> dict[str, torch.Tensor]:
        kind = self._return_tensors(return_tensors)
        rows = as_mappings(examples)
        label_name = label_key(rows[0])
        num_choices = len(rows[0]["input_ids"])
        for i, row in enumerate(rows):
            if len(row["input_ids"]) != num_choices:
                raise ValueError(
                    f"Example {i} has {len(row['input_ids'])} choices but example 0 has {num_choices}: "
                    "every example in a batch needs the same number of choices."
                )
        flat = [
            {key: value[c] for key, value in row.items() if key != label_name}
            for row in rows
            for c in range(num_choices)
        ]
        padded = self._pad_inputs(flat)
        batch = {key: value.view(len(rows), num_choices, -1) for key, value in padded.items()}
        if label_name in rows[0]:
            batch["labels"] = to_tensor([row[label_name] for row in rows], label_name, torch.int64)
        return as_requested(batch, kind)
