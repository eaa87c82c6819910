"""``trainwell predict`` and ``trainwell.cli.inference.load_trained``: a model ``trainwell train`` trained with a task
gives predictions from texts given as arguments, a file or stdin, into stdout, JSONL or CSV, from its output_dir,
a checkpoint or its config; and a folder that is not such a run gets one line saying what it is and what to pass.

The runs are trained here, a few steps each, on the tiny corpus of ``tests/test_cli_tasks.py``."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys

import pytest
import yaml

from tests.common.cli import run_cli
from tests.test_cli_tasks import CAUSAL, CLASSIFICATION, NEGATIVE, POSITIVE, make_project
from trainwell.cli import CliError, main
from trainwell.cli.inference import load_trained


def _train(folder, name, model, task_body, **extra):
    body = {"tokenizer": "tokenizer.json", "output_dir": str(folder / name), "use_cpu": True, "disable_tqdm": True,
            "report": False, "logging_steps": 4, "per_device_train_batch_size": 8, "model": model, **task_body,
            **extra}
    config = folder / f"{name}.yaml"
    config.write_text(yaml.safe_dump(body, sort_keys=False))
    assert main(["train", str(config)]) == 0
    return folder / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A text classifier (embedding-bag, accuracy 1 on its eval set) and a causal LM (the tiny transformer)."""
    folder = make_project(tmp_path_factory.mktemp("predict") / "project")
    classifier = _train(folder, "classifier", {"builtin": "embedding-bag", "kwargs": {"dim": 16}}, CLASSIFICATION)
    lm = _train(folder, "lm", {"builtin": "transformer", "kwargs": {"size": "tiny"}}, CAUSAL)
    return folder, classifier, lm


def test_classifier_predicts_labels_with_scores_from_arguments(runs, capsys):
    _, classifier, _ = runs
    code, out, err = run_cli(capsys, "predict", classifier, POSITIVE[0], NEGATIVE[1], "lovely")
    assert code == 0, err
    lines = [line.split("\t") for line in out.splitlines()]
    assert [(label, text) for label, _, text in lines] == [("pos", POSITIVE[0]), ("neg", NEGATIVE[1]),
                                                            ("pos", "lovely")]
    assert all(0.5 < float(score) <= 1.0 for _, score, _ in lines)


def test_classifier_reads_a_csv_column_and_writes_jsonl_and_csv(runs, capsys):
    folder, classifier, _ = runs
    data = folder / "data" / "train.csv"
    out_jsonl, out_csv = folder / "predictions.jsonl", folder / "predictions.csv"
    code, _, err = run_cli(capsys, "predict", classifier, "--data", data, "--text-column", "review",
                           "--output", out_jsonl)
    assert code == 0 and "36 predictions (text-classification" in err and str(out_jsonl) in err, err
    rows = [json.loads(line) for line in out_jsonl.read_text().splitlines()]
    with open(data, newline="") as f:
        truth = list(csv.DictReader(f))
    assert [r["text"] for r in rows] == [t["review"] for t in truth]
    assert [r["label"] for r in rows] == [t["sentiment"] for t in truth]  # it learned the training set
    assert all(set(r["scores"]) == {"neg", "pos"} and r["score"] == max(r["scores"].values()) for r in rows)
    code, _, err = run_cli(capsys, "predict", classifier, "--data", folder / "data" / "eval.jsonl",
                           "--text-column", "review", "--output", out_csv)
    assert code == 0, err
    with open(out_csv, newline="") as f:
        written = list(csv.DictReader(f))
    assert list(written[0]) == ["text", "label", "score"] and len(written) == 6


def test_classifier_reads_stdin_and_a_text_file_and_its_config_and_checkpoint_name_it(runs, capsys, monkeypatch):
    folder, classifier, _ = runs
    monkeypatch.setattr(sys, "stdin", io.StringIO("awful music\n\nlovely music\n"))
    code, out, err = run_cli(capsys, "predict", folder / "classifier.yaml")  # the config names its output_dir
    assert code == 0, err
    assert [line.split("\t")[0] for line in out.splitlines()] == ["neg", "pos"]  # the blank line skipped
    texts = folder / "texts.txt"
    texts.write_text("great acting\n\nslow boring\n")
    code, out, err = run_cli(capsys, "predict", classifier / "checkpoint-12", "--data", texts, "--format", "jsonl")
    assert code == 0, err
    assert [json.loads(line)["label"] for line in out.splitlines()] == ["pos", "neg"]


