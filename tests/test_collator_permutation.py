"""Tests for DataCollatorForPermutationLanguageModeling (XLNet permutation LM), on the in-code tokenizer of
tests/common/tokenizer.py, and (when transformers is installed) draw for draw against the reference."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch

from tests.common.tokenizer import make_tokenizer
from trainwell.data.collators import (
    DataCollatorForPermutationLanguageModeling,
    numpy_default_data_collator,
    torch_default_data_collator,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
TEXTS = ["hello", "a longer sentence!", "abc", "padding test!"]  # 7, 20, 5, 15 tokens with [CLS] and [SEP]
KEYS = ["input_ids", "perm_mask", "target_mapping", "labels"]


def features(texts=TEXTS):
    tok = make_tokenizer()
    return [tok(text) for text in texts]


def collate(features, seed=0, **kwargs):
    torch.manual_seed(seed)
    tokenizer = kwargs.pop("tokenizer", None) or make_tokenizer()
    return DataCollatorForPermutationLanguageModeling(tokenizer, **kwargs)(features)


# ---------------------------------------------------------------------------------------------------------
# the batch


@pytest.mark.parametrize("side", ["right", "left"])
def test_keys_shapes_dtypes_and_target_mapping(side):
    batch = collate(features(), tokenizer=make_tokenizer(padding_side=side))
    assert list(batch) == KEYS
    assert batch["input_ids"].shape == batch["labels"].shape == (4, 20)
    assert batch["perm_mask"].shape == batch["target_mapping"].shape == (4, 20, 20)
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.int64
    assert batch["perm_mask"].dtype == batch["target_mapping"].dtype == torch.float32
    assert torch.equal(batch["target_mapping"], torch.eye(20).expand(4, 20, 20))


def test_labels_keep_the_predicted_ids_and_minus_100_elsewhere():
    feats = features()
    batch = collate(feats, plm_probability=0.5)
    original = DataCollatorForPermutationLanguageModeling(make_tokenizer())._collate(feats)
    predicted = batch["labels"] != -100
    assert predicted.any() and (~predicted).any()
    assert torch.equal(batch["labels"][predicted], original[predicted])
    assert (batch["input_ids"][predicted] == MASK).all()
    assert torch.equal(batch["input_ids"][~predicted], original[~predicted])


@pytest.mark.parametrize("side", ["right", "left"])
def test_special_tokens_and_padding_are_never_predicted(side):
    # plm_probability=1 with spans of one token predicts every token that may be predicted.
    feats = features()
    batch = collate(feats, tokenizer=make_tokenizer(padding_side=side), plm_probability=1.0, max_span_length=1)
    ids = DataCollatorForPermutationLanguageModeling(make_tokenizer(padding_side=side))._collate(feats)
    special = (ids == PAD) | (ids == CLS) | (ids == SEP)
    assert (ids == PAD).any() and special.any()
    assert (batch["labels"][special] == -100).all()
    assert torch.equal(batch["labels"][~special], ids[~special])  # every other token is predicted
    assert torch.equal(batch["input_ids"][special], ids[special])


def test_perm_mask_hides_only_predicted_tokens_in_a_two_half_order():
    batch = collate(features(), seed=3, plm_probability=0.5)
    perm, predicted = batch["perm_mask"].bool(), batch["labels"] != -100
    for row in range(perm.shape[0]):
        p, chosen = perm[row], predicted[row]
        assert not p[:, ~chosen].any()  # tokens that are not predicted are seen by everyone
        assert p.diagonal()[chosen].all()  # a predicted token does not see itself
        both = chosen[:, None] & chosen[None, :] & ~torch.eye(len(chosen), dtype=torch.bool)
        assert torch.equal((p ^ p.T)[both], torch.ones(int(both.sum()), dtype=torch.bool))  # a strict order
    # The order of the second half repeats the first half's: token i and token i + L/2 stand in the same
    # relation to every predicted token.
    half = perm.shape[-1] // 2
    for row in range(perm.shape[0]):
        for i in range(half):
            j = i + half
            if predicted[row, i] and predicted[row, j]:
                assert perm[row, i, j] and not perm[row, j, i]


def test_bare_sequences_tensors_and_dict_features_give_the_same_batch():
    feats = features()
    as_dicts = collate(feats)
    as_lists = collate([f["input_ids"] for f in feats])
    as_tensors = collate([torch.tensor(f["input_ids"]) for f in feats])
    as_arrays = collate([np.array(f["input_ids"]) for f in feats])
    for other in (as_lists, as_tensors, as_arrays):
        assert all(torch.equal(as_dicts[k], other[k]) for k in KEYS)


def test_the_features_are_never_modified():
    feats = features()
    before = copy.deepcopy(feats)
    collate(feats, plm_probability=1.0, max_span_length=1)
    assert feats == before
    tensors = [torch.tensor([CLS, 10, 11, 12, 13, SEP]) for _ in range(3)]  # equal lengths: stacked, not padded
    kept = [t.clone() for t in tensors]
    collate([{"input_ids": t} for t in tensors], plm_probability=1.0, max_span_length=1)
    collate(tensors, plm_probability=1.0, max_span_length=1)
    assert all(torch.equal(a, b) for a, b in zip(tensors, kept))
    padded = torch.tensor([[CLS, 10, 11, SEP], [CLS, 12, SEP, PAD]])
    copy_of_padded = padded.clone()
    DataCollatorForPermutationLanguageModeling(make_tokenizer(), plm_probability=1.0).torch_mask_tokens(padded)
    assert torch.equal(padded, copy_of_padded)


def test_the_same_torch_seed_gives_the_same_batches():
    collator = DataCollatorForPermutationLanguageModeling(make_tokenizer())
    feats = features()

    def run(seed):
        torch.manual_seed(seed)
        return [collator(feats) for _ in range(3)]

    first, again, other = run(0), run(0), run(1)
    for a, b in zip(first, again):
        assert all(torch.equal(a[k], b[k]) for k in KEYS)
    assert any(not torch.equal(a["labels"], b["labels"]) for a, b in zip(first, other))


def test_numpy_output():
    feats = features()
    random.seed(0)
    np.random.seed(0)
    batch = collate(feats, return_tensors="np")
    assert list(batch) == KEYS and all(isinstance(v, np.ndarray) for v in batch.values())
    assert batch["input_ids"].dtype == batch["labels"].dtype == np.int64
    assert batch["perm_mask"].dtype == batch["target_mapping"].dtype == np.float32
    assert batch["perm_mask"].shape == (4, 20, 20)
    per_call = DataCollatorForPermutationLanguageModeling(make_tokenizer())(feats, return_tensors="np")
    assert isinstance(per_call["labels"], np.ndarray)
    # The numpy path draws from Python's random and numpy's RNG, like the reference's: seeding them repeats it.
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(123)
    again = DataCollatorForPermutationLanguageModeling(make_tokenizer(), return_tensors="np")(feats)
    assert all(np.array_equal(batch[k], again[k]) for k in KEYS)
    special = np.isin(per_call["input_ids"], [PAD, CLS, SEP])
    assert (per_call["labels"][special] == -100).all()
    ids = np.array([[CLS, 10, 11, SEP]])
    out = DataCollatorForPermutationLanguageModeling(make_tokenizer()).numpy_mask_tokens(ids)
    assert len(out) == 4 and all(isinstance(v, np.ndarray) for v in out)
    assert np.array_equal(ids, [[CLS, 10, 11, SEP]])


# ---------------------------------------------------------------------------------------------------------
# errors


def test_odd_length_is_a_clear_error():
    collator = DataCollatorForPermutationLanguageModeling(make_tokenizer())
    with pytest.raises(ValueError, match="even sequence length"):
        collator([[CLS, 10, SEP]])
    with pytest.raises(ValueError, match="even sequence length"):
        collator([[CLS, 10, SEP]], return_tensors="np")


def test_a_tokenizer_without_mask_token_is_refused_when_collating():
    collator = DataCollatorForPermutationLanguageModeling(make_tokenizer(mask_token=None))  # as the reference
    with pytest.raises(ValueError, match="mask token"):
        collator([[CLS, 10, 11, SEP]])


def test_padding_without_a_pad_token_is_a_clear_error():
    collator = DataCollatorForPermutationLanguageModeling(make_tokenizer(pad_token=None))
    with pytest.raises(ValueError, match="pad token"):
        collator([[CLS, 10, 11, SEP], [CLS, 10, SEP]])
    assert collator([[CLS, 10, 11, SEP]])["labels"].shape == (1, 4)  # nothing to pad: fine without one


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"plm_probability": 0}, "plm_probability"),
        ({"plm_probability": 1.5}, "plm_probability"),
        ({"max_span_length": 0}, "max_span_length"),
        ({"return_tensors": "tf"}, "return_tensors"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataCollatorForPermutationLanguageModeling(make_tokenizer(), **kwargs)


# ---------------------------------------------------------------------------------------------------------
# names


def test_reference_paths_and_positional_signature():
    import trainwell
    from trainwell.data.data_collator import DataCollatorForPermutationLanguageModeling as from_path

    assert (
        from_path is trainwell.DataCollatorForPermutationLanguageModeling is DataCollatorForPermutationLanguageModeling
    )
    collator = from_path(make_tokenizer(), 0.25, 3, "np")
    assert (collator.plm_probability, collator.max_span_length, collator.return_tensors) == (0.25, 3, "np")
    default = from_path(make_tokenizer())
    assert (default.plm_probability, default.max_span_length, default.return_tensors) == (1 / 6, 5, "pt")


def test_torch_and_numpy_default_data_collators():
    from trainwell.data.data_collator import numpy_default_data_collator as np_path
    from trainwell.data.data_collator import torch_default_data_collator as pt_path

    assert np_path is numpy_default_data_collator and pt_path is torch_default_data_collator
    feats = [{"input_ids": [1, 2], "label": 0}, {"input_ids": [3, 4], "label": 1}]
    pt, arrays = torch_default_data_collator(feats), numpy_default_data_collator(feats)
    assert isinstance(pt["input_ids"], torch.Tensor) and isinstance(arrays["input_ids"], np.ndarray)
    assert arrays["labels"].dtype == np.int64 and arrays["labels"].tolist() == pt["labels"].tolist() == [0, 1]
    assert np.array_equal(arrays["input_ids"], pt["input_ids"].numpy())


# ---------------------------------------------------------------------------------------------------------
# draw for draw against the reference


def _reference_tokenizer(side):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )
    tokenizer.padding_side = side
    return tokenizer


def _batches():
    """Several batches of [CLS] ... [SEP] examples of mixed lengths, each padded to an even length."""
    rng = torch.Generator().manual_seed(1234)
    batches = []
    for size in (1, 2, 3, 4, 4, 2):
        rows = [
            [CLS, *torch.randint(5, 15, (int(torch.randint(0, 40, (1,), generator=rng)),), generator=rng).tolist(), SEP]
            for _ in range(size)
        ]
        longest = max(len(r) for r in rows)
        if longest % 2:
            next(r for r in rows if len(r) == longest).append(5)
        batches.append([{"input_ids": r} for r in rows])
    return batches


@pytest.mark.parametrize("return_tensors", ["pt", "np"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    "kwargs", [{}, {"plm_probability": 0.5, "max_span_length": 2}, {"plm_probability": 1.0, "max_span_length": 1}]
)
def test_bitwise_equal_to_the_reference_at_the_same_seed(return_tensors, side, kwargs):
    pytest.importorskip("transformers")
    from transformers.data.data_collator import DataCollatorForPermutationLanguageModeling as Reference

    tokenizer = _reference_tokenizer(side)

    def run(cls):
        torch.manual_seed(7)
        random.seed(7)
        np.random.seed(7)
        collator = cls(tokenizer, return_tensors=return_tensors, **kwargs)
        out = [collator(batch) for batch in _batches()]
        return out, (torch.rand(1).item(), random.random(), np.random.rand())  # where each RNG was left

    (ours, our_rngs), (theirs, their_rngs) = run(DataCollatorForPermutationLanguageModeling), run(Reference)
    assert our_rngs == their_rngs  # the same number of draws from each RNG
    for mine, ref in zip(ours, theirs):
        assert list(mine) == list(ref)
        for key in ref:
            assert type(mine[key]) is type(ref[key]) and mine[key].dtype == ref[key].dtype, key
            assert mine[key].shape == ref[key].shape, key
            assert np.array_equal(np.asarray(mine[key]), np.asarray(ref[key])), key
