#!/usr/bin/env python
"""Fine-tune a ``transformers`` sequence classifier on local CSV or JSON files with trainwell's Trainer.

Written the way the reference's example scripts are (argument dataclasses and ``HfArgumentParser``,
``--do_train``/``--do_eval``, resuming from the last checkpoint, ``log_metrics``/``save_metrics``/``save_state``
and a model card at the end), so it doubles as a check of the drop-in promise: replace ``trainwell`` with
``transformers`` in this file and it runs on the reference Trainer unchanged (``tests/test_examples.py`` does
exactly that and compares the metrics).

    python examples/run_classification.py --model_name_or_path MODEL_DIR --train_file train.csv \\
        --validation_file dev.csv --output_dir out --do_train --do_eval

The files need a text column (``--text_column``, default ``sentence``) and a label column (``--label_column``,
default ``label``). The model and tokenizer are loaded with ``from_pretrained`` (a local folder works offline).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import datasets
import numpy as np
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

import trainwell
from trainwell import DataCollatorWithPadding, EvalPrediction, HfArgumentParser, Trainer, TrainingArguments, set_seed
from trainwell.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "A model folder or model id to fine-tune."})


@dataclass
class DataArguments:
    train_file: str = field(default=None, metadata={"help": "A CSV or JSON file with the training examples."})
    validation_file: str = field(default=None, metadata={"help": "A CSV or JSON file with the evaluation examples."})
    text_column: str = field(default="sentence", metadata={"help": "The column holding the text."})
    label_column: str = field(default="label", metadata={"help": "The column holding the label."})
    max_seq_length: int = field(default=128, metadata={"help": "Longer texts are truncated."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only this many evaluation examples."})


def setup_logging(training_args: TrainingArguments) -> None:
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        trainwell.utils.logging.set_verbosity_info()  # the default log_level ("passive") then means INFO
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    trainwell.utils.logging.set_verbosity(log_level)
    trainwell.utils.logging.enable_default_handler()
    trainwell.utils.logging.enable_explicit_format()


def last_checkpoint_of(training_args: TrainingArguments) -> str | None:
    if not (os.path.isdir(training_args.output_dir) and training_args.do_train):
        return None
    checkpoint = get_last_checkpoint(training_args.output_dir)
    if checkpoint is not None and training_args.resume_from_checkpoint is None:
        logger.info(f"Checkpoint detected, resuming training at {checkpoint}.")
    return checkpoint


def load_data(data_args: DataArguments) -> datasets.DatasetDict:
    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    files = {split: path for split, path in files.items() if path is not None}
    kind = "csv" if next(iter(files.values())).endswith(".csv") else "json"
    return datasets.load_dataset(kind, data_files=files)


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    logger.info(f"Training/evaluation parameters {training_args}")
    last_checkpoint = last_checkpoint_of(training_args)
    set_seed(training_args.seed)

    raw = load_data(data_args)
    labels = sorted(str(label) for label in raw["train"].unique(data_args.label_column))
    label_to_id = {label: i for i, label in enumerate(labels)}
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, num_labels=len(labels))
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, config=config)

    def preprocess(examples: dict) -> dict:
        encoded = tokenizer(examples[data_args.text_column], truncation=True, max_length=data_args.max_seq_length)
        # a new column: reusing the name of the (text) label column would keep that column's string type
        encoded["labels"] = [label_to_id[str(label)] for label in examples[data_args.label_column]]
        return encoded

    with training_args.main_process_first(desc="dataset map pre-processing"):
        processed = raw.map(preprocess, batched=True, remove_columns=raw["train"].column_names)
    train_dataset, eval_dataset = processed["train"], processed.get("validation")
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    if eval_dataset is not None and data_args.max_eval_samples is not None:
        eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))

    def compute_metrics(prediction: EvalPrediction) -> dict:
        predicted = np.argmax(prediction.predictions, axis=1)
        return {"accuracy": float((predicted == prediction.label_ids).mean())}

    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None, compute_metrics=compute_metrics,
        processing_class=tokenizer, data_collator=DataCollatorWithPadding(tokenizer),
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        logger.info("*** Evaluate ***")
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    card = {"finetuned_from": model_args.model_name_or_path, "tasks": "text-classification"}
    if training_args.push_to_hub:
        trainer.push_to_hub(**card)
    else:
        trainer.create_model_card(**card)


if __name__ == "__main__":
    main()
