"""Turning the sections of a ``trainwell train`` config into objects: factories and built-in file loaders.

A *factory reference* is ``"package.module:attribute"`` (the module is imported, the attribute looked up)
or ``{factory: "package.module:attribute", kwargs: {...}}`` (the attribute is called with ``kwargs``).
Built-in loaders read local files: JSONL (one JSON object per line), CSV (a header row; numbers become
ints or floats) and plain text (byte blocks for a causal LM, as in the demo). Nothing is downloaded.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from trainwell.cli import CliError
from trainwell.utils.errors import choice_error, did_you_mean

FORMATS = ("jsonl", "csv", "text")
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".txt": "text"}
_FILE_KEYS = ("path", "format", "columns", "block_size", "eval_fraction", "limit")
_FACTORY_KEYS = ("factory", "kwargs")


def add_import_paths(config_path: str) -> None:
    """Let ``module:attribute`` references name modules beside the config or in the current directory.

    A console script (``trainwell train``) starts with its own bin folder on ``sys.path``, not the current
    directory as ``python -m`` or ``python script.py`` would; a user's ``my_model.py`` next to the config
    would not import.
    """
    for folder in (os.getcwd(), os.path.dirname(os.path.abspath(config_path))):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def import_object(reference: str, what: str) -> Any:
    """The object named by ``"package.module:attribute"`` (``attribute`` may be dotted)."""
    module_name, colon, attribute = str(reference).partition(":")
    if not colon or not module_name or not attribute:
        raise CliError(f"{what}: {reference!r} is not a 'package.module:attribute' reference.")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise CliError(f"{what}: cannot import module {module_name!r} ({err}). Is it on PYTHONPATH?") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise CliError(f"{what}: {module_name!r} has no attribute {part!r}." + did_you_mean(part, names))
        obj = getattr(obj, part)
    return obj


def _check_keys(spec: dict[str, Any], allowed: tuple[str, ...], what: str) -> None:
    for key in spec:
        if key not in allowed:
            raise CliError(f"{what}: unknown key {key!r}; allowed: {', '.join(map(repr, allowed))}."
                           + did_you_mean(key, allowed))


def call_factory(spec: Any, what: str, call_plain: bool) -> Any:
    """Resolve a factory reference. A plain string is called with no arguments when ``call_plain`` (models,
    data) and returned as is otherwise (a collator or metrics function *is* the callable)."""
    if isinstance(spec, str):
        obj = import_object(spec, what)
        return obj() if call_plain else obj
    if isinstance(spec, dict) and "factory" in spec:
        _check_keys(spec, _FACTORY_KEYS, what)
        kwargs = spec.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise CliError(f"{what}.kwargs must be a mapping, got {type(kwargs).__name__}.")
        return import_object(spec["factory"], what)(**kwargs)
    raise CliError(f"{what}: expected 'package.module:attribute' or {{factory: ..., kwargs: {{...}}}}, got {spec!r}.")


def build_model(spec: Any) -> Any:
    if spec is None:
        raise CliError("the config has no 'model': name a factory, e.g. model: mypackage.models:build_model")
    model = call_factory(spec, "model", call_plain=True)
    import torch

    if not isinstance(model, torch.nn.Module):
        raise CliError(f"model: the factory returned {type(model).__name__}, not a torch.nn.Module.")
    return model


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_rows(path: str, fmt: str, columns: list[str] | None = None, limit: int | None = None) -> list[dict]:
    """Rows of a JSONL or CSV file as dicts (CSV numbers converted), keeping only ``columns`` when given."""
    rows: list[dict[str, Any]] = []
    with open(path, newline="" if fmt == "csv" else None, encoding="utf-8") as f:
        if fmt == "csv":
            rows = [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
        else:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise CliError(f"{path}:{number}: not a JSON object ({err.msg}).") from None
    if columns:
        missing = [c for c in columns if rows and c not in rows[0]]
        if missing:
            raise CliError(f"{path}: no column {missing[0]!r}; the columns are {sorted(rows[0])}.")
        rows = [{c: r[c] for c in columns} for r in rows]
    return rows[:limit] if limit else rows


def load_file(spec: Any, what: str) -> tuple[Any, Any]:
    """``(dataset, split_off_eval_or_None)`` for one file spec: a path, or a mapping of ``_FILE_KEYS``."""
    spec = {"path": spec} if isinstance(spec, (str, os.PathLike)) else spec
    if not isinstance(spec, dict) or "path" not in spec:
        raise CliError(f"{what}: expected a file path or {{path: ..., format: ...}}, got {spec!r}.")
    _check_keys(spec, _FILE_KEYS, what)
    path = str(spec["path"])
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what}: no such file {path!r}.")
    fmt = spec.get("format") or _SUFFIX_FORMAT.get(Path(path).suffix.lower(), "text")
    if fmt not in FORMATS:
        raise choice_error(f"{what}.format", fmt, FORMATS)
    fraction = float(spec.get("eval_fraction", 0.0))
    if fmt == "text":
        from trainwell.examples.bytedata import text_blocks

        return text_blocks(path, int(spec.get("block_size", 128)), fraction)
    rows = read_rows(path, fmt, spec.get("columns"), spec.get("limit"))
    cut = len(rows) - int(len(rows) * fraction)
    return rows[:cut], (rows[cut:] if fraction > 0 else None)


def build_data(spec: Any) -> tuple[Any, Any]:
    """``(train_dataset, eval_dataset_or_None)`` from the config's ``data`` section."""
    if spec is None:
        raise CliError("the config has no 'data': give {train: FILE, eval: FILE} or a factory.")
    if isinstance(spec, dict) and "factory" not in spec:
        _check_keys(spec, ("train", "eval"), "data")
        if "train" not in spec:
            raise CliError("data: 'train' is missing (a file path, or {path: ..., format: ...}).")
        train, split_eval = load_file(spec["train"], "data.train")
        evaluation = load_file(spec["eval"], "data.eval")[0] if spec.get("eval") is not None else split_eval
        return train, evaluation
    made = call_factory(spec, "data", call_plain=True)
    if isinstance(made, dict):
        _check_keys(made, ("train", "eval", "validation"), "data (the factory's result)")
        return made.get("train"), made.get("eval", made.get("validation"))
    if isinstance(made, tuple) and len(made) == 2:
        return made
    return made, None
