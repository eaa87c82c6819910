"""Length-grouped training order (``train_sampling_strategy="group_by_length"``).

Owns :class:`LengthGroupedSampler` and the one-time computation of sample lengths. Samples of similar length
are put in the same batches, so little padding is wasted, while the order stays random across batches.

Differences from the reference, on purpose:

* the order is a pure function of ``(seed, epoch)`` (the reference's training sampler draws from the global
  torch RNG, so ``model_init`` or anything else that consumes it changes the data order), and the sampler has
  the :class:`~trainwell.data.samplers.ResumableSampler` interface (``set_epoch``, ``skip``, ``state_dict``),
  so an interrupted run resumes at the exact sample;
* lengths are read with ``dataset[i]`` for ``i < len(dataset)``, once, never by iterating the dataset (the
  reference's ``for item in dataset`` loops forever on a dataset whose ``__getitem__`` never raises
  ``IndexError``);
* it only ever orders training data: evaluation stays in dataset order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from trainwell.data.samplers import ResumableSampler

MAX_MEGABATCH_MULTIPLIER = 50


def grouped_order(lengths: Sequence[int], batch_size: int, generator: torch.Generator) -> list[int]:
    """A random order in which consecutive ``batch_size`` chunks hold samples of similar length.

    The indices are shuffled and cut into megabatches of ``m * batch_size`` (``m = min(n // (4 *
    batch_size), 50)``, at least 1); each megabatch is sorted longest first, and the longest sample overall
    leads the first batch, so an out-of-memory error shows up at the first step rather than hours later.
    """
    n = len(lengths)
    if n == 0:
        return []
    multiplier = max(1, min(n // (batch_size * 4), MAX_MEGABATCH_MULTIPLIER))
    size = multiplier * batch_size
    order = torch.randperm(n, generator=generator).tolist()
    megabatches = [sorted(order[i:i + size], key=lambda j: lengths[j], reverse=True) for i in range(0, n, size)]
    longest = max(range(len(megabatches)), key=lambda k: lengths[megabatches[k][0]])
    megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for mb in megabatches for i in mb]


class LengthGroupedSampler(ResumableSampler):
    """Length-grouped random order over ``range(len(lengths))``, seeded by ``seed + epoch`` and resumable."""

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: the length-grouped sampler needs a batch size >= 1.")
        super().__init__(len(lengths), shuffle=True, seed=seed)
        self.lengths = [int(x) for x in lengths]
        self.batch_size = int(batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.tensor(grouped_order(self.lengths, self.batch_size, generator), dtype=torch.long)

    def state_dict(self) -> dict[str, int]:
        return {**super().state_dict(), "batch_size": self.batch_size}


def sample_lengths(dataset: Any, length_column: str, input_name: str, strategy: str = "group_by_length") -> list[int]:
    """The length of every sample: the ``length_column`` column when the dataset has one, else
    ``len(dataset[i][input_name])`` for each ``i`` (one pass, by index). ``strategy`` names the
    ``train_sampling_strategy`` that needs them, in the error for a sample without a length.
    """
    columns = getattr(dataset, "column_names", None)
    if columns is not None and length_column in columns:
        return [int(x) for x in dataset[length_column]]
    lengths = []
    for i in range(len(dataset)):
        item = dataset[i]
        if isinstance(item, Mapping) and length_column in item:
            lengths.append(int(item[length_column]))
            continue
        if not isinstance(item, Mapping) or input_name not in item:
            keys = list(item) if isinstance(item, Mapping) else type(item).__name__
            raise ValueError(
                f"train_sampling_strategy={strategy!r} needs each sample's length: sample {i} has no "
                f"{input_name!r} (it has {keys}). Add a {length_column!r} column with the lengths, set "
                "length_column_name to the column that holds them, or use train_sampling_strategy='random'."
            )
        lengths.append(_length(item[input_name]))
    return lengths


def _length(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.shape[-1]) if value.dim() else 1
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[-1]) if len(shape) else 1
    return len(value)

