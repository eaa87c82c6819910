"""Cost-balanced micro-batches across data-parallel ranks (``train_sampling_strategy="batch_rebalance"``).

Owns :class:`BatchRebalanceSampler` and the per-step split it relies on (:func:`step_micro_batches`). Each
optimizer step takes the next ``effective_batch_size`` samples of the epoch's order (identical on every rank,
so no communication is needed), sorts them longest first and cuts them into ``dp_size * grad_accum``
contiguous micro-batches whose padded cost is as even as a hill climb on their *sizes* can make it: long
samples travel in small micro-batches, short ones in large. The micro-batches are ranked by cost; the
``dp_size`` most expensive form accumulation slot 0 (one per rank), the next ``dp_size`` slot 1, and so on,
so the ranks that run a slot together wait little on each other.

The sampler yields *this rank's* micro-batches (lists of indices of varying size): it is a batch sampler
that has already sharded the data, so a loader must take it as ``batch_sampler`` and must not be sharded
across processes again (:func:`yields_rank_batches` tells the loader code so; :func:`keep_rank_batches`
undoes the sharding Accelerate adds to a loader it prepares).

Parity with the reference's sampler of the same name: for the same lengths, arguments, seed and epoch it
yields the same micro-batches in the same order (same cost model, same tie-breaking), so a script moved
over trains on the same batches. Beyond it, the sampler has the resumable interface of
:class:`~trainwell.data.samplers.ResumableSampler`: ``skip(k)`` drops the first ``k`` micro-batches of the
next pass without balancing the steps it skips.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

#: weight of attention's quadratic term in the cost of a padded micro-batch
QUADRATIC_COST_COEF = 0.001


def micro_batch_cost(size: int, longest: int) -> float:
    """Cost of ``size`` samples padded to ``longest`` tokens: linear work plus attention's quadratic term."""
    # The operations run in this exact order on purpose: costs are compared for equality while balancing, so
    # they must be the very floats the reference computes, or ties would break differently.
    return size * longest + QUADRATIC_COST_COEF * size * longest * longest


def yields_rank_batches(sampler: Any) -> bool:
    """Whether ``sampler`` yields this process's micro-batches itself (pass it as ``batch_sampler``, never shard)."""
    return bool(getattr(sampler, "yields_rank_batches", False))


def keep_rank_batches(prepared: Any, sampler: Any) -> Any:
    """``prepared`` (a loader Accelerate prepared around ``sampler``) with Accelerate's sharding undone.

    With several processes Accelerate wraps a loader's batch sampler in a ``BatchSamplerShard`` that keeps every
    ``num_processes``-th batch; on a sampler that already yields only this rank's micro-batches that would drop
    most of them, so the wrapper is turned into a pass-through. A loader that dispatches batches from the main
    process cannot carry per-rank micro-batches of varying size at all, and is refused.
    """
    if not yields_rank_batches(sampler):
        return prepared
    if type(prepared).__name__ == "DataLoaderDispatcher":
        raise ValueError("train_sampling_strategy='batch_rebalance' gives every process its own micro-batches, which "
                         "accelerator_config.dispatch_batches=True cannot do: set dispatch_batches=False.")
    shard = getattr(prepared, "batch_sampler", None)
    if shard is not None and shard is not sampler and getattr(shard, "batch_sampler", None) is sampler:
        shard.num_processes, shard.process_index = 1, 0
    return prepared


def _costs(counts: Sequence[int], longest_first: Sequence[int]) -> list[float]:
    """Cost of each contiguous group of ``longest_first`` cut by ``counts`` (a group's first sample is its longest)."""
    costs, start = [], 0
    for count in counts:
        costs.append(micro_batch_cost(count, longest_first[start]) if count else 0.0)
        start += count
    return costs


