"""The ``task`` section of a ``trainwell train`` config: text in CSV/JSONL/text files to a ready Trainer, no Python.

Owns what a task means: its settings (``Task``, read by ``parse_task``), reading the text (and labels) out of the
data rows with clear errors, the label mapping (``Labels``), tokenizing (with ``trainwell.cli.tokenizer``), the
collator that pads the batches, the metrics, and the model (a factory, or one ``trainwell.cli.models`` builds).
``prepare(sections)`` returns it all as a ``TaskRun``; ``trainwell.cli.train`` hands it to the Trainer.

* ``text-classification``: ``text_column`` and ``label_column`` (defaults ``text`` and ``label``); labels may be
  strings or integers; the sorted distinct training labels get the ids 0, 1, ... (integers 0..K-1 keep theirs).
  Texts are truncated to ``max_length`` tokens (default 128). Metric: ``accuracy``.
* ``causal-lm``: ``text_column``; with ``block_size`` (the default, 128) the texts are joined (an end-of-text
  token between them when the tokenizer has one) and cut into blocks of that many tokens, as Hugging Face's
  ``run_clm`` does (the last, shorter block is kept); with ``max_length`` each text is one example, truncated.
  Labels are the input ids (the model shifts them); padding is labelled -100.

The tokenizer, the task's settings, the label mapping and the tokenizer's special ids are written beside the model as
``tokenizer.json`` (or the transformers tokenizer files) and ``task.json``, in every checkpoint too, so the model can
be used (``trainwell.cli.inference.load_trained``, ``trainwell predict``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainwell.cli import CliError
from trainwell.cli.tokenizer import TextTokenizer, load_tokenizer, require_pad_token
from trainwell.utils.errors import choice_error, did_you_mean

TASK_FILE = "task.json"
# task -> (the keys its mapping takes, the transformers auto class of its models)
TASKS: dict[str, tuple[tuple[str, ...], str]] = {
    "text-classification": (("name", "text_column", "label_column", "max_length"),
                            "AutoModelForSequenceClassification"),
    "causal-lm": (("name", "text_column", "block_size", "max_length"), "AutoModelForCausalLM"),
}
ALIASES = {"sequence-classification": "text-classification", "classification": "text-classification",
           "clm": "causal-lm", "language-modeling": "causal-lm"}
DEFAULT_LENGTH = 128


@dataclass(frozen=True)
class Task:
    """A task's settings. Exactly one of ``max_length`` and ``block_size`` is set (``parse_task`` sees to it)."""

    name: str
    text_column: str = "text"
    label_column: str = "label"
    max_length: int | None = None
    block_size: int | None = None

    @property
    def length(self) -> int:
        """The longest sequence the task makes, which the model's position table must cover."""
        return int(self.block_size or self.max_length or DEFAULT_LENGTH)

    def to_json(self) -> dict[str, Any]:
        shown = {"task": self.name, "text_column": self.text_column}
        if self.name == "text-classification":
            shown["label_column"] = self.label_column
        shown.update({k: v for k, v in (("max_length", self.max_length), ("block_size", self.block_size)) if v})
        return shown


def _positive(spec: dict[str, Any], key: str) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise CliError(f"task.{key}={value!r}: pass a whole number of tokens, at least 2.")
    return value


def parse_task(spec: Any) -> Task:
    """The ``task`` section (a name, or ``{name: ..., ...}``) as a ``Task``; errors name the key and the fix."""
    spec = {"name": spec} if isinstance(spec, str) else spec
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise CliError(f"task: expected a task name ({', '.join(TASKS)}) or {{name: ..., text_column: ...}}, "
                       f"got {spec!r}.")
    name = spec["name"].strip().lower().replace("_", "-")
    name = ALIASES.get(name, name)
    if name not in TASKS:
        raise choice_error("task", spec["name"], TASKS)
    allowed = TASKS[name][0]
    for key in spec:
        if key not in allowed:
            raise CliError(f"task: {name} takes no key {key!r}; it takes {', '.join(map(repr, allowed))}."
                           + did_you_mean(key, allowed))
    for key in ("text_column", "label_column"):
        if key in spec and not isinstance(spec[key], str):
            raise CliError(f"task.{key}={spec[key]!r}: name a column, e.g. {key}: text.")
    max_length, block_size = _positive(spec, "max_length"), _positive(spec, "block_size")
    if max_length and block_size:
        raise CliError("task: set block_size (join the texts and cut them into blocks) or max_length (one example "
                       "per text, truncated), not both.")
    if name == "causal-lm" and not max_length:
        block_size = block_size or DEFAULT_LENGTH
    elif name == "text-classification":
        max_length = max_length or DEFAULT_LENGTH
    columns = {k: spec[k] for k in ("text_column", "label_column") if k in spec}
    return Task(name, max_length=max_length, block_size=block_size, **columns)


