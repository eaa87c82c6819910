"""Collecting evaluation outputs: detach, move to the host, gather across processes, pad and accumulate.

Owns three things:

* the ``-100`` padding rule for outputs whose later dimensions differ between batches;
* :class:`OutputAccumulator`, which writes each batch's rows straight into one preallocated host array per
  output (grown by doubling when the number of rows is unknown, widened when a longer sequence arrives).
  The reference re-concatenates the growing result at every batch (quadratic time, ~2.5x the kept
  predictions at peak); here each row is copied once and no list of batches is ever held, so the peak is
  the kept predictions plus about one batch;
* the gatherers that combine one evaluation step across processes. :class:`ExactGatherer` works with
  trainwell's own evaluation sharding (``trainwell.data.sharding``): every process reports how many of its
  rows are real, so rows of the filler batches that even out the last step are dropped exactly, losses
  included. :class:`AccelerateGatherer` is the fallback for loaders prepared by Accelerate (e.g. returned
  by an overridden ``get_eval_dataloader``), where Accelerate's ``gather_for_metrics`` decides.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

PAD_INDEX = -100
# Buffers at least this large are mapped with transparent huge pages where the OS offers them (Linux).
HUGE_PAGE_MIN_BYTES = 4 << 20


def empty_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty``, backed by an anonymous mapping advised to use huge pages when it is large.

    Writing the predictions is the first touch of every page of the result. With 4 KiB pages that is one page
    fault per 4 KiB, which on a virtual machine costs more than the copy itself: about 24 ms per 8 MB batch
    measured here, against 5 ms with 2 MiB pages. Untouched pages still cost no resident memory.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE_MIN_BYTES or advice is None:
        return np.empty(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes)
    try:
        mapping.madvise(advice)
    except OSError:  # huge pages disabled: the mapping still works with normal pages
        pass
    return np.frombuffer(mapping, dtype=dtype).reshape(shape)  # the array keeps the mapping alive


def nested_detach(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.detach()
    if isinstance(data, (list, tuple)):
        return type(data)(nested_detach(d) for d in data)
    if isinstance(data, Mapping):
        return {k: nested_detach(v) for k, v in data.items()}
    return data


def to_numpy(data: Any) -> Any:
    """Tensors to numpy (bf16/fp16 become float32, which numpy can hold exactly), recursively.

    A CPU tensor shares its memory with the returned array (no copy).
    """
    if isinstance(data, torch.Tensor):
        data = data.detach()
        if data.dtype in (torch.bfloat16, torch.float16):
            data = data.float()
        return data.cpu().numpy()
    if isinstance(data, (list, tuple)):
        return _rebuild(type(data), [to_numpy(d) for d in data])
    if isinstance(data, Mapping):
        return {k: to_numpy(v) for k, v in data.items()}
    return data


nested_numpify = to_numpy  # the reference's name


def nested_concat(tensors: Any, new_tensors: Any, padding_index: int = PAD_INDEX) -> Any:
    """Concatenate two nested structures of tensors or arrays along dim 0, padding later dims with
    ``padding_index`` (the reference's helper; trainwell's own evaluation accumulates without it)."""
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(nested_concat(t, n, padding_index) for t, n in zip(tensors, new_tensors))
    if isinstance(tensors, Mapping):
        return type(tensors)({k: nested_concat(v, new_tensors[k], padding_index) for k, v in tensors.items()})
    if isinstance(tensors, torch.Tensor):
        joined = pad_and_concatenate([to_numpy(tensors), to_numpy(new_tensors)], padding_index)
        return torch.from_numpy(joined).to(device=tensors.device, dtype=tensors.dtype)
    return pad_and_concatenate([tensors, new_tensors], padding_index)


def nested_truncate(tensors: Any, limit: int) -> Any:
    """The first ``limit`` rows of every tensor or array in a nested structure."""
    if isinstance(tensors, (list, tuple)):
        return type(tensors)(nested_truncate(t, limit) for t in tensors)
    if isinstance(tensors, Mapping):
        return type(tensors)({k: nested_truncate(v, limit) for k, v in tensors.items()})
    return tensors[:limit]


def _rebuild(kind: type, items: list[Any]) -> Any:
    """A list/tuple/namedtuple of type ``kind`` holding ``items``."""
    if issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return kind(*items)
    return kind(items)


def flatten(data: Any) -> tuple[list[Any], Any]:
    """(leaves, spec): the non-container values of a nested list/tuple/dict, and how to rebuild it.

    The spec holds container types and dict keys only, never the values.
    """
    if isinstance(data, (list, tuple, Mapping)):
        values = list(data.values()) if isinstance(data, Mapping) else list(data)
        parts = [flatten(v) for v in values]
        meta = list(data.keys()) if isinstance(data, Mapping) else type(data)
        return [leaf for p in parts for leaf in p[0]], (meta, [p[1] for p in parts])
    return [data], None


def unflatten(leaves: list[Any], spec: Any) -> Any:
    """The inverse of :func:`flatten`."""
    return _build(iter(leaves), spec)


def _build(leaves: Iterator[Any], spec: Any) -> Any:
    # A module-level function, not a recursive closure: a closure that refers to itself is a reference cycle,
    # and it would keep the (large) leaves alive until the garbage collector runs.
    if spec is None:
        return next(leaves)
    meta, children = spec
    items = [_build(leaves, c) for c in children]
    if isinstance(meta, list):  # dict keys
        return dict(zip(meta, items))
    return _rebuild(meta, items)


def pad_and_concatenate(arrays: list[np.ndarray], pad_index: int = PAD_INDEX) -> np.ndarray:
    """Concatenate along dim 0; arrays whose later dims differ are padded with ``pad_index`` to the largest.

    0-d arrays (a scalar per batch) become 1-d first.
    """
    arrays = [np.asarray(a) for a in arrays]
    if len(arrays) == 1:
        return arrays[0].reshape(1) if arrays[0].ndim == 0 else arrays[0]
    buffer = _ArrayBuffer(pad_index, capacity=sum(max(1, a.shape[0] if a.ndim else 1) for a in arrays))
    for a in arrays:
        buffer.add(a)
    return buffer.result()


class _ArrayBuffer:
    """The rows of one output leaf, written into a preallocated array.

    Rows past ``filled`` are ``np.empty`` pages that were never touched, so an over-sized buffer costs address
    space, not resident memory. Growing (more rows than expected, a wider batch, a wider dtype) copies the
    filled rows once; with the number of rows known up front and fixed trailing shapes it never happens.
    """

    def __init__(self, pad_index: int, capacity: int | None) -> None:
        self.pad_index = pad_index
        self.capacity = capacity
        self.data: np.ndarray | None = None
        self.filled = 0

    def add(self, array: np.ndarray) -> None:
        array = np.asarray(array)
        if array.ndim == 0:
            array = array.reshape(1)
        if self.data is None:
            rows = max(self.capacity or 0, array.shape[0]) if self.capacity else max(8 * array.shape[0], 1)
            self.data = empty_array((rows, *array.shape[1:]), array.dtype)
        data = self.data
        if array.ndim != data.ndim:
            raise ValueError(
                f"Cannot concatenate evaluation outputs with different numbers of dimensions: an earlier batch "
                f"had shape {data.shape[1:]} per sample, this one {array.shape[1:]}. Return outputs of a fixed "
                "rank, or set eval_do_concat_batches=False to receive a list of batches."
            )
        end = self.filled + array.shape[0]
        trailing = tuple(max(a, b) for a, b in zip(data.shape[1:], array.shape[1:]))
        dtype = np.result_type(data.dtype, array.dtype)
        if end > data.shape[0] or trailing != data.shape[1:] or dtype != data.dtype:
            self._grow(max(end, 2 * data.shape[0]) if end > data.shape[0] else data.shape[0], trailing, dtype)
        region = self.data[self.filled:end]
        if array.shape[1:] != trailing:
            region.fill(self.pad_index)
            region = region[(slice(None), *(slice(0, s) for s in array.shape[1:]))]
        region[...] = array
        self.filled = end

    def _grow(self, rows: int, trailing: tuple[int, ...], dtype: np.dtype) -> None:
        old = self.data[: self.filled]
        new = empty_array((rows, *trailing), dtype)
        if self.filled:
            target = new[: self.filled]
            if old.shape[1:] != trailing:
                target.fill(self.pad_index)
                target = target[(slice(None), *(slice(0, s) for s in old.shape[1:]))]
            target[...] = old
        self.data = new

    def result(self) -> np.ndarray:
        return self.data[: self.filled]


class OutputAccumulator:
    """Accumulates one nested output (array, or tuple/list/dict of arrays) per batch on the host.

    With ``concat=True`` (``eval_do_concat_batches``) ``result()`` is the same structure with every leaf the
    concatenation of all batches along dim 0, padded with ``pad_index`` where later dims differ;
    ``expected_rows`` (e.g. the dataset length) lets each leaf be allocated once at its final size. With
    ``concat=False`` it is the list of per-batch structures. Every batch must share the structure.
    """

    def __init__(self, pad_index: int = PAD_INDEX, expected_rows: int | None = None, concat: bool = True) -> None:
        self.pad_index = pad_index
        self.expected_rows = expected_rows
        self.concat = concat
        self._batches: list[Any] = []
        self._buffers: list[_ArrayBuffer | list[Any]] | None = None
        self._spec: Any = None
        self._count = 0

    def add(self, batch: Any) -> None:
        if batch is None:
            return
        self._count += 1
        if not self.concat:
            self._batches.append(batch)
            return
        leaves, spec = flatten(batch)
        if self._buffers is None:
            self._spec = spec
            self._buffers = [self._new_buffer(leaf) for leaf in leaves]
        if len(leaves) != len(self._buffers):
            raise ValueError(
                f"Evaluation outputs changed structure between batches ({len(self._buffers)} then {len(leaves)} "
                "values): return the same outputs for every batch, or set eval_do_concat_batches=False."
            )
        for buffer, leaf in zip(self._buffers, leaves):
            if isinstance(buffer, list):
                buffer.append(leaf)
            else:
                buffer.add(leaf)

    def _new_buffer(self, leaf: Any) -> _ArrayBuffer | list[Any]:
        if isinstance(leaf, (np.ndarray, np.generic, int, float, bool)):
            return _ArrayBuffer(self.pad_index, self.expected_rows)
        return []  # objects (strings, ...) are kept as a list of per-batch values

    def __len__(self) -> int:
        return self._count

    def result(self) -> Any:
        if not self.concat:
            return self._batches or None
        if self._buffers is None:
            return None
        leaves = [b if isinstance(b, list) else b.result() for b in self._buffers]
        return unflatten(leaves, self._spec)


# ----------------------------------------------------------------------------------------- across processes
# A gatherer takes one step's outputs as a list (entries may be None) and the real row counts of every
# process (None when unknown), and returns the list with every entry combined over processes.
class LocalGatherer:
    """One process: nothing to gather."""

    def __call__(self, parts: list[Any], counts: Sequence[int] | None) -> list[Any]:
        return parts


class AccelerateGatherer:
    """Loaders prepared by Accelerate: pad dim 1 across processes, then ``gather_for_metrics``, which drops
    the *rows* Accelerate duplicated (a batch loss that averaged them in cannot be corrected here)."""

    def __init__(self, runtime: Any, use_gather_object: bool) -> None:
        self.runtime = runtime
        self.use_gather_object = use_gather_object

    def __call__(self, parts: list[Any], counts: Sequence[int] | None) -> list[Any]:
        accelerator = self.runtime.accelerator
        if self.use_gather_object:
            return [None if p is None else accelerator.gather_for_metrics(p, use_gather_object=True) for p in parts]
        return [None if p is None else accelerator.gather_for_metrics(self.runtime.pad_across_processes(p))
                for p in parts]


class ExactGatherer:
    """Combines one step's outputs of every data-parallel rank, keeping the first ``counts[r]`` rows of rank ``r``.

    Under tensor parallelism the processes of one group evaluated the same batch: only the group's first process
    (``runtime.data_parallel_leaders``) contributes.

    Tensors go through two collectives per step: one for all leaves' shapes, one per leaf for its data padded
    to the largest shape (dim 0 with anything, later dims with ``pad_index``). With ``use_gather_object`` the
    whole structure is pickled and exchanged instead (for outputs that are not tensors).
    """

    def __init__(self, runtime: Any, use_gather_object: bool, pad_index: int = PAD_INDEX) -> None:
        self.runtime = runtime
        self.use_gather_object = use_gather_object
        self.pad_index = pad_index

    def __call__(self, data: list[Any], counts: Sequence[int] | None) -> list[Any]:
        if counts is None:
            raise ValueError("ExactGatherer needs the number of real rows of every process for each step.")
        if self.use_gather_object:
            return self._gather_objects(data, counts)
        leaves, spec = flatten(data)
        tensors = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        if tensors:
            shapes = self._max_shapes([leaves[i] for i in tensors])
            for i, shape in zip(tensors, shapes):
                leaves[i] = self._gather_tensor(leaves[i], shape, counts)
        return unflatten(leaves, spec)

    def _max_shapes(self, tensors: list[torch.Tensor]) -> list[list[int]]:
        """The elementwise largest shape of each tensor over processes (one collective for all of them)."""
        flat = [d for t in tensors for d in (t.shape if t.dim() else (1,))]
        local = torch.tensor(flat, dtype=torch.int64, device=self.runtime.device)
        biggest = self.runtime.gather(local).reshape(self.runtime.num_processes, -1).amax(0).tolist()
        shapes, pos = [], 0
        for t in tensors:
            n = max(t.dim(), 1)
            shapes.append(biggest[pos:pos + n])
            pos += n
        return shapes

    def _gather_tensor(self, tensor: torch.Tensor, shape: list[int], counts: Sequence[int]) -> torch.Tensor:
        tensor = tensor.reshape(1) if tensor.dim() == 0 else tensor
        if list(tensor.shape) != shape:
            padded = tensor.new_full(shape, self.pad_index)
            padded[tuple(slice(0, s) for s in tensor.shape)] = tensor
            tensor = padded
        gathered = self.runtime.gather(tensor.contiguous()).reshape(self.runtime.num_processes, *shape)
        leaders = self.runtime.data_parallel_leaders
        return torch.cat([gathered[leader, : counts[r]] for r, leader in enumerate(leaders)], dim=0)

    def _gather_objects(self, data: Any, counts: Sequence[int]) -> Any:
        import torch.distributed as dist

        parts: list[Any] = [None] * self.runtime.num_processes
        dist.all_gather_object(parts, to_numpy(data))
        flat = [flatten(parts[leader]) for leader in self.runtime.data_parallel_leaders]
        spec = flat[0][1]
        merged = [_merge_rows([f[0][i] for f in flat], counts, self.pad_index) for i in range(len(flat[0][0]))]
        return unflatten(merged, spec)


def _merge_rows(values: list[Any], counts: Sequence[int], pad_index: int) -> Any:
    """Concatenate the real rows of each process's value (arrays along dim 0, lists by items)."""
    if all(isinstance(v, np.ndarray) and v.ndim > 0 for v in values):
        return pad_and_concatenate([v[:c] for v, c in zip(values, counts)], pad_index)
    if all(isinstance(v, list) for v in values):
        return [item for v, c in zip(values, counts) for item in v[:c]]
    return [v for v, c in zip(values, counts) if c > 0]


def make_gatherer(runtime: Any, dataloader: Any, use_gather_object: bool) -> Callable[[Any, Any], Any]:
    """The gatherer for ``dataloader``: exact for trainwell's sharded loaders, Accelerate's otherwise.

    One data-parallel rank (tensor parallelism over every process) needs none: each process has all outputs.
    """
    if not runtime.distributed or runtime.data_parallel_size == 1:
        return LocalGatherer()
    from trainwell.data.sharding import is_sharded_loader

    if is_sharded_loader(dataloader):
        return ExactGatherer(runtime, use_gather_object)
    return AccelerateGatherer(runtime, use_gather_object)