def _top_up(counts: list[int], member: int, slot: set[int], frozen: set[int], longest_first: Sequence[int],
            cap: float) -> None:
    """Move samples into group ``member`` from the cheapest groups outside ``slot`` while it stays under ``cap``."""
    while True:
        costs = _costs(counts, longest_first)
        start = sum(counts[:member])
        longest = longest_first[start] if counts[member] else 0
        if micro_batch_cost(counts[member] + 1, longest) > cap:
            return
        donors = [i for i in range(len(counts)) if i not in frozen and i not in slot and counts[i] > 1]
        if not donors:
            return
        donor = min(donors, key=costs.__getitem__)
        counts[member] += 1
        counts[donor] -= 1


def _freeze_slot(counts: list[int], costs: list[float], top: int, frozen: set[int], longest_first: Sequence[int],
                 dp_size: int) -> None:
    """Stop balancing the accumulation slot of ``top``, a single-sample group that cannot get any cheaper.

    Its slot-mates are first filled up to ``top``'s cost with samples taken from the groups still balancing,
    which leaves those groups cheaper and easier to even out.
    """
    ranking = sorted(range(len(costs)), key=costs.__getitem__, reverse=True)
    first = ranking.index(top) // dp_size * dp_size
    # A set, built from the ranking like the reference's: its iteration order decides who is topped up first.
    slot = set(ranking[first:first + dp_size])
    for member in slot:
        if member not in frozen and member != top:
            _top_up(counts, member, slot, frozen, longest_first, costs[top])
    frozen.update(slot)


