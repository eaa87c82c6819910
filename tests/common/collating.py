"""What the collator tests share: the tiny tokenizer's special ids, a few texts, the two padding paths, and helpers
that compare and unpad batches."""

from __future__ import annotations

import pytest
import torch

from tests.common.tokenizer import make_tokenizer

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
TEXTS = ["hi", "hello there", "abc", "a much longer sentence here"]
BOTH_PATHS = pytest.mark.parametrize("with_pad", [False, True], ids=["fallback", "tokenizer.pad"])
SIDES = pytest.mark.parametrize("side", ["right", "left"])


def encode(texts=TEXTS, **kwargs):
    tok = make_tokenizer()
    return [tok(text, **kwargs) for text in texts]


def assert_same_batch(a, b):
    a, b = dict(a), dict(b)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


def unpad(row: list[int], side: str, value: int) -> list[int]:
    """Strip ``value`` from ``side`` of a row (test helper)."""
    row = list(row)
    while row and row[-1 if side == "right" else 0] == value:
        row.pop(-1 if side == "right" else 0)
    return row
