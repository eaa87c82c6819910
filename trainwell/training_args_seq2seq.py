"""``Seq2SeqTrainingArguments``: the reference's arguments for sequence-to-sequence training with generation."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwell.training_args import TrainingArguments, _arg

logger = logging.getLogger(__name__)


@dataclass
class Seq2SeqTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus the generation settings :class:`~trainwell.Seq2SeqTrainer` evaluates with."""

    sortish_sampler: bool = _arg(False, "Accepted for compatibility: the reference does not use it either.")
    predict_with_generate: bool = _arg(False, "Evaluate and predict with generate() (generated token ids as "
                                       "predictions) instead of one forward pass.")
    generation_max_length: int | None = _arg(None, "max_length for generate() during evaluation (default: the "
                                             "model's generation_config).")
    generation_num_beams: int | None = _arg(None, "num_beams for generate() during evaluation (default: the "
                                            "model's generation_config).")
    generation_config: str | Path | Any | None = _arg(None, "A GenerationConfig, or a model id / folder to load "
                                                      "one from (needs transformers).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sortish_sampler:
            logger.warning("sortish_sampler=True has no effect (in the reference neither): batches are sampled as "
                           "train_sampling_strategy says.")
