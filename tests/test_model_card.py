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
    assert header["tags"] == ["generated_from_trainer", "regression"] and header["datasets"] == ["toy-regression"]
    assert header["language"] == ["en"] and header["model-index"][0]["name"] == "my-model"
    assert "# my-model" in card and "fine-tuned version of [org/base-model]" in card and "toy-regression" in card
    last = [h for h in trained.state.log_history if "eval_loss" in h][-1]
    assert f"- Loss: {last['eval_loss']:.4f}" in card and f"- Mae: {last['eval_mae']:.4f}" in card
    for line in ("- learning_rate: 5e-05", "- train_batch_size: 8", "- gradient_accumulation_steps: 2",
                 "- total_train_batch_size: 16", "- lr_scheduler_warmup_steps: 1", "- training_steps: 6"):
        assert line in card
    table = card.split("### Training results")[1].split("###")[0].strip().splitlines()
    assert table[0] == "| Training Loss | Epoch | Step | Mae | Validation Loss |"
    assert len(table) == 2 + 2  # header, rule, one row per evaluation (steps 3 and 6)
    assert "| 6 |" in table[-1]
    assert "- Pytorch " in card


def test_a_card_without_evaluation_or_arguments(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=make_args(str(tmp_path), max_steps=2),
                      train_dataset=RegressionDataset())
    trainer.train()
    trainer.create_model_card()
    card = _card(trainer)
    assert "This model was trained from scratch." in card and "### Training results" not in card
    assert "tags:\n- generated_from_trainer" in card


def test_tasks_and_dataset_args_fill_the_model_index(trained):
    trained.create_model_card(dataset="toy-regression", dataset_args="noisy", tasks="tabular-regression")
    yaml = pytest.importorskip("yaml")
    (entry,) = yaml.safe_load(_card(trained).split("---")[1])["model-index"][0]["results"]
    assert entry["task"] == {"type": "tabular-regression", "name": "Tabular Regression"}
    assert entry["dataset"] == {"name": "toy-regression", "type": "toy-regression", "args": "noisy"}
    last = [h for h in trained.state.log_history if "eval_loss" in h][-1]
    assert {m["type"]: m["value"] for m in entry["metrics"]} == {"mae": last["eval_mae"], "loss": last["eval_loss"]}