# --- rows and columns --------------------------------------------------------------------------------------------


def _as_rows(dataset: Any, what: str) -> list[dict[str, Any]]:
    """A dataset as a list of dicts: files already are; a factory's dataset is read in full (map-style or
    iterable, including a ``datasets.Dataset``)."""
    if dataset is None:
        return []
    rows = dataset if isinstance(dataset, list) else list(dataset)
    if rows and not isinstance(rows[0], Mapping):
        raise CliError(f"{what}: a task reads columns from rows (mappings of column -> value), but the dataset "
                       f"gives {type(rows[0]).__name__}.")
    return [row if isinstance(row, dict) else dict(row) for row in rows]


def check_column(rows: list[dict[str, Any]], column: str, key: str, what: str) -> None:
    """``CliError`` unless every row has ``column``: names the columns found and the closest one."""
    if not rows:
        raise CliError(f"{what}: no rows to train on.")
    found = list(rows[0])
    if column not in rows[0]:
        raise CliError(f"{what}: no column {column!r} ({key}); the columns are {found}." + did_you_mean(column, found)
                       + f" Set {key} to the column that holds it.")
    for number, row in enumerate(rows, 1):
        if row.get(column) is None:
            raise CliError(f"{what}: row {number} has no value in column {column!r} ({key}); the row is {row}.")


def read_rows(data: Any, task: Task) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(train_rows, eval_rows_or_None)`` from the data section, the text (and label) columns checked."""
    from trainwell.cli import build

    train, evaluation = build.build_data(data, text_column=task.text_column)
    splits = [(_as_rows(train, "data.train"), "data.train")]
    if evaluation is not None:
        splits.append((_as_rows(evaluation, "data.eval"), "data.eval"))
    for rows, what in splits:
        check_column(rows, task.text_column, "task.text_column", what)
        if task.name == "text-classification":
            check_column(rows, task.label_column, "task.label_column", what)
    return splits[0][0], (splits[1][0] if len(splits) > 1 else None)


def _texts(rows: list[dict[str, Any]], column: str) -> list[str]:
    # A CSV cell that looks like a number was read as one; it is still text here.
    return [row[column] if isinstance(row[column], str) else str(row[column]) for row in rows]


# --- labels ------------------------------------------------------------------------------------------------------


def _label_value(value: Any, number: int, what: str) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (str, int)):  # bool is an int: true/false labels work too
        return value
    raise CliError(f"{what}: row {number} has the label {value!r}; text-classification takes string or whole-number "
                   "labels (one class each).")


@dataclass
class Labels:
    """The classes, in id order: the sorted distinct training labels (strings, or integers)."""

    values: list[Any]
    column: str
    ids: dict[Any, int] = field(init=False)

    def __post_init__(self) -> None:
        self.ids = {value: i for i, value in enumerate(self.values)}

    @classmethod
    def from_rows(cls, train: list[dict[str, Any]], evaluation: list[dict[str, Any]] | None, column: str) -> Labels:
        seen = {_label_value(row[column], n, "data.train") for n, row in enumerate(train, 1)}
        if len({isinstance(v, str) for v in seen}) > 1:
            example = ", ".join(sorted(map(repr, seen))[:4])
            raise CliError(f"data.train: the labels in column {column!r} mix strings and numbers ({example}): make "
                           "them all strings (quote the numbers) or all whole numbers.")
        labels = cls(sorted(seen), column)
        if evaluation is not None:
            unseen = {_label_value(row[column], n, "data.eval") for n, row in enumerate(evaluation, 1)} - seen
            if unseen:
                raise CliError(f"data.eval: the labels {sorted(unseen, key=repr)} never occur in the training data "
                               f"(column {column!r}), so no model output stands for them; the training labels are "
                               f"{labels.values}. Add training rows with them, or drop those rows from the eval file.")
        return labels

    def encode(self, rows: list[dict[str, Any]]) -> list[int]:
        return [self.ids[_label_value(row[self.column], n, "data")] for n, row in enumerate(rows, 1)]

    def to_json(self) -> dict[str, Any]:
        names = [str(v) for v in self.values]
        return {"labels": self.values, "id2label": dict(enumerate(names)),
                "label2id": {name: i for i, name in enumerate(names)}}

    def config_kwargs(self) -> dict[str, Any]:
        """What a transformers config takes to name its outputs."""
        names = [str(v) for v in self.values]
        return {"num_labels": len(names), "id2label": dict(enumerate(names)),
                "label2id": {name: i for i, name in enumerate(names)}}


class Accuracy:
    """``compute_metrics`` for classification: ``{"accuracy": ...}`` from argmax predictions (see
    ``argmax_logits``). Also works with ``batch_eval_metrics`` (counts per batch until ``compute_result``)."""

    def __init__(self) -> None:
        self._right = 0
        self._total = 0

    def __call__(self, prediction: Any, compute_result: bool = True) -> dict[str, float]:
        import numpy as np

        def as_array(x: Any) -> Any:
            return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)

        predicted, labels = as_array(prediction.predictions), as_array(prediction.label_ids)
        self._right += int((predicted == labels).sum())
        self._total += int(labels.size)
        if not compute_result:
            return {}
        result = {"accuracy": self._right / max(self._total, 1)}
        self._right = self._total = 0
        return result


def argmax_logits(logits: Any, labels: Any) -> Any:  # noqa: ARG001 - the Trainer's preprocess_logits signature
    """Keep the predicted class, not the logits: evaluation then holds one number per example."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return logits.argmax(dim=-1)


