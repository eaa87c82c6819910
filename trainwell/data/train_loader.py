"""The training loader, built together with what makes it resumable.

Owns :func:`build_train_feed`: dataset + collator + sampler become a ``DataLoader`` (prepared by the runtime)
and, beside it, the pieces that a resume and each new epoch act on: the sampler (``set_epoch``, ``skip``), the
loader's own random generator (reseeded per epoch, so creating an epoch's iterator never draws from the global
RNG and worker seeds are a function of (seed, epoch)), and the position of a stateful ``IterableDataset``
(``trainwell.data.position``). They travel as one :class:`TrainFeed`.

``Trainer.get_train_dataloader()`` returns only the loader (the reference's contract, which subclasses
override); the feed is attached to that loader object, and :meth:`TrainFeed.of` finds it again. A loader built
elsewhere (an override) gets a plain feed: its epochs are started with ``set_epoch`` where it has one, and a
resume replays the consumed batches. Walking epochs is ``trainwell.loop.epochs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainwell.data import loaders
from trainwell.data.position import DataPosition

_ATTACHED = "_trainwell_feed"  # the attribute of a loader that holds its feed


@dataclass
class TrainFeed:
    """A training loader and its resumable parts (each None when the loader has no such part)."""

    loader: Any
    sampler: Any = None  #: trainwell's sampler: ``set_epoch(e)``, ``skip(indices)``
    generator: torch.Generator | None = None  #: the loader's generator, reseeded with ``data_seed + epoch``
    position: DataPosition | None = None  #: a stateful iterable dataset's position as of the last batch received
    data_seed: int = 0
    indices_per_batch: int = 1  #: sampler indices behind one batch the loop receives (all processes)
    dataset: Any = field(init=False)  #: the dataset the loader reads (Accelerate's wrappers forward it too)

    def __post_init__(self) -> None:
        self.dataset = getattr(self.loader, "dataset", None)

    @classmethod
    def of(cls, loader: Any) -> TrainFeed:
        """The feed built with ``loader``, or a plain one for a loader built elsewhere."""
        feed = getattr(loader, _ATTACHED, None)
        return feed if isinstance(feed, TrainFeed) and feed.loader is loader else cls(loader)


def is_stateful(dataset: Any, num_workers: int) -> bool:
    """Whether ``dataset`` can save and restore its own position as the training loop reads it.

    Only an ``IterableDataset`` with ``state_dict``/``load_state_dict`` read in the main process
    (``dataloader_num_workers=0``): with workers, each worker iterates its own copy and the main process's
    object never moves, so its state would be meaningless.
    """
    from torch.utils.data import IterableDataset

    if not isinstance(dataset, IterableDataset) or num_workers > 0:
        return False
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def build_train_feed(
    dataset: Any, collator: Callable, sampler: Any, args: Any, runtime: Any, batch_size: int
) -> TrainFeed:
    """The training loader over ``dataset`` (columns already removed) with ``sampler``, prepared by ``runtime``."""
    position = DataPosition(dataset) if is_stateful(dataset, args.dataloader_num_workers) else None
    if position is not None:
        collator = position.wrap_collate(collator)
    loader = loaders.build_dataloader(
        dataset, batch_size=batch_size, collate_fn=collator, args=args, sampler=sampler, train=True,
        rank=runtime.process_index,
    )
    data_seed = args.data_seed if args.data_seed is not None else args.seed
    generator = torch.Generator()
    generator.manual_seed(data_seed)
    loader.generator = generator
    prepared = runtime.prepare_dataloader(loader)
    if position is not None and type(prepared).__name__ == "DataLoaderDispatcher":
        # the main process reads one batch per process for each batch it hands out, unless it splits one
        position.reads_per_batch = 1 if prepared.split_batches else runtime.num_processes
    feed = TrainFeed(prepared, sampler, generator, position, data_seed, batch_size * runtime.num_processes)
    setattr(prepared, _ATTACHED, feed)
    return feed
