"""Walking the training data epoch by epoch, window by window, from wherever the run stands.

Owns :class:`EpochIterator`: starting an epoch (``set_epoch`` on the sampler and the dataset, seeding the
loader as the reference's is seeded: ``TrainFeed.start_epoch``), skipping what a resumed run already
consumed, and cutting the epoch's micro-batches into accumulation windows (``StepPlan.window_size``).
Skipping is as cheap as the data allows:

* map-style data skips at the sampler: nothing is loaded or collated to skip it (in a loader a subclass built,
  at its batch sampler, as the reference does: ``Runtime.skip_first_batches``);
* a stateful ``IterableDataset`` (``state_dict``/``load_state_dict``) is set to its saved position;
* any other iterable data is replayed: the consumed batches are read again and dropped (documented cost);
  resuming in a later pass over a stream without ``set_epoch`` reads the earlier passes too, since its order
  may depend on how often it was iterated.

On the resumed epoch, the run's checkpointer restores the ``DATA`` phase before the iterator is built (into the
providers registered here: the dataset's position, the loader seed the epoch drew, the RNG states of the batch
read ahead of the checkpoint's step) and the ``RNG`` phase once it exists, right before its first batch (so the
uninterrupted run's random draws continue exactly).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from trainwell.checkpoint.checkpointer import Provider
from trainwell.checkpoint.contents import Phase
from trainwell.data import rebalance
from trainwell.data.train_loader import ReadAhead, draw_loader_seed

if TYPE_CHECKING:
    from trainwell.checkpoint.checkpointer import Checkpointer
    from trainwell.data.train_loader import TrainFeed
    from trainwell.hooks import TrainerHooks
    from trainwell.loop.plan import StepPlan


class EpochIterator:
    """The windows of each epoch of one ``train()`` call over ``feed``."""

    def __init__(self, hooks: TrainerHooks, feed: TrainFeed, plan: StepPlan, checkpointer: Checkpointer) -> None:
        self.hooks, self.feed, self.plan = hooks, feed, plan
        self.checkpointer, self.resume = checkpointer, checkpointer.resume
        self.replay = not hooks.args.ignore_data_skip
        #: micro-batches of the current epoch consumed so far (those a resume skipped included)
        self.consumed = 0
        # What the checkpoint restores of the resumed epoch (the DATA phase, through the providers below), used as
        # the epoch starts.
        self._seed: Any = None  # the CPU RNG state the epoch's loader seed is drawn from
        self._pending: Any = None  # the RNG states the batch read ahead was read from
        #: the state the epoch's loader seed was drawn from (``"epoch_seed"`` of ``CONTENTS``)
        self.seed_provider = Provider(lambda: feed.epoch_rng, self._set_seed)
        #: the RNG states the batch read ahead of the step was read from (``"pending_batch"``)
        self.pending_provider = Provider(self._pending_rng, self._set_pending)
        self.epoch = 0  #: the epoch being walked
        #: the sample places of the epoch used so far, all processes (``"epoch_samples"``: read by the resume itself)
        self.samples_provider = Provider(self._samples_used, lambda state: None)

    def start(self, epoch: int, skip_windows: int) -> Iterator[list[Any]]:
        """The windows of ``epoch`` after its first ``skip_windows`` (a lazy iterator: nothing read ahead)."""
        resuming_here = self.resume is not None and epoch == self.resume.epoch
        self.epoch = epoch
        self.consumed = self.plan.batches_before(skip_windows)
        restored = self.checkpointer.restore(Phase.DATA) if resuming_here else ()
        batches = self._batches(epoch, self.consumed, resuming_here, "data_position" in restored)
        if resuming_here:
            if self._pending is not None and isinstance(batches, ReadAhead):
                batches.reread(self._pending)  # the batch read ahead before the checkpoint, read the same way again
            if self.consumed and self.feed.generator is None:
                # A loader a subclass built draws its pass's worker seed from the global RNG as it starts: the
                # reference reads the resumed window first and restores the RNG after (its ``rng_to_sync``).
                return self._windows(batches, skip_windows, lambda: self.checkpointer.restore(Phase.RNG))
            self.checkpointer.restore(Phase.RNG)
            if self.consumed == 0 and self.feed.generator is not None:
                draw_loader_seed()  # the epoch began after the saved state in the run that saved: draw as it did
        return self._windows(batches, skip_windows)

    def _windows(self, batches: Iterator[Any], window: int,
                 after_first: Callable[[], Any] | None = None) -> Iterator[list[Any]]:
        """The windows from ``window`` on; ``after_first`` is called once the first one is read."""
        while True:
            size = self.plan.window_size(window)
            taken = [batch for _, batch in zip(range(size), batches)]
            if after_first is not None:
                after_first, call = None, after_first
                call()
            if not taken:
                return
            self.consumed += len(taken)
            yield taken
            window += 1

    def _batches(self, epoch: int, skip: int, resuming_here: bool, restored: bool) -> Iterator[Any]:
        """``restored``: the dataset was set to its saved position (nothing to skip: it resumes there by itself)."""
        feed, loader = self.feed, self.feed.loader
        if restored:
            skip = 0
        if resuming_here and self.replay and feed.sampler is None and not restored and not self.plan.sized:
            self._replay_earlier_passes(epoch)
        if skip and feed.sampler is None:
            skipping = self.hooks.runtime.skip_first_batches(loader, skip)  # a loader built by a subclass
            if skipping is not None:
                loader, skip = skipping, 0
        if feed.sampler is not None:
            feed.sampler.set_epoch(epoch)
        if feed.generator is not None and resuming_here:
            # mid-epoch: the seed this epoch drew before the checkpoint; at its start: the checkpoint's own state
            feed.start_epoch(self._seed, draw=False)
        elif feed.generator is not None:
            feed.start_epoch()
        # Accelerate's prepared loaders forward set_epoch to their dataset; a plain DataLoader has none.
        target = loader if hasattr(loader, "set_epoch") else feed.dataset
        if hasattr(target, "set_epoch") and target is not feed.sampler:
            target.set_epoch(epoch)
        # Nor do they forward it to a batch sampler they wrapped (to shard it, or to skip into it): the reference
        # reaches it, so a subclass's epoch-seeded batch sampler (sentence-transformers') draws each epoch anew.
        wrapped = getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)
        if hasattr(wrapped, "set_epoch") and wrapped is not feed.sampler:
            wrapped.set_epoch(epoch)
        if skip and feed.sampler is not None:
            feed.sampler.skip(skip * feed.indices_per_batch)
            return self._read_ahead(iter(loader))
        iterator = iter(loader)
        if feed.position is not None:
            iterator = feed.position.track(iterator)
        for _ in range(skip):  # iterable data: replay (documented cost)
            next(iterator, None)
        return self._read_ahead(iterator)

    # ------------------------------------------------------------------------------- what the providers read and set
    def _set_seed(self, state: Any) -> None:
        self._seed = state

    def _samples_used(self) -> dict[str, int] | None:
        """``{"epoch", "samples"}`` for trainwell's index sampler over data with a length (None otherwise: a sampler
        of this rank's own micro-batches, or a loader a subclass built, counts no global sample places)."""
        sampler = self.feed.sampler
        if sampler is None or not self.plan.sized or rebalance.yields_rank_batches(sampler):
            return None
        return {"epoch": self.epoch, "samples": self.consumed * self.feed.indices_per_batch}

    def _pending_rng(self) -> Any:
        return self.feed.reader.pending_rng if self.feed.reader is not None else None

    def _set_pending(self, state: Any) -> None:
        self._pending = state

    def _read_ahead(self, iterator: Iterator[Any]) -> Iterator[Any]:
        self.feed.reader = ReadAhead(iterator) if self.feed.reads_ahead else None
        return self.feed.reader or iterator

    def _replay_earlier_passes(self, epoch: int) -> None:
        """Read the passes before ``epoch`` of an iterable dataset that has no ``set_epoch``."""
        if epoch <= 0 or hasattr(self.hooks.train_dataset, "set_epoch"):
            return
        for _ in range(epoch):
            for _ in self.feed.loader:
                pass
