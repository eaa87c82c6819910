"""Models ``trainwell train`` builds for a task without a Python factory.

Owns the forms of the ``model`` section beside a factory reference, and building them once the task, the
tokenizer and the labels are known (``build_task_model``):

* ``model: builtin`` or ``{builtin: NAME, kwargs: {...}}``: a small pure-torch model, no ``transformers`` needed,
  sized from the tokenizer's vocabulary (and the labels, the sequence length): ``embedding-bag`` for
  text classification (``EmbeddingBagClassifier``), ``transformer`` for a causal LM (``TokenLM``, the demo's
  ``ByteLM`` over token ids);
* ``{config: path/to/config.json}``: a ``transformers`` model of that configuration, freshly initialised;
* ``{pretrained: path/to/folder}``: a ``transformers`` model saved in a local folder (``local_files_only``).

``transformers`` is imported only for the last two, with a ``pip install transformers`` error when it is missing.
Reading the config section and tokenizing belong to ``trainwell.cli.tasks``.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from trainwell.cli import CliError
from trainwell.cli.config import ConfigPath
from trainwell.examples.bytelm import SIZES, ByteLM, ByteLMConfig
from trainwell.utils.errors import choice_error, did_you_mean

# The keys each form of the model section takes (a factory's are checked in build.py).
MODEL_FORMS: dict[str, tuple[str, ...]] = {
    "factory": ("factory", "kwargs"), "builtin": ("builtin", "kwargs"), "config": ("config",),
    "pretrained": ("pretrained",),
}


class EmbeddingBagClassifier(nn.Module):
    """fastText-style text classifier: the mean of the token embeddings (padding left out), then a linear layer.

    ``forward(input_ids, attention_mask=None, labels=None) -> {"logits", "loss"?}``; without an attention mask,
    positions holding ``pad_token_id`` are left out. Trains in seconds on a CPU; a baseline, not a transformer.
    """

    main_input_name = "input_ids"

    def __init__(self, vocab_size: int, num_labels: int, pad_token_id: int | None = None, dim: int = 64,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.pad_token_id = pad_token_id
        # mode="sum" with per-sample weights 1/length is a masked mean that reads each embedding row once.
        self.bag = nn.EmbeddingBag(vocab_size, dim, mode="sum")
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(dim, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if attention_mask is None:
            attention_mask = (input_ids != self.pad_token_id) if self.pad_token_id is not None \
                else torch.ones_like(input_ids)
        mask = attention_mask.to(self.head.weight.dtype)
        weights = mask / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        logits = self.head(self.dropout(self.bag(input_ids, per_sample_weights=weights)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


class TokenLM(ByteLM):
    """``ByteLM`` over a tokenizer's ids; takes (and needs no) ``attention_mask``: batches are padded on the
    right, where the causal mask keeps padding from reaching earlier positions and labels of -100 keep it out
    of the loss."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,  # noqa: ARG002
                labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return super().forward(input_ids, labels=labels)


def embedding_bag(vocab_size: int, num_labels: int, pad_token_id: int | None = None, dim: int = 64,
                  dropout: float = 0.0) -> EmbeddingBagClassifier:
    """The ``embedding-bag`` built-in (``vocab_size``, ``num_labels``, ``pad_token_id`` come from the task)."""
    return EmbeddingBagClassifier(vocab_size, num_labels, pad_token_id, dim, dropout)


def transformer(vocab_size: int, block_size: int, size: str = "small", n_layer: int | None = None,
                n_head: int | None = None, d_model: int | None = None, dropout: float | None = None) -> TokenLM:
    """The ``transformer`` built-in: ``trainwell.examples.bytelm``'s named ``size`` (tiny, small, medium), fields
    overridden by keyword (``vocab_size`` and ``block_size`` come from the tokenizer and the task)."""
    if size not in SIZES:
        raise choice_error("model.kwargs.size", size, SIZES)
    chosen = {"n_layer": n_layer, "n_head": n_head, "d_model": d_model, "dropout": dropout}
    fields = {**SIZES[size].to_dict(), **{k: v for k, v in chosen.items() if v is not None}}
    return TokenLM(ByteLMConfig(**{**fields, "vocab_size": vocab_size, "block_size": block_size}))


# name -> (task it serves, factory, the keyword arguments trainwell fills in).
BUILTINS: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    "embedding-bag": ("text-classification", embedding_bag, ("vocab_size", "num_labels", "pad_token_id")),
    "transformer": ("causal-lm", transformer, ("vocab_size", "block_size")),
}


def model_kind(spec: Any) -> str:
    """``"factory"``, ``"builtin"``, ``"config"`` or ``"pretrained"``: which form the model section takes."""
    if spec == "builtin":
        return "builtin"
    if not isinstance(spec, dict):
        return "factory"
    kinds = [kind for kind in MODEL_FORMS if kind in spec]
    if len(kinds) > 1:
        raise CliError(f"model: give one of {', '.join(map(repr, MODEL_FORMS))}, not {' and '.join(kinds)}.")
    kind = kinds[0] if kinds else "factory"
    for key in spec:
        if kinds and key not in MODEL_FORMS[kind]:
            raise CliError(f"model: unknown key {key!r} beside {kind!r}; allowed: "
                           f"{', '.join(map(repr, MODEL_FORMS[kind]))}." + did_you_mean(key, MODEL_FORMS[kind]))
    return kind


