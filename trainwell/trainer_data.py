"""The ``Trainer``'s data loaders: datasets and collators turned into loaders for training and evaluation.

Owns ``get_train_dataloader`` / ``get_eval_dataloader`` / ``get_test_dataloader`` (the reference's override
points), unused-column removal, the training sampler, the cache of evaluation loaders kept with
``dataloader_persistent_workers``, and the check that ``compute_metrics`` suits ``batch_eval_metrics``.
Builders live in ``trainwell.data``; this mixin only reads the Trainer's attributes (``args``, ``runtime``,
``model``, ``data_collator``, ``processing_class``, datasets).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

import torch

from trainwell.checkpoint.training_state import is_stateful
from trainwell.data import loaders
from trainwell.data.position import DataPosition
from trainwell.utils import model as model_utils

logger = logging.getLogger(__name__)


def check_compute_metrics(compute_metrics: Callable | None, batch_eval_metrics: bool) -> None:
    """With ``batch_eval_metrics``, ``compute_metrics`` is called per batch and must accept ``compute_result``."""
    if not batch_eval_metrics or compute_metrics is None:
        return
    try:
        params = inspect.signature(compute_metrics).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "compute_result" not in params and not takes_kwargs:
        name = getattr(compute_metrics, "__qualname__", type(compute_metrics).__name__)
        raise ValueError(
            f"batch_eval_metrics=True calls compute_metrics once per batch as compute_metrics(eval_pred, "
            f"compute_result=...), but {name} takes no compute_result argument. Add a compute_result parameter "
            "(accumulate per batch; return the metrics when it is True), or set batch_eval_metrics=False."
        )


class DataMixin:
    # compute_metrics is checked when it is set (in Trainer.__init__ and on any later assignment), so a
    # batch_eval_metrics mismatch fails before training rather than at the first evaluation.
    @property
    def compute_metrics(self) -> Callable | None:
        return self.__dict__.get("_compute_metrics")

    @compute_metrics.setter
    def compute_metrics(self, value: Callable | None) -> None:
        check_compute_metrics(value, bool(getattr(self.args, "batch_eval_metrics", False)))
        self.__dict__["_compute_metrics"] = value

    def _collator_for(self, dataset: Any, description: str) -> tuple[Any, Any]:
        """(dataset, collator) with unused columns removed as ``remove_unused_columns`` asks."""
        collator = self.data_collator
        if not self.args.remove_unused_columns:
            return dataset, collator
        columns = self._get_signature_columns()
        if loaders.is_hf_dataset(dataset):
            return loaders.remove_hf_columns(dataset, columns), collator
        return dataset, loaders.RemoveColumnsCollator(collator, columns)

    def _get_signature_columns(self) -> list[str]:
        if self._signature_columns is None:
            params = model_utils.forward_parameters(self.model)
            self._signature_columns = loaders.signature_columns(params, self.label_names)
        return self._signature_columns

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        strategy = getattr(self.args.train_sampling_strategy, "value", self.args.train_sampling_strategy)
        if loaders.is_iterable(dataset):
            if strategy not in ("random", "sequential"):
                logger.warning("train_sampling_strategy=%r is ignored: an iterable dataset has no sampler.", strategy)
            return None
        processing = self.processing_class
        names = getattr(processing, "model_input_names", None) if processing is not None else None
        input_name = names[0] if names else model_utils.main_input_name(self.model)
        group = self._train_batch_size * self.args.gradient_accumulation_steps
        return loaders.train_sampler(dataset, self.args, batch_size=group, input_name=input_name)

    def get_train_dataloader(self) -> Any:
        """The training loader: seeded resumable sampler, collator, worker seeding; prepared by the runtime."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset: pass it to the Trainer.")
        dataset, collator = self._collator_for(self.train_dataset, "training")
        sampler = self._get_train_sampler(dataset)
        self._train_sampler = sampler
        self._data_position = DataPosition(dataset) if is_stateful(dataset, self.args) else None
        if self._data_position is not None:
            collator = self._data_position.wrap_collate(collator)
        dataloader = loaders.build_dataloader(
            dataset, batch_size=self._train_batch_size, collate_fn=collator, args=self.args, sampler=sampler,
            train=True, rank=self.runtime.process_index,
        )
        # The loader's own generator: creating an epoch's iterator must not draw from the global RNG (it would
        # shift dropout after a resume), and worker seeds become a function of (seed, epoch).
        self._train_generator = torch.Generator()
        self._train_generator.manual_seed(self._data_seed())
        dataloader.generator = self._train_generator
        prepared = self.runtime.prepare_dataloader(dataloader)
        if self._data_position is not None and type(prepared).__name__ == "DataLoaderDispatcher":
            # the main process reads one batch per process for each batch it hands out, unless it splits one
            self._data_position.reads_per_batch = 1 if prepared.split_batches else self.runtime.num_processes
        return prepared

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """The evaluation loader (dataset order); ``eval_dataset`` may be a dataset or a key of a dict of them."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer.evaluate() needs an eval_dataset: pass it to the Trainer or to evaluate().")
        if isinstance(eval_dataset, str):
            if not isinstance(self.eval_dataset, dict) or eval_dataset not in self.eval_dataset:
                names = sorted(self.eval_dataset) if isinstance(self.eval_dataset, dict) else []
                raise KeyError(f"eval_dataset={eval_dataset!r} is not one of the Trainer's eval datasets {names}.")
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        return self._eval_loader(dataset, "evaluation")

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        return self._eval_loader(test_dataset, "test")

    def _eval_loader(self, dataset: Any, description: str) -> Any:
        """Dataset order; sharded without duplicates across processes (see ``trainwell.data.sharding``).

        With ``dataloader_persistent_workers`` the loader of each dataset is built once and kept, so its
        worker processes survive between evaluations (the point of the option).
        """
        persistent = self.args.dataloader_persistent_workers and self.args.dataloader_num_workers > 0
        cache: dict[int, tuple[Any, Any]] = self.__dict__.setdefault("_eval_dataloaders", {})
        if persistent and id(dataset) in cache and cache[id(dataset)][0] is dataset:
            return cache[id(dataset)][1]
        original = dataset
        dataset, collator = self._collator_for(dataset, description)
        runtime = self.runtime
        dataloader = loaders.build_eval_dataloader(
            dataset, batch_size=self.args.eval_batch_size, collate_fn=collator, args=self.args,
            rank=runtime.process_index, world=runtime.num_processes,
        )
        if not runtime.distributed:  # sharded loaders are never handed to Accelerate (it would add duplicates)
            dataloader = runtime.prepare_dataloader(dataloader)
        if persistent:
            cache[id(original)] = (original, dataloader)
        return dataloader

    def num_examples(self, dataloader: Any) -> int:
        """Samples in the loader's dataset (or batches × batch size when the dataset has no length)."""
        dataset = getattr(dataloader, "dataset", None)
        if loaders.has_length(dataset):
            return len(dataset)
        return len(dataloader) * (getattr(dataloader, "batch_size", None) or self.args.per_device_train_batch_size)
