"""Samplers whose order is a pure function of (seed, epoch) and that can start mid-epoch.

Owns the training sampler. Its order for epoch ``e`` is ``randperm(n)`` drawn from a generator seeded with
``seed + e`` (the convention of Accelerate's seedable sampler, so an epoch's order never depends on what
else consumed the global RNG). ``skip(k)`` makes the next pass start at position ``k`` of that order: resuming
mid-epoch costs one ``randperm`` and no sample is loaded or collated to skip it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Random (``shuffle=True``) or sequential order over ``range(num_samples)``, resumable at any position.

    ``set_epoch(e)`` selects the permutation; ``skip(k)`` drops the first ``k`` indices of the *next* pass
    only (later epochs start at 0 again). ``len()`` is always the full epoch, so batch arithmetic done
    before a resume stays valid.
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0) -> None:
        self.num_samples = int(num_samples)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.epoch = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip(self, num_indices: int) -> None:
        if num_indices < 0:
            raise ValueError(f"skip({num_indices}): the number of indices to skip must be >= 0")
        self._skip = int(num_indices)

    def order(self, epoch: int) -> torch.Tensor:
        """The full index order of ``epoch`` (what an uninterrupted pass yields)."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[int]:
        start, self._skip = self._skip, 0
        return iter(self.order(self.epoch)[start:].tolist())

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed, "num_samples": self.num_samples}
