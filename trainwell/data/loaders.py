"""Building data loaders: sampler, collator, unused-column removal and worker seeding.

Owns turning a dataset plus ``TrainingArguments`` into a ``torch.utils.data.DataLoader``: the
``dataloader_*`` options, the training order (``train_sampling_strategy``), the evaluation loader (dataset
order; sharded without duplicates across processes by ``trainwell.data.sharding``) and the ``datasets``
interop (checked by module name, so ``datasets`` stays optional). Sharding *training* data across
processes and device placement are the runtime's job (``trainwell.backend``); the order of samples is the
samplers'; padding and stacking are the collators'.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, SequentialSampler

from trainwell.data.length_grouped import ResumableLengthGroupedSampler, sample_lengths
from trainwell.data.rebalance import BatchRebalanceSampler, yields_rank_batches
from trainwell.data.samplers import ResumableSampler
from trainwell.data.sharding import (
    EvalShardBatchSampler,
    IterableEvalShard,
    ShardCollator,
)
from trainwell.utils.seed import seed_worker

logger = logging.getLogger(__name__)


def length_or_none(obj: Any) -> int | None:
    """``len(obj)``, or None for an object without a length (an iterable dataset, a loader over one)."""
    try:
        return len(obj)
    except (TypeError, NotImplementedError, AttributeError):
        return None


def has_length(dataset: Any) -> bool:
    return length_or_none(dataset) is not None


def is_iterable(dataset: Any) -> bool:
    return isinstance(dataset, IterableDataset) or not has_length(dataset)


def is_hf_dataset(dataset: Any) -> bool:
    """A ``datasets.Dataset`` or ``datasets.IterableDataset`` with known columns (checked by module name:
    ``datasets`` stays an optional package). An iterable one without declared features has no column names.
    """
    return type(dataset).__module__.startswith("datasets.") and getattr(dataset, "column_names", None) is not None


def _empty_batch_error(columns: Sequence[str], keys: Sequence[str]) -> ValueError:
    return ValueError(
        "remove_unused_columns=True would drop every key of your samples: the model's forward takes "
        f"{list(columns)} but the samples have {list(keys)}. Rename the dataset's columns to match the "
        "forward arguments, or pass remove_unused_columns=False to keep them all."
    )


class RemoveColumnsCollator:
    """Wraps a collator and drops sample keys the model's ``forward`` does not take, before collating.

    Unlike the reference it never hands an empty batch on: if nothing would be left it raises, naming the
    forward arguments and the sample keys.
    """

    def __init__(self, collator: Callable, columns: Sequence[str]) -> None:
        self.collator = collator
        self.columns = frozenset(columns)
        self._column_order = list(columns)
        self._logged = False

    def __call__(self, features: list[Any]) -> Any:
        if features and isinstance(features[0], Mapping):
            keys = list(features[0])
            kept = [k for k in keys if k in self.columns]
            if not kept:
                raise _empty_batch_error(self._column_order, keys)
            if len(kept) != len(keys) and not self._logged:
                dropped = [k for k in keys if k not in self.columns]
                logger.info("The following sample keys are not forward arguments and were dropped: %s", dropped)
                self._logged = True
            if len(kept) != len(keys):
                features = [{k: f[k] for k in kept} for f in features]
        return self.collator(features)


def remove_hf_columns(dataset: Any, columns: Sequence[str], description: str | None = None) -> Any:
    """Drop the columns of a ``datasets.Dataset`` that the model cannot take (raising if none would be left);
    ``description`` names the set in the message ("Training", "Evaluation"...)."""
    present = list(dataset.column_names)
    ignored = [c for c in present if c not in set(columns)]
    if len(ignored) == len(present):
        raise _empty_batch_error(columns, present)
    if ignored:
        logger.info("Columns not taken by the model's forward were removed from the %s: %s",
                    f"{description} set" if description else "dataset", ignored)
        dataset = dataset.remove_columns(ignored)
    return dataset


def build_dataloader(
    dataset: Any,
    *,
    batch_size: int,
    collate_fn: Callable,
    args: Any,
    sampler: Any = None,
    train: bool,
    rank: int = 0,
) -> DataLoader:
    """A ``DataLoader`` with the ``dataloader_*`` options of ``args`` applied.

    A sampler that yields whole micro-batches (``batch_rebalance``) becomes the loader's ``batch_sampler``: it
    decides the batch sizes itself, so ``batch_size`` and ``dataloader_drop_last`` do not apply.
    """
    workers = _worker_kwargs(args, rank)
    if yields_rank_batches(sampler) and not isinstance(dataset, IterableDataset):
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, **workers)
    kwargs: dict[str, Any] = {"batch_size": batch_size, "collate_fn": collate_fn, **workers}
    if not isinstance(dataset, IterableDataset):
        kwargs["sampler"] = sampler
        kwargs["drop_last"] = args.dataloader_drop_last
    elif args.dataloader_drop_last:
        kwargs["drop_last"] = True
    return DataLoader(dataset, **kwargs)


def pins_memory(args: Any) -> bool:
    """``dataloader_pin_memory``, where there is an accelerator to copy to: on a machine without one, pinning
    buys nothing and torch warns about it on every loader."""
    return bool(args.dataloader_pin_memory) and torch.accelerator.is_available()


def _worker_kwargs(args: Any, rank: int) -> dict[str, Any]:
    """``DataLoader`` keywords for workers, pinning and prefetching; every worker seeded per rank."""
    kwargs: dict[str, Any] = {
        "num_workers": args.dataloader_num_workers,
        "pin_memory": pins_memory(args),
        "persistent_workers": args.dataloader_persistent_workers and args.dataloader_num_workers > 0,
    }
    if args.dataloader_num_workers > 0:
        if args.dataloader_prefetch_factor is not None:
            kwargs["prefetch_factor"] = args.dataloader_prefetch_factor
        if args.dataloader_multiprocessing_context is not None:
            kwargs["multiprocessing_context"] = args.dataloader_multiprocessing_context
        if not args.dataloader_in_order:
            kwargs["in_order"] = False
        kwargs["worker_init_fn"] = functools.partial(seed_worker, rank=rank)
    return kwargs


def data_seed(args: Any) -> int:
    """The seed of the training data order: ``data_seed``, or ``seed`` when it is None. The sampler and the
    training loader's generator both read it here."""
    return args.data_seed if args.data_seed is not None else args.seed


