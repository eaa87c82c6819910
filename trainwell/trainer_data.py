"""The ``Trainer``'s data loaders: datasets and collators turned into loaders for training and evaluation.

Owns ``get_train_dataloader`` / ``get_eval_dataloader`` / ``get_test_dataloader`` (the reference's override
points), unused-column removal and the training sampler. Builders live in ``trainwell.data``; this mixin
only reads the Trainer's attributes (``args``, ``runtime``, ``model``, ``data_collator``, datasets).
"""

from __future__ import annotations

from typing import Any

import torch

from trainwell.data import loaders
from trainwell.utils import model as model_utils


class DataMixin:
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
        if loaders.is_iterable(dataset):
            return None
        return loaders.train_sampler(dataset, self.args)

    def get_train_dataloader(self) -> Any:
        """The training loader: seeded resumable sampler, collator, worker seeding; prepared by the runtime."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train() needs a train_dataset: pass it to the Trainer.")
        dataset, collator = self._collator_for(self.train_dataset, "training")
        sampler = self._get_train_sampler(dataset)
        self._train_sampler = sampler
        dataloader = loaders.build_dataloader(
            dataset, batch_size=self._train_batch_size, collate_fn=collator, args=self.args, sampler=sampler,
            train=True, rank=self.runtime.process_index,
        )
        # The loader's own generator: creating an epoch's iterator must not draw from the global RNG (it would
        # shift dropout after a resume), and worker seeds become a function of (seed, epoch).
        self._train_generator = torch.Generator()
        self._train_generator.manual_seed(self._data_seed())
        dataloader.generator = self._train_generator
        return self.runtime.prepare_dataloader(dataloader)

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
        dataset, collator = self._collator_for(dataset, description)
        sampler = None if loaders.is_iterable(dataset) else loaders.eval_sampler(dataset)
        dataloader = loaders.build_dataloader(
            dataset, batch_size=self.args.eval_batch_size, collate_fn=collator, args=self.args, sampler=sampler,
            train=False, rank=self.runtime.process_index,
        )
        return self.runtime.prepare_dataloader(dataloader)

    def num_examples(self, dataloader: Any) -> int:
        """Samples in the loader's dataset (or batches × batch size when the dataset has no length)."""
        dataset = getattr(dataloader, "dataset", None)
        if loaders.has_length(dataset):
            return len(dataset)
        return len(dataloader) * (getattr(dataloader, "batch_size", None) or self.args.per_device_train_batch_size)
