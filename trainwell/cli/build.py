"""Turning the sections of a ``trainwell train`` config into objects: factories and built-in file loaders.

A *factory reference* is ``"package.module:attribute"`` (the module is imported, the attribute looked up)
or ``{factory: "package.module:attribute", kwargs: {...}}`` (the attribute is called with ``kwargs``); the
module may also be a file path, ``"./my_model.py:build"``. Built-in loaders read local files: JSONL (one JSON
object per line), CSV (a header row; numbers become ints or floats) and plain text (byte blocks for a causal
LM, as in the demo). Nothing is downloaded.

Where factory modules come from (see docs/cli.md): a module importable the ordinary way (installed, the standard
library, ``PYTHONPATH``) always wins; only a name that is not importable otherwise is looked up in the config's
folder, then the current directory. Those folders go on ``sys.path`` only then, *after* the installed packages,
and only for the run, so a ``json.py`` or ``accelerate.py`` lying beside a config is never imported by trainwell
or its dependencies. A named module that collides with an importable one gets the importable module and a
warning; a path reference (``./json.py:loads``) loads the file itself under a private module name.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from trainwell.cli import CliError, callables
from trainwell.cli.config import ConfigPath
from trainwell.utils.errors import choice_error, did_you_mean

FORMATS = ("jsonl", "csv", "text")
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".txt": "text"}
_FILE_KEYS = ("path", "format", "columns", "block_size", "eval_fraction", "limit")
_FACTORY_KEYS = ("factory", "kwargs")
_FILE_MODULE_PREFIX = "_trainwell_file_"

# The folders local factory modules are looked up in (the config's folder, then the current directory), set by
# ``factory_folders`` for the run; and those of them that supplied a module, appended to ``sys.path`` until then.
_folders: list[str] = []
_kept: list[str] = []
_warned: set[str] = set()


@contextlib.contextmanager
def factory_folders(config_path: str) -> Iterator[list[str]]:
    """Look factory modules up beside ``config_path``, then in the current directory, while this block runs.

    A console script (``trainwell train``) starts with its bin folder on ``sys.path``, not the current directory,
    so without this a user's ``my_model.py`` next to the config would not import. The folders go on ``sys.path``
    (at the end) only when a named module is not importable otherwise, and the ones that supplied a module stay
    there until the block ends: a factory's deferred ``import helpers`` and DataLoader workers started with
    ``spawn`` (which import the module again by name) need them. ``sys.path`` is as before afterwards.
    """
    global _folders, _kept
    folders: list[str] = []
    for folder in (os.path.dirname(os.path.abspath(config_path)), os.getcwd()):
        if folder not in folders:
            folders.append(folder)
    saved = _folders, _kept
    _folders, _kept = folders, []
    _warned.clear()
    try:
        yield folders
    finally:
        for folder in _kept:
            _remove_from_path(folder)
        _folders, _kept = saved


def _remove_from_path(folder: str) -> None:
    if folder in sys.path:  # the last occurrence: the code that ran may have put its own copy in front
        del sys.path[len(sys.path) - 1 - sys.path[::-1].index(folder)]


def _top_level_folders(module: ModuleType | None) -> list[str]:
    """The folders a top-level module was found in (the parent of a package's folder)."""
    if module is None:
        return []
    if getattr(module, "__path__", None) is not None:
        return [os.path.dirname(os.path.realpath(p)) for p in module.__path__]
    file = getattr(module, "__file__", None)
    return [os.path.dirname(os.path.realpath(file))] if file else []


@contextlib.contextmanager
def _local_import(extra: tuple[str, ...] = ()) -> Iterator[None]:
    """Append the factory folders (and ``extra``) to ``sys.path`` while a local module is imported; afterwards
    keep (until ``factory_folders`` ends) only those that supplied a module.

    Appended, not prepended: the local module's own ``import helpers`` finds ``helpers.py`` beside it, but an
    ``import html`` (its own or a dependency's) still gets the installed module.
    """
    added = [f for f in dict.fromkeys((*_folders, *extra)) if f not in sys.path]
    before = set(sys.modules)
    sys.path.extend(added)
    if added:
        importlib.invalidate_caches()  # the folders' listings may be older than files written since
    try:
        yield
    finally:
        used = {folder for name in set(sys.modules) - before if "." not in name
                for folder in _top_level_folders(sys.modules.get(name))}
        for folder in added:
            if os.path.realpath(folder) in used:
                _kept.append(folder)
            else:
                _remove_from_path(folder)


def _importable(name: str) -> bool:
    """Whether the top-level module ``name`` imports without the factory folders (nothing is imported)."""
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _local_candidates(name: str) -> list[str]:
    """``name.py`` files and ``name/`` folders holding Python files in the factory folders, in lookup order."""
    found = []
    for folder in _folders:
        module, package = os.path.join(folder, name + ".py"), os.path.join(folder, name)
        if os.path.isfile(module):
            found.append(module)
        if os.path.isdir(package) and any(f.endswith(".py") for f in os.listdir(package)):
            found.append(package)
    return found


def _is_from(module: ModuleType, candidate: str) -> bool:
    """Whether ``module`` was loaded from ``candidate`` (a ``.py`` file, or a package folder)."""
    places = [getattr(module, "__file__", None), *list(getattr(module, "__path__", []) or [])]
    real = os.path.realpath(candidate)
    for place in filter(None, places):
        place = os.path.realpath(place)
        if place == real or place.startswith(real + os.sep):
            return True
    return False


def _warn_collision(module_name: str, module: ModuleType, candidates: list[str], what: str, attribute: str) -> None:
    name = module.__name__
    if any(_is_from(module, c) for c in candidates) or name in _warned:
        return
    _warned.add(name)
    where = getattr(module, "__file__", None) or ", ".join(getattr(module, "__path__", []) or []) or "built in"
    local = candidates[0]
    fix = "Rename the local file or folder"
    if local.endswith(".py") and module_name == name:
        fix += f", or name the file by path ('./{os.path.basename(local)}:{attribute}')"
    print(f"trainwell train: warning: {what}: {name!r} is the importable module {where}, not {local}: installed "
          f"and already imported modules win over files beside the config or in the current directory. {fix}.",
          file=sys.stderr)


def _load_file_module(reference: str, what: str) -> ModuleType:
    """The module of a ``.py`` file named by path (relative to the config's folder, then the current directory),
    loaded under a private name, so it never takes the place of an installed module of the same name."""
    path = os.path.expanduser(reference)
    if not os.path.isabs(path):
        tried = [os.path.join(folder, path) for folder in (_folders or [os.getcwd()])]
        path = next((p for p in tried if os.path.isfile(p)), tried[0])
    path = os.path.realpath(path)
    if not os.path.isfile(path):
        raise CliError(f"{what}: no such file {reference!r} (looked in {', '.join(_folders or [os.getcwd()])}).")
    stem = re.sub(r"\W", "_", Path(path).stem)
    name = f"{_FILE_MODULE_PREFIX}{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CliError(f"{what}: cannot load {reference!r} as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look the module up by name
    try:
        with _local_import((os.path.dirname(path),)):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_module(module_name: str, what: str, attribute: str) -> ModuleType:
    try:
        if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
            return _load_file_module(module_name, what)
        top = module_name.partition(".")[0]
        candidates = _local_candidates(top)
        if _importable(top):
            try:
                return importlib.import_module(module_name)
            finally:
                if candidates and top in sys.modules:
                    _warn_collision(module_name, sys.modules[top], candidates, what, attribute)
        with _local_import():
            return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        looked = f", then in {' and '.join(_folders)}" if _folders else ""
        raise CliError(f"{what}: cannot import module {module_name!r} ({err}). Factory modules are looked up "
                       f"among the installed modules and PYTHONPATH{looked}.") from None


def import_object(reference: str, what: str) -> Any:
    """The object named by ``"package.module:attribute"`` or ``"path/to/file.py:attribute"`` (``attribute``
    may be dotted)."""
    module_name, colon, attribute = str(reference).rpartition(":")
    if not colon or not module_name or not attribute:
        raise CliError(f"{what}: {reference!r} is not a 'package.module:attribute' reference.")
    obj: Any = _import_module(module_name, what, attribute)
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


def _describe(parameters: list[inspect.Parameter]) -> str:
    shown = [p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in parameters]
    return ", ".join(shown) or "no parameters"


def check_call(factory: Any, kwargs: dict[str, Any], what: str, reference: str) -> None:
    """``CliError`` unless ``factory(**kwargs)`` binds: names the config key, the unknown or missing keyword
    argument, the parameters the factory takes and the closest one. A factory taking ``**kwargs`` takes any."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins and C types have no signature: let the call itself tell
        return
    params = list(signature.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = [p.name for p in named]
    for key in kwargs:
        if key not in names:
            raise CliError(f"{what}.kwargs: {reference} has no parameter {key!r}; it takes: {_describe(named)}."
                           + did_you_mean(key, names))
    missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise CliError(f"{what}: {reference} needs {', '.join(map(repr, missing))}: set it under {what}.kwargs "
                       f"({{factory: {reference}, kwargs: {{{missing[0]}: ...}}}}); it takes: {_describe(named)}.")


def resolve_factory(spec: Any, what: str, call_plain: bool) -> tuple[Any, dict[str, Any] | None]:
    """``(callable, kwargs)`` for a factory reference, the keyword arguments checked against the callable's
    signature and the callable against ``trainwell.cli.callables``' rules (nothing is called); ``kwargs`` is
    ``None`` for a plain string that is not to be called."""
    if isinstance(spec, str):
        obj = import_object(spec, what)
        if what == "compute_metrics":  # the callable itself (never called here)
            callables.check_metrics_function(obj, what, spec)
        callables.check_origin(obj, what, spec)
        if call_plain:
            check_call(obj, {}, what, spec)
        return obj, ({} if call_plain else None)
    if isinstance(spec, dict) and "factory" in spec:
        _check_keys(spec, _FACTORY_KEYS, what)
        kwargs = spec.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise CliError(f"{what}.kwargs must be a mapping, got {type(kwargs).__name__}.")
        obj = import_object(spec["factory"], what)
        if what == "compute_metrics":
            callables.check_metrics_origin(obj, what, str(spec["factory"]))
        callables.check_origin(obj, what, str(spec["factory"]))
        check_call(obj, kwargs, what, str(spec["factory"]))
        return obj, kwargs
    raise CliError(f"{what}: expected 'package.module:attribute' or {{factory: ..., kwargs: {{...}}}}, got {spec!r}.")


def call_factory(spec: Any, what: str, call_plain: bool) -> Any:
    """Resolve a factory reference. A plain string is called with no arguments when ``call_plain`` (models,
    data) and returned as is otherwise (a collator or metrics function *is* the callable). What a
    ``compute_metrics`` factory returns must be a metrics function (``callables.check_metrics_function``)."""
    obj, kwargs = resolve_factory(spec, what, call_plain)
    if kwargs is None:
        return obj
    built = obj(**kwargs)
    if what == "compute_metrics":
        callables.check_metrics_function(built, what, f"what {spec['factory']} returned")
    return built


# section -> whether a plain 'module:attribute' reference is called (models, data) or is the callable itself.
FACTORY_SECTIONS = {"model": True, "data": True, "data_collator": False, "compute_metrics": False}


def check_factories(sections: dict[str, Any]) -> None:
    """Import every factory the config names and check its keyword arguments, before anything is built."""
    from trainwell.cli.models import model_kind

    for section, call_plain in FACTORY_SECTIONS.items():
        spec = sections.get(section)
        if spec is None or (section == "data" and isinstance(spec, dict) and "factory" not in spec):
            continue
        if section == "model" and model_kind(spec) != "factory":  # built by trainwell: see cli/models.py
            continue
        resolve_factory(spec, section, call_plain)


def build_model(spec: Any) -> Any:
    """The model of a config without a task: a factory's ``torch.nn.Module``."""
    from trainwell.cli.models import model_kind

    if spec is None:
        raise CliError("the config has no 'model': name a factory, e.g. model: mypackage.models:build_model")
    kind = model_kind(spec)
    if kind != "factory":
        raise CliError(f"model: {spec!r} is sized from a tokenizer and a task: add task: text-classification or "
                       "causal-lm (with its text_column) and tokenizer: path/to/tokenizer.json, or name a factory.")
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


def load_file(spec: Any, what: str, text_column: str | None = None) -> tuple[Any, Any]:
    """``(dataset, split_off_eval_or_None)`` for one file spec: a path, or a mapping of ``_FILE_KEYS``.

    A plain-text file becomes byte blocks (the demo's format), or, with ``text_column`` (a task tokenizes it), one
    row ``{text_column: the file's text}`` (and one for the split-off eval text)."""
    spec = {"path": spec} if isinstance(spec, (str, os.PathLike)) else spec
    if not isinstance(spec, dict) or "path" not in spec:
        raise CliError(f"{what}: expected a file path or {{path: ..., format: ...}}, got {spec!r}.")
    _check_keys(spec, _FILE_KEYS, what)
    given = spec["path"]
    path = str(given)
    if not Path(path).is_file():
        where = given.explain() if isinstance(given, ConfigPath) else f"{path!r} (in {os.getcwd()})"
        raise FileNotFoundError(f"{what}: no such file {where}.")
    fmt = spec.get("format") or _SUFFIX_FORMAT.get(Path(path).suffix.lower(), "text")
    if fmt not in FORMATS:
        raise choice_error(f"{what}.format", fmt, FORMATS)
    fraction = float(spec.get("eval_fraction", 0.0))
    if fmt == "text" and text_column is not None:
        return _text_rows(path, text_column, fraction)
    if fmt == "text":
        from trainwell.examples.bytedata import text_blocks

        return text_blocks(path, int(spec.get("block_size", 128)), fraction)
    rows = read_rows(path, fmt, spec.get("columns"), spec.get("limit"))
    cut = len(rows) - int(len(rows) * fraction)
    return rows[:cut], (rows[cut:] if fraction > 0 else None)


def _text_rows(path: str, column: str, fraction: float) -> tuple[list[dict], list[dict] | None]:
    if not 0.0 <= fraction < 1.0:
        raise CliError(f"eval_fraction={fraction}: pass a number in [0, 1).")
    text = Path(path).read_text(encoding="utf-8")
    cut = len(text) - int(len(text) * fraction)
    return [{column: text[:cut]}], ([{column: text[cut:]}] if fraction > 0 else None)


def build_data(spec: Any, text_column: str | None = None) -> tuple[Any, Any]:
    """``(train_dataset, eval_dataset_or_None)`` from the config's ``data`` section (``text_column``: see
    ``load_file``)."""
    if spec is None:
        raise CliError("the config has no 'data': give {train: FILE, eval: FILE} or a factory.")
    if isinstance(spec, dict) and "factory" not in spec:
        _check_keys(spec, ("train", "eval"), "data")
        if "train" not in spec:
            raise CliError("data: 'train' is missing (a file path, or {path: ..., format: ...}).")
        train, split_eval = load_file(spec["train"], "data.train", text_column)
        if spec.get("eval") is not None:
            return train, load_file(spec["eval"], "data.eval", text_column)[0]
        evaluation = split_eval
        return train, evaluation
    made = call_factory(spec, "data", call_plain=True)
    if isinstance(made, dict):
        _check_keys(made, ("train", "eval", "validation"), "data (the factory's result)")
        return made.get("train"), made.get("eval", made.get("validation"))
    if isinstance(made, tuple) and len(made) == 2:
        return made
    return made, None
