"""``DataCollatorForPermutationLanguageModeling``: XLNet-style permutation language-modeling batches.

Owns the choice of the tokens to predict (one span of up to ``max_span_length`` tokens in every context of
``span / plm_probability`` tokens, never special tokens or padding) and the random factorisation order that
becomes ``perm_mask``. Padding is ``base``'s job; which tokens count as special is ``language_modeling``'s.

The random draws are the reference collator's, made with the same calls in the same order: the torch path
from the global torch RNG, the numpy path from Python's ``random`` and numpy's global RNG. A script seeded
the same way (``set_seed`` seeds all three) gets the same batches as with the reference.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from trainwell.data.collators.base import (
    LABEL_PAD_ID,
    DataCollatorMixin,
    as_requested,
    check_return_tensors,
    collate_token_sequences,
)
from trainwell.data.collators.language_modeling import DataCollatorForLanguageModeling, _mask_token_id

PlmBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class _Draws(NamedTuple):
    """Where one batch's randomness comes from."""

    span_length: Callable[[int], int]  # a span length, given max_span_length
    offset: Callable[[int], int]  # where a span starts in its context, given the number of possible starts
    order: Callable[[int], torch.Tensor]  # a random permutation of range(n)


def _numpy_order(n: int) -> torch.Tensor:
    import numpy as np  # only the numpy path needs it

    order = np.arange(n)
    np.random.shuffle(order)
    return torch.from_numpy(order)


_TORCH_DRAWS = _Draws(
    span_length=lambda longest: int(torch.randint(1, longest + 1, (1,)).item()),
    offset=lambda starts: int(torch.randint(starts, (1,)).item()),
    order=torch.randperm,
)

# The reference's numpy path uses Python's random.randint, whose upper bound is inclusive: its spans are
# 1..max_span_length + 1 tokens long and may start one token later. Kept, so seeded numpy batches match it.
_NUMPY_DRAWS = _Draws(
    span_length=lambda longest: random.randint(1, longest + 1),
    offset=lambda starts: random.randint(0, starts),
    order=_numpy_order,
)