# --- tokenizing --------------------------------------------------------------------------------------------------


def classification_examples(rows: list[dict[str, Any]], task: Task, tokenizer: TextTokenizer,
                            labels: Labels) -> list[dict[str, Any]]:
    ids = tokenizer.encode(_texts(rows, task.text_column), task.max_length)
    return [{"input_ids": x, "labels": y} for x, y in zip(ids, labels.encode(rows))]


def causal_examples(rows: list[dict[str, Any]], task: Task, tokenizer: TextTokenizer,
                    what: str) -> list[dict[str, Any]]:
    """Blocks of ``block_size`` tokens from the joined texts, or one truncated example per text."""
    encoded = tokenizer.encode(_texts(rows, task.text_column), task.max_length)
    if task.block_size is None:
        sequences = [ids for ids in encoded if len(ids) >= 2]
    else:
        eos = tokenizer.eos_token_id
        stream = [i for ids in encoded for i in (ids if eos is None or ids[-1:] == [eos] else [*ids, eos])]
        size = task.block_size
        sequences = [stream[start:start + size] for start in range(0, len(stream), size)]
        sequences = [ids for ids in sequences if len(ids) >= 2]  # a block needs an input and a next token
    if not sequences:
        raise CliError(f"{what}: the text makes no example of at least 2 tokens ({sum(map(len, encoded))} tokens in "
                       f"all): add text, or check task.text_column.")
    return [{"input_ids": ids, "labels": list(ids)} for ids in sequences]


# --- the run -----------------------------------------------------------------------------------------------------


@dataclass
class TaskRun:
    """Everything a task gives the Trainer, and what it writes beside the model."""

    task: Task
    tokenizer: TextTokenizer
    model: Any
    train_dataset: list[dict[str, Any]]
    eval_dataset: list[dict[str, Any]] | None
    data_collator: Any
    labels: Labels | None = None
    compute_metrics: Any = None
    preprocess_logits_for_metrics: Any = None
    model_note: Any = None  # how the model was made, for task.json

    def trainer_kwargs(self) -> dict[str, Any]:
        return {"model": self.model, "train_dataset": self.train_dataset, "eval_dataset": self.eval_dataset,
                "data_collator": self.data_collator, "processing_class": self.tokenizer,
                "compute_metrics": self.compute_metrics,
                "preprocess_logits_for_metrics": self.preprocess_logits_for_metrics}

    def describe(self) -> str:
        sizes = f"{len(self.train_dataset)} training examples" + (
            f", {len(self.eval_dataset)} evaluation examples" if self.eval_dataset is not None else "")
        classes = f", {len(self.labels.values)} classes" if self.labels is not None else ""
        return (f"{self.task.name}: {sizes}{classes}; tokenizer {self.tokenizer.source} "
                f"({self.tokenizer.vocab_size} tokens)")