def test_causal_lm_continues_a_prompt_greedily_or_sampled_by_seed(runs, capsys):
    _, _, lm = runs
    code, out, err = run_cli(capsys, "predict", lm, "great", "a lovely", "--max-new-tokens", 4)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("great") and lines[1].startswith("a lovely")
    assert run_cli(capsys, "predict", lm, "great", "a lovely", "--max-new-tokens", 4)[1] == out  # greedy
    sampled = [run_cli(capsys, "predict", lm, "great", "--max-new-tokens", 6, "--temperature", 1.5, "--seed", s,
                       "--format", "jsonl")[1] for s in (1, 1, 2, 3, 4)]
    assert sampled[0] == sampled[1] and len(set(sampled)) > 1  # one seed, one text; seeds differ
    row = json.loads(sampled[0])
    vocabulary = set(" ".join(POSITIVE + NEGATIVE).split())
    assert row["text"] == "great" and set(row["generated"].split()) <= vocabulary
    assert 1 <= len(row["generated"].split()) <= 6 and row["generated"].startswith(" ")  # the tokenizer's spacing


def test_the_python_loader(runs):
    _, classifier, lm = runs
    trained = load_trained(classifier)
    assert trained.task.name == "text-classification" and trained.labels == ["neg", "pos"]
    assert [p["label"] for p in trained.predict(POSITIVE[:2] + NEGATIVE[:2], batch_size=3)] == [
        "pos", "pos", "neg", "neg"]
    generated = load_trained(lm).predict(["great fun"], max_new_tokens=2)
    assert generated[0]["text"] == "great fun" and isinstance(generated[0]["generated"], str)
    with pytest.raises(CliError, match="text 1 is '': pass a non-empty string"):
        trained.predict([""])


# --- a folder that is not a run --------------------------------------------------------------------------------------


def _error(capsys, *argv) -> str:
    code, out, err = run_cli(capsys, "predict", *argv)
    assert code == 2 and out == "" and err.count("\n") == 2 and "Traceback" not in err, (code, out, err)
    return err.splitlines()[0]


def test_folders_that_are_not_runs_are_named_with_what_to_pass(runs, capsys, tmp_path):
    folder, classifier, _ = runs
    assert "nope': no such folder" in _error(capsys, tmp_path / "nope", "x")
    assert "is not a trainwell run: it has no task.json; pass the output_dir" in _error(capsys, folder / "data", "x")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "trainer_state.json").write_text("{}")
    assert "holds a model trained without a task: section" in _error(capsys, plain, "x")
    unfinished = tmp_path / "unfinished"
    shutil.copytree(classifier / "checkpoint-12", unfinished / "checkpoint-12")
    (unfinished / "trainer_state.json").write_text("{}")
    # a run without its final model (interrupted, still training) predicts with its newest checkpoint, saying so
    code, out, err = run_cli(capsys, "predict", unfinished, "x")
    assert code == 0 and out.split("\t")[0] in ("pos", "neg")
    assert f"{unfinished} has no final model yet (interrupted, or still training): using its newest checkpoint, " \
           f"{unfinished / 'checkpoint-12'}" in err
    assert "without a task: section, not the config" in _error(capsys, folder / "tokenizer.json", "x")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "task.json").write_text('{"task": "translation"}')
    assert "task 'translation' is not one of text-classification, causal-lm" in _error(capsys, broken, "x")


