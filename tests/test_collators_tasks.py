"""Tests for trainwell.data.collators' task collators: sequence-to-sequence, token classification, multiple choice
and flattening, on both tokenizer paths (the tokenizer's own ``pad()`` and trainwell's fallback), which must agree."""

from __future__ import annotations

import pytest
import torch

from tests.common.collating import BOTH_PATHS, PAD, SIDES, TEXTS, assert_same_batch, encode, unpad
from tests.common.tokenizer import make_tokenizer
from trainwell.data.collators import (
    DataCollatorForMultipleChoice,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithFlattening,
)

# ---------------------------------------------------------------------------------------------------------
# DataCollatorForSeq2Seq


def _seq2seq_features(label_name="labels"):
    features = encode()
    for i, f in enumerate(features):
        f[label_name] = list(range(10, 12 + 2 * i))  # lengths 2, 4, 6, 8: independent of the inputs
    return features


@SIDES
@BOTH_PATHS
def test_seq2seq_pads_labels_separately(side, with_pad):
    tok = make_tokenizer(with_pad, padding_side=side)
    batch = DataCollatorForSeq2Seq(tok)(_seq2seq_features())
    assert batch["input_ids"].shape == (4, 29) and batch["labels"].shape == (4, 8)
    assert batch["labels"].dtype == torch.int64
    first = [10, 11] + [-100] * 6 if side == "right" else [-100] * 6 + [10, 11]
    assert batch["labels"][0].tolist() == first


@pytest.mark.parametrize(
    "kwargs, label_length", [({"pad_to_multiple_of": 5}, 10), ({"padding": "max_length", "max_length": 30}, 30)]
)
def test_seq2seq_label_length_and_paths_agree(kwargs, label_length):
    features = _seq2seq_features()
    fallback = DataCollatorForSeq2Seq(make_tokenizer(False), label_pad_token_id=-1, **kwargs)(features)
    with_pad = DataCollatorForSeq2Seq(make_tokenizer(True), label_pad_token_id=-1, **kwargs)(features)
    assert_same_batch(fallback, with_pad)
    assert fallback["labels"].shape == (4, label_length) and fallback["labels"][0, -1] == -1


def test_seq2seq_decoder_inputs_from_the_model_and_label_key():
    class Model:
        def prepare_decoder_input_ids_from_labels(self, labels):
            shifted = torch.full_like(labels, 0)
            shifted[:, 1:] = labels[:, :-1].clamp(min=0)
            return shifted

    batch = DataCollatorForSeq2Seq(make_tokenizer(), model=Model())(_seq2seq_features("label"))
    assert "label" not in batch and batch["labels"].shape == (4, 8)
    assert batch["decoder_input_ids"][0].tolist() == [0, 10, 11, 0, 0, 0, 0, 0]
    assert "decoder_input_ids" not in DataCollatorForSeq2Seq(make_tokenizer(), model=object())(_seq2seq_features())


def test_seq2seq_without_labels():
    assert "labels" not in DataCollatorForSeq2Seq(make_tokenizer())(encode())
    features = [dict(f, labels=None) for f in encode()]
    assert "labels" not in DataCollatorForSeq2Seq(make_tokenizer())(features)
    features[0]["labels"] = [1]
    with pytest.raises(ValueError, match="Some examples have labels"):
        DataCollatorForSeq2Seq(make_tokenizer())(features)


# ---------------------------------------------------------------------------------------------------------
# DataCollatorForTokenClassification


@SIDES
@BOTH_PATHS
@pytest.mark.parametrize("label_name", ["labels", "label"])
def test_token_classification_aligns_labels_with_tokens(side, with_pad, label_name):
    tok = make_tokenizer(with_pad, padding_side=side)
    features = [dict(f, **{label_name: [i % 3 for i in range(len(f["input_ids"]))]}) for f in encode()]
    batch = DataCollatorForTokenClassification(tok, pad_to_multiple_of=4)(features)
    labels = batch[label_name]
    assert labels.shape == batch["input_ids"].shape == (4, 32) and labels.dtype == torch.int64
    assert torch.equal(labels == -100, batch["attention_mask"] == 0)
    assert unpad(labels[0].tolist(), side, -100) == features[0][label_name]