def prepare(sections: dict[str, Any]) -> TaskRun:
    """Read, check, tokenize and build everything a task's run needs (before any training)."""
    from trainwell.data.collators import DataCollatorWithPadding

    task = parse_task(sections["task"])
    model_spec = _checked_model_spec(sections.get("model"), task)
    if sections.get("tokenizer") is None:
        raise CliError(f"task: {task.name} needs a tokenizer: add tokenizer: path/to/tokenizer.json (or a folder "
                       "holding a saved tokenizer).")
    tokenizer = load_tokenizer(sections["tokenizer"])
    train_rows, eval_rows = read_rows(sections.get("data"), task)
    run = _classification(task, tokenizer, train_rows, eval_rows) if task.name == "text-classification" \
        else _causal(task, tokenizer, train_rows, eval_rows)
    # Padding: DataCollatorWithPadding pads input_ids with pad_token_id, builds attention_mask, and pads
    # sequence labels (causal LM) with -100, so padding never counts in the loss.
    run.data_collator = DataCollatorWithPadding(tokenizer)
    run.model = _build_model(model_spec, run)
    # The special ids too: a pad token the config named (or a causal LM's stand-in) is not marked in the file.
    tokenizer.extra_files[TASK_FILE] = {**task.to_json(), **(run.labels.to_json() if run.labels else {}),
                                        "model": run.model_note, "pad_token_id": tokenizer.pad_token_id,
                                        "eos_token_id": tokenizer.eos_token_id}
    return run


def _classification(task: Task, tokenizer: TextTokenizer, train: list, evaluation: list | None) -> TaskRun:
    require_pad_token(tokenizer, task.name)
    labels = Labels.from_rows(train, evaluation, task.label_column)
    encoded_eval = classification_examples(evaluation, task, tokenizer, labels) if evaluation is not None else None
    return TaskRun(task, tokenizer, None, classification_examples(train, task, tokenizer, labels), encoded_eval,
                   None, labels, Accuracy(), argmax_logits)


def _causal(task: Task, tokenizer: TextTokenizer, train: list, evaluation: list | None) -> TaskRun:
    if tokenizer.pad_token_id is None:
        # Padding sits on the right, under a causal mask, labelled -100: its id never reaches the loss, so
        # the end-of-text token (or id 0) can stand in, as GPT-2 fine-tuning scripts do.
        tokenizer.pad_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    encoded_eval = causal_examples(evaluation, task, tokenizer, "data.eval") if evaluation is not None else None
    return TaskRun(task, tokenizer, None, causal_examples(train, task, tokenizer, "data.train"), encoded_eval, None)


def _checked_model_spec(spec: Any, task: Task) -> Any:
    from trainwell.cli.models import check_builtin, model_kind

    if spec is None:
        raise CliError(f"the config has no 'model': for task {task.name} write model: builtin (a small torch model "
                       "sized from the tokenizer), {config: path/to/config.json} or {pretrained: path/to/folder} "
                       "(transformers), or a factory.")
    if model_kind(spec) == "builtin":
        check_builtin(spec, task.name)
    return spec


def _build_model(spec: Any, run: TaskRun) -> Any:
    from trainwell.cli import build, models

    kind, vocab = models.model_kind(spec), run.tokenizer.vocab_size
    run.model_note = spec if isinstance(spec, str) else {k: str(v) if k in ("config", "pretrained") else v
                                                          for k, v in spec.items()}
    if kind == "factory":
        return build.build_model(spec)
    if kind == "builtin":
        factory, kwargs = models.check_builtin(spec, run.task.name)
        name = models.builtin_name(spec, run.task.name)
        filled = {"vocab_size": vocab, "block_size": run.task.length, "pad_token_id": run.tokenizer.pad_token_id,
                  "num_labels": len(run.labels.values) if run.labels else 0}
        kwargs = {**{k: filled[k] for k in models.BUILTINS[name][2]}, **kwargs}
        run.model_note = {"builtin": name, "kwargs": kwargs}  # enough to build the same model again
        return factory(**kwargs)
    config_kwargs = run.labels.config_kwargs() if run.labels is not None else {}
    model = models.transformers_model(spec, kind, TASKS[run.task.name][1], run.tokenizer, config_kwargs)
    models.check_fits(model, vocab, run.task.length, f"model.{kind}")
    return model


def perplexity(eval_loss: float) -> float:
    """``exp(eval_loss)``, ``inf`` when that overflows."""
    try:
        return math.exp(eval_loss)
    except OverflowError:
        return float("inf")