def test_input_and_output_errors_come_before_the_model_is_loaded(runs, capsys, monkeypatch):
    folder, classifier, _ = runs

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    assert "no texts to predict on: give texts as arguments" in _error(capsys, classifier)
    assert "--output out.txt: name a .jsonl or .csv file" in _error(capsys, classifier, "x", "--output", "out.txt")
    assert "not both" in _error(capsys, classifier, "x", "--data", folder / "data" / "train.csv")
    line = _error(capsys, classifier, "--data", folder / "data" / "stories.jsonl", "--text-column", "review")
    assert "row 1 has no column 'review' (the columns are ['text'])" in line
    assert "--data: no such file" in _error(capsys, classifier, "--data", folder / "missing.txt")


def test_a_factory_model_is_loaded_into_the_module_the_caller_builds(runs, tmp_path):
    _, classifier, _ = runs
    run = tmp_path / "factory-run"
    shutil.copytree(classifier, run)
    task = json.loads((run / "task.json").read_text())
    kwargs = task["model"]["kwargs"]
    (run / "task.json").write_text(json.dumps({**task, "model": "mypackage.models:build"}))
    with pytest.raises(CliError, match=r"from the factory 'mypackage.models:build'.*load_trained\(path, model="):
        load_trained(run)
    from trainwell.cli.models import embedding_bag

    trained = load_trained(run, model=embedding_bag(**kwargs))
    assert trained.predict([POSITIVE[0]])[0]["label"] == "pos"


def test_transformers_models_from_a_config_predict_too(tmp_path, capsys):
    pytest.importorskip("transformers")
    folder = make_project(tmp_path / "project")
    (folder / "bert.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": 21, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 32}))
    (folder / "gpt2.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 21, "n_embd": 16,
                                                  "n_layer": 1, "n_head": 2, "n_positions": 16}))
    classifier = _train(folder, "bert", {"config": "bert.json"}, CLASSIFICATION, max_steps=12, eval_strategy="no")
    lm = _train(folder, "gpt2", {"config": "gpt2.json"}, CAUSAL, max_steps=4, eval_strategy="no")
    capsys.readouterr()  # the training's own output
    code, out, err = run_cli(capsys, "predict", classifier, POSITIVE[0], "--format", "jsonl")
    assert code == 0 and json.loads(out)["label"] in ("neg", "pos"), err
    # a prompt longer than the 16 positions: the model sees its last 16 tokens
    code, out, err = run_cli(capsys, "predict", lm, " ".join(POSITIVE), "--max-new-tokens", 3, "--format", "jsonl")
    assert code == 0 and json.loads(out)["text"] == " ".join(POSITIVE), err


# --- a hostile run folder --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("edit", "expected"), [
    ({"max_length": "long"}, "task.max_length='long': pass a whole number of tokens"),
    ({"max_length": -5}, "task.max_length=-5: pass a whole number of tokens"),
    ({"text_column": 3}, "task.text_column=3: name a column"),
    ({"labels": 5}, "needs its 'labels' (in id order: a list of names or numbers), not 5"),
    ({"labels": [["nested"]]}, "needs its 'labels'"),
    ({"pad_token_id": "x"}, "pad_token_id='x' is not a token id"),
    ({"model": {"builtin": "embedding-bag", "kwargs": ["dim", 16]}}, "model.kwargs=['dim', 16] is not a mapping"),
    ({"model": {"builtin": "embedding-bag", "kwargs": {"bogus": 1}}}, "has no parameter 'bogus'"),
    ({"model": {"builtin": "embedding-bag", "kwargs": {"vocab_size": 10**12, "num_labels": 2, "dim": 16}}},
     "in that model. The folder's files do not belong together"),
    ({"model": {"builtin": "embedding-bag", "kwargs": {"vocab_size": "x", "num_labels": 2}}},
     "the embedding-bag model cannot be built from"),
], ids=["length-text", "length-negative", "column", "labels", "labels-nested", "pad", "kwargs-list", "kwargs-key",
        "kwargs-huge", "kwargs-kind"])