def test_token_classification_without_labels_and_paths_agree():
    features = encode()
    assert_same_batch(
        DataCollatorForTokenClassification(make_tokenizer(False))(features),
        DataCollatorForTokenClassification(make_tokenizer(True))(features),
    )


# ---------------------------------------------------------------------------------------------------------
# DataCollatorForMultipleChoice


def _choices(n_examples=3, n_choices=4):
    tok = make_tokenizer()
    examples = []
    for i in range(n_examples):
        enc = tok(["question " + str(i)] * n_choices, [TEXTS[(i + c) % 4] for c in range(n_choices)])
        examples.append(dict(enc, label=i % n_choices))
    return examples


@SIDES
def test_multiple_choice_shape_and_paths_agree(side):
    examples = _choices()
    fallback = DataCollatorForMultipleChoice(make_tokenizer(False, padding_side=side), pad_to_multiple_of=8)(examples)
    with_pad = DataCollatorForMultipleChoice(make_tokenizer(True, padding_side=side), pad_to_multiple_of=8)(examples)
    assert_same_batch(fallback, with_pad)
    assert fallback["input_ids"].shape == fallback["attention_mask"].shape == (3, 4, 40)
    assert fallback["token_type_ids"].shape == (3, 4, 40)
    assert fallback["labels"].tolist() == [0, 1, 2] and fallback["labels"].dtype == torch.int64
    # choice c of example i is the flattened row i * 4 + c
    row = unpad(fallback["input_ids"][1, 2].tolist(), side, PAD)
    assert row == examples[1]["input_ids"][2]


def test_multiple_choice_errors_and_missing_labels():
    examples = _choices()
    examples[1] = {k: (v[:3] if isinstance(v, list) else v) for k, v in examples[1].items()}
    with pytest.raises(ValueError, match="same number of choices"):
        DataCollatorForMultipleChoice(make_tokenizer())(examples)
    unlabeled = [{k: v for k, v in e.items() if k != "label"} for e in _choices(2, 2)]
    assert "labels" not in DataCollatorForMultipleChoice(make_tokenizer())(unlabeled)


# ---------------------------------------------------------------------------------------------------------
# DataCollatorWithFlattening


def test_flattening_packs_into_one_row():
    features = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}, {"input_ids": torch.tensor([8, 9])}]
    batch = DataCollatorWithFlattening()(features)
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert all(batch[k].dtype == torch.int64 for k in batch)


def test_flattening_options():
    features = [{"input_ids": [5, 6, 7], "labels": [1, 2, 3]}, {"input_ids": [8, 9], "labels": [4, 5]}]
    collator = DataCollatorWithFlattening(
        return_flash_attn_kwargs=True, return_seq_idx=True, separator_id=-1, position_ids_start=2
    )
    batch = collator(features)
    assert batch["labels"].tolist() == [[-1, 2, 3, -1, 5]]
    assert batch["position_ids"].tolist() == [[2, 3, 4, 2, 3]]
    assert batch["seq_idx"].tolist() == [[0, 0, 0, 1, 1]] and batch["seq_idx"].dtype == torch.int32
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5] and batch["cu_seq_lens_k"].dtype == torch.int32
    assert batch["max_length_q"] == batch["max_length_k"] == 3 and isinstance(batch["max_length_q"], int)
    assert "position_ids" not in DataCollatorWithFlattening(return_position_ids=False)(features)
    assert collator(features, separator_id=-7)["labels"][0, 0] == -7
    with pytest.raises(ValueError, match="return_tensors"):
        DataCollatorWithFlattening(return_tensors="tf")
