"""Tests for trainwell.data.collators (the default, padding and language-modeling collators, and what every collator
keeps to; the task collators are in test_collators_tasks.py), on the tiny in-code tokenizer of
tests/common/tokenizer.py.

Each padding collator is checked on both tokenizer paths (the tokenizer's own ``pad()`` and trainwell's
fallback) and the two must agree exactly.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import pickle
import warnings

import numpy as np
import pytest
import torch

from tests.common.collating import BOTH_PATHS, CLS, MASK, PAD, SEP, SIDES, TEXTS, assert_same_batch, encode
from tests.common.tokenizer import make_tokenizer
from trainwell.data.collators import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
)

# ---------------------------------------------------------------------------------------------------------
# default_data_collator


def test_default_collator_int_label_and_stacking():
    features = [
        {"label": 1, "x": [1.0, 2.0], "t": torch.tensor([1, 2]), "a": np.array([1, 2]), "s": "text", "n": None},
        {"label": 0, "x": [3.0, 4.0], "t": torch.tensor([3, 4]), "a": np.array([3, 4]), "s": "more", "n": None},
    ]
    batch = default_data_collator(features)
    assert set(batch) == {"labels", "x", "t", "a"}
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    assert batch["x"].dtype == torch.float32 and batch["x"].shape == (2, 2)
    assert torch.equal(batch["t"], torch.tensor([[1, 2], [3, 4]]))
    assert torch.equal(batch["a"], torch.tensor([[1, 2], [3, 4]]))


@pytest.mark.parametrize(
    "labels, dtype",
    [
        ([0.5, 1.5], torch.float32),
        ([np.int64(1), np.int64(2)], torch.long),
        ([np.float32(1), np.float32(2)], torch.float32),
        ([True, False], torch.long),
        ([torch.tensor(1), torch.tensor(0)], torch.long),
        ([torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)], torch.float32),
    ],
)
def test_default_collator_label_dtypes(labels, dtype):
    batch = default_data_collator([{"label": v} for v in labels])
    assert batch["labels"].dtype == dtype and batch["labels"].shape == (2,)


def test_default_collator_label_ids():
    assert default_data_collator([{"label_ids": [1, 2]}, {"label_ids": [0, 1]}])["labels"].dtype == torch.long
    assert default_data_collator([{"label_ids": [0.5]}, {"label_ids": [1.0]}])["labels"].dtype == torch.float32
    tensors = [{"label_ids": torch.tensor(v, dtype=torch.int32)} for v in ([1, 2], [3, 4])]
    labels = default_data_collator(tensors)["labels"]
    assert labels.dtype == torch.int32 and labels.tolist() == [[1, 2], [3, 4]]  # a tensor keeps its dtype
    arrays = [{"label_ids": np.array([1, 2])}, {"label_ids": np.array([3, 4])}]
    assert default_data_collator(arrays)["labels"].dtype == torch.long
    # a None label falls through to label_ids
    assert default_data_collator([{"label": None, "label_ids": [7]}])["labels"].tolist() == [[7]]


def test_default_collator_reads_objects_with_vars():
    @dataclasses.dataclass
    class Example:
        input_ids: list
        label: int

    batch = DefaultDataCollator()([Example([1, 2], 0), Example([3, 4], 1)])
    assert batch["input_ids"].tolist() == [[1, 2], [3, 4]] and batch["labels"].tolist() == [0, 1]


def test_tensorflow_is_refused_by_name():
    with pytest.raises(ValueError, match="return_tensors='tf' is not supported.*'np'"):
        default_data_collator([{"x": [1]}], return_tensors="tf")
    with pytest.raises(ValueError, match="return_tensors"):
        DefaultDataCollator(return_tensors="tf")
    with pytest.raises(ValueError, match="return_tensors"):
        DataCollatorWithPadding(make_tokenizer(), return_tensors="tf")
    with pytest.raises(ValueError, match="return_tensors"):
        DataCollatorForSeq2Seq(make_tokenizer())(encode(), return_tensors="tf")


def _labelled(features, key="labels"):
    return [{**f, key: list(f["input_ids"])} for f in features]


NUMPY_CASES = {  # name -> (collator for a return_tensors value, features)
    "default": (lambda rt: DefaultDataCollator(return_tensors=rt),
                [{"x": [1, 2], "label": 0}, {"x": [3, 4], "label": 1}]),
    "padding": (lambda rt: DataCollatorWithPadding(make_tokenizer(), return_tensors=rt), encode()),
    "seq2seq": (lambda rt: DataCollatorForSeq2Seq(make_tokenizer(), return_tensors=rt), _labelled(encode())),
    "token_classification": (lambda rt: DataCollatorForTokenClassification(make_tokenizer(), return_tensors=rt),
                             _labelled(encode())),
    "language_modeling": (lambda rt: DataCollatorForLanguageModeling(make_tokenizer(), mlm=False, return_tensors=rt),
                          encode()),
    "flattening": (lambda rt: DataCollatorWithFlattening(return_tensors=rt), _labelled(encode())),
}


@pytest.mark.parametrize("name", list(NUMPY_CASES))
def test_return_tensors_np_gives_the_same_values_as_numpy_arrays(name):
    make, features = NUMPY_CASES[name]
    torch_batch = make("pt")(features)
    for numpy_batch in (make("np")(features), make("pt")(features, return_tensors="np")
                        if name != "padding" else make("np")(features)):
        assert numpy_batch.keys() == torch_batch.keys()
        for key, value in torch_batch.items():
            if isinstance(value, torch.Tensor):
                assert isinstance(numpy_batch[key], np.ndarray), key
                np.testing.assert_array_equal(numpy_batch[key], value.numpy())
                assert numpy_batch[key].dtype == value.numpy().dtype


def test_default_collator_errors_name_the_problem():
    with pytest.raises(ValueError, match="empty"):
        default_data_collator([])
    with pytest.raises(ValueError, match="'input_ids'"):
        default_data_collator([{"input_ids": [1, 2]}, {"input_ids": [1]}])


# ---------------------------------------------------------------------------------------------------------
# DataCollatorWithPadding and the two padding paths


@SIDES
@BOTH_PATHS
def test_with_padding_pads_on_the_tokenizer_side(side, with_pad):
    tok = make_tokenizer(with_pad, padding_side=side)
    features = encode(return_special_tokens_mask=True)
    batch = DataCollatorWithPadding(tok)(features)
    longest = max(len(f["input_ids"]) for f in features)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "special_tokens_mask"}
    for key in batch:
        assert batch[key].shape == (4, longest) and batch[key].dtype == torch.long
    for i, feature in enumerate(features):
        n = len(feature["input_ids"])
        real = slice(0, n) if side == "right" else slice(longest - n, longest)
        pads = slice(n, longest) if side == "right" else slice(0, longest - n)
        assert batch["input_ids"][i, real].tolist() == feature["input_ids"]
        assert (batch["input_ids"][i, pads] == PAD).all()
        assert (batch["attention_mask"][i, real] == 1).all() and (batch["attention_mask"][i, pads] == 0).all()
        assert (batch["special_tokens_mask"][i, pads] == 1).all()
        assert (batch["token_type_ids"][i, pads] == 0).all()


@pytest.mark.parametrize(
    "kwargs, length",
    [
        ({}, 29),
        ({"pad_to_multiple_of": 8}, 32),
        ({"padding": "longest", "pad_to_multiple_of": 5}, 30),
        ({"padding": "max_length", "max_length": 40}, 40),
        ({"padding": "max_length", "max_length": 30, "pad_to_multiple_of": 16}, 32),
        ({"padding": "max_length"}, 64),  # the tokenizer's model_max_length
    ],
)
@SIDES
def test_padding_lengths_and_paths_agree(kwargs, length, side):
    features = encode()
    fallback = DataCollatorWithPadding(make_tokenizer(False, padding_side=side), **kwargs)(features)
    with_pad = DataCollatorWithPadding(make_tokenizer(True, padding_side=side), **kwargs)(features)
    assert fallback["input_ids"].shape == (4, length)
    assert_same_batch(fallback, with_pad)


@BOTH_PATHS
@pytest.mark.parametrize("padding", [False, "do_not_pad"])
def test_do_not_pad(with_pad, padding):
    tok = make_tokenizer(with_pad)
    same_length = encode(["ab", "cd"])
    batch = DataCollatorWithPadding(tok, padding=padding, pad_to_multiple_of=8)(same_length)
    assert batch["input_ids"].shape == (2, 4)  # no padding at all, not even to the multiple
    if not with_pad:
        with pytest.raises(ValueError, match="'input_ids'.*different lengths"):
            DataCollatorWithPadding(tok, padding=padding)(encode())


@BOTH_PATHS
def test_with_padding_renames_labels(with_pad):
    tok = make_tokenizer(with_pad)
    features = [dict(f, label=i) for i, f in enumerate(encode())]
    batch = DataCollatorWithPadding(tok)(features)
    assert "label" not in batch and batch["labels"].tolist() == [0, 1, 2, 3]
    features = [dict(f, label_ids=[i, i]) for i, f in enumerate(encode())]
    batch = DataCollatorWithPadding(tok)(features)
    assert "label_ids" not in batch and batch["labels"].shape == (4, 2)


def test_fallback_pads_sequence_labels_with_minus_100():
    features = [dict(f, labels=f["input_ids"]) for f in encode()]
    batch = DataCollatorWithPadding(make_tokenizer(padding_side="left"))(features)
    assert batch["labels"].shape == batch["input_ids"].shape
    assert torch.equal(batch["labels"] == -100, batch["attention_mask"] == 0)


def test_tokenizer_pad_is_called_with_the_reference_arguments():
    calls = []

    class Spy:
        pad_token_id = 0

        def pad(self, features, **kwargs):
            calls.append(kwargs)
            return {"input_ids": torch.zeros(len(features), 3, dtype=torch.long)}

    DataCollatorWithPadding(Spy(), padding="max_length", max_length=3, pad_to_multiple_of=2)(encode())
    assert calls == [{"padding": "max_length", "max_length": 3, "pad_to_multiple_of": 2, "return_tensors": "pt"}]


def test_fallback_works_with_a_minimal_tokenizer():
    class Minimal:  # only a pad id: no padding_side, no model_input_names, no pad()
        pad_token_id = 9

    batch = DataCollatorWithPadding(Minimal())([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_missing_pad_token_is_a_clear_error():
    with pytest.raises(ValueError, match="tokenizer.pad_token"):
        DataCollatorWithPadding(make_tokenizer(pad_token=None))(encode())
    with pytest.raises(ValueError, match="pad_token"):
        DataCollatorForSeq2Seq(make_tokenizer(pad_token=None))(encode())
    with pytest.raises(ValueError, match="tokenizer.pad_token"):
        DataCollatorForLanguageModeling(make_tokenizer(pad_token=None), mlm=False)([[1, 2], [3]])


def test_bad_padding_arguments():
    with pytest.raises(ValueError, match="padding='shortest'"):
        DataCollatorWithPadding(make_tokenizer(), padding="shortest")
    with pytest.raises(ValueError, match="padding_side='middle'"):
        DataCollatorWithPadding(make_tokenizer(padding_side="middle"))(encode())


# ---------------------------------------------------------------------------------------------------------
# DataCollatorForLanguageModeling


@SIDES
@BOTH_PATHS
def test_causal_lm_labels_copy_inputs_with_padding_ignored(side, with_pad):
    tok = make_tokenizer(with_pad, padding_side=side)
    batch = DataCollatorForLanguageModeling(tok, mlm=False, pad_to_multiple_of=8)(encode())
    assert batch["input_ids"].shape == (4, 32)
    expected = batch["input_ids"].masked_fill(batch["input_ids"] == PAD, -100)
    assert torch.equal(batch["labels"], expected)
    assert torch.equal(batch["labels"] == -100, batch["attention_mask"] == 0)


@SIDES
def test_lm_accepts_bare_token_lists(side):
    tok = make_tokenizer(padding_side=side)
    lists = [[5, 6, 7], [8], torch.tensor([9, 10])]
    batch = DataCollatorForLanguageModeling(tok, mlm=False)(lists)
    expected = [[5, 6, 7], [8, PAD, PAD], [9, 10, PAD]] if side == "right" else [[5, 6, 7], [PAD, PAD, 8], [PAD, 9, 10]]
    assert set(batch) == {"input_ids", "labels"} and batch["input_ids"].tolist() == expected
    assert DataCollatorForLanguageModeling(tok, mlm=False)([[5, 6], [7, 8]])["labels"].tolist() == [[5, 6], [7, 8]]


@SIDES
@pytest.mark.parametrize("with_special_mask", [False, True])
def test_mlm_masking_statistics(side, with_special_mask):
    tok = make_tokenizer(padding_side=side)
    texts = ["the quick brown fox jumps over the lazy dog", "hi", "pack my box with five dozen liquor jugs"] * 40
    features = encode(texts, return_special_tokens_mask=with_special_mask)
    originals = DataCollatorWithPadding(tok)(features)["input_ids"]
    batch = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=0)(features)
    inputs, labels = batch["input_ids"], batch["labels"]
    maskable = originals > MASK  # neither a special token nor padding
    chosen = labels != -100
    assert not (chosen & ~maskable).any()  # special tokens and padding are never chosen
    assert torch.equal(inputs[~chosen], originals[~chosen])
    assert torch.equal(labels[chosen], originals[chosen])
    assert 0.12 < chosen.sum().item() / maskable.sum().item() < 0.18
    n = chosen.sum().item()
    as_mask = (inputs[chosen] == MASK).sum().item() / n
    unchanged = (inputs[chosen] == labels[chosen]).sum().item() / n
    assert 0.72 < as_mask < 0.88 and 0.04 < unchanged < 0.18 and 0.03 < 1 - as_mask - unchanged < 0.18


def test_mlm_never_masks_padding_even_if_the_tokenizer_forgets_it():
    class Forgetful(type(make_tokenizer())):
        def get_special_tokens_mask(self, ids, already_has_special_tokens=False):
            return [0] * len(ids)  # claims nothing is special, not even [PAD]

    class NoMaskMethod:  # special ids come from the *_token_id attributes instead
        pad_token_id, cls_token_id, sep_token_id, mask_token_id = PAD, CLS, SEP, MASK

        def __len__(self):
            return 50

    features = encode(TEXTS * 10)
    for tok in (Forgetful(), NoMaskMethod()):
        batch = DataCollatorForLanguageModeling(tok, mlm_probability=1.0, seed=0)(features)
        padding = batch["attention_mask"] == 0
        assert padding.any() and (batch["labels"][padding] == -100).all()
        assert (batch["input_ids"][padding] == PAD).all()
    assert (batch["labels"][:, 0] == -100).all()  # [CLS], found through cls_token_id


def test_mlm_is_reproducible_with_a_seed_and_paths_agree():
    features = encode(TEXTS * 5)

    def run(with_pad, seed):
        return DataCollatorForLanguageModeling(make_tokenizer(with_pad), seed=seed)(features)

    assert_same_batch(run(False, 1), run(True, 1))
    assert_same_batch(run(False, 1), run(False, 1))
    assert not torch.equal(run(False, 1)["labels"], run(False, 2)["labels"])
    collator = DataCollatorForLanguageModeling(make_tokenizer(), seed=1)
    first, second = collator(features), collator(features)
    assert not torch.equal(first["labels"], second["labels"])  # the generator advances between batches


def test_mlm_seed_differs_per_dataloader_worker(monkeypatch):
    class Info:
        def __init__(self, id):
            self.id = id

    features = encode(TEXTS * 5)
    collator = DataCollatorForLanguageModeling(make_tokenizer(), seed=3)
    main = collator(features)["labels"]
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: Info(0))
    worker0 = collator(features)["labels"]
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: Info(1))
    worker1 = collator(features)["labels"]
    assert torch.equal(main, worker0)  # worker 0 restarts from seed + 0, not from the parent's state
    assert not torch.equal(worker0, worker1)
    pickle.loads(pickle.dumps(collator))  # DataLoader workers may need to pickle it


@pytest.mark.parametrize("mask_prob, random_prob", [(1.0, 0.0), (0.0, 0.0), (0.0, 1.0)])
def test_mlm_replacement_probabilities(mask_prob, random_prob):
    collator = DataCollatorForLanguageModeling(
        make_tokenizer(), mlm_probability=0.5, mask_replace_prob=mask_prob, random_replace_prob=random_prob, seed=0
    )
    batch = collator(encode(TEXTS * 10))
    chosen = batch["labels"] != -100
    picked = batch["input_ids"][chosen]
    if mask_prob == 1.0:
        assert (picked == MASK).all()
    elif random_prob == 0.0:
        assert torch.equal(picked, batch["labels"][chosen])  # chosen but left unchanged
    else:
        assert (picked != batch["labels"][chosen]).float().mean() > 0.8  # random ids, rarely the original
        assert ((picked >= 0) & (picked < len(make_tokenizer()))).all()


def test_mlm_uses_a_precomputed_special_tokens_mask():
    features = encode(["abcd", "ab"], add_special_tokens=False)
    for f in features:
        f["special_tokens_mask"] = [1] + [0] * (len(f["input_ids"]) - 1)  # pretend the first char is special
    collator = DataCollatorForLanguageModeling(
        make_tokenizer(), mlm_probability=1.0, mask_replace_prob=1.0, random_replace_prob=0.0
    )
    batch = collator(features)
    assert "special_tokens_mask" not in batch
    assert batch["input_ids"].tolist() == [[5, MASK, MASK, MASK], [5, MASK, PAD, PAD]]


def test_whole_word_masking_masks_words_together():
    space = make_tokenizer().convert_tokens_to_ids(" ")
    features = encode(["ab cd ef gh", "abc de f"] * 20, return_offsets_mapping=True, return_special_tokens_mask=True)
    with pytest.warns(UserWarning, match="mask_replace_prob"):
        collator = DataCollatorForLanguageModeling(make_tokenizer(), whole_word_mask=True, mlm_probability=0.5, seed=0)
    batch = collator(features)
    assert "offset_mapping" not in batch and "special_tokens_mask" not in batch
    chosen = batch["labels"] != -100
    assert chosen.any() and (batch["input_ids"][chosen] == MASK).all()
    for feature, row in zip(features, chosen.tolist()):
        words, previous = [], space  # a word is the characters up to and including a space
        for token, flag, special in zip(feature["input_ids"], row, feature["special_tokens_mask"]):
            if special:
                assert not flag
                continue
            if previous == space:
                words.append([])
            words[-1].append(flag)
            previous = token
        assert all(len(set(word)) == 1 for word in words)  # a word is masked entirely or not at all
        assert len({word[0] for word in words}) >= 1


def test_language_modeling_argument_errors():
    with pytest.raises(ValueError, match="mask token"):
        DataCollatorForLanguageModeling(make_tokenizer(mask_token=None))
    DataCollatorForLanguageModeling(make_tokenizer(mask_token=None), mlm=False)  # fine for causal LM
    with pytest.raises(ValueError, match="mlm_probability=1.5"):
        DataCollatorForLanguageModeling(make_tokenizer(), mlm_probability=1.5)
    with pytest.raises(ValueError, match="must not exceed 1"):
        DataCollatorForLanguageModeling(make_tokenizer(), mask_replace_prob=0.8, random_replace_prob=0.3)
    with pytest.raises(ValueError, match="mlm=True"):
        DataCollatorForLanguageModeling(make_tokenizer(), mlm=False, whole_word_mask=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # mask_replace_prob=1.0 is what whole-word masking needs: no warning
        collator = DataCollatorForLanguageModeling(make_tokenizer(), whole_word_mask=True, mask_replace_prob=1.0)
    with pytest.raises(ValueError, match="offset_mapping"):
        collator(encode())


# ---------------------------------------------------------------------------------------------------------
# hygiene


def test_collators_never_import_transformers():
    package = pathlib.Path(__file__).resolve().parents[1] / "trainwell" / "data" / "collators"
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "transformers" or n.startswith("transformers.") for n in names), path


@pytest.mark.parametrize("name", list(NUMPY_CASES))
def test_collators_never_mutate_the_features_they_are_given(name):
    import copy

    make, features = NUMPY_CASES[name]
    before = copy.deepcopy(features)
    make("pt")(features)
    assert features == before
    mlm = DataCollatorForLanguageModeling(make_tokenizer(), mlm=True, mlm_probability=0.5)
    tensors = [torch.tensor(f["input_ids"]) for f in encode()]
    kept = [t.clone() for t in tensors]
    mlm([{"input_ids": t} for t in tensors])
    assert all(torch.equal(a, b) for a, b in zip(tensors, kept))  # masking works on the batch, not the inputs
