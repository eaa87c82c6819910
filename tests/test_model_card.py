"""Trainer.create_model_card: the README.md model card an example script writes at its last line."""

from __future__ import annotations

import os

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer


def _mae(prediction):
    return {"mae": float(abs(prediction.predictions - prediction.label_ids).mean())}


@pytest.fixture
def trained(tmp_path):
    args = make_args(str(tmp_path / "my-model"), max_steps=6, eval_strategy="steps", eval_steps=3, logging_steps=2,
                     gradient_accumulation_steps=2, warmup_steps=1)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=16), compute_metrics=_mae)
    trainer.train()
    return trainer


def _card(trainer):
    with open(os.path.join(trainer.args.output_dir, "README.md"), encoding="utf-8") as fh:
        return fh.read()


def test_the_card_records_the_run(trained):
    trained.create_model_card(dataset="toy-regression", tags=["regression"], license="apache-2.0",
                              finetuned_from="org/base-model", language="en")
    card = _card(trained)
    yaml = pytest.importorskip("yaml")
    header = yaml.safe_load(card.split("---")[1])
    assert header["license"] == "apache-2.0" and header["base_model"] == "org/base-model"
    assert header["tags"] == ["regression", "generated_from_trainer"] and "datasets" not in header  # tags only
    assert header["language"] == ["en"] and header["model-index"] == [{"name": "my-model", "results": []}]
    assert "# my-model" in card and "fine-tuned version of [org/base-model]" in card
    assert "on the toy-regression dataset." in card
    last = [h for h in trained.state.log_history if "eval_loss" in h][-1]
    assert f"- Loss: {last['eval_loss']:.4f}" in card and f"- Mae: {last['eval_mae']:.4f}" in card
    for line in ("- learning_rate: 5e-05", "- train_batch_size: 8", "- gradient_accumulation_steps: 2",
                 "- total_train_batch_size: 16", "- lr_scheduler_warmup_steps: 1", "- training_steps: 6"):
        assert line in card
    table = card.split("### Training results")[1].split("###")[0].strip().splitlines()
    assert table[0] == "| Training Loss | Epoch | Step | Validation Loss | Mae    |"
    assert table[1] == "|:-------------:|:-----:|:----:|:---------------:|:------:|"
    assert len(table) == 2 + 2  # header, rule, one row per evaluation (steps 3 and 6)
    cells = [cell.strip() for cell in table[-1].split("|")[1:4]]
    assert cells == [f"{trained.state.log_history[-3]['loss']:.4f}", "1.5", "6"]
    assert "- Pytorch " in card


def test_a_card_without_evaluation_or_arguments(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=make_args(str(tmp_path), max_steps=2),
                      train_dataset=RegressionDataset())
    trainer.train()
    trainer.create_model_card()
    card = _card(trainer)
    assert "This model was trained from scratch on an unknown dataset.\n" in card
    assert "### Training results" not in card and "It achieves" not in card
    assert "tags:\n- generated_from_trainer" in card and "results: []" in card


def _accuracy(prediction):
    return {"accuracy": float((abs(prediction.predictions - prediction.label_ids) < 1.0).mean())}


def _classified(tmp_path, **kwargs):
    args = make_args(str(tmp_path / "clf"), max_steps=4, eval_strategy="steps", eval_steps=2, logging_steps=1)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                      eval_dataset=kwargs.pop("eval_dataset", RegressionDataset(length=16)), compute_metrics=_accuracy)
    trainer.train()
    return trainer


def test_tasks_dataset_tags_and_args_fill_the_model_index(tmp_path):
    trainer = _classified(tmp_path)
    trainer.create_model_card(dataset_tags="toy", dataset="Toy data", dataset_args="noisy", tasks="text-classification")
    yaml = pytest.importorskip("yaml")
    header = yaml.safe_load(_card(trainer).split("---")[1])
    (entry,) = header["model-index"][0]["results"]
    assert entry["task"] == {"name": "Text Classification", "type": "text-classification"}
    assert entry["dataset"] == {"name": "Toy data", "type": "toy", "args": "noisy"}
    last = [h for h in trainer.state.log_history if "eval_loss" in h][-1]
    # only the metric types the Hub recognizes: accuracy, not the loss
    assert entry["metrics"] == [{"name": "Accuracy", "type": "accuracy", "value": last["eval_accuracy"]}]
    assert header["datasets"] == ["toy"] and header["metrics"] == ["accuracy"]


@pytest.mark.parametrize("kwargs", [
    {"dataset": "toy", "tasks": "text-classification"},  # a dataset name without a tag: no dataset entry
    {"dataset_tags": "toy", "tasks": "tabular-regression"},  # a task the model-index does not know
    {"dataset_tags": "toy"},  # no task (a plain torch model has none to infer)
])
def test_no_model_index_result_without_a_task_a_dataset_and_a_metric(tmp_path, kwargs):
    trainer = _classified(tmp_path)
    trainer.create_model_card(**kwargs)
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(_card(trainer).split("---")[1])["model-index"][0]["results"] == []


