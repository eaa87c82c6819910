"""Argument handling behind ``TrainingArguments``: normalization, validation, support checks and the parser.

Submodules: :mod:`~trainwell.args.normalize` (4.x aliases, JSON strings, enums, derived defaults),
:mod:`~trainwell.args.validate` (cross-field checks), :mod:`~trainwell.args.support` (fields trainwell does
not act on yet) and :mod:`~trainwell.args.parser` (command line, JSON and YAML). Names are resolved lazily so
that importing ``trainwell.training_args`` does not pay for argparse.
"""

from __future__ import annotations

from trainwell.utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "TrainwellArgumentParser": "trainwell.args.parser",
    "HfArgumentParser": "trainwell.args.parser",
    "string_to_bool": "trainwell.args.parser",
    "KNOWN_REPORT_TO": "trainwell.args.normalize",
    "ALIASES": "trainwell.args.aliases",
    "Alias": "trainwell.args.aliases",
    "validate_args": "trainwell.args.validate",
    "check_supported": "trainwell.args.support",
}

__all__ = sorted(_EXPORTS)

# dir() also lists the submodules, which are imported by name rather than through _EXPORTS.
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, extra_dir=["normalize", "validate", "support", "parser"])
