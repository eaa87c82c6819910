"""The reference's ``transformers.hf_argparser`` names, under the same path."""

from __future__ import annotations

from trainwell.utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = dict.fromkeys(["HfArgumentParser", "HfArg", "string_to_bool"], "trainwell.args.parser")

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
