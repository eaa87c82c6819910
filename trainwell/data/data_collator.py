"""The reference's ``transformers.data.data_collator`` names, under the same path (the collators package owns
them)."""

from __future__ import annotations

from trainwell.data.collators import *  # noqa: F403  (the collators' public names)
from trainwell.data.collators import __all__ as _collators
from trainwell.data.collators.base import DataCollatorMixin

__all__ = [*_collators, "DataCollatorMixin"]
