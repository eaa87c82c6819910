"""``Trainer.create_model_card``: a ``README.md`` model card in ``output_dir``, from the run itself.

The card is the reference's, section for section and rule for rule: a YAML header the Hugging Face Hub reads
(language, license, base model, tags ending with ``generated_from_trainer``, datasets, the recognized metric
types and a ``model-index``), a title, the last evaluation's results, placeholders for the parts only a person
can write, the training hyperparameters, the table of the evaluations made during training, and the framework
versions. The rules it shares with the reference:

* the results table lists the evaluations logged *during training* (before the first ``train_runtime``
  entry of ``log_history``); no table without a finished ``train()``; "It achieves ..." is the last evaluation
  of the whole log, a final ``trainer.evaluate()`` included;
* a ``model-index`` result needs a known task, a dataset *tag* and a recognized metric (accuracy, f1, ...);
  without all three ``results`` is empty, as the Hub rejects partial entries;
* the dataset is inferred from the Trainer's datasets when they are ``datasets.Dataset`` objects loaded from
  the Hub (their builder name, config and split), the task from the ``transformers`` model class;
* an explicit ``finetuned_from`` is kept as given; otherwise the model's ``config._name_or_path`` unless it
  is a local folder.

Where trainwell writes less than the reference, on purpose: ``library_name: transformers`` only for a
``transformers`` model; an unknown base model (a model built from a config has ``_name_or_path == ""``) is
"trained from scratch", not a link to ``https://huggingface.co/``; a dataset without a builder name (one made
with ``Dataset.from_dict``) is not named "None"; results and table rows hold the evaluation metrics only (no
memory or throughput keys); a run without evaluations has no empty "Training results" section; a
``model_name`` left out with ``output_dir="."`` is the folder's name. The card
needs no Hub access and no ``transformers``. It is written beside its name and renamed into place: a
``README.md`` that is a symbolic link is replaced, what it pointed to is never written.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Any

import yaml

from trainwell.args.storage import local_output_dir
from trainwell.utils.safe_files import write_text_file

MODEL_CARD_NAME = "README.md"
_MISSING = "More information needed"
_COMMENT = "<!-- This model card was written by trainwell from the training run. Edit it freely. -->"
# keys of an evaluation log that are bookkeeping, not results
_NOT_RESULTS = ("runtime", "samples_per_second", "steps_per_second", "tokens_per_second", "epoch", "step",
                "mem_", "jit_compilation_time", "model_preparation_time")
# The tasks a model-index result may name (the Hub's task tags), with their display names.
TASK_NAMES = {
    "fill-mask": "Masked Language Modeling", "image-classification": "Image Classification",
    "image-segmentation": "Image Segmentation", "multiple-choice": "Multiple Choice",
    "object-detection": "Object Detection", "question-answering": "Question Answering",
    "table-question-answering": "Table Question Answering", "text-classification": "Text Classification",
    "text-generation": "Causal Language Modeling", "token-classification": "Token Classification",
    "zero-shot-classification": "Zero Shot Classification",
    "automatic-speech-recognition": "Automatic Speech Recognition", "audio-classification": "Audio Classification",
}
# Metric types the model-index records, matched against the results' names (rouge1 counts as rouge).
METRIC_TYPES = ("accuracy", "bleu", "f1", "matthews_correlation", "pearsonr", "precision", "recall", "rouge",
                "sacrebleu", "spearmanr", "wer")
# The task of a transformers model class: the transformers.models.auto.modeling_auto tables that list it.
# Later entries win, as in the reference's scan.
_TASK_TABLES = (
    ("text-generation", ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",)),
    ("image-classification", ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",)),
    ("image-segmentation", ("MODEL_FOR_IMAGE_SEGMENTATION_MAPPING_NAMES",)),
    ("fill-mask", ("MODEL_FOR_MASKED_LM_MAPPING_NAMES",)),
    ("object-detection", ("MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",)),
    ("question-answering", ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",)),
    ("text2text-generation", ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",)),
    ("text-classification", ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",)),
    ("table-question-answering", ("MODEL_FOR_TABLE_QUESTION_ANSWERING_MAPPING_NAMES",)),
    ("token-classification", ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",)),
    ("audio-classification", ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",)),
    ("automatic-speech-recognition", ("MODEL_FOR_CTC_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES")),
    ("zero-shot-image-classification", ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",)),
    ("image-text-to-text", ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",)),
)
# Builders of local files: a dataset loaded with them names no Hub dataset.
_LOCAL_BUILDERS = ("csv", "json", "pandas", "parquet", "text")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _display_name(key: str) -> str:
    """``eval_f1_macro`` -> ``F1 Macro``; ``eval_loss`` -> ``Loss``."""
    return " ".join(part.capitalize() for part in key.removeprefix("eval_").split("_"))


def _is_result(key: str) -> bool:
    return key.startswith("eval_") and not any(part in key for part in _NOT_RESULTS)


def _results_of(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if _is_result(k)}


def last_evaluation(log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of the last evaluation logged, by display name (``Loss``, ``Accuracy``); empty without one."""
    for entry in reversed(log_history):
        if results := _results_of(entry):
            return {_display_name(k): v for k, v in results.items()}
    return {}


