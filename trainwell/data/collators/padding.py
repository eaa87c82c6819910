"""``DataCollatorWithPadding``: pad tokenized examples to one batch (the Trainer's default with a tokenizer).

Owns only the collator; the padding itself (the tokenizer's ``pad()`` or the built-in fallback) lives in
``base.pad_features``, and the option checks in ``base.PaddingCollatorMixin``, so every padding collator pads
the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainwell.data.collators.base import PaddingCollatorMixin, as_requested


@dataclass
class DataCollatorWithPadding(PaddingCollatorMixin):
    """Pad a list of tokenized examples dynamically and return a batch of torch tensors.

    Args:
        tokenizer: any object with ``pad_token_id`` (and optionally ``padding_side``, default ``"right"``).
            Its ``pad()`` method is used when it has one; otherwise trainwell pads itself
            (see :func:`trainwell.data.collators.base.pad_features`).
        padding: ``True`` / ``"longest"`` (pad to the longest example), ``"max_length"`` (pad to
            ``max_length``, or the tokenizer's ``model_max_length``), ``False`` / ``"do_not_pad"``.
        max_length: the target length for ``padding="max_length"``. Padding never truncates.
        pad_to_multiple_of: round the padded length up to a multiple of this (e.g. 8 for tensor cores).
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).

    ``label`` and ``label_ids`` are renamed ``labels`` in the returned batch.
    """

    tokenizer: Any
    padding: bool | str | Any = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, features: Sequence[Any]) -> Any:
        batch = self._pad_inputs(features)
        for name in ("label", "label_ids"):
            if name in batch:
                batch["labels"] = batch.pop(name)
        return as_requested(batch, self._return_tensors(None))