@dataclass
class DataCollatorForPermutationLanguageModeling(DataCollatorMixin):
    """Collate examples for permutation language modeling (XLNet).

    Examples are bare token sequences or feature dicts, of which only ``input_ids`` is used; they are padded
    to the longest with the tokenizer's ``pad_token_id`` on its ``padding_side``. The padded length must be
    even, and the tokenizer must have a mask token (both ``ValueError`` otherwise, raised when a batch is
    made). The batch holds, for ``B`` examples of length ``L``:

    * ``input_ids`` (``B, L``, int64): the ids, with every token to predict replaced by the mask token.
    * ``labels`` (``B, L``, int64): the original id where a token is to be predicted, -100 elsewhere.
    * ``target_mapping`` (``B, L, L``, float32): the identity per example (prediction ``i`` is token ``i``).
    * ``perm_mask`` (``B, L, L``, float32): 1 where token ``i`` may not attend to token ``j``.

    Tokens to predict are chosen per example, left to right: draw a span length ``s`` in
    ``[1, max_span_length]``, reserve a context of ``int(s / plm_probability)`` tokens, and predict ``s``
    consecutive tokens at a random place in it; repeat from the end of the context. Special tokens and
    padding are never predicted. A random factorisation order is drawn for the first half of the sequence
    and repeated on the second half (so nothing leaks through XLNet's reused half); ordinary tokens (neither
    predicted nor special nor padding) come first in it and are seen by every token, while a predicted token
    ``j`` is hidden (``perm_mask[b, i, j] = 1``) from every token ``i`` that does not come after it, itself
    included.

    ``return_tensors="pt"`` draws from the global torch RNG (``torch.randint`` per span, ``torch.randperm``
    per example), exactly as the reference. ``"np"`` returns numpy arrays and, like the reference's numpy
    path, draws spans with Python's ``random.randint`` and orders with ``numpy.random.shuffle``; that path
    inherits the reference's inclusive bounds, so its spans can be ``max_span_length + 1`` tokens long.
    The features passed in are never modified.
    """

    tokenizer: Any
    plm_probability: float = 1 / 6
    max_span_length: int = 5  # the longest span of consecutive tokens to predict
    return_tensors: str = "pt"

    # Which tokens are never predicted: special tokens and padding, judged as masked LM judges them.
    _protected = DataCollatorForLanguageModeling._protected

    def __post_init__(self) -> None:
        check_return_tensors(self.return_tensors)
        if not 0 < self.plm_probability <= 1:
            raise ValueError(f"plm_probability={self.plm_probability!r} must be in (0, 1].")
        if self.max_span_length < 1:
            raise ValueError(f"max_span_length={self.max_span_length!r} must be at least 1.")

    def torch_call(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """The batch as torch tensors, drawn from the global torch RNG."""
        return _as_batch(self._mask(self._collate(examples), _TORCH_DRAWS))

    def numpy_call(self, examples: Sequence[Any]) -> dict[str, Any]:
        """The batch as numpy arrays, drawn from Python's and numpy's global RNGs (see the class docstring)."""
        return as_requested(_as_batch(self._mask(self._collate(examples), _NUMPY_DRAWS)), "np")

    def torch_mask_tokens(self, inputs: torch.Tensor) -> PlmBatch:
        """``(input_ids, perm_mask, target_mapping, labels)`` for a padded ``(batch, length)`` id tensor, which
        is left unchanged."""
        return self._mask(inputs, _TORCH_DRAWS)

    def numpy_mask_tokens(self, inputs: Any) -> tuple[Any, Any, Any, Any]:
        """:meth:`torch_mask_tokens` for a numpy array, with the numpy path's draws; returns numpy arrays."""
        return tuple(t.numpy() for t in self._mask(torch.as_tensor(inputs), _NUMPY_DRAWS))

    def _collate(self, examples: Sequence[Any]) -> torch.Tensor:
        if examples and isinstance(examples[0], Mapping):
            examples = [example["input_ids"] for example in examples]
        return collate_token_sequences(examples, self.tokenizer)

    def _mask(self, inputs: torch.Tensor, draws: _Draws) -> PlmBatch:
        mask_id = _mask_token_id(self.tokenizer)
        if mask_id is None:
            raise ValueError(
                "Permutation language modeling replaces the tokens to predict with the mask token, but the "
                "tokenizer has none: add one, e.g. tokenizer.add_special_tokens({'mask_token': '<mask>'})."
            )
        batch_size, length = inputs.shape
        if length % 2:
            raise ValueError(
                f"Permutation language modeling needs an even sequence length, but the batch is {length} tokens "
                "long: the factorisation order is drawn for one half of the sequence and repeated on the other, "
                "so that nothing leaks through the reused half. Tokenize to an even length."
            )
        chosen = torch.zeros((batch_size, length), dtype=torch.bool)
        for row in range(batch_size):
            start = 0
            while start < length:
                span = draws.span_length(self.max_span_length)
                context = int(span / self.plm_probability)
                begin = start + draws.offset(context - span + 1)
                chosen[row, begin : begin + span] = True
                start += context
        protected = self._protected(inputs, None)
        chosen &= ~protected
        ids = inputs.long()
        labels = ids.masked_fill(~chosen, LABEL_PAD_ID)
        input_ids = ids.masked_fill(chosen, mask_id)

        half = length // 2
        target_mapping = torch.eye(length, dtype=torch.float32).repeat(batch_size, 1, 1)
        perm_mask = torch.zeros((batch_size, length, length), dtype=torch.float32)
        for row in range(batch_size):
            order = draws.order(half)
            rank = torch.cat([order, order + half]).masked_fill(~chosen[row] & ~protected[row], -1)
            perm_mask[row] = (rank[:, None] <= rank[None, :]) & chosen[row]
        return input_ids, perm_mask, target_mapping, labels


def _as_batch(tensors: PlmBatch) -> dict[str, torch.Tensor]:
    return dict(zip(("input_ids", "perm_mask", "target_mapping", "labels"), tensors))
