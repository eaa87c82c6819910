"""Length-grouped training order (``train_sampling_strategy="group_by_length"``).

Owns the length-grouped samplers and the one-time computation of sample lengths. Samples of similar length
are put in the same batches, so little padding is wasted, while the order stays random across batches.

* :class:`LengthGroupedSampler` and :class:`DistributedLengthGroupedSampler` are the reference's public
  classes, with its constructors (``batch_size, dataset=None, lengths=None, model_input_name=None, ...``) and
  its orders: the first draws from ``generator`` (the global torch RNG when None) on every pass, the second
  from ``seed + epoch`` and deals the order over ``num_replicas`` processes. Scripts that build one get what
  they got from the reference.
* :class:`ResumableLengthGroupedSampler` is what the Trainer trains with. It is a ``LengthGroupedSampler``
  (``isinstance`` holds) that differs on purpose: its order is a pure function of ``(seed, epoch)`` (the
  reference's training sampler draws from the global torch RNG, so ``model_init`` or anything else that
  consumes it changes the data order), and it has the :class:`~trainwell.data.samplers.ResumableSampler`
  interface (``set_epoch``, ``skip``, ``state_dict``), so an interrupted run resumes at the exact sample.

Lengths are read with ``dataset[i]`` for ``i < len(dataset)``, once, never by iterating the dataset (the
reference's ``for item in dataset`` loops forever on a dataset whose ``__getitem__`` never raises
``IndexError``). The Trainer only ever orders training data this way: evaluation stays in dataset order.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DistributedSampler, Sampler

from trainwell.data.samplers import ResumableSampler

MAX_MEGABATCH_MULTIPLIER = 50
DEFAULT_INPUT_NAME = "input_ids"


def grouped_order(lengths: Sequence[int], batch_size: int, generator: torch.Generator | None) -> list[int]:
    """A random order in which consecutive ``batch_size`` chunks hold samples of similar length.

    The indices are shuffled and cut into megabatches of ``m * batch_size`` (``m = min(n // (4 *
    batch_size), 50)``, at least 1); each megabatch is sorted longest first, and the longest sample overall
    leads the first batch, so an out-of-memory error shows up at the first step rather than hours later.
    ``generator`` None draws the shuffle from the global torch RNG.
    """
    n = len(lengths)
    if n == 0:
        return []
    multiplier = max(1, min(n // (batch_size * 4), MAX_MEGABATCH_MULTIPLIER))
    size = multiplier * batch_size
    order = torch.randperm(n, generator=generator).tolist()
    megabatches = [sorted(order[i:i + size], key=lambda j: lengths[j], reverse=True) for i in range(0, n, size)]
    longest = max(range(len(megabatches)), key=lambda k: lengths[megabatches[k][0]])
    megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for mb in megabatches for i in mb]


class LengthGroupedSampler(Sampler[int]):
    """The reference's length-grouped sampler: a new :func:`grouped_order` drawn from ``generator`` on each pass.

    ``lengths`` (a sequence of ints or a 1-D tensor) are the samples' lengths. When None they are read from
    ``dataset``, whose samples must be dicts holding ``model_input_name`` (``"input_ids"`` when None): the
    length of ``dataset[i][model_input_name]`` for every ``i``. ``generator`` None draws from the global torch
    RNG, as the reference does.
    """

    def __init__(
        self,
        batch_size: int,
        dataset: Any = None,
        lengths: Sequence[int] | torch.Tensor | None = None,
        model_input_name: str | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.batch_size = _checked_batch_size(batch_size, type(self).__name__)
        self.lengths = resolve_lengths(type(self).__name__, dataset, lengths, model_input_name)
        self.generator = generator

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        return iter(grouped_order(self.lengths, self.batch_size, self.generator))


class DistributedLengthGroupedSampler(DistributedSampler):
    """The reference's length-grouped sampler for ``num_replicas`` processes; this one yields rank ``rank``'s share.

    Every process draws the same :func:`grouped_order` from ``seed + epoch`` (``set_epoch`` changes it), pads it
    by repeating it from its start to a multiple of ``num_replicas`` (``drop_last=True`` cuts the tail instead),
    and takes every ``num_replicas``-th index from ``rank``. ``num_replicas`` and ``rank`` default to those of
    the initialized ``torch.distributed`` process group. ``dataset``, ``lengths`` and ``model_input_name`` are
    read as by :class:`LengthGroupedSampler`.
    """

    def __init__(
        self,
        batch_size: int,
        dataset: Any = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        lengths: Sequence[int] | torch.Tensor | None = None,
        model_input_name: str | None = None,
    ) -> None:
        # DistributedSampler.__init__ is not called: it needs a sized dataset, and every attribute it sets
        # (read by its set_epoch and by Accelerate) is set here.
        owner = type(self).__name__
        self.batch_size = _checked_batch_size(batch_size, owner)
        self.num_replicas, self.rank = _topology(owner, num_replicas, rank)
        self.lengths = resolve_lengths(owner, dataset, lengths, model_input_name)
        self.dataset, self.seed, self.drop_last, self.shuffle, self.epoch = dataset, int(seed), bool(drop_last), True, 0
        n = len(self.lengths)
        self.num_samples = n // self.num_replicas if self.drop_last else math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = grouped_order(self.lengths, self.batch_size, generator)
        if order and len(order) < self.total_size:  # every rank gets num_samples: repeat from the start
            order = order * math.ceil(self.total_size / len(order))
        return iter(order[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class ResumableLengthGroupedSampler(ResumableSampler, LengthGroupedSampler):
    """The Trainer's length-grouped order over ``range(len(lengths))``: seeded by ``seed + epoch``, resumable.

    A :class:`LengthGroupedSampler` (so ``isinstance`` checks written for the reference's Trainer hold) whose
    order, ``len`` and iteration are those of :class:`~trainwell.data.samplers.ResumableSampler`.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0) -> None:
        ResumableSampler.__init__(self, len(lengths), shuffle=True, seed=seed)
        self.lengths = [int(x) for x in lengths]
        self.batch_size = _checked_batch_size(batch_size, "the length-grouped sampler")
        self.generator = None  # never drawn from: the order comes from seed + epoch

    def order(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.tensor(grouped_order(self.lengths, self.batch_size, generator), dtype=torch.long)

    def state_dict(self) -> dict[str, int]:
        return {**super().state_dict(), "batch_size": self.batch_size}


def _checked_batch_size(batch_size: Any, owner: str) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: {owner} needs a batch size >= 1 (the samples of one batch).")
    return int(batch_size)


def _topology(owner: str, num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, each read from the initialized process group when None."""
    if num_replicas is None or rank is None:
        import torch.distributed as dist  # deferred: only a sampler left to find its topology needs it

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                f"{owner}(num_replicas={num_replicas!r}, rank={rank!r}): a None value is read from "
                "torch.distributed, which is not initialized. Pass num_replicas= and rank=, or call "
                "torch.distributed.init_process_group() first."
            )
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(
            f"{owner}(num_replicas={num_replicas!r}, rank={rank!r}): pass num_replicas >= 1 and a rank in "
            f"[0, {num_replicas - 1}]."
        )
    return int(num_replicas), int(rank)


def resolve_lengths(
    owner: str, dataset: Any, lengths: Sequence[int] | torch.Tensor | None, model_input_name: str | None
) -> list[int]:
    """``lengths`` as a list of ints, or, when None, the length of each sample's ``model_input_name`` in
    ``dataset`` (``"input_ids"`` when None); ``ValueError`` naming the fix when neither is usable."""
    if lengths is not None:
        return [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    name = model_input_name if model_input_name is not None else DEFAULT_INPUT_NAME
    if dataset is None or not hasattr(dataset, "__len__"):
        given = "no dataset" if dataset is None else f"a dataset without a length ({type(dataset).__name__})"
        raise ValueError(
            f"{owner} needs the samples' lengths and got neither lengths= nor a dataset to read them from "
            f"({given}): pass lengths=[one int per sample], or a map-style dataset whose samples hold {name!r}."
        )

    def missing(i: int, item: Any) -> ValueError:
        return ValueError(
            f"{owner} reads lengths from samples that are dicts holding {name!r}: sample {i} has no {name!r} "
            f"(it has {_shape_of(item)}). Pass lengths=[one int per sample], or model_input_name= the key that "
            "holds each sample's input."
        )

    return _read_lengths(dataset, name, None, missing)


def sample_lengths(dataset: Any, length_column: str, input_name: str, strategy: str = "group_by_length") -> list[int]:
    """The length of every sample: the ``length_column`` column when the dataset has one, else
    ``len(dataset[i][input_name])`` for each ``i`` (one pass, by index). ``strategy`` names the
    ``train_sampling_strategy`` that needs them, in the error for a sample without a length.
    """
    columns = getattr(dataset, "column_names", None)
    if columns is not None and length_column in columns:
        return [int(x) for x in dataset[length_column]]

    def missing(i: int, item: Any) -> ValueError:
        return ValueError(
            f"train_sampling_strategy={strategy!r} needs each sample's length: sample {i} has no "
            f"{input_name!r} (it has {_shape_of(item)}). Add a {length_column!r} column with the lengths, set "
            "length_column_name to the column that holds them, or use train_sampling_strategy='random'."
        )

    return _read_lengths(dataset, input_name, length_column, missing)


def _read_lengths(
    dataset: Any, input_name: str, length_column: str | None, missing: Callable[[int, Any], Exception]
) -> list[int]:
    """One pass over ``dataset[i]``: each sample's ``length_column`` when it has one, else the length of its
    ``input_name``; ``missing(i, sample)`` is raised for a sample that has neither."""
    lengths = []
    for i in range(len(dataset)):
        item = dataset[i]
        if length_column is not None and isinstance(item, Mapping) and length_column in item:
            lengths.append(int(item[length_column]))
            continue
        if not isinstance(item, Mapping) or input_name not in item:
            raise missing(i, item)
        lengths.append(_length(item[input_name]))
    return lengths


def _shape_of(item: Any) -> str:
    return str(list(item)) if isinstance(item, Mapping) else type(item).__name__


def _length(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.shape[-1]) if value.dim() else 1
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[-1]) if len(shape) else 1
    return len(value)
