#!/usr/bin/env python
"""Fine-tune a ``transformers`` token classifier (NER, POS tagging) on local JSON-lines files with trainwell.

The reference's example style (argument dataclasses, ``--do_train``/``--do_eval``, resume from the last
checkpoint, metrics files, a model card at the end); replace ``trainwell`` with ``transformers`` in this file and
it runs on the reference (``tests/test_examples.py`` compares the two).

    python examples/run_ner.py --model_name_or_path MODEL_DIR --train_file train.json \\
        --validation_file dev.json --output_dir out --do_train --do_eval

Each line holds a list of words (``--tokens_column``, default ``tokens``) and one tag per word
(``--tags_column``, default ``ner_tags``). Only the first sub-token of a word carries its tag; the others and
the special tokens are ignored (label ``-100``). Evaluation reports the accuracy over tagged words.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import datasets
import numpy as np
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

import trainwell
from trainwell import DataCollatorForTokenClassification, HfArgumentParser, Trainer, TrainingArguments, set_seed
from trainwell.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "A model folder or model id."})


@dataclass
class DataArguments:
    train_file: str = field(default=None, metadata={"help": "A JSON-lines file of tagged sentences."})
    validation_file: str = field(default=None, metadata={"help": "The same, for evaluation."})
    tokens_column: str = field(default="tokens", metadata={"help": "The column holding the words."})
    tags_column: str = field(default="ner_tags", metadata={"help": "The column holding one tag per word."})


def setup_logging(training_args: TrainingArguments) -> None:
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        trainwell.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    trainwell.utils.logging.set_verbosity(log_level)
    trainwell.utils.logging.enable_default_handler()


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
    set_seed(training_args.seed)

    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    raw = datasets.load_dataset("json", data_files={k: v for k, v in files.items() if v is not None})
    tags = sorted({tag for row in raw["train"][data_args.tags_column] for tag in row})
    tag_to_id = {tag: i for i, tag in enumerate(tags)}
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, num_labels=len(tags),
                                        id2label=dict(enumerate(tags)), label2id=tag_to_id)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    # a checkpoint with another number of tags (or none) gets a freshly initialized classification head
    model = AutoModelForTokenClassification.from_pretrained(model_args.model_name_or_path, config=config,
                                                            ignore_mismatched_sizes=True)

    def tokenize_and_align(examples: dict) -> dict:
        encoded = tokenizer(examples[data_args.tokens_column], truncation=True, is_split_into_words=True)
        labels = []
        for i, word_tags in enumerate(examples[data_args.tags_column]):
            previous, row = None, []
            for word in encoded.word_ids(batch_index=i):
                row.append(-100 if word is None or word == previous else tag_to_id[word_tags[word]])
                previous = word
            labels.append(row)
        encoded["labels"] = labels
        return encoded

    with training_args.main_process_first(desc="tokenizing"):
        processed = raw.map(tokenize_and_align, batched=True, remove_columns=raw["train"].column_names)

    def compute_metrics(prediction) -> dict:
        predicted = np.argmax(prediction.predictions, axis=-1)
        tagged = prediction.label_ids != -100
        return {"accuracy": float((predicted[tagged] == prediction.label_ids[tagged]).mean())}

    trainer = Trainer(
        model=model, args=training_args, train_dataset=processed["train"] if training_args.do_train else None,
        eval_dataset=processed.get("validation") if training_args.do_eval else None, processing_class=tokenizer,
        data_collator=DataCollatorForTokenClassification(tokenizer), compute_metrics=compute_metrics,
    )
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint or last_checkpoint)
        trainer.save_model()
        metrics = result.metrics
        metrics["train_samples"] = len(processed["train"])
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(processed["validation"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    card = {"finetuned_from": model_args.model_name_or_path, "tasks": "token-classification"}
    if training_args.push_to_hub:
        trainer.push_to_hub(**card)
    else:
        trainer.create_model_card(**card)


if __name__ == "__main__":
    main()
