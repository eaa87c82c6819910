"""The training loader, built together with what makes it resumable.

Owns :func:`build_train_feed`: dataset + collator + sampler become a ``DataLoader`` (prepared by the runtime)
and, beside it, the pieces that a resume and each new epoch act on: the sampler (``set_epoch``, ``skip``), the
loader's own random generator (see :meth:`TrainFeed.start_epoch`: the global RNG moves exactly as under the
reference, whose loader draws its worker seed from it, and a resume mid-epoch recreates that seed), and the
position of a stateful ``IterableDataset`` (``trainwell.data.position``). They travel as one :class:`TrainFeed`.

``Trainer.get_train_dataloader()`` returns only the loader (the reference's contract, which subclasses
override); the feed is attached to that loader object, and :meth:`TrainFeed.of` finds it again. A loader built
elsewhere (an override) gets a plain feed: its epochs are started with ``set_epoch`` as the reference's are, and a
resume skips its consumed batches at its batch sampler (map-style data) or replays them (iterable data). Walking
epochs is ``trainwell.loop.epochs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainwell.data import loaders, rebalance
from trainwell.data.position import DataPosition
from trainwell.utils.seed import get_rng_state, set_rng_state

_ATTACHED = "_trainwell_feed"  # the attribute of a loader that holds its feed


@dataclass
class TrainFeed:
    """A training loader and its resumable parts (each None when the loader has no such part)."""

    loader: Any
    sampler: Any = None  #: trainwell's sampler: ``set_epoch(e)``, ``skip(indices)``
    generator: torch.Generator | None = None  #: the loader's generator, set by :meth:`start_epoch`
    position: DataPosition | None = None  #: a stateful iterable dataset's position as of the last batch received
    indices_per_batch: int = 1  #: sampler indices behind one batch the loop receives (all processes)
    dataset: Any = field(init=False)  #: the dataset the loader reads (Accelerate's wrappers forward it too)
    #: the global CPU RNG state this epoch's loader seed was drawn from (saved with checkpoints)
    epoch_rng: torch.Tensor | None = field(init=False, default=None)
    reads_ahead: bool = False  #: a plain loader, read one ahead here (Accelerate's prepared loaders do it)
    reader: ReadAhead | None = field(init=False, default=None)  #: the current epoch's, when ``reads_ahead``

    def __post_init__(self) -> None:
        self.dataset = getattr(self.loader, "dataset", None)

    def start_epoch(self, state: torch.Tensor | None = None, draw: bool = True) -> None:
        """Seed the epoch's iterator as the reference's loader is seeded, keeping the global RNG in step.

        The reference's loader has no generator: each epoch's iterator draws its worker base seed (one int64)
        from the global RNG, which dropout then continues from. Here the loader draws it from its own generator
        set to ``state`` (default: the global state now), so the value is the same, and ``draw`` moves the global
        RNG past it. A resume mid-epoch passes the state saved with the checkpoint and ``draw=False`` (the
        checkpoint's RNG states, restored next, are already past the draw).
        """
        state = torch.get_rng_state() if state is None else state
        self.generator.set_state(state)
        self.epoch_rng = state
        if draw:
            draw_loader_seed()

    @classmethod
    def of(cls, loader: Any) -> TrainFeed:
        """The feed built with ``loader``, or a plain one for a loader built elsewhere."""
        feed = getattr(loader, _ATTACHED, None)
        return feed if isinstance(feed, TrainFeed) and feed.loader is loader else cls(loader)


_START, _END = object(), object()


class ReadAhead:
    """An epoch's batches read one ahead, as Accelerate's prepared loaders (so the reference's) read them.

    The reference collates batch k+1 before it runs step k, so a collator or dataset that draws random numbers
    (masking, augmentation) interleaves them with the model's (dropout) in that order; reading one ahead keeps
    it. It also keeps the RNG states the pending batch was read from (``pending_rng``, saved with a
    checkpoint), so a resume reads that batch again identically (:meth:`reread`). The torch state costs ~1 µs to
    record; python's and numpy's ~50 µs, so they are recorded only when reading the first batch moved them.
    """

    def __init__(self, iterator: Any) -> None:
        self._iterator, self._pending = iterator, _START
        self.pending_rng: dict[str, Any] | None = None
        self._host_rngs: bool | None = None  # whether reading draws from python's or numpy's RNG (None: unknown)

    def __iter__(self) -> ReadAhead:
        return self

    def __next__(self) -> Any:
        if self._pending is _START:
            self._read()
        batch = self._pending
        if batch is _END:
            raise StopIteration
        self._read()
        return batch

    def reread(self, state: dict[str, Any]) -> None:
        """Read the pending batch now, from ``state`` (the RNG states it was read from before the checkpoint)."""
        set_rng_state(state)
        self._read()

    def _read(self) -> None:
        host = self._host_rngs is not False
        before = get_rng_state() if host else {"cpu": torch.get_rng_state()}
        self._pending = next(self._iterator, _END)
        self.pending_rng = before if self._pending is not _END else None
        if self._host_rngs is None:
            after = get_rng_state()
            self._host_rngs = after["python"] != before["python"] or after["numpy"] != before["numpy"]


def draw_loader_seed() -> None:
    """What creating an epoch's iterator of a loader without a generator takes from the global RNG."""
    torch.empty((), dtype=torch.int64).random_()


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


def is_resumable(sampler: Any) -> bool:
    """Whether ``sampler`` is one of trainwell's: an order that ``set_epoch`` selects and ``skip`` starts mid-pass."""
    return callable(getattr(sampler, "set_epoch", None)) and callable(getattr(sampler, "skip", None))


def build_train_feed(
    dataset: Any, collator: Callable, sampler: Any, args: Any, runtime: Any, batch_size: int
) -> TrainFeed:
    """The training loader over ``dataset`` (columns already removed) with ``sampler``, prepared by ``runtime``.

    A sampler that is not trainwell's (a subclass's ``_get_train_sampler`` returning torch's ``RandomSampler``,
    TRL's ``RepeatSampler``...) gets the reference's loader: prepared by Accelerate (which swaps a ``RandomSampler``
    for its seedable one), epochs started with ``set_epoch``, a resume skipping at its batch sampler."""
    if sampler is not None and not is_resumable(sampler):
        loader = loaders.build_dataloader(dataset, batch_size=batch_size, collate_fn=collator, args=args,
                                          sampler=sampler, train=True, rank=runtime.process_index)
        prepared = runtime.prepare_dataloader(loader, as_reference=True)
        feed = TrainFeed(prepared)
        setattr(prepared, _ATTACHED, feed)
        return feed
    position = DataPosition(dataset) if is_stateful(dataset, args.dataloader_num_workers) else None
    if position is not None:
        collator = position.wrap_collate(collator)
    loader = loaders.build_dataloader(
        dataset, batch_size=batch_size, collate_fn=collator, args=args, sampler=sampler, train=True,
        rank=runtime.process_index,
    )
    generator = torch.Generator()
    # read outside train(); each epoch of train() sets it again (TrainFeed.start_epoch)
    generator.manual_seed(loaders.data_seed(args))
    loader.generator = generator
    prepared = runtime.prepare_dataloader(loader)
    if position is not None and type(prepared).__name__ == "DataLoaderDispatcher":
        # the main process reads one batch per process for each batch it hands out, unless it splits one
        position.reads_per_batch = 1 if prepared.split_batches else runtime.num_processes
    # skip() counts indices for an index sampler, this rank's micro-batches for a rank-batch sampler (rebalance)
    per_batch = 1 if rebalance.yields_rank_batches(sampler) else batch_size * runtime.data_parallel_size
    feed = TrainFeed(prepared, sampler, generator, position, per_batch,
                     reads_ahead=prepared is loader and position is None)
    setattr(prepared, _ATTACHED, feed)
    return feed
