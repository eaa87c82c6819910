"""Splitting evaluation data across processes without duplicated samples.

Owns the distributed evaluation order. Accelerate evens out the last step by repeating samples and later
cuts the repeated *rows* of the gathered outputs; a per-batch loss computed over real and repeated samples
cannot be cut that way, so ``eval_loss`` came out slightly wrong. trainwell shards evaluation data itself:

* the dataset is cut into global batches of ``batch_size`` consecutive samples (what one process would see);
* step ``s`` gives global batch ``s * world + r`` to process ``r``; gathering a step in rank order is therefore
  dataset order, and each batch is exactly the batch a single process would evaluate (same losses);
* in the last step a process without a batch of its own evaluates a *filler* (sample 0) and reports 0 real
  rows, so every process runs the same number of forward passes (sharded models need that) and the
  gatherer (``trainwell.loop.gather.ExactGatherer``) drops the filler's rows, losses included.

Map-style data uses :class:`EvalShardBatchSampler`, whose row counts are a pure function of the step.
Iterable data uses :class:`IterableEvalShard`: every process reads the whole stream (it must be the same
on every process, as for Accelerate's ``IterableDatasetShard``) and keeps its own batches, so it knows the
row counts of every process without communicating.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset, Sampler

FILLER_INDEX = 0


class EvalShardBatchSampler(Sampler[list[int]]):
    """The batches of process ``rank`` out of ``world``: global batch ``s * world + rank`` at step ``s``."""

    def __init__(self, num_samples: int, batch_size: int, rank: int, world: int, drop_last: bool = False) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: the evaluation batch size must be >= 1.")
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.rank, self.world = int(rank), int(world)
        full, rest = divmod(self.num_samples, self.batch_size)
        self.num_batches = full if drop_last or rest == 0 else full + 1  # global batches
        self.steps = -(-self.num_batches // self.world)

    def _batch_rows(self, batch: int) -> int:
        if batch >= self.num_batches:
            return 0
        return min(self.batch_size, self.num_samples - batch * self.batch_size)

    def counts(self, step: int) -> list[int]:
        """Real rows of every process at ``step`` (0 for a process evaluating a filler)."""
        return [self._batch_rows(step * self.world + r) for r in range(self.world)]

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.steps):
            batch = step * self.world + self.rank
            rows = self._batch_rows(batch)
            start = batch * self.batch_size
            yield list(range(start, start + rows)) if rows else [FILLER_INDEX]

    def __len__(self) -> int:
        return self.steps

    @property
    def real_samples(self) -> int:
        """Samples evaluated over all processes (the dataset, less a dropped last batch)."""
        return sum(self._batch_rows(b) for b in range(self.num_batches))


class ShardedBatch:
    """A collated batch with the real row counts of every process for this step."""

    __slots__ = ("counts", "inputs")

    def __init__(self, inputs: Any, counts: list[int]) -> None:
        self.inputs = inputs
        self.counts = counts


class IterableEvalShard(IterableDataset):
    """Per step, ``(samples of this process's batch or a filler, real rows of every process)``."""

    def __init__(self, dataset: Any, batch_size: int, rank: int, world: int, drop_last: bool = False) -> None:
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.rank, self.world = int(rank), int(world)
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[tuple[list[Any], list[int]]]:
        round_: list[list[Any]] = []
        batch: list[Any] = []
        filler = None
        for sample in self.dataset:
            if filler is None:
                filler = sample
            batch.append(sample)
            if len(batch) == self.batch_size:
                round_.append(batch)
                batch = []
                if len(round_) == self.world:
                    yield self._step(round_, filler)
                    round_ = []
        if batch and not self.drop_last:
            round_.append(batch)
        if round_:
            yield self._step(round_, filler)

    def _step(self, round_: list[list[Any]], filler: Any) -> tuple[list[Any], list[int]]:
        counts = [len(round_[r]) if r < len(round_) else 0 for r in range(self.world)]
        mine = round_[self.rank] if self.rank < len(round_) else [filler]
        return mine, counts

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)


class ShardCollator:
    """Collates an :class:`IterableEvalShard` step into a :class:`ShardedBatch`."""

    def __init__(self, collator: Callable) -> None:
        self.collator = collator

    def __call__(self, step: tuple[list[Any], list[int]]) -> ShardedBatch:
        samples, counts = step
        return ShardedBatch(self.collator(samples), counts)


def is_sharded_loader(dataloader: Any) -> bool:
    """Whether ``dataloader`` was built by trainwell's evaluation sharding (exact gathering applies)."""
    return isinstance(getattr(dataloader, "batch_sampler", None), EvalShardBatchSampler) or isinstance(
        getattr(dataloader, "dataset", None), IterableEvalShard
    )


def step_counts(dataloader: Any, step: int, item: Any) -> tuple[Any, list[int] | None]:
    """(inputs, real rows of every process) for ``item``, the ``step``-th value of ``dataloader``."""
    if isinstance(item, ShardedBatch):
        return item.inputs, item.counts
    sampler = getattr(dataloader, "batch_sampler", None)
    if isinstance(sampler, EvalShardBatchSampler):
        return item, sampler.counts(step)
    return item, None