def test_the_results_table_holds_the_training_log_only(tmp_path):
    trainer = _classified(tmp_path)
    final = trainer.evaluate(RegressionDataset(length=8, seed=1))  # after train(): in "It achieves", not the table
    trainer.create_model_card()
    card = _card(trainer)
    assert f"- Loss: {final['eval_loss']:.4f}\n" in card
    table = card.split("### Training results")[1].split("###")[0].strip().splitlines()
    assert [row.split("|")[3].strip() for row in table[2:]] == ["2", "4"]


def test_no_results_table_without_a_finished_training(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=make_args(str(tmp_path)), eval_dataset=RegressionDataset(8))
    metrics = trainer.evaluate()
    trainer.create_model_card()
    card = _card(trainer)
    assert "### Training results" not in card and f"- Loss: {metrics['eval_loss']:.4f}" in card


def test_an_explicit_finetuned_from_is_kept_an_inferred_local_folder_is_not(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=make_args(str(tmp_path / "out")))
    local = str(tmp_path)
    trainer.create_model_card(finetuned_from=local)
    assert f"base_model: {local}" in _card(trainer) and f"fine-tuned version of [{local}]" in _card(trainer)
    trainer.model.config = type("Config", (), {"_name_or_path": local})()  # what from_pretrained(folder) leaves
    trainer.create_model_card()
    assert "base_model" not in _card(trainer) and "trained from scratch" in _card(trainer)
    trainer.model.config._name_or_path = "org/base"
    trainer.create_model_card()
    assert "base_model: org/base" in _card(trainer)


def _hub_like(datasets, n, builder, split):
    """A datasets.Dataset that says it was loaded from the Hub (builder and config names, split)."""
    data = RegressionDataset(length=n)
    info = datasets.DatasetInfo(builder_name=builder, config_name="noisy")
    return datasets.Dataset.from_dict({"input_x": data.x.tolist(), "labels": data.ys[0].tolist()}, info=info,
                                      split=split)


@pytest.mark.parametrize("builder", ["toy_hub", "csv", None])
def test_the_dataset_is_inferred_from_a_hub_dataset(tmp_path, builder):
    datasets = pytest.importorskip("datasets")
    trainer = _classified(tmp_path, eval_dataset=_hub_like(datasets, 16, builder, "validation"))
    trainer.create_model_card(tasks="text-classification")
    card = _card(trainer)
    yaml = pytest.importorskip("yaml")
    header = yaml.safe_load(card.split("---")[1])
    if builder != "toy_hub":  # local files (csv, json, ...) and from_dict name no Hub dataset
        assert "datasets" not in header and "on an unknown dataset." in card
        return
    assert header["datasets"] == ["toy_hub"] and "on the toy_hub dataset." in card
    (entry,) = header["model-index"][0]["results"]
    assert entry["dataset"] == {"name": "toy_hub", "type": "toy_hub", "config": "noisy", "split": "validation",
                                "args": "noisy"}


def test_the_card_is_the_references_when_installed(tmp_path):
    """The same tiny transformers run under both Trainers writes the same card, but for trainwell's own
    comment, the optimizer's name and the framework versions."""
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    import torch

    import trainwell

    rows = {"input_ids": [[1 + i % 5, 2, 3, 4] for i in range(16)], "labels": [i % 2 for i in range(16)]}
    info = datasets.DatasetInfo(builder_name="toy_hub", config_name="small")
    cards = []
    for module in (trainwell, transformers):
        config = transformers.BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=8, max_position_embeddings=8)
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(config)
        model.config._name_or_path = "org/tiny-bert"
        out = str(tmp_path / "tiny-classifier")
        args = module.TrainingArguments(out, report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no",
                                        max_steps=4, eval_strategy="steps", eval_steps=2, logging_steps=1,
                                        per_device_train_batch_size=4)
        trainer = module.Trainer(model=model, args=args, compute_metrics=_class_accuracy,
                                 train_dataset=datasets.Dataset.from_dict(rows, info=info, split="train"),
                                 eval_dataset=datasets.Dataset.from_dict(rows, info=info, split="test"))
        trainer.train()
        trainer.evaluate()
        trainer.create_model_card(license="mit", language="en", tags=["tiny"])  # a license: no Hub lookup
        cards.append(_comparable(_card(trainer)))
    assert cards[0] == cards[1]
    assert "- task:" in cards[0] and "| Training Loss | Epoch | Step | Validation Loss | Accuracy |" in cards[0]


def _class_accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def _comparable(card):
    """The card without what differs on purpose: the comment, the optimizer's name and the versions."""
    card = card.split("### Framework versions")[0]
    lines = [line for line in card.splitlines() if not line.startswith(("<!--", "should probably", "- optimizer:"))]
    return "\n".join(lines)
