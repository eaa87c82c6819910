"""Where a stateful ``IterableDataset`` stands as of the last batch the training loop received.

A dataset with ``state_dict``/``load_state_dict`` saves its own position in a checkpoint. Asking it for its state
at save time is only right when nothing reads ahead of the loop. Accelerate's prepared loaders do read ahead: a
``DataLoaderShard`` fetches batch k+1 before handing out batch k (so it can tell the last batch), and a
``DataLoaderDispatcher`` reads ``num_processes`` batches per step on the main process. At save time the dataset
has then moved past what was trained on, and a resume would skip those batches.

So the collate function (called once per batch, right after the dataset yields the batch's samples) records the
dataset's state into a queue, and the loop takes the matching entry off the queue when it receives the batch.
The saved position is the one of the last batch received. Cost: one ``state_dict()`` copy per batch.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any


class DataPosition:
    """Pairs each batch the loop receives with the dataset state right after that batch was read."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        #: batches the underlying loader reads for one batch the loop receives (a dispatcher reads one per rank)
        self.reads_per_batch = 1
        self._read: deque[Any] = deque()
        self._received: Any = None

    def wrap_collate(self, collate_fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """``collate_fn`` that also records the dataset's state once the batch is read."""

        def collate_and_record(samples: list[Any]) -> Any:
            batch = collate_fn(samples)
            # a copy: a state_dict may hand out its live internals, which move on with the next batch
            self._read.append(copy.deepcopy(self.dataset.state_dict()))
            return batch

        return collate_and_record

    def track(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """Yield from ``iterator`` (a new pass: earlier read-ahead is dropped), noting each batch as received."""
        self._read.clear()
        for batch in iterator:
            for _ in range(min(self.reads_per_batch, len(self._read))):
                self._received = self._read.popleft()
            yield batch

    def restored(self) -> None:
        """The dataset was just set to a checkpoint's position: that is the position until a batch is received."""
        self._read.clear()
        self._received = copy.deepcopy(self.dataset.state_dict())

    def state_dict(self) -> Any:
        """The dataset state as of the last batch received (the dataset's own state before the first one)."""
        return self._received if self._received is not None else self.dataset.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Set the dataset to ``state`` (a checkpoint's position): the next batch read continues from there."""
        self.dataset.load_state_dict(state)
        self.restored()