def train_sampler(dataset: Dataset, args: Any, batch_size: int = 1, input_name: str = "input_ids") -> Sampler:
    """The training order of ``train_sampling_strategy``, seeded by ``data_seed`` (or ``seed``) and the epoch.

    ``group_by_length`` groups ``batch_size`` samples of similar length and ``batch_rebalance`` balances the
    padded cost of micro-batches across processes (lengths from the ``length_column_name`` column, else from
    ``input_name``, computed here once). ``batch_size`` is the samples of one optimizer step on one process
    (``train_batch_size * gradient_accumulation_steps``).
    """
    strategy = args.train_sampling_strategy
    seed = data_seed(args)
    if strategy == "group_by_length":
        lengths = sample_lengths(dataset, args.length_column_name, input_name)
        return ResumableLengthGroupedSampler(lengths, batch_size, seed=seed)
    if strategy == "batch_rebalance":
        lengths = sample_lengths(dataset, args.length_column_name, input_name, strategy)
        return rebalance_sampler(lengths, args, batch_size, seed)
    if strategy not in ("random", "sequential"):
        raise NotImplementedError(
            f"train_sampling_strategy={strategy!r} is not supported by trainwell: use 'random', 'sequential', "
            "'group_by_length' or 'batch_rebalance'."
        )
    return ResumableSampler(len(dataset), shuffle=strategy != "sequential", seed=seed)


def rebalance_sampler(lengths: Sequence[int], args: Any, batch_size: int, seed: int) -> BatchRebalanceSampler:
    """The ``batch_rebalance`` sampler of this process: ``batch_size`` samples per step on each of the processes.

    Built as the reference's Trainer builds it (one step is ``batch_size x world_size`` samples, the micro-batches
    are dealt over ``world_size`` ranks and ``gradient_accumulation_steps`` slots), except for the seed: the
    reference always uses 42 (its sampler's default), trainwell ``data_seed``/``seed`` like every other strategy.
    The two agree under the default ``seed=42``.
    """
    world = max(1, args.world_size)
    return BatchRebalanceSampler(
        lengths, effective_batch_size=batch_size * world, dp_size=world, grad_accum=args.gradient_accumulation_steps,
        seed=seed, rank=args.process_index if world > 1 else 0, drop_last=args.dataloader_drop_last,
    )


def eval_sampler(dataset: Dataset) -> SequentialSampler:
    """Evaluation is always in dataset order (whatever the training strategy)."""
    return SequentialSampler(dataset)


def build_eval_dataloader(
    dataset: Any, *, batch_size: int, collate_fn: Callable, args: Any, rank: int = 0, world: int = 1
) -> DataLoader:
    """The evaluation loader: dataset order; with several processes, sharded without duplicated samples.

    A distributed iterable dataset is read in the main process of every rank (each rank must see the same
    stream to know the other ranks' batch sizes), so ``dataloader_num_workers`` does not apply to it.
    """
    if world <= 1:
        sampler = None if is_iterable(dataset) else eval_sampler(dataset)
        return build_dataloader(dataset, batch_size=batch_size, collate_fn=collate_fn, args=args, sampler=sampler,
                                train=False, rank=rank)
    if is_iterable(dataset):
        shard = IterableEvalShard(dataset, batch_size, rank, world, drop_last=args.dataloader_drop_last)
        return DataLoader(shard, batch_size=None, collate_fn=ShardCollator(collate_fn),
                          pin_memory=pins_memory(args))
    batches = EvalShardBatchSampler(len(dataset), batch_size, rank, world, drop_last=args.dataloader_drop_last)
    kwargs = _worker_kwargs(args, rank)
    return DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn, **kwargs)


