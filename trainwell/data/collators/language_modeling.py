"""``DataCollatorForLanguageModeling``: masked (BERT-style) or causal language-modeling batches.

Owns the masking: which tokens are chosen (``mlm_probability``, never special tokens or padding, optionally
whole words), and what a chosen token becomes (``mask_replace_prob`` the mask token,
``random_replace_prob`` a random token, the rest unchanged). Padding is ``base``'s job.

The random draws are made in the same order and shapes as the reference collator, so with the same
``seed`` (or the same global torch RNG state) and the same tokenizer the masks are identical to it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainwell.data.collators.base import (
    LABEL_PAD_ID,
    as_requested,
    check_return_tensors,
    collate_token_sequences,
    pad_features,
)


def _mask_token_id(tokenizer: Any) -> int | None:
    token_id = getattr(tokenizer, "mask_token_id", None)
    if token_id is None and getattr(tokenizer, "mask_token", None) is not None:
        token_id = tokenizer.convert_tokens_to_ids(tokenizer.mask_token)
    return token_id


def _vocab_size(tokenizer: Any) -> int:
    # len() counts added tokens too, which is what the reference samples random replacements from.
    try:
        return len(tokenizer)
    except TypeError:
        return int(tokenizer.vocab_size)


def _special_ids(tokenizer: Any) -> set[int]:
    ids = getattr(tokenizer, "all_special_ids", None)
    if ids is None:
        names = ("pad", "cls", "sep", "bos", "eos", "unk", "mask")
        ids = [getattr(tokenizer, f"{name}_token_id", None) for name in names]
    return {i for i in ids if i is not None}


def _check_probability(name: str, value: Any) -> float:
    if value is None or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name}={value!r} must be a probability between 0 and 1.")
    return float(value)


@dataclass
class DataCollatorForLanguageModeling:
    """Collate examples for masked (``mlm=True``) or causal (``mlm=False``) language modeling.

    Examples are feature dicts (padded with :func:`~trainwell.data.collators.base.pad_features`) or bare
    token sequences (padded with the tokenizer's ``pad_token_id`` on its ``padding_side``), always to the
    longest example, rounded up to ``pad_to_multiple_of``.

    * ``mlm=False``: ``labels`` is a copy of ``input_ids`` with every ``pad_token_id`` set to -100 (the
      model shifts labels itself). Note that when ``pad_token_id == eos_token_id`` real EOS tokens are
      ignored too, exactly as in the reference.
    * ``mlm=True``: each token is chosen with probability ``mlm_probability``, except special tokens
      (the ``special_tokens_mask`` feature when present, else ``tokenizer.get_special_tokens_mask``) and
      padding. ``labels`` holds the original id at chosen positions and -100 elsewhere. A chosen token
      becomes the mask token with probability ``mask_replace_prob``, a uniformly random token id with
      probability ``random_replace_prob``, and stays unchanged otherwise.
    * ``whole_word_mask=True`` chooses whole words (from the ``offset_mapping`` feature) and always uses
      the mask token.
    * ``seed`` gives the collator its own generator (``seed + worker_id`` inside a DataLoader worker), so
      masking is reproducible and independent of the global RNG; without it the global torch RNG is used.
    """

    tokenizer: Any
    mlm: bool = True
    whole_word_mask: bool = False
    mlm_probability: float | None = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    seed: int | None = None

    def __post_init__(self) -> None:
        check_return_tensors(self.return_tensors)
        self.generator: torch.Generator | None = None  # built lazily, per process: see _refresh_generator
        self._generator_worker: int | None = None
        if self.mlm:
            if _mask_token_id(self.tokenizer) is None:
                raise ValueError(
                    "mlm=True needs a mask token, but the tokenizer has none: add one "
                    "(tokenizer.add_special_tokens({'mask_token': '[MASK]'})) or pass mlm=False for causal LM."
                )
            self.mlm_probability = _check_probability("mlm_probability", self.mlm_probability)
        elif self.whole_word_mask:
            raise ValueError("whole_word_mask=True only applies to masked LM: pass mlm=True as well.")
        self.mask_replace_prob = _check_probability("mask_replace_prob", self.mask_replace_prob)
        self.random_replace_prob = _check_probability("random_replace_prob", self.random_replace_prob)
        if self.whole_word_mask:
            # Decided before the sum check (unlike the reference), so mask_replace_prob=1.0 alone is accepted.
            if self.mask_replace_prob < 1:
                warnings.warn(
                    "whole_word_mask=True does not support random replacement: using mask_replace_prob=1.0, "
                    "random_replace_prob=0.0.",
                    UserWarning,
                    stacklevel=3,
                )
            self.mask_replace_prob, self.random_replace_prob = 1.0, 0.0
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError(
                f"mask_replace_prob + random_replace_prob = {self.mask_replace_prob + self.random_replace_prob} "
                "must not exceed 1 (what is left is the share of chosen tokens kept unchanged)."
            )

    def __call__(self, examples: Sequence[Any], return_tensors: str | None = None) -> Any:
        kind = return_tensors or self.return_tensors
        check_return_tensors(kind)
        return as_requested(self.torch_call(examples), kind)

    def numpy_call(self, examples: Sequence[Any]) -> Any:
        """The batch as numpy arrays (masking drawn from the same torch generator as :meth:`torch_call`)."""
        return as_requested(self.torch_call(examples), "np")

    def _refresh_generator(self) -> None:
        """Create the seeded generator on first use, and again in each DataLoader worker.

        Keying on the worker id (not just "created yet?") means a collator that was already used in the main
        process still gets a distinct stream per worker, instead of every worker replaying the parent's.
        """
        if self.seed is None:
            return
        info = torch.utils.data.get_worker_info()
        worker = -1 if info is None else info.id
        if self.generator is None or self._generator_worker != worker:
            self.generator = torch.Generator().manual_seed(self.seed + max(worker, 0))
            self._generator_worker = worker

    def torch_call(self, examples: Sequence[Any]) -> Any:
        """Pad ``examples`` and add ``labels`` (masking ``input_ids`` in place when ``mlm``)."""
        self._refresh_generator()
        if isinstance(examples[0], Mapping):
            batch = pad_features(self.tokenizer, examples, pad_to_multiple_of=self.pad_to_multiple_of)
        else:
            batch = {"input_ids": collate_token_sequences(examples, self.tokenizer, self.pad_to_multiple_of)}
        # Inputs to the masking, not to the model.
        special_tokens_mask = batch.pop("special_tokens_mask", None)
        offset_mapping = batch.pop("offset_mapping", None)
        if self.mlm:
            batch["input_ids"], batch["labels"] = self.torch_mask_tokens(
                batch["input_ids"], special_tokens_mask=special_tokens_mask, offset_mapping=offset_mapping
            )
        else:
            labels = batch["input_ids"].clone()
            pad_id = getattr(self.tokenizer, "pad_token_id", None)
            if pad_id is not None:
                labels[labels == pad_id] = LABEL_PAD_ID
            batch["labels"] = labels
        return batch

    def _protected(self, inputs: torch.Tensor, special_tokens_mask: Any | None) -> torch.Tensor:
        """Boolean mask of positions that must never be chosen: special tokens and padding."""
        if special_tokens_mask is None:
            if callable(getattr(self.tokenizer, "get_special_tokens_mask", None)):
                special_tokens_mask = [
                    self.tokenizer.get_special_tokens_mask(row, already_has_special_tokens=True)
                    for row in inputs.tolist()
                ]
            else:
                special = torch.tensor(sorted(_special_ids(self.tokenizer)), dtype=inputs.dtype)
                special_tokens_mask = torch.isin(inputs, special)
        protected = torch.as_tensor(special_tokens_mask).bool().clone()
        pad_id = getattr(self.tokenizer, "pad_token_id", None)
        if pad_id is not None:
            # Cheap insurance: a tokenizer whose special-token mask forgets padding must not mask it.
            protected |= inputs == pad_id
        return protected

    def torch_mask_tokens(
        self, inputs: torch.Tensor, special_tokens_mask: Any | None = None, offset_mapping: Any | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose tokens to predict and corrupt them; returns ``(inputs, labels)``. ``inputs`` is modified."""
        labels = inputs.clone()
        protected = self._protected(inputs, special_tokens_mask)
        probability = torch.full(labels.shape, self.mlm_probability)
        if self.whole_word_mask:
            word_ids, is_word_start = _words(offset_mapping, protected)
            probability.masked_fill_(~is_word_start, 0.0)  # one draw per word, at its first token
        else:
            probability.masked_fill_(protected, 0.0)
        chosen = torch.bernoulli(probability, generator=self.generator).bool()
        if self.whole_word_mask:
            chosen = _spread_to_words(chosen, word_ids)
        labels[~chosen] = LABEL_PAD_ID

        to_mask = torch.bernoulli(torch.full(labels.shape, self.mask_replace_prob), generator=self.generator)
        to_mask = to_mask.bool() & chosen
        inputs[to_mask] = _mask_token_id(self.tokenizer)
        if self.mask_replace_prob == 1 or self.random_replace_prob == 0:
            return inputs, labels

        # Of the chosen tokens not masked (1 - mask_replace_prob), the share that becomes random tokens.
        random_share = self.random_replace_prob / (1 - self.mask_replace_prob)
        to_random = torch.bernoulli(torch.full(labels.shape, random_share), generator=self.generator)
        to_random = to_random.bool() & chosen & ~to_mask
        random_ids = torch.randint(
            _vocab_size(self.tokenizer), labels.shape, dtype=torch.long, generator=self.generator
        )
        inputs[to_random] = random_ids[to_random].to(inputs.dtype)
        return inputs, labels


def _words(offset_mapping: Any, protected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Word ids (-1 for protected tokens) and word-start flags, from character offsets.

    A token starts a new word when it is not protected and either does not touch the previous token's
    end or follows a protected token.
    """
    if offset_mapping is None:
        raise ValueError(
            "whole_word_mask=True needs each example's 'offset_mapping' (tokenize with "
            "return_offsets_mapping=True, which needs a fast tokenizer)."
        )
    offsets = torch.as_tensor(offset_mapping)
    starts, ends = offsets[..., 0], offsets[..., 1]
    prev_ends = torch.roll(ends, 1, dims=1)
    prev_ends[:, 0] = -1
    prev_protected = torch.roll(protected, 1, dims=1)
    prev_protected[:, 0] = False
    is_word_start = ~protected & ((starts != prev_ends) | prev_protected)
    word_ids = torch.cumsum(is_word_start.long(), dim=1)
    word_ids[protected] = -1
    return word_ids, is_word_start


def _spread_to_words(chosen: torch.Tensor, word_ids: torch.Tensor) -> torch.Tensor:
    """Extend each chosen word start to every token of its word."""
    index = word_ids.clamp(min=0)
    per_word = torch.zeros(chosen.shape[0], chosen.shape[1] + 1, dtype=torch.long)
    per_word.scatter_add_(1, index, chosen.long())
    return (per_word.gather(1, index) > 0) & (word_ids >= 0)
