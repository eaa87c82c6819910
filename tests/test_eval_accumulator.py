"""OutputAccumulator: one preallocated host array per output, -100 padding, bounded memory, gatherer rules."""

from __future__ import annotations

import tracemalloc
from collections import namedtuple

import numpy as np
import pytest
import torch

from trainwell.data.sharding import EvalShardBatchSampler, IterableEvalShard
from trainwell.loop import gather
from trainwell.loop.gather import (
    OutputAccumulator,
    _merge_rows,
    empty_array,
    flatten,
    pad_and_concatenate,
    unflatten,
)


@pytest.mark.parametrize("expected", [None, 10, 4])
def test_rows_are_concatenated_whatever_the_expected_count(expected):
    acc = OutputAccumulator(expected_rows=expected)
    batches = [np.arange(i * 12, i * 12 + 12, dtype=np.float32).reshape(4, 3) for i in range(3)][:2]
    batches.append(np.full((2, 3), 7.0, dtype=np.float32))
    for b in batches:
        acc.add(b)
    np.testing.assert_array_equal(acc.result(), np.concatenate(batches))


def test_later_dims_are_padded_with_minus_100_in_either_order():
    acc = OutputAccumulator(expected_rows=5)
    acc.add(np.ones((2, 3), dtype=np.int64))
    acc.add(np.full((2, 5), 2, dtype=np.int64))  # wider: earlier rows are re-padded
    acc.add(np.full((1, 1), 3, dtype=np.int64))
    out = acc.result()
    assert out.shape == (5, 5)
    assert (out[:2, 3:] == -100).all() and (out[:2, :3] == 1).all()
    assert (out[2:4] == 2).all() and out[4].tolist() == [3, -100, -100, -100, -100]


def test_nested_structures_scalars_and_dtype_promotion():
    Pair = namedtuple("Pair", "a b")
    acc = OutputAccumulator()
    acc.add({"x": Pair(np.zeros((2, 2), np.float32), np.float32(1.0)), "y": (np.ones(2, np.int32),)})
    acc.add({"x": Pair(np.ones((1, 2), np.float64), np.float32(2.0)), "y": (np.ones(1, np.int32),)})
    out = acc.result()
    assert isinstance(out["x"], Pair) and out["x"].a.dtype == np.float64 and out["x"].a.shape == (3, 2)
    assert out["x"].b.tolist() == [1.0, 2.0] and out["y"][0].shape == (3,)


def test_rank_or_structure_changes_are_clear_errors():
    acc = OutputAccumulator()
    acc.add(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="eval_do_concat_batches=False"):
        acc.add(np.zeros((2, 3, 1)))
    acc = OutputAccumulator()
    acc.add((np.zeros(2), np.zeros(2)))
    with pytest.raises(ValueError, match="changed structure"):
        acc.add((np.zeros(2),))


def test_concat_false_keeps_batches_and_empty_is_none():
    acc = OutputAccumulator(concat=False)
    assert acc.result() is None
    acc.add(np.zeros(2))
    acc.add(None)
    acc.add(np.zeros(3))
    assert [len(b) for b in acc.result()] == [2, 3] and len(acc) == 2
    assert OutputAccumulator().result() is None


def test_pad_and_concatenate_and_flatten_roundtrip():
    out = pad_and_concatenate([np.array(1.0), np.array(2.0)])
    assert out.tolist() == [1.0, 2.0]
    data = {"a": [np.zeros(1), (None, 3)], "b": np.ones(2)}
    leaves, spec = flatten(data)
    assert len(leaves) == 4
    rebuilt = unflatten(leaves, spec)
    assert rebuilt["a"][1] == (None, 3) and isinstance(rebuilt["a"], list)


def test_peak_memory_is_about_the_kept_predictions(monkeypatch):
    """The contract behind benchmarks/eval_scaling.py: no list of batches, no second full copy."""
    monkeypatch.setattr(gather, "HUGE_PAGE_MIN_BYTES", 1 << 62)  # plain numpy memory, which tracemalloc sees
    rows, width, batch = 2000, 2000, 16
    kept = rows * width * 4
    acc = OutputAccumulator(expected_rows=rows)
    tracemalloc.start()
    for start in range(0, rows, batch):
        acc.add(np.ones((min(batch, rows - start), width), dtype=np.float32))
    result = acc.result()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.shape == (rows, width)
    assert peak <= 1.3 * kept, peak / kept


def test_merge_rows_drops_filler_rows():
    arrays = [np.arange(4), np.arange(10, 13), np.array([99])]
    assert _merge_rows(arrays, [4, 3, 0], -100).tolist() == [0, 1, 2, 3, 10, 11, 12]
    assert _merge_rows([["a", "b"], ["c"]], [2, 0], -100) == ["a", "b"]


def test_shard_sampler_covers_the_dataset_once_in_order():
    for n, b, world, drop in [(23, 4, 2, False), (3, 4, 2, False), (23, 4, 3, True), (16, 4, 2, False)]:
        samplers = [EvalShardBatchSampler(n, b, r, world, drop_last=drop) for r in range(world)]
        per_rank = [list(s) for s in samplers]
        assert len({len(s) for s in samplers}) == 1 and all(len(p) == len(samplers[0]) for p in per_rank)
        order = []
        for step in range(len(samplers[0])):
            counts = samplers[0].counts(step)
            for r in range(world):
                order += per_rank[r][step][: counts[r]]
        expected = (n // b) * b if drop else n
        assert order == list(range(expected)) and samplers[0].real_samples == expected


def test_iterable_shard_steps_and_counts():
    world = 2
    shards = [IterableEvalShard(range(11), 3, r, world) for r in range(world)]
    steps = [list(s) for s in shards]
    assert [c for _, c in steps[0]] == [[3, 3], [3, 2]]
    assert steps[1][1][0] == [9, 10] and steps[0][1][0] == [6, 7, 8]
    tail = list(IterableEvalShard(range(7), 3, 1, world))
    assert tail[-1] == ([0], [1, 0])  # rank 1 evaluates a filler and reports no real rows
    assert [c for _, c in IterableEvalShard(range(7), 3, 0, world, drop_last=True)] == [[3, 3]]


def test_to_numpy_shares_memory_and_widens_half():
    from trainwell.loop.gather import to_numpy

    t = torch.ones(3)
    a = to_numpy(t)
    a[0] = 5
    assert t[0] == 5
    assert to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype == np.float32


def test_large_buffers_are_ordinary_writable_arrays():
    big = empty_array((3, 1 << 20), np.float32)  # 12 MB: a huge-page mapping on Linux
    big[...] = 2.0
    assert big.shape == (3, 1 << 20) and big.dtype == np.float32 and float(big.sum()) == 6 * (1 << 20)
    acc = OutputAccumulator(expected_rows=6)
    acc.add(np.ones((4, 1 << 19), np.float32))
    acc.add(np.zeros((2, 1 << 19), np.float32))
    out = acc.result()
    assert out.shape == (6, 1 << 19) and out[:4].all() and not out[4:].any()


def test_results_are_freed_without_the_garbage_collector():
    import gc
    import weakref

    gc.disable()
    try:
        acc = OutputAccumulator(expected_rows=4)
        acc.add({"a": (np.ones((4, 2)),)})
        out = acc.result()
        ref = weakref.ref(out["a"][0].base if out["a"][0].base is not None else out["a"][0])
        del acc, out
        assert ref() is None  # no reference cycle keeps the predictions alive after evaluate() returns
    finally:
        gc.enable()