def training_rows(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per evaluation logged during training (before the first ``train_runtime`` entry): the training
    loss logged last before it (``"No log"`` if none), epoch, step and the metrics. Empty without a finished
    ``train()``."""
    end = next((i for i, entry in enumerate(log_history) if "train_runtime" in entry), None)
    rows: list[dict[str, Any]] = []
    train_loss: Any = "No log"
    for entry in log_history[:end] if end is not None else ():
        train_loss = entry.get("loss", train_loss)
        if results := _results_of(entry):
            row = {"Training Loss": train_loss, "Epoch": entry.get("epoch"), "Step": entry.get("step")}
            row.update({("Validation Loss" if k == "eval_loss" else _display_name(k)): v for k, v in results.items()})
            rows.append(row)
    return rows


def _shown(value: Any) -> str:
    """A float with more than 4 decimals rounded to 4, anything else as ``str`` (``0.5`` stays ``0.5``)."""
    text = str(value)
    if isinstance(value, float) and "." in text and len(text.split(".")[1]) > 4:
        return f"{value:.4f}"
    return text


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of ``rows``, columns padded to their widest cell, centred; the columns are the union
    of the rows' keys, in first-seen order."""
    columns = list(dict.fromkeys(c for row in rows for c in row))
    cells = [[_shown(row.get(c, "")) for c in columns] for row in rows]
    widths = [max([len(c), *(len(line[i]) for line in cells)]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "".join(f"| {v}" + " " * (w - len(v) + 1) for v, w in zip(values, widths)) + "|\n"

    return line(columns) + "".join("|:" + "-" * w + ":" for w in widths) + "|\n" + "".join(map(line, cells))


def hyperparameters(trainer: Any) -> dict[str, Any]:
    """The training hyperparameters the card lists, in the reference's order and names."""
    args, runtime = trainer.args, trainer.runtime
    out: dict[str, Any] = {"learning_rate": args.learning_rate, "train_batch_size": args.per_device_train_batch_size,
                           "eval_batch_size": args.per_device_eval_batch_size, "seed": args.seed}
    if runtime.num_processes > 1:
        out["distributed_type"] = str(runtime.accelerator.distributed_type.value).lower()
        out["num_devices"] = runtime.num_processes
    if args.gradient_accumulation_steps > 1:
        out["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    total = args.per_device_train_batch_size * args.gradient_accumulation_steps * runtime.num_processes
    if total != args.per_device_train_batch_size:
        out["total_train_batch_size"] = total
    optim = str(args.optim).upper()  # an OptimizerNames member: str() is its value
    optim_args = args.optim_args or "No additional optimizer arguments"
    out["optimizer"] = (f"Use {optim} with betas=({args.adam_beta1},{args.adam_beta2}) and epsilon="
                        f"{args.adam_epsilon} and optimizer_args={optim_args}" if "ADAM" in optim
                        else f"Use {optim} and the args are:\n{optim_args}")
    out["lr_scheduler_type"] = str(args.lr_scheduler_type)
    if args.warmup_steps:
        out["lr_scheduler_warmup_steps"] = args.warmup_steps
    if args.max_steps > 0:
        out["training_steps"] = args.max_steps
    else:
        out["num_epochs"] = args.num_train_epochs
    if args.fp16 or args.bf16:
        out["mixed_precision_training"] = "Native AMP"
    if args.label_smoothing_factor:
        out["label_smoothing_factor"] = args.label_smoothing_factor
    return out


def _versions() -> list[str]:
    lines = []
    for name, package in (("trainwell", "trainwell"), ("Transformers", "transformers"), ("Pytorch", "torch"),
                          ("Accelerate", "accelerate"), ("Datasets", "datasets"), ("Tokenizers", "tokenizers")):
        try:
            lines.append(f"- {name} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return lines


def infer_dataset(trainer: Any) -> dict[str, Any] | None:
    """``{"tag", "args", "metadata"}`` of the eval dataset (else the train dataset) when it is a ``datasets``
    dataset from the Hub: its builder name, config name and split. None otherwise (a plain torch dataset, a
    local file builder such as ``csv``, a dataset without a builder name)."""
    data = trainer.eval_dataset if trainer.eval_dataset is not None else trainer.train_dataset
    datasets = sys.modules.get("datasets")  # a datasets object means the package is imported already
    if datasets is None or not isinstance(data, (datasets.Dataset, datasets.IterableDataset)):
        return None
    tag = data.builder_name
    if tag is None or tag in _LOCAL_BUILDERS:
        return None
    return {"tag": tag, "args": data.config_name, "metadata": {"config": data.config_name, "split": str(data.split)}}


def infer_task(model: Any) -> str | None:
    """The task of a ``transformers`` model class (``BertForSequenceClassification`` -> ``text-classification``),
    read from ``transformers``' own model tables; None for any other model."""
    if not type(model).__module__.startswith("transformers"):
        return None
    try:
        from transformers.models.auto import modeling_auto  # present: the model comes from it
    except ImportError:
        return None
    task = None
    for name, tables in _TASK_TABLES:
        classes = [c for table in tables for v in getattr(modeling_auto, table, {}).values() for c in _as_list(v)]
        if type(model).__name__ in classes:
            task = name
    return task


def model_index(name: str, tasks: list[str], datasets: dict[str, dict[str, Any]], results: dict[str, Any]) -> list:
    """The ``model-index``: one result per known task and dataset, each with the recognized metrics; a result
    that would lack its task, its dataset or its metrics is left out."""
    metrics = metric_types(results)
    entries = [
        {"task": {"name": TASK_NAMES[task], "type": task}, "dataset": dataset,
         "metrics": [{"name": shown, "type": kind, "value": results[shown]} for kind, shown in metrics.items()]}
        for task in dict.fromkeys(t for t in tasks if t in TASK_NAMES) for dataset in datasets.values()
    ]
    return [{"name": name, "results": entries if metrics else []}]


def metric_types(results: dict[str, Any]) -> dict[str, str]:
    """Metric type -> display name, for the results whose name is a recognized metric (``Accuracy`` -> accuracy)."""
    found: dict[str, str] = {}
    for shown in results:
        kind = shown.lower().replace(" ", "_")
        if kind in METRIC_TYPES:
            found[kind] = shown
        elif kind == "rouge1":
            found["rouge"] = shown
    return found


def _datasets(tags: list[str], names: list[str], args: list[Any], metadata: list[dict]) -> dict[str, dict[str, Any]]:
    """Dataset tag -> its model-index ``dataset`` entry (name, type, the inferred config and split, args)."""
    out = {}
    args = args + [None] * (len(tags) - len(args))
    for i, (tag, shown) in enumerate(zip(tags, names)):
        out[tag] = {"name": shown, "type": tag, **(metadata[i] if i < len(metadata) else {})}
        if args[i] is not None:
            out[tag]["args"] = args[i]
    return out


def _dataset_sentence(names: list[str]) -> str:
    if not names:
        return "an unknown dataset."
    if len(names) == 1:
        return f"the {names[0]} dataset."
    return ", ".join(f"the {n}" for n in names[:-1]) + f" and the {names[-1]} datasets."


def _base_model(trainer: Any, finetuned_from: str | None) -> str | None:
    if finetuned_from is not None:
        return finetuned_from or None  # kept as given, even a local folder
    path = getattr(getattr(trainer.model, "config", None), "_name_or_path", None)
    return None if not path or os.path.isdir(path) else path


def _header(meta: dict[str, Any]) -> str:
    """The YAML front matter: each key only when it has a value, ``model-index`` always."""
    data = {k: v for k, v in meta.items() if v or k == "model-index"}
    return f"---\n{yaml.dump(data, sort_keys=False)}---\n"


def model_card(trainer: Any, **kwargs: Any) -> str:
    """The card's text; ``kwargs`` are ``create_model_card``'s arguments."""
    tags = _as_list(kwargs.get("tags"))
    tags += [] if "generated_from_trainer" in tags else ["generated_from_trainer"]
    dataset_tags, dataset_args, metadata = _as_list(kwargs.get("dataset_tags")), kwargs.get("dataset_args"), []
    if (inferred := infer_dataset(trainer)) is not None:
        dataset_tags = dataset_tags if kwargs.get("dataset_tags") is not None else [inferred["tag"]]
        dataset_args = dataset_args if dataset_args is not None else [inferred["args"]]
        metadata = [inferred["metadata"]]
    names = _as_list(kwargs.get("dataset")) or dataset_tags
    base = _base_model(trainer, kwargs.get("finetuned_from"))
    tasks = _as_list(kwargs.get("tasks")) or _as_list(infer_task(trainer.model))
    name = kwargs.get("model_name") or os.path.basename(os.path.abspath(trainer.args.output_dir))
    results = last_evaluation(trainer.state.log_history)
    datasets = _datasets(dataset_tags, names, _as_list(dataset_args), metadata)
    meta = {"library_name": "transformers" if type(trainer.model).__module__.startswith("transformers") else None,
            "language": _as_list(kwargs.get("language")), "license": kwargs.get("license"), "base_model": base,
            "tags": tags, "datasets": dataset_tags, "metrics": list(metric_types(results)),
            "model-index": model_index(name, tasks, datasets, results)}
    card = _header(meta) + f"\n{_COMMENT}\n\n# {name}\n\n"
    card += (f"This model is a fine-tuned version of [{base}](https://huggingface.co/{base}) on " if base
             else "This model was trained from scratch on ") + _dataset_sentence(names)
    if results:
        card += "\nIt achieves the following results on the evaluation set:\n"
        card += "\n".join(f"- {k}: {_shown(v)}" for k, v in results.items())
    card += "\n"
    for section in ("Model description", "Intended uses & limitations", "Training and evaluation data"):
        card += f"\n## {section}\n\n{_MISSING}\n"
    card += "\n## Training procedure\n\n### Training hyperparameters\n\n"
    card += "The following hyperparameters were used during training:\n"
    card += "".join(f"- {k}: {v}\n" for k, v in hyperparameters(trainer).items())
    if rows := training_rows(trainer.state.log_history):
        card += "\n### Training results\n\n" + markdown_table(rows) + "\n"
    return card + "\n### Framework versions\n\n" + "".join(f"{line}\n" for line in _versions())


def create_model_card(trainer: Any, **kwargs: Any) -> None:
    """Write ``README.md`` into ``output_dir`` on the main process (the others do nothing). The card is written
    beside its name and renamed into place (``utils.safe_files``): a ``README.md`` that is a symbolic link is
    replaced by the card, and what it pointed to is never written."""
    if not trainer.is_world_process_zero():
        return
    write_text_file(os.path.join(local_output_dir(trainer.args), MODEL_CARD_NAME), model_card(trainer, **kwargs))
