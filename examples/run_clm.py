#!/usr/bin/env python
"""Train or fine-tune a ``transformers`` causal language model on local text files with trainwell's Trainer.

The reference's example style (argument dataclasses, ``--do_train``/``--do_eval``, resume from the last
checkpoint, metrics files, a model card at the end); replace ``trainwell`` with ``transformers`` in this file and
it runs on the reference (``tests/test_examples.py`` compares the two).

    python examples/run_clm.py --model_name_or_path MODEL_DIR --train_file train.txt --validation_file dev.txt \\
        --output_dir out --do_train --do_eval --block_size 64

Text files (``.txt``, one document per line) or CSV/JSON files with a ``text`` column. The texts are tokenized,
concatenated and cut into blocks of ``block_size`` tokens; the labels are the inputs (the model shifts them).
Evaluation reports ``perplexity`` = exp(``eval_loss``).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from itertools import chain

import datasets
from transformers import AutoModelForCausalLM, AutoTokenizer

import trainwell
from trainwell import HfArgumentParser, Trainer, TrainingArguments, default_data_collator, set_seed
from trainwell.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "A model folder or model id."})


@dataclass
class DataArguments:
    train_file: str = field(default=None, metadata={"help": "A .txt, .csv or .json file of training text."})
    validation_file: str = field(default=None, metadata={"help": "The same, for evaluation."})
    block_size: int = field(default=128, metadata={"help": "Tokens per training example."})


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
    trainwell.utils.logging.enable_explicit_format()


def load_texts(data_args: DataArguments) -> datasets.DatasetDict:
    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    files = {split: path for split, path in files.items() if path is not None}
    extension = next(iter(files.values())).rsplit(".", 1)[-1]
    return datasets.load_dataset({"txt": "text"}.get(extension, extension), data_files=files)


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
    set_seed(training_args.seed)

    raw = load_texts(data_args)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    block = data_args.block_size

    def tokenize(examples: dict) -> dict:
        return tokenizer(examples["text"])

    def group(examples: dict) -> dict:
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = (len(joined["input_ids"]) // block) * block
        result = {k: [v[i : i + block] for i in range(0, total, block)] for k, v in joined.items()}
        result["labels"] = [ids.copy() for ids in result["input_ids"]]
        return result

    with training_args.main_process_first(desc="tokenizing and grouping"):
        tokenized = raw.map(tokenize, batched=True, remove_columns=raw["train"].column_names)
        blocks = tokenized.map(group, batched=True)

    trainer = Trainer(
        model=model, args=training_args, train_dataset=blocks["train"] if training_args.do_train else None,
        eval_dataset=blocks.get("validation") if training_args.do_eval else None, processing_class=tokenizer,
        data_collator=default_data_collator,
    )
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint or last_checkpoint)
        trainer.save_model()
        metrics = result.metrics
        metrics["train_samples"] = len(blocks["train"])
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(blocks["validation"])
        metrics["perplexity"] = math.exp(metrics["eval_loss"]) if metrics["eval_loss"] < 100 else float("inf")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    card = {"finetuned_from": model_args.model_name_or_path, "tasks": "text-generation"}
    if training_args.push_to_hub:
        trainer.push_to_hub(**card)
    else:
        trainer.create_model_card(**card)


if __name__ == "__main__":
    main()
