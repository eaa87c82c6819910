"""``Trainer.create_model_card``: a ``README.md`` model card in ``output_dir``, from the run itself.

The card is what the reference's ``create_model_card`` writes, section for section: a YAML header the Hugging
Face Hub reads (license, language, tags with ``generated_from_trainer``, datasets, base model, a ``model-index``
with the last evaluation's metrics), a title, the last evaluation's results, placeholders for the parts only a
person can write, the training hyperparameters, a table of the training results from ``log_history`` and the
framework versions. It needs no Hub access and no ``transformers``; it is useful on its own as a record of a run.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import TYPE_CHECKING, Any

from trainwell.utils.safe_files import write_text_file

if TYPE_CHECKING:
    from trainwell.trainer import Trainer

MODEL_CARD_NAME = "README.md"
_MISSING = "More information needed"
# keys of an evaluation log that are bookkeeping, not results
_NOT_RESULTS = ("runtime", "samples_per_second", "steps_per_second", "tokens_per_second", "epoch", "step",
                "mem_", "jit_compilation_time")


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _title(key: str) -> str:
    """``eval_f1_macro`` -> ``F1 Macro``; ``eval_loss`` -> ``Loss``."""
    key = key.removeprefix("eval_")
    return " ".join(part if part.isupper() else part.capitalize() for part in key.split("_"))


def _is_result(key: str) -> bool:
    return key.startswith("eval_") and not any(part in key for part in _NOT_RESULTS)


def last_evaluation(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The metrics of the last evaluation logged (without runtime and throughput)."""
    for entry in reversed(log_history):
        results = {k: v for k, v in entry.items() if _is_result(k)}
        if results:
            return results
    return {}


def results_table(log_history: list[dict[str, Any]]) -> str:
    """One row per evaluation: the training loss logged last before it, epoch, step and the metrics."""
    rows, train_loss = [], None
    for entry in log_history:
        if "loss" in entry:
            train_loss = entry["loss"]
        results = {k: v for k, v in entry.items() if _is_result(k)}
        if results:
            rows.append({"Training Loss": "No log" if train_loss is None else f"{train_loss:.4f}",
                         "Epoch": entry.get("epoch"), "Step": entry.get("step"),
                         **{("Validation Loss" if k == "eval_loss" else _title(k)): v for k, v in results.items()}})
    if not rows:
        return ""
    columns = list(dict.fromkeys(c for row in rows for c in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(":---:" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def hyperparameters(trainer: Trainer) -> dict[str, Any]:
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
    optim = str(getattr(args.optim, "value", args.optim)).upper()
    out["optimizer"] = (f"Use {optim} with betas=({args.adam_beta1},{args.adam_beta2}) and "
                        f"epsilon={args.adam_epsilon}" + (f" and optimizer_args={args.optim_args}"
                                                         if args.optim_args else ""))
    out["lr_scheduler_type"] = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
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


def _yaml_list(key: str, values: list[str]) -> list[str]:
    return [f"{key}:"] + [f"- {v}" for v in values] if values else []


def _header(name: str, base: str | None, meta: dict[str, Any], results: dict[str, float]) -> list[str]:
    lines = ["---"]
    if meta["library_name"]:
        lines.append(f"library_name: {meta['library_name']}")
    if meta["license"]:
        lines.append(f"license: {meta['license']}")
    if base:
        lines.append(f"base_model: {base}")
    lines += _yaml_list("language", meta["language"]) + _yaml_list("tags", meta["tags"])
    lines += _yaml_list("datasets", meta["datasets"])
    if results:
        lines += ["metrics:"] + [f"- {k.removeprefix('eval_')}" for k in results if k != "eval_loss"]
    return [*lines, "model-index:", f"- name: {name}", *_index_results(meta, results), "---", ""]


def _index_results(meta: dict[str, Any], results: dict[str, float]) -> list[str]:
    """The model-index ``results``: one entry per task (``tasks``) with the dataset (``dataset`` and its
    ``dataset_args`` config) and the last evaluation's metrics; empty without a task or an evaluation."""
    if not (meta["tasks"] and results):
        return ["  results: []"]
    lines = ["  results:"]
    for task in meta["tasks"]:
        lines += ["  - task:", f"      type: {task}", f"      name: {_title(task.replace('-', '_'))}"]
        if meta["datasets"]:
            lines += ["    dataset:", f"      name: {meta['datasets'][0]}", f"      type: {meta['datasets'][0]}"]
            if meta["dataset_args"]:
                lines.append(f"      args: {meta['dataset_args'][0]}")
        lines.append("    metrics:")
        for key, value in results.items():
            lines += [f"    - name: {_title(key)}", f"      type: {key.removeprefix('eval_')}", f"      value: {value}"]
    return lines


def model_card(trainer: Trainer, **kwargs: Any) -> str:
    """The card's text; ``kwargs`` are ``create_model_card``'s arguments."""
    args = trainer.args
    model = trainer.model
    config = getattr(model, "config", None)
    base = kwargs.get("finetuned_from") or getattr(config, "_name_or_path", None) or None
    if base and os.path.isdir(base):
        base = None  # a local folder is no model id
    name = kwargs.get("model_name") or args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir))
    datasets = _as_list(kwargs.get("dataset_tags")) or _as_list(kwargs.get("dataset"))
    tags = list(dict.fromkeys(["generated_from_trainer", *_as_list(kwargs.get("tags"))]))
    library = "transformers" if type(model).__module__.startswith("transformers") else None
    meta = {"library_name": library, "license": kwargs.get("license"), "language": _as_list(kwargs.get("language")),
            "tags": tags, "datasets": datasets, "tasks": _as_list(kwargs.get("tasks")),
            "dataset_args": _as_list(kwargs.get("dataset_args"))}
    results = last_evaluation(trainer.state.log_history)
    lines = _header(name, base, meta, results)
    lines += ["<!-- This model card was written by trainwell from the training run. Edit it freely. -->", "",
              f"# {name}", ""]
    on = f" on the {', '.join(_as_list(kwargs.get('dataset')))} dataset" if kwargs.get("dataset") else ""
    lines.append(f"This model is a fine-tuned version of [{base}](https://huggingface.co/{base}){on}."
                 if base else f"This model was trained from scratch{on}.")
    if results:
        lines += ["It achieves the following results on the evaluation set:"]
        lines += [f"- {_title(k)}: {_cell(v)}" for k, v in results.items()]
    lines.append("")
    for section in ("Model description", "Intended uses & limitations", "Training and evaluation data"):
        lines += [f"## {section}", "", _MISSING, ""]
    lines += ["## Training procedure", "", "### Training hyperparameters", "",
              "The following hyperparameters were used during training:"]
    lines += [f"- {k}: {v}" for k, v in hyperparameters(trainer).items()]
    table = results_table(trainer.state.log_history)
    if table:
        lines += ["", "### Training results", "", table]
    lines += ["", "### Framework versions", "", *_versions(), ""]
    return "\n".join(lines)


def create_model_card(trainer: Trainer, **kwargs: Any) -> None:
    """Write ``README.md`` into ``output_dir`` on the main process (the others do nothing). The card is written
    beside its name and renamed into place (``utils.safe_files``): a ``README.md`` that is a symbolic link is
    replaced by the card, and what it pointed to is never written."""
    if not trainer.is_world_process_zero():
        return
    write_text_file(os.path.join(trainer.args.output_dir, MODEL_CARD_NAME), model_card(trainer, **kwargs))