def test_hostile_task_json_values_are_named(runs, capsys, tmp_path, edit, expected):
    """Every value ``task.json`` holds is checked before it builds anything: a crafted size is a mismatch with the
    weights (the model is built on the meta device first), never an allocation; one line, no traceback."""
    _, classifier, _ = runs
    run = tmp_path / "run"
    shutil.copytree(classifier, run)
    task = json.loads((run / "task.json").read_text())
    (run / "task.json").write_text(json.dumps({**task, **edit}))
    line = _error(capsys, run, "x")
    assert str(run / "task.json") in line and expected in line, line


@pytest.mark.parametrize("kind", ["link", "fifo", "huge"])
def test_a_task_json_that_is_not_a_small_regular_file_is_named(runs, capsys, tmp_path, kind):
    _, classifier, _ = runs
    run = tmp_path / "run"
    shutil.copytree(classifier, run)
    task = run / "task.json"
    if kind == "link":
        (tmp_path / "outside.json").write_text(task.read_text())
        task.unlink()
        task.symlink_to(tmp_path / "outside.json")
    elif kind == "fifo":
        task.unlink()
        os.mkfifo(task)
    else:
        task.write_text(json.dumps({**json.loads(task.read_text()), "padding": "x" * (17 << 20)}))
    with pytest.raises(CliError) as err:
        load_trained(run)
    assert str(task) in str(err.value) and {"link": "is a symbolic link", "fifo": "is a FIFO",
                                            "huge": "is larger than"}[kind] in str(err.value)


def _remote_code_run(runs, tmp_path):
    """The classifier's run with a transformers config naming code of its own (auto_map): importing that code would
    leave a marker file."""
    pytest.importorskip("transformers")
    _, classifier, _ = runs
    run, marker = tmp_path / "remote", tmp_path / "code-ran"
    shutil.copytree(classifier, run)
    task = json.loads((run / "task.json").read_text())
    (run / "task.json").write_text(json.dumps({**task, "model": {"config": "bert.json"}}))
    (run / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {
        "AutoConfig": "configuration_evil.EvilConfig", "AutoModelForSequenceClassification": "modeling_evil.Evil"}}))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (run / name).write_text(f"open({str(marker)!r}, 'w').close()\n")
    return run, marker


def test_code_in_a_run_folder_never_runs_without_trust_remote_code(runs, capsys, tmp_path, monkeypatch):
    """transformers is told trust_remote_code=False outright: it raises instead of asking on stdin (where a "y"
    would run the folder's code); the error says how to trust it."""
    run, marker = _remote_code_run(runs, tmp_path)

    class NoInput(io.StringIO):
        def readline(self, *args):
            raise AssertionError("stdin was read: transformers asked whether to run the folder's code")

        read = readline

    monkeypatch.setattr(sys, "stdin", NoInput())
    monkeypatch.setattr("builtins.input", NoInput().readline)
    line = _error(capsys, run, "x")
    assert "names code of its own (auto_map)" in line and "--trust-remote-code" in line, line
    assert not marker.exists()


def test_trust_remote_code_is_handed_to_transformers_when_given(runs, capsys, tmp_path, monkeypatch):
    import transformers

    run, _ = _remote_code_run(runs, tmp_path)
    seen = {}

    def recording(path, **kwargs):
        seen.update(kwargs)
        raise OSError("stopped here")

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", recording)
    _error(capsys, run, "x", "--trust-remote-code")
    assert seen["trust_remote_code"] is True and seen["local_files_only"] is True
    with pytest.raises(CliError, match="stopped here"):
        load_trained(run)
    assert seen["trust_remote_code"] is False  # said outright, never left for transformers to ask


def test_sampling_suggested_by_task_json_applies_unless_given():
    from trainwell.cli.predict import _generation_defaults

    assert _generation_defaults({"generation": {"temperature": 0.8, "top_k": 40}}) == {"temperature": 0.8, "top_k": 40}
    assert _generation_defaults({"generation": {"temperature": "hot", "top_k": -1}}) == {}  # not numbers in range
    assert _generation_defaults({"generation": [1]}) == {} and _generation_defaults({}) == {}


def test_the_help_names_the_demos_run_as_a_run_to_predict_with(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "output_dir of a `trainwell demo` run or of a `trainwell train` run with a task" in text
