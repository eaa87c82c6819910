"""The reference's ``transformers.trainer_callback`` names, under the same path (re-exported from their owners)."""

from __future__ import annotations

from trainwell import _EXPORTS as TOP_LEVEL  # the owners of the top-level names
from trainwell.utils.lazy import lazy_exports

_NAMES = ("TrainerState", "TrainerControl", "ExportableState", "TrainerCallback", "CallbackHandler",
          "DefaultFlowCallback", "ProgressCallback", "PrinterCallback", "EarlyStoppingCallback", "IntervalStrategy",
          "SaveStrategy", "TrainingArguments")
_EXPORTS: dict[str, str] = {**{name: TOP_LEVEL[name] for name in _NAMES}, "has_length": "trainwell.data.loaders"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
