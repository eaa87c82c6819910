"""``trainwell train`` with a ``task`` and a ``tokenizer``: text classification and causal LM from CSV/JSONL text
with a local tokenizer and no hand-written Python, on trainwell's own torch models and on transformers models
built from a config.json or a saved folder; and the errors a person meets on the way.

Everything is built here: a WordLevel ``tokenizer.json`` trained on the tiny corpus, CSV and JSONL files, and the
YAML configs (relative paths, run from another folder)."""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest
import yaml

from tests.common.cli import run_cli
from trainwell.cli.tasks import Labels, Task, causal_examples, parse_task
from trainwell.cli.tokenizer import load_tokenizer

POSITIVE = ["great fun film", "a lovely warm story", "great acting and great music", "lovely and fun",
            "warm great lovely", "fun music and a great story"]
NEGATIVE = ["dull boring film", "a terrible slow story", "boring acting and awful music", "awful and dull",
            "slow terrible boring", "dull music and a slow story"]


_run = run_cli


@pytest.fixture
def project(tmp_path, monkeypatch):
    """``project/`` (``make_project``); the current directory is elsewhere, so relative paths must resolve
    against the config's folder."""
    folder = make_project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return folder


def make_project(folder):
    """``folder`` with ``tokenizer.json``, ``data/train.csv`` (review, sentiment), ``data/eval.jsonl`` and
    ``data/stories.jsonl`` (text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    (folder / "data").mkdir(parents=True)
    rows = [(text, "pos") for text in POSITIVE] + [(text, "neg") for text in NEGATIVE]
    rows = [rows[i] for i in (0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11)]  # interleaved classes
    with open(folder / "data" / "train.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["review", "sentiment"])
        writer.writerows(rows * 3)
    (folder / "data" / "eval.jsonl").write_text(
        "".join(json.dumps({"review": text, "sentiment": label}) + "\n" for text, label in rows[:6]))
    (folder / "data" / "stories.jsonl").write_text(
        "".join(json.dumps({"text": text}) + "\n" for text in (POSITIVE + NEGATIVE) * 4))
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "</s>"])
    tokenizer.train_from_iterator(POSITIVE + NEGATIVE, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def _config(folder, name="run.yaml", **values) -> str:
    body = {"tokenizer": "tokenizer.json", "output_dir": str(folder / "out"), "use_cpu": True,
            "disable_tqdm": True, "report": False, "logging_steps": 4, "per_device_train_batch_size": 8, **values}
    path = folder / name
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return str(path)


CLASSIFICATION = {"task": {"name": "text-classification", "text_column": "review", "label_column": "sentiment",
                           "max_length": 16},
                  "data": {"train": "data/train.csv", "eval": "data/eval.jsonl"},
                  "max_steps": 24, "learning_rate": 0.05, "eval_strategy": "steps", "eval_steps": 12,
                  "save_steps": 12}
CAUSAL = {"task": {"name": "causal-lm", "block_size": 8},
          "data": {"train": {"path": "data/stories.jsonl", "eval_fraction": 0.25}},
          "max_steps": 16, "learning_rate": 0.01, "eval_strategy": "steps", "eval_steps": 8, "save_steps": 8}


def _losses(out):
    state = json.loads((out / "trainer_state.json").read_text())
    history = state["log_history"]
    return [e["loss"] for e in history if "loss" in e], [e for e in history if "eval_loss" in e], state


def _assert_saved_with_tokenizer(out, checkpoint):
    for folder in (out, out / checkpoint):
        assert (folder / "model.safetensors").exists() and (folder / "task.json").exists(), folder
        assert (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists(), folder


# --- trainwell's own torch models (no transformers needed) -----------------------------------------------------------


def test_text_classification_with_the_builtin_model(project, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    config = _config(project, model={"builtin": "embedding-bag", "kwargs": {"dim": 16}}, **CLASSIFICATION)
    code, out, err = _run(capsys, "train", config)
    assert code == 0, err
    assert "text-classification: 36 training examples, 6 evaluation examples, 2 classes" in out
    losses, evals, state = _losses(project / "out")
    assert state["global_step"] == 24 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert [e["step"] for e in evals] == [12, 24] and evals[-1]["eval_accuracy"] == 1.0
    assert "eval_accuracy=1" in out and "tokenizer and task.json" in out
    _assert_saved_with_tokenizer(project / "out", "checkpoint-24")
    task = json.loads((project / "out" / "task.json").read_text())
    assert task["id2label"] == {"0": "neg", "1": "pos"} and task["label2id"] == {"neg": 0, "pos": 1}
    assert task["label_column"] == "sentiment" and task["model"]["builtin"] == "embedding-bag"
    assert task["model"]["kwargs"] == {"vocab_size": 18, "num_labels": 2, "pad_token_id": 0, "dim": 16}


def test_causal_lm_with_the_builtin_transformer(project, capsys):
    config = _config(project, model={"builtin": "transformer", "kwargs": {"size": "tiny"}}, **CAUSAL)
    code, out, err = _run(capsys, "train", config)
    assert code == 0, err
    losses, evals, _ = _losses(project / "out")
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    assert len(evals) == 2 and math.isfinite(evals[-1]["eval_loss"]) and evals[-1]["eval_loss"] < losses[0]
    assert "eval_perplexity=" in out
    _assert_saved_with_tokenizer(project / "out", "checkpoint-16")
    task = json.loads((project / "out" / "checkpoint-16" / "task.json").read_text())
    assert task["task"] == "causal-lm" and task["block_size"] == 8 and task["model"]["kwargs"]["vocab_size"] == 18


# --- transformers models from a config.json or a saved folder ------------------------------------------------------


def test_text_classification_with_a_tiny_bert_config(project, capsys):
    transformers = pytest.importorskip("transformers")
    (project / "bert.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": 21, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 32}))
    config = _config(project, model={"config": "bert.json"}, **CLASSIFICATION)
    code, out, err = _run(capsys, "train", config)
    assert code == 0, err
    losses, evals, _ = _losses(project / "out")
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] and "eval_accuracy" in evals[-1]
    _assert_saved_with_tokenizer(project / "out", "checkpoint-24")
    saved = transformers.AutoConfig.from_pretrained(str(project / "out"))
    assert saved.id2label == {0: "neg", 1: "pos"} and saved.pad_token_id == 0


def test_causal_lm_with_a_gpt2_config_a_tokenizer_folder_then_the_saved_folder(project, capsys):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    folder = project / "hf-tokenizer"
    transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(project / "tokenizer.json")),
                                         unk_token="[UNK]", eos_token="</s>").save_pretrained(str(folder))
    (project / "gpt2.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 21, "n_embd": 16,
                                                   "n_layer": 1, "n_head": 2, "n_positions": 16}))
    config = _config(project, model={"config": "gpt2.json"}, **{**CAUSAL, "tokenizer": "hf-tokenizer"})
    code, out, err = _run(capsys, "train", config)
    assert code == 0, err
    losses, evals, _ = _losses(project / "out")
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] and evals
    _assert_saved_with_tokenizer(project / "out", "checkpoint-16")
    saved = json.loads((project / "out" / "config.json").read_text())
    assert saved["eos_token_id"] == 2 and saved["pad_token_id"] == 2  # the tokenizer's </s>, not GPT-2's 50256

    again = _config(project, "again.yaml", model={"pretrained": "out"},
                    **{**CAUSAL, "tokenizer": "out", "output_dir": str(project / "again"), "max_steps": 2,
                       "eval_strategy": "no"})
    code, out, err = _run(capsys, "train", again)
    assert code == 0, err
    assert json.loads((project / "again" / "trainer_state.json").read_text())["global_step"] == 2


def test_a_transformers_model_without_transformers_says_how_to_install_it(project, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    (project / "bert.json").write_text("{}")
    code, _, err = _run(capsys, "train", _config(project, model={"config": "bert.json"}, **CLASSIFICATION))
    assert code == 2 and "pip install transformers" in err and "model: builtin" in err


# --- errors: what is wrong, the value, the fix -----------------------------------------------------------------------


@pytest.mark.parametrize("change, expected", [
    ({"task": {"name": "text-classification", "text_column": "reveiw", "label_column": "sentiment"}},
     ["data.train: no column 'reveiw' (task.text_column); the columns are ['review', 'sentiment'].",
      "Did you mean 'review'?", "Set task.text_column to the column"]),
    ({"task": {"name": "text-classification", "text_column": "review"}},
     ["data.train: no column 'label' (task.label_column); the columns are ['review', 'sentiment']."]),
    ({"task": "text-clasification"}, ["task='text-clasification' is not a valid value",
                                      "'text-classification', 'causal-lm'", "Did you mean 'text-classification'?"]),
    ({"task": {"name": "causal-lm", "label_column": "x"}}, ["causal-lm takes no key 'label_column'"]),
    ({"task": {"name": "causal-lm", "block_size": 8, "max_length": 8}}, ["not both"]),
    ({"tokenizer": "tokenizers/nope.json"}, ["tokenizer: no such file or folder 'tokenizers/nope.json': looked for",
                                            "relative to the config's folder", "nothing is downloaded"]),
    ({"tokenizer": {"path": "tokenizer.json", "pad_token": "<pad>"}}, ["tokenizer.pad_token='<pad>'", "no such token"]),
    ({"model": {"builtin": "transformer"}}, ["model.builtin='transformer' is a causal-lm model",
                                             "builtin: embedding-bag"]),
    ({"model": {"builtin": "embedding-bag", "kwargs": {"dimm": 8}}}, ["has no parameter 'dimm'", "Did you mean 'dim'"]),
    ({"model": {"builtin": "embedding-bag", "kwargs": {"vocab_size": 8}}}, ["model.kwargs.vocab_size", "leave it out"]),
    ({"model": {"config": "missing.json"}}, ["model.config: no such file 'missing.json': looked for"]),
])
def test_task_errors_name_the_value_and_the_fix(project, capsys, change, expected):
    body = {"model": "builtin", **CLASSIFICATION, **change}
    code, _, err = _run(capsys, "train", _config(project, **body))
    assert code == 2, err
    for text in expected:
        assert text in err, (text, err)


def test_eval_labels_unseen_in_training_are_named(project, capsys):
    with open(project / "data" / "eval.jsonl", "a") as f:
        f.write(json.dumps({"review": "great", "sentiment": "meh"}) + "\n")
    code, _, err = _run(capsys, "train", _config(project, model="builtin", **CLASSIFICATION))
    assert code == 2
    assert "data.eval: the labels ['meh'] never occur in the training data (column 'sentiment')" in err
    assert "the training labels are ['neg', 'pos']" in err


def test_a_tokenizer_or_a_builtin_model_without_a_task_says_to_add_one(project, capsys):
    base = {"data": {"train": "data/train.csv"}, "max_steps": 1}
    code, _, err = _run(capsys, "train", _config(project, model="tests.common.models:RegressionModel", **base))
    assert code == 2 and "add task: text-classification or causal-lm" in err
    body = {**base, "tokenizer": None, "model": "builtin"}
    code, _, err = _run(capsys, "train", _config(project, **body))
    assert code == 2 and "is sized from a tokenizer and a task" in err


# --- the pieces, without training ----------------------------------------------------------------------------------


def test_labels_strings_sorted_integers_keep_their_ids_and_mixtures_are_refused():
    rows = [{"y": "pos"}, {"y": "neg"}, {"y": "pos"}]
    assert Labels.from_rows(rows, None, "y").encode(rows) == [1, 0, 1]
    numbers = [{"y": 2}, {"y": 0}, {"y": 1.0}]
    labels = Labels.from_rows(numbers, [{"y": 1}], "y")
    assert labels.values == [0, 1, 2] and labels.encode(numbers) == [2, 0, 1]
    with pytest.raises(Exception, match="mix strings and numbers"):
        Labels.from_rows([{"y": "pos"}, {"y": 1}], None, "y")
    with pytest.raises(Exception, match="row 2 has the label 0.5"):
        Labels.from_rows([{"y": 1}, {"y": 0.5}], None, "y")


def test_causal_examples_pack_blocks_with_end_of_text_or_keep_one_text_each(project):
    tokenizer = load_tokenizer(str(project / "tokenizer.json"))
    rows = [{"text": "great fun film"}, {"text": "a lovely warm story"}]
    eos = tokenizer.eos_token_id
    great, fun, film, a, lovely, warm, story = tokenizer.encode(["great fun film a lovely warm story"])[0]
    blocks = causal_examples(rows, parse_task({"name": "causal-lm", "block_size": 3}), tokenizer, "data.train")
    assert [b["input_ids"] for b in blocks] == [[great, fun, film], [eos, a, lovely], [warm, story, eos]]
    assert all(b["labels"] == b["input_ids"] for b in blocks)
    blocks = causal_examples(rows, parse_task({"name": "causal-lm", "block_size": 4}), tokenizer, "data.train")
    assert [len(b["input_ids"]) for b in blocks] == [4, 4]  # a last block of one token predicts nothing: dropped
    one_each = causal_examples(rows, Task("causal-lm", max_length=3), tokenizer, "data.train")
    assert [len(b["input_ids"]) for b in one_each] == [3, 3]


def test_the_task_mapping_form_and_aliases():
    assert parse_task("causal-lm") == Task("causal-lm", block_size=128)
    assert parse_task({"name": "Text_Classification", "max_length": 32}) == Task("text-classification", max_length=32)
    assert parse_task("clm").name == "causal-lm"
    with pytest.raises(Exception, match="at least 2"):
        parse_task({"name": "causal-lm", "block_size": 1})


def test_dotted_overrides_below_a_task_name_a_tokenizer_path_or_builtin(project, capsys):
    config = _config(project, model="builtin", **{**CLASSIFICATION, "task": "text-classification"})
    code, out, err = _run(capsys, "train", config, "--print-config", "--task.max_length", 8,
                          "--tokenizer.eos_token", "</s>", "--model.kwargs.dim", 8)
    assert code == 0, err
    merged = json.loads(out)
    assert merged["task"] == {"name": "text-classification", "max_length": 8}
    assert merged["tokenizer"] == {"path": str(project / "tokenizer.json"), "eos_token": "</s>"}
    assert merged["model"] == {"builtin": True, "kwargs": {"dim": 8}}
    code, _, err = _run(capsys, "train", config, "--tokenizer.pad_token", "[PAD]")  # YAML reads a list
    assert code == 2 and "tokenizer.pad_token=['PAD']: name the token as a string" in err


def test_a_tokenizer_folder_without_transformers_is_read_with_tokenizers(project, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    folder = project / "saved"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((project / "tokenizer.json").read_bytes())
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.kind == "tokenizers" and tokenizer.pad_token_id == 0 and tokenizer.vocab_size == 18
    (folder / "tokenizer.json").unlink()
    with pytest.raises(Exception, match="pip install transformers"):
        load_tokenizer(str(folder))