def without_unused_columns(dataset: Any, collator: Callable, columns: Sequence[str] | None,
                           description: str | None = None) -> tuple[Any, Callable]:
    """(dataset, collator) with sample keys outside ``columns`` dropped (``columns=None``: keep everything);
    ``description`` names the set in the message of :func:`remove_hf_columns`.

    A ``datasets.Dataset`` loses the columns themselves; any other dataset keeps them and the collator drops
    the keys per batch.
    """
    if columns is None:
        return dataset, collator
    if is_hf_dataset(dataset):
        return remove_hf_columns(dataset, columns, description), collator
    return dataset, RemoveColumnsCollator(collator, columns)


def sampler_for_training(dataset: Any, args: Any, group_size: int, processing_class: Any, model_input: str) -> Any:
    """The training sampler of ``train_sampling_strategy`` (None for iterable data, which has no sampler).

    ``group_by_length`` measures lengths on the processing class's first input name, else the model's main input.
    """
    strategy = args.train_sampling_strategy
    if is_iterable(dataset):
        if strategy not in ("random", "sequential"):
            logger.warning("train_sampling_strategy=%r is ignored: an iterable dataset has no sampler.", strategy)
        return None
    names = getattr(processing_class, "model_input_names", None) if processing_class is not None else None
    return train_sampler(dataset, args, batch_size=group_size, input_name=names[0] if names else model_input)


def pick_eval_dataset(eval_dataset: Any, default: Any) -> Any:
    """The dataset ``get_eval_dataloader(eval_dataset)`` evaluates: the argument, a key of the Trainer's dict of
    eval datasets, or the Trainer's own."""
    if eval_dataset is None and default is None:
        raise ValueError("Trainer.evaluate() needs an eval_dataset: pass it to the Trainer or to evaluate().")
    if isinstance(eval_dataset, str):
        if not isinstance(default, dict) or eval_dataset not in default:
            names = sorted(default) if isinstance(default, dict) else []
            raise KeyError(f"eval_dataset={eval_dataset!r} is not one of the Trainer's eval datasets {names}.")
        return default[eval_dataset]
    return eval_dataset if eval_dataset is not None else default


class EvalLoaders:
    """Builds evaluation loaders; with ``dataloader_persistent_workers`` keeps one per dataset, so its worker
    processes survive between evaluations (the point of the option)."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Any, Any]] = {}

    def get(self, dataset: Any, collator: Callable, columns: Sequence[str] | None, args: Any, runtime: Any,
            batch_size: int | None = None, sampler_fn: Callable[[Any], Any] | None = None,
            description: str | None = None) -> Any:
        """The loader of ``dataset`` in dataset order, sharded without duplicates across processes; or, when
        ``sampler_fn`` returns a sampler for it (a subclass's ``_get_eval_sampler``), the reference's loader with that
        sampler (prepared by Accelerate, which pads the last batches of the other processes with repeated samples).

        ``columns``: the sample keys to keep (see :func:`without_unused_columns`, which ``description`` is passed
        to); ``batch_size``: by default ``eval_batch_size``.
        """
        persistent = args.dataloader_persistent_workers and args.dataloader_num_workers > 0
        kept = self._kept.get(id(dataset))
        if persistent and kept is not None and kept[0] is dataset:
            return kept[1]
        original = dataset
        dataset, collator = without_unused_columns(dataset, collator, columns, description)
        batch_size = args.eval_batch_size if batch_size is None else batch_size
        sampler = sampler_fn(dataset) if sampler_fn is not None and not is_iterable(dataset) else None
        if sampler is not None:
            loader = runtime.prepare_dataloader(build_dataloader(
                dataset, batch_size=batch_size, collate_fn=collator, args=args, sampler=sampler, train=False,
                rank=runtime.process_index), as_reference=True)
        else:
            loader = build_eval_dataloader(dataset, batch_size=batch_size, collate_fn=collator, args=args,
                                           rank=runtime.data_parallel_rank, world=runtime.data_parallel_size)
            if not runtime.distributed:  # sharded loaders are never handed to Accelerate (it would add duplicates)
                loader = runtime.prepare_dataloader(loader)
        if persistent:
            self._kept[id(original)] = (original, loader)
        return loader


def num_examples(dataloader: Any, default_batch_size: int) -> int:
    """Samples in the loader's dataset (or batches × batch size when the dataset has no length)."""
    dataset = getattr(dataloader, "dataset", None)
    if has_length(dataset):
        return len(dataset)
    return len(dataloader) * (getattr(dataloader, "batch_size", None) or default_batch_size)
