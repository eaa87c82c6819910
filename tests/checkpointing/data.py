"""Iterable datasets for the resume tests: a plain one (resumed by replay) and one with ``state_dict``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset


class PlainIterable(IterableDataset):
    """Yields ``data`` in a seeded shuffled order; each pass (``__iter__``) draws a new order."""

    def __init__(self, data: Dataset, seed: int = 0) -> None:
        self.data, self.seed, self.passes = data, seed, 0

    def _order(self, pass_index: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + pass_index)
        return torch.randperm(len(self.data), generator=generator).tolist()

    def __iter__(self) -> Iterator[Any]:
        order, self.passes = self._order(self.passes), self.passes + 1
        for index in order:
            yield self.data[index]


class StatefulIterable(PlainIterable):
    """Like :class:`PlainIterable`, and saves/restores its position (pass and offset) in O(1).

    ``state_dict()`` is the position of the next sample to yield; ``load_state_dict`` makes the next
    ``__iter__`` start there.
    """

    def __init__(self, data: Dataset, seed: int = 0) -> None:
        super().__init__(data, seed)
        self.position = 0
        self.loads = 0  # samples read through __getitem__ (to show resume does not replay)

    def __iter__(self) -> Iterator[Any]:
        pass_index, start = self.passes, self.position
        order = self._order(pass_index)
        for offset in range(start, len(order)):
            self.position = offset + 1
            self.loads += 1
            yield self.data[order[offset]]
        self.passes, self.position = pass_index + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"passes": self.passes, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.passes, self.position = int(state["passes"]), int(state["position"])
