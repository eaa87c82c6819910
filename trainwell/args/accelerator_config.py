"""``AcceleratorConfig``: the data-loading and state options of ``TrainingArguments.accelerator_config``.

Importable from ``trainwell.training_args`` too, where the reference defines it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from trainwell.args import normalize
from trainwell.args.fields import check_known_keys


def _arg(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class AcceleratorConfig:
    """The data-loading and state options the Trainer forwards to ``accelerate.Accelerator``."""

    split_batches: bool = _arg(False, "Split each loader batch across processes instead of giving each process "
                               "its own batch (the batch size must then divide by the number of processes).")
    dispatch_batches: bool | None = _arg(None, "Iterate the loader on the main process only and send each process "
                                         "its slice. None: on for iterable datasets, off otherwise.")
    even_batches: bool = _arg(True, "Repeat samples from the start so every process gets the same number of batches.")
    use_seedable_sampler: bool = _arg(True, "Use Accelerate's seedable random sampler for reproducible shuffling.")
    non_blocking: bool = _arg(False, "Copy batches to the device with non_blocking=True (pair it with pinned memory).")
    gradient_accumulation_kwargs: dict | None = _arg(None, "Extra options for Accelerate's gradient accumulation "
                                                     "plugin, such as {'sync_each_batch': True}.")
    use_configured_state: bool = _arg(False, "Reuse an AcceleratorState/PartialState the script already created "
                                      "instead of building a new one.")

    def to_dict(self) -> dict[str, Any]:
        """A deep-copied plain dict of the fields."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceleratorConfig:
        """Build from a dict; an unknown key is a ``ValueError`` naming it (with a did-you-mean)."""
        check_known_keys(data, {f.name for f in fields(cls)}, "accelerator_config")
        return cls(**data)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> AcceleratorConfig:
        """Build from a JSON file holding one object."""
        return cls.from_dict(normalize.load_json_object(path, "accelerator_config"))