def balanced_counts(longest_first: Sequence[int], groups: int, dp_size: int, max_moves: int) -> list[int]:
    """Sizes of ``groups`` contiguous groups of the sorted lengths ``longest_first`` with near-equal cost.

    Starts from equal sizes and repeatedly moves one sample from the most expensive group to the cheapest
    (a hill climb that stops on a repeated state, equal costs, or after ``max_moves``). It returns the sizes
    with the smallest cost spread seen, so stopping early never loses samples.
    """
    n = len(longest_first)
    if n < groups:
        raise ValueError(f"{n} samples cannot fill {groups} micro-batches (dp_size x grad_accum) with one each: "
                         "lower the batch size or use more data.")
    counts = [n // groups + (1 if i < n % groups else 0) for i in range(groups)]
    best, best_spread = list(counts), math.inf
    frozen: set[int] = set()
    seen: set[tuple[int, ...]] = set()
    for _ in range(max_moves):
        if tuple(counts) in seen:
            break
        seen.add(tuple(counts))
        costs = _costs(counts, longest_first)
        active = [i for i in range(groups) if i not in frozen]
        if len(active) <= 1:
            break
        top, bottom = max(active, key=costs.__getitem__), min(active, key=costs.__getitem__)
        if costs[top] - costs[bottom] < best_spread:
            best, best_spread = list(counts), costs[top] - costs[bottom]
        if costs[top] == costs[bottom]:
            break
        if counts[top] > 1:
            counts[top] -= 1
            counts[bottom] += 1
        else:
            _freeze_slot(counts, costs, top, frozen, longest_first, dp_size)
    return best


def step_micro_batches(indices: Sequence[int], lengths: Sequence[int], dp_size: int, grad_accum: int,
                       max_moves: int) -> list[list[list[int]]]:
    """One optimizer step's samples split into micro-batches: ``result[rank][slot]`` is a list of indices.

    Slot 0 holds the ``dp_size`` most expensive micro-batches (one per rank), slot 1 the next, and so on.
    """
    longest_first = sorted(indices, key=lengths.__getitem__, reverse=True)  # stable: ties keep step order
    sorted_lengths = [lengths[i] for i in longest_first]
    counts = balanced_counts(sorted_lengths, dp_size * grad_accum, dp_size, max_moves)
    starts = [sum(counts[:g]) for g in range(len(counts))]
    costs = _costs(counts, sorted_lengths)
    by_cost = sorted(range(len(counts)), key=costs.__getitem__, reverse=True)
    return [
        [longest_first[starts[g]:starts[g] + counts[g]] for g in (by_cost[s * dp_size + r] for s in range(grad_accum))]
        for r in range(dp_size)
    ]


class BatchRebalanceSampler(Sampler[list[int]]):
    """This rank's cost-balanced micro-batches; the order a pure function of ``(seed, epoch)``, resumable.

    Arguments (and defaults) are the reference's: ``effective_batch_size`` samples per optimizer step over all
    ``dp_size`` ranks and ``grad_accum`` micro-batches; ``shuffle`` draws the epoch's order with
    ``randperm`` from a generator seeded ``seed + epoch`` (else dataset order); ``drop_last=False`` keeps the
    last, partial step, padded with samples from the start of the epoch if it has fewer samples than
    micro-batches. ``len()`` is this rank's micro-batches in a full epoch; every rank has the same number.
    """

    yields_rank_batches = True  #: read by the loader code: a batch sampler, already sharded

    def __init__(self, lengths: Sequence[int], effective_batch_size: int, dp_size: int, grad_accum: int,
                 shuffle: bool = True, seed: int = 42, rank: int = 0, drop_last: bool = True) -> None:
        if dp_size < 1 or grad_accum < 1 or not 0 <= rank < dp_size:
            raise ValueError(f"dp_size={dp_size}, grad_accum={grad_accum}, rank={rank}: need dp_size >= 1, "
                             "grad_accum >= 1 and 0 <= rank < dp_size.")
        if effective_batch_size < dp_size * grad_accum:
            raise ValueError(f"effective_batch_size={effective_batch_size} is smaller than dp_size x grad_accum "
                             f"= {dp_size * grad_accum}: every micro-batch needs at least one sample.")
        self.lengths = [int(x) for x in lengths]
        self.effective_batch_size, self.dp_size, self.grad_accum = effective_batch_size, dp_size, grad_accum
        self.shuffle, self.seed, self.rank, self.drop_last = shuffle, int(seed), rank, drop_last
        self.epoch = 0
        self._skip = 0
        full, tail = divmod(len(self.lengths), effective_batch_size)
        self.num_steps = full + (1 if tail and not drop_last else 0)  #: optimizer steps in an epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip(self, num_batches: int) -> None:
        """Drop the first ``num_batches`` micro-batches of the next pass only (the unit this sampler yields)."""
        if num_batches < 0:
            raise ValueError(f"skip({num_batches}): the number of micro-batches to skip must be >= 0")
        self._skip = int(num_batches)

    def order(self, epoch: int) -> list[list[int]]:
        """This rank's micro-batches of ``epoch``, in order (what an uninterrupted pass yields)."""
        return list(self._micro_batches(epoch, 0))

    def __iter__(self) -> Iterator[list[int]]:
        # Read the epoch and the skip now, not at the first next(): a later set_epoch/skip is for the next pass.
        start, self._skip = self._skip, 0
        return self._micro_batches(self.epoch, start)

    def __len__(self) -> int:
        return self.num_steps * self.grad_accum

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seed": self.seed, "num_samples": len(self.lengths),
                "effective_batch_size": self.effective_batch_size, "dp_size": self.dp_size,
                "grad_accum": self.grad_accum, "rank": self.rank, "drop_last": self.drop_last}

    def _micro_batches(self, epoch: int, start: int) -> Iterator[list[int]]:
        # Steps depend only on the epoch's permutation, so a resume balances none of the steps it skips.
        permutation = self._permutation(epoch)
        first_step, first_slot = divmod(start, self.grad_accum)
        max_moves = max(30 * self.dp_size * self.grad_accum, self.effective_batch_size)
        for step in range(first_step, self.num_steps):
            indices = self._step_indices(permutation, step)
            mine = step_micro_batches(indices, self.lengths, self.dp_size, self.grad_accum, max_moves)[self.rank]
            yield from mine[first_slot if step == first_step else 0:]

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.lengths)))
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(len(self.lengths), generator=generator).tolist()

    def _step_indices(self, permutation: list[int], step: int) -> list[int]:
        size = self.effective_batch_size
        indices = permutation[step * size:(step + 1) * size]
        missing = self.dp_size * self.grad_accum - len(indices)
        if missing > 0:  # only a kept partial last step: wrap around the epoch's order, as DistributedSampler pads
            indices = indices + (permutation * math.ceil(missing / len(permutation)))[:missing]
        return indices
