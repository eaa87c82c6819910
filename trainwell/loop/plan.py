"""The step arithmetic of one ``train()`` call, as one frozen value built by one pure function.

Owns: how many optimizer steps the run takes (``max_steps``), how many epochs that spans, how many
micro-batches and optimizer steps an epoch holds, how those micro-batches split into accumulation windows
(the last one of an epoch may be shorter), and the sample counts behind the speed metrics. Nothing here
reads a dataset, a model or the clock: the caller passes the loader's length and the example count.

The rules (the reference Trainer's): with data of known length, ``updates_per_epoch = max(ceil(batches /
GA), 1)``; ``max_steps > 0`` wins over epochs (then ``epochs = ceil(max_steps / updates_per_epoch)``), else
``max_steps = ceil(num_train_epochs * updates_per_epoch)`` over ``ceil(num_train_epochs)`` epochs. Data
without a length needs ``max_steps`` and is read pass after pass until it is reached; a pass is then
counted as ``max_steps * GA`` micro-batches.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any


def require_max_steps(has_length: bool, max_steps: int) -> None:
    """Data without a length cannot derive the number of steps from epochs: it needs ``max_steps > 0``."""
    if not has_length and max_steps <= 0:
        raise ValueError(
            f"max_steps={max_steps}: the train_dataset has no length (an IterableDataset), so the number of "
            "steps cannot be derived from num_train_epochs. Pass max_steps > 0."
        )


@dataclass(frozen=True)
class StepPlan:
    """How long a run is and how its epochs split into optimizer steps.

    A plan unpacks and indexes as the reference's ``set_initial_training_values`` tuple: ``(num_train_epochs,
    num_update_steps_per_epoch, num_examples, num_train_samples, total_train_batch_size, steps_in_epoch,
    max_steps)``, so code written against the reference can unpack it or read ``plan[5]`` (``steps_in_epoch``,
    what the reference's test helpers read) and ``len(plan) == 7``.
    """

    num_train_epochs: int  #: epochs the loop walks (``sys.maxsize`` for data without a length)
    updates_per_epoch: int  #: optimizer steps in a full epoch
    num_examples: int
    num_train_samples: float  #: samples the whole run trains on (for ``train_samples_per_second``)
    total_train_batch_size: int  #: samples per optimizer step, over all processes
    steps_in_epoch: int  #: micro-batches in an epoch
    max_steps: int
    accumulation: int = 1  #: micro-batches per optimizer step (``gradient_accumulation_steps``)

    def as_tuple(self) -> tuple[int, int, int, float, int, int, int]:
        """The reference's 7-tuple (``accumulation`` is not in it)."""
        return (self.num_train_epochs, self.updates_per_epoch, self.num_examples, self.num_train_samples,
                self.total_train_batch_size, self.steps_in_epoch, self.max_steps)

    def __iter__(self) -> Any:
        return iter(self.as_tuple())

    def __getitem__(self, index: int | slice) -> Any:
        return self.as_tuple()[index]

    def __len__(self) -> int:
        return 7

    @classmethod
    def of(cls, values: StepPlan | tuple, accumulation: int) -> StepPlan:
        """A plan from ``set_initial_training_values``' result: a plan, or the reference's 7-tuple."""
        if isinstance(values, StepPlan):
            return values
        return cls(*values, accumulation=accumulation)

    @property
    def sized(self) -> bool:
        """Whether the data has a length (else it is read pass after pass until ``max_steps``)."""
        return self.num_train_epochs != sys.maxsize

    def window_size(self, window: int) -> int:
        """Micro-batches in window ``window`` of an epoch (0 past the epoch's end)."""
        return max(min(self.accumulation, self.steps_in_epoch - window * self.accumulation), 0)

    def batches_before(self, window: int) -> int:
        """Micro-batches of an epoch consumed by its first ``window`` windows."""
        return min(window * self.accumulation, self.steps_in_epoch)

    def epochs_for(self, max_steps: int) -> int:
        """Epochs that ``max_steps`` optimizer steps touch (the ``num_train_epochs`` of ``TrainerState``)."""
        return -(-max_steps // self.updates_per_epoch)

    def position_at(self, global_step: int, epoch: float | None, saved_max_steps: int | None) -> tuple[int, int]:
        """(epoch, windows of it already trained) of a checkpoint at ``global_step``: where a resume continues.

        With a length, ``global_step`` windows of *this* run's global batch: a resume with another world size
        continues the data exactly when the global batch is kept (2 processes x 4 -> 1 x 8). Without one, a
        pass counts as ``max_steps`` windows, so ``global_step`` alone cannot say in which pass the checkpoint
        was written; the checkpoint's ``epoch`` can: the loop sets it to ``pass + batches_consumed_in_pass /
        (max_steps * accumulation)``, with the ``max_steps`` of the run that wrote it (``saved_max_steps``; this
        run may train for longer). A pass that ended with a short window rounds up, so the replay runs to its end.
        """
        if self.sized:
            return divmod(global_step, self.updates_per_epoch)
        max_steps = saved_max_steps or self.max_steps
        if max_steps <= 0:
            return 0, 0
        passes = int(math.floor(epoch or 0))
        consumed = int(round(((epoch or 0) - passes) * max_steps * self.accumulation))
        return passes, -(-consumed // self.accumulation)

    def position_of_samples(self, epoch: int, samples: int) -> tuple[int, int] | None:
        """(epoch, windows of it already trained) of a checkpoint that had used ``samples`` sample places of
        ``epoch`` over all its processes, in *this* run's windows; None when they do not end on one of its windows.

        Exact whatever global batch the checkpoint's run took (8 processes -> 4 with the same per-device batch):
        the sampler's order is one global order, so the first ``samples`` places of it are what was trained on.
        """
        if not self.sized or self.total_train_batch_size <= 0:
            return None
        micro = self.total_train_batch_size // self.accumulation  # sample places per micro-batch, all processes
        if samples >= self.num_examples or samples >= self.steps_in_epoch * micro:
            return epoch + 1, 0  # the epoch was used up
        if samples % self.total_train_batch_size:
            return None
        return epoch, samples // self.total_train_batch_size


def build_plan(
    args: Any, batches_per_epoch: int | None, num_examples: int | None, total_train_batch_size: int
) -> StepPlan:
    """The plan of a run over ``batches_per_epoch`` micro-batches per epoch (None: data without a length).

    ``num_examples`` is the number of samples in the dataset (None without a length).
    """
    ga = args.gradient_accumulation_steps
    require_max_steps(batches_per_epoch is not None, args.max_steps)
    if batches_per_epoch is None:
        samples = args.max_steps * total_train_batch_size
        return StepPlan(sys.maxsize, args.max_steps, samples, samples, total_train_batch_size,
                        args.max_steps * ga, args.max_steps, ga)
    updates = max(math.ceil(batches_per_epoch / ga), 1)
    if args.max_steps > 0:
        max_steps = args.max_steps
        epochs = -(-max_steps // updates)
        samples: float = max_steps * total_train_batch_size
    else:
        max_steps = math.ceil(args.num_train_epochs * updates)
        epochs = math.ceil(args.num_train_epochs)
        samples = (num_examples or 0) * args.num_train_epochs
    return StepPlan(epochs, updates, num_examples or 0, samples, total_train_batch_size, batches_per_epoch,
                    max_steps, ga)