def builtin_name(spec: Any, task: str) -> str:
    """The built-in a ``builtin`` spec names (``true`` or ``builtin``: the task's own), checked against the task."""
    name = True if spec == "builtin" else spec.get("builtin")
    defaults = {serves: builtin for builtin, (serves, _, _) in BUILTINS.items()}
    if name is True:
        return defaults[task]
    if name not in BUILTINS:
        raise choice_error("model.builtin", name, [*BUILTINS, "true"])
    if BUILTINS[name][0] != task:
        raise CliError(f"model.builtin={name!r} is a {BUILTINS[name][0]} model, but the task is {task}: use "
                       f"builtin: {defaults[task]} (or builtin: true, the task's own).")
    return name


def check_builtin(spec: Any, task: str) -> tuple[Any, dict[str, Any]]:
    """``(factory, user_kwargs)`` of a built-in, its keyword arguments checked before any data is read."""
    from trainwell.cli.build import check_call

    name = builtin_name(spec, task)
    _, factory, filled = BUILTINS[name]
    kwargs = {} if spec == "builtin" else (spec.get("kwargs") or {})
    if not isinstance(kwargs, dict):
        raise CliError(f"model.kwargs must be a mapping, got {type(kwargs).__name__}.")
    for key in filled:
        if key in kwargs:
            raise CliError(f"model.kwargs.{key}: trainwell sets it from the tokenizer and the task; leave it out.")
    check_call(factory, {**dict.fromkeys(filled, 0), **kwargs}, "model", f"builtin {name}")
    return factory, kwargs


def _require_transformers(kind: str) -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ImportError(f"model.{kind}: building a transformers model needs transformers: pip install "
                          "transformers. Or use model: builtin, a small torch model trainwell builds itself.") from None


def _existing(given: Any, kind: str, folder: bool) -> str:
    path = str(given)
    if (os.path.isdir if folder else os.path.isfile)(path):
        return path
    where = given.explain() if isinstance(given, ConfigPath) else f"{path!r} (in {os.getcwd()})"
    what = "a folder holding a saved model" if folder else "a transformers config.json file"
    raise CliError(f"model.{kind}: no such {'folder' if folder else 'file'} {where}. Name {what}; nothing is "
                   "downloaded.")


def transformers_model(spec: dict[str, Any], kind: str, auto_class: str, tokenizer: Any,
                       config_kwargs: dict[str, Any]) -> nn.Module:
    """A ``transformers`` model of class ``auto_class`` from ``{config: FILE}`` (fresh weights) or ``{pretrained:
    FOLDER}``, with ``config_kwargs`` (labels) set, and the tokenizer's special ids where the config has none."""
    path = _existing(spec[kind], kind, folder=kind == "pretrained")
    transformers = _require_transformers(kind)
    auto = getattr(transformers, auto_class)
    try:
        if kind == "pretrained":
            # trust_remote_code=False, said: a folder naming code of its own is an error, never a question on stdin
            model = auto.from_pretrained(path, local_files_only=True, trust_remote_code=False, **config_kwargs)
        else:
            model = auto.from_config(_config(transformers, path, tokenizer, config_kwargs))
    except (OSError, ValueError, KeyError) as err:
        raise CliError(f"model.{kind}: cannot build a {auto_class} from {path} ({err}).") from None
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id  # sequence classification finds the last token by it
    return model


def _config(transformers: Any, path: str, tokenizer: Any, config_kwargs: dict[str, Any]) -> Any:
    """The configuration in a config.json file, with the labels and the tokenizer's special ids, given to the
    config class at once (set afterwards, GPT-2's defaults would first be checked against the vocabulary)."""
    try:
        with open(path, encoding="utf-8") as f:
            written = json.load(f)
    except ValueError as err:
        raise CliError(f"model.config: {path} is not a JSON file ({err}).") from None
    if not isinstance(written, dict) or not isinstance(written.get("model_type"), str):
        raise CliError(f"model.config: {path} has no model_type (e.g. \"model_type\": \"bert\" or \"gpt2\"): "
                       "transformers needs it to know which model to build.")
    values = {**written, **_token_ids(written, tokenizer), **config_kwargs}
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values)


def _token_ids(written: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The special ids a config file leaves out come from the tokenizer (the end-of-text token for both ends, as
    GPT-2 does), not from the model type's defaults, which may lie outside a small vocabulary (GPT-2's 50256)."""
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
           "bos_token_id": tokenizer.eos_token_id}
    return {key: value for key, value in ids.items() if key not in written}


def check_fits(model: nn.Module, vocab_size: int, length: int, what: str) -> None:
    """``CliError`` when the tokenizer's ids or the sequence length do not fit the model's tables."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if isinstance(rows, int) and rows < vocab_size:
        raise CliError(f"{what}: the model's vocabulary has {rows} entries but the tokenizer's has {vocab_size}: set "
                       f"vocab_size: {vocab_size} (or more) in the model's config.")
    config = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions"):
        limit = getattr(config, key, None)
        if isinstance(limit, int) and limit < length:
            raise CliError(f"{what}: the model takes at most {limit} positions ({key}) but the task makes sequences "
                           f"of {length}: lower task.max_length / task.block_size, or raise {key}.")
