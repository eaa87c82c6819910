"""The reference's ``transformers.trainer_callback`` names, under the same path (re-exported from their owners)."""

from __future__ import annotations

from trainwell.utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["TrainerState", "TrainerControl", "ExportableState"], "trainwell.state"),
    "TrainerCallback": "trainwell.events.callback",
    "CallbackHandler": "trainwell.events.handler",
    "DefaultFlowCallback": "trainwell.events.flow",
    "ProgressCallback": "trainwell.events.progress",
    "PrinterCallback": "trainwell.events.progress",
    "EarlyStoppingCallback": "trainwell.events.early_stopping",
    "IntervalStrategy": "trainwell.outputs",
    "SaveStrategy": "trainwell.outputs",
    "TrainingArguments": "trainwell.training_args",
    "has_length": "trainwell.data.loaders",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
