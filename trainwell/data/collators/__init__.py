"""Data collators: turn a list of dataset examples into one batch of torch tensors.

Same names, fields and behaviour as the Hugging Face collators, without needing ``transformers``: every
padding collator takes any tokenizer-like object with ``pad_token_id`` (its ``pad()`` is used when it has
one; trainwell pads itself otherwise). ``return_tensors`` is ``"pt"`` (torch) or ``"np"`` (numpy arrays of the
same values).

Modules: ``base`` (default collator and shared padding helpers), ``padding``, ``language_modeling``,
``permutation`` (XLNet permutation LM), ``seq2seq``, ``token_classification``, ``multiple_choice``,
``flattening``.
"""

from __future__ import annotations

from trainwell.data.collators.base import (
    DataCollator,
    DefaultDataCollator,
    default_data_collator,
    numpy_default_data_collator,
    pad_features,
    torch_default_data_collator,
)
from trainwell.data.collators.flattening import DataCollatorWithFlattening
from trainwell.data.collators.language_modeling import DataCollatorForLanguageModeling
from trainwell.data.collators.multiple_choice import DataCollatorForMultipleChoice
from trainwell.data.collators.padding import DataCollatorWithPadding
from trainwell.data.collators.permutation import DataCollatorForPermutationLanguageModeling
from trainwell.data.collators.seq2seq import DataCollatorForSeq2Seq
from trainwell.data.collators.token_classification import DataCollatorForTokenClassification

__all__ = [
    "DataCollator",
    "DataCollatorForLanguageModeling",
    "DataCollatorForMultipleChoice",
    "DataCollatorForPermutationLanguageModeling",
    "DataCollatorForSeq2Seq",
    "DataCollatorForTokenClassification",
    "DataCollatorWithFlattening",
    "DataCollatorWithPadding",
    "DefaultDataCollator",
    "default_data_collator",
    "numpy_default_data_collator",
    "pad_features",
    "torch_default_data_collator",
]
