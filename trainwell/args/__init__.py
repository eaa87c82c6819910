"""Argument handling behind ``TrainingArguments``: normalization, validation, support checks and the parser.

Submodules: :mod:`~trainwell.args.normalize` (4.x aliases, JSON strings, enums, derived defaults),
:mod:`~trainwell.args.validate` (cross-field checks), :mod:`~trainwell.args.support` (fields trainwell does
not act on yet) and :mod:`~trainwell.args.parser` (command line, JSON and YAML). Names are resolved lazily so
that importing ``trainwell.training_args`` does not pay for argparse.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "TrainwellArgumentParser": "trainwell.args.parser",
    "HfArgumentParser": "trainwell.args.parser",
    "string_to_bool": "trainwell.args.parser",
    "KNOWN_REPORT_TO": "trainwell.args.normalize",
    "ALIASES": "trainwell.args.normalize",
    "Alias": "trainwell.args.normalize",
    "validate_args": "trainwell.args.validate",
    "check_supported": "trainwell.args.support",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainwell.args' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(__all__) | {"normalize", "validate", "support", "parser"})
