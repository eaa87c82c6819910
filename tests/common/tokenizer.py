"""A tiny character-level tokenizer, built in code, for tests that need one (no downloads, no transformers).

Two flavours:

* ``CharTokenizer``: the attributes the collators read (``pad_token_id``, ``padding_side``,
  ``model_input_names``, ``mask_token_id``, ...) but **no** ``pad()`` method, so trainwell pads by itself;
* ``CharTokenizerWithPad``: the same plus a ``pad()`` that behaves like a Hugging Face tokenizer's
  (pads the model inputs, ``token_type_ids`` and ``special_tokens_mask``, leaves every other key alone,
  and refuses to pad without a pad token). Tests compare both paths.

Ids: ``[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4``, then one id per character of ``ALPHABET``.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

import torch

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
ALPHABET = string.ascii_lowercase + string.digits + " .,!?'-"


class CharTokenizer:
    """Character-level tokenizer: ``"[CLS] h i [SEP]"``; pair inputs get ``token_type_ids`` 0 then 1."""

    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    pad_token_type_id = 0
    model_max_length = 64

    def __init__(self, padding_side: str = "right", pad_token: str | None = "[PAD]", mask_token: str | None = "[MASK]"):
        self.vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(ALPHABET))}
        self.ids_to_tokens = {i: token for token, i in self.vocab.items()}
        self.padding_side = padding_side
        self.pad_token = pad_token
        self.mask_token = mask_token
        self.unk_token, self.cls_token, self.sep_token = "[UNK]", "[CLS]", "[SEP]"

    # ids of the special tokens ------------------------------------------------------------------------
    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.vocab[token]

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def mask_token_id(self) -> int | None:
        return self._id(self.mask_token)

    @property
    def cls_token_id(self) -> int:
        return self.vocab[self.cls_token]

    @property
    def sep_token_id(self) -> int:
        return self.vocab[self.sep_token]

    @property
    def unk_token_id(self) -> int:
        return self.vocab[self.unk_token]

    @property
    def all_special_ids(self) -> list[int]:
        tokens = (self.pad_token, self.unk_token, self.cls_token, self.sep_token, self.mask_token)
        return [self.vocab[t] for t in tokens if t is not None]

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    # conversions -------------------------------------------------------------------------------------
    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self.ids_to_tokens[ids]
        return [self.ids_to_tokens[int(i)] for i in ids]

    def get_special_tokens_mask(self, ids: Sequence[int], already_has_special_tokens: bool = False) -> list[int]:
        if not already_has_special_tokens:
            return [1] + [0] * len(ids) + [1]
        special = set(self.all_special_ids)
        return [1 if int(i) in special else 0 for i in ids]

    # encoding ----------------------------------------------------------------------------------------
    def _encode_one(self, text: str, pair: str | None, add_special_tokens: bool) -> dict[str, list[int]]:
        first = [self.convert_tokens_to_ids(c) for c in text.lower()]
        second = [self.convert_tokens_to_ids(c) for c in (pair or "").lower()]
        if add_special_tokens:
            first = [self.cls_token_id] + first + [self.sep_token_id]
            second = second + [self.sep_token_id] if pair is not None else []
        ids = first + second
        return {
            "input_ids": ids,
            "token_type_ids": [0] * len(first) + [1] * len(second),
            "attention_mask": [1] * len(ids),
        }

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        add_special_tokens: bool = True,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
    ) -> dict[str, Any]:
        """Encode one text (lists of ints) or a list of texts (lists of lists), never padded."""
        if not isinstance(text, str):
            pairs = text_pair if text_pair is not None else [None] * len(text)
            encoded = [self(t, p, add_special_tokens, return_special_tokens_mask, return_offsets_mapping)
                       for t, p in zip(text, pairs)]
            return {key: [e[key] for e in encoded] for key in encoded[0]}
        out: dict[str, Any] = self._encode_one(text, text_pair, add_special_tokens)
        if return_special_tokens_mask:
            out["special_tokens_mask"] = self.get_special_tokens_mask(out["input_ids"], True)
        if return_offsets_mapping:
            out["offset_mapping"] = self._offsets(text, out["special_tokens_mask"] if return_special_tokens_mask
                                                  else self.get_special_tokens_mask(out["input_ids"], True))
        return out

    @staticmethod
    def _offsets(text: str, special: list[int]) -> list[list[int]]:
        # Character k of the text covers [k, k+1); a space covers nothing ([k, k]), so the next character
        # does not touch it and starts a new word, as with a real word-piece tokenizer. Specials are [0, 0].
        offsets, chars = [], iter(enumerate(text.lower()))
        for is_special in special:
            if is_special:
                offsets.append([0, 0])
                continue
            k, char = next(chars)
            offsets.append([k, k] if char == " " else [k, k + 1])
        return offsets


class CharTokenizerWithPad(CharTokenizer):
    """``CharTokenizer`` plus a Hugging-Face-like ``pad()`` (written independently of trainwell's fallback)."""

    def pad(
        self,
        encoded_inputs: Sequence[Mapping[str, Any]],
        padding: Any = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        self.pad_calls = getattr(self, "pad_calls", 0) + 1
        columns = {k: [self._plain(f[k]) for f in encoded_inputs] for k in encoded_inputs[0]}
        strategy = {True: "longest", False: "do_not_pad"}.get(padding, padding)
        if strategy == "max_length" and max_length is None:
            max_length = self.model_max_length
        if strategy != "do_not_pad" and self.pad_token is None:
            raise ValueError("Asking to pad but the tokenizer does not have a padding token.")
        if "attention_mask" not in columns:
            columns["attention_mask"] = [[1] * len(ids) for ids in columns["input_ids"]]
        target = None
        if strategy == "longest":
            target = max(len(ids) for ids in columns["input_ids"])
        elif strategy == "max_length":
            target = max_length
        if target is not None and pad_to_multiple_of and target % pad_to_multiple_of:
            target += pad_to_multiple_of - target % pad_to_multiple_of
        fills = {"input_ids": self.pad_token_id, "attention_mask": 0,
                 "token_type_ids": self.pad_token_type_id, "special_tokens_mask": 1}
        for key, fill in fills.items():
            if key in columns and target is not None:
                columns[key] = [self._pad_row(row, target, fill) for row in columns[key]]
        if return_tensors == "pt":
            return {k: torch.tensor(v) for k, v in columns.items()}
        return columns

    def _pad_row(self, row: list[Any], target: int, fill: Any) -> list[Any]:
        extra = [fill] * max(0, target - len(row))
        return row + extra if self.padding_side == "right" else extra + row

    @staticmethod
    def _plain(value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else value


def make_tokenizer(with_pad: bool = False, **kwargs: Any) -> CharTokenizer:
    """A fresh tokenizer; ``with_pad`` picks the flavour with a ``pad()`` method."""
    return (CharTokenizerWithPad if with_pad else CharTokenizer)(**kwargs)
