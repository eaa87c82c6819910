"""MemoryTracker (skip_memory_metrics=False): metric names per stage, init folding, nesting, and reference parity."""

from __future__ import annotations

import mmap
import sys
import time

import numpy as np
import pytest

from trainwell.techniques import memory
from trainwell.techniques.memory import MemoryTracker

MB = 2**20
HAS_GPU = memory._find_device_memory() is not None  # CPU-only machines get no *_mem_gpu_* names at all


def _names(stage: str, gpu: bool) -> list[str]:
    devices = ("cpu", "gpu") if gpu else ("cpu",)
    return [f"{stage}_mem_{d}_{k}_delta" for k in ("alloc", "peaked") for d in devices]


def _run(tracker: MemoryTracker, stage: str) -> dict:
    metrics: dict = {}
    tracker.start(stage)
    tracker.stop(stage, metrics)
    return metrics


@pytest.fixture
def tracker() -> MemoryTracker:
    t = MemoryTracker(skip_memory_metrics=False)
    t.start("init")
    t.stop("init")
    return t


def test_first_update_carries_init_numbers_in_reference_order(tracker):
    metrics = {"train_loss": 1.0}
    tracker.start("train")
    tracker.stop("train", metrics)
    expected = ["train_loss", *_names("init", HAS_GPU), *_names("train", HAS_GPU), "before_init_mem_cpu"]
    expected += ["before_init_mem_gpu"] if HAS_GPU else []
    assert list(metrics) == expected
    assert all(isinstance(metrics[k], int) for k in expected[1:])
    assert metrics["before_init_mem_cpu"] > 0
    assert all(metrics[k] >= 0 for k in metrics if k.endswith("peaked_delta"))


def test_later_stages_get_only_their_own_names(tracker):
    _run(tracker, "train")
    assert list(_run(tracker, "eval")) == _names("eval", HAS_GPU)
    assert list(_run(tracker, "test")) == _names("test", HAS_GPU)
    assert list(_run(tracker, "eval")) == _names("eval", HAS_GPU)


def test_init_goes_to_whichever_stage_updates_first(tracker):
    metrics = _run(tracker, "eval")
    assert set(_names("init", HAS_GPU)) <= set(metrics) and "before_init_mem_cpu" in metrics
    assert list(_run(tracker, "train")) == _names("train", HAS_GPU)


def test_stop_without_metrics_does_not_consume_the_init_numbers(tracker):
    tracker.start("train")
    tracker.stop("train")
    assert "init_mem_cpu_alloc_delta" in _run(tracker, "eval")


def test_evaluate_inside_train_is_ignored(tracker):
    tracker.start("train")
    eval_metrics = {"eval_loss": 0.5}
    tracker.start("eval")
    assert tracker.stage == "train"
    tracker.stop("eval", eval_metrics)
    # Like the reference: the nested dict gets nothing, not even the pending init numbers.
    assert eval_metrics == {"eval_loss": 0.5}
    assert tracker.stage == "train"
    train_metrics: dict = {}
    tracker.stop("train", train_metrics)
    assert tracker.stage is None
    assert "init_mem_cpu_alloc_delta" in train_metrics and "train_mem_cpu_alloc_delta" in train_metrics


def test_reentrant_start_of_the_active_stage_keeps_the_outer_measurement(tracker):
    tracker.start("eval")
    tracker.start("eval")
    inner: dict = {}
    tracker.stop("eval", inner)
    assert inner == {} and tracker.stage == "eval"
    outer: dict = {}
    tracker.stop("eval", outer)
    assert "eval_mem_cpu_alloc_delta" in outer and tracker.stage is None


def test_stop_with_nothing_active_is_a_no_op(tracker):
    metrics: dict = {}
    tracker.stop("train", metrics)
    assert metrics == {}


def test_unknown_stage_is_rejected():
    with pytest.raises(ValueError, match="unknown memory-tracking stage"):
        MemoryTracker(skip_memory_metrics=True).start("training")


def _fresh_pages(size: int) -> mmap.mmap:
    """``size`` bytes of new, written pages: an anonymous mapping, so RSS grows by ``size`` whatever malloc keeps
    resident from earlier tests (a heap that reuses freed pages would hide a malloc'd buffer)."""
    pages = mmap.mmap(-1, size)
    np.frombuffer(pages, dtype=np.uint8)[:] = 1  # write every page
    return pages


def test_a_100mb_buffer_freed_inside_the_stage_shows_as_a_peak(tracker):
    tracker.start("train")
    buf = _fresh_pages(100 * MB)
    time.sleep(0.3)  # gives the sampling thread the GIL while the buffer is alive
    buf.close()
    metrics: dict = {}
    tracker.stop("train", metrics)
    assert 80 * MB <= metrics["train_mem_cpu_peaked_delta"] <= 400 * MB
    assert metrics["train_mem_cpu_alloc_delta"] < 50 * MB


def test_a_100mb_buffer_kept_shows_as_allocated(tracker):
    tracker.start("train")
    buf = _fresh_pages(100 * MB)
    metrics: dict = {}
    tracker.stop("train", metrics)
    assert 80 * MB <= metrics["train_mem_cpu_alloc_delta"] <= 400 * MB
    buf.close()


def test_skipped_tracker_starts_no_thread_and_imports_no_psutil(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # any import of psutil would now fail

    def no_sampler(*args, **kwargs):
        raise AssertionError("a sampling thread was started")

    monkeypatch.setattr(memory, "_PeakSampler", no_sampler)
    tracker = MemoryTracker()  # skip_memory_metrics defaults to True, as in TrainingArguments
    assert not tracker.enabled
    for stage in ("init", "train", "eval", "test"):
        metrics: dict = {}
        tracker.start(stage)
        tracker.stop(stage, metrics)
        assert metrics == {}


def test_missing_psutil_is_a_clear_error_when_tracking(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(ImportError, match="pip install psutil"):
        MemoryTracker(skip_memory_metrics=False)


def test_names_match_the_reference_tracker():
    trainer_utils = pytest.importorskip("transformers.trainer_utils")
    ref = trainer_utils.TrainerMemoryTracker(skip_memory_metrics=False)
    ours = MemoryTracker(skip_memory_metrics=False)
    ref_metrics: dict[str, dict] = {"train": {}, "eval": {}, "nested": {}, "test": {}}

    # The reference derives the stage from its caller's function name, hence these names.
    def __init__():  # noqa: N807
        ref.start()
        ref.stop_and_update_metrics()

    def evaluate(key):
        ref.start()
        ref.stop_and_update_metrics(ref_metrics[key])

    def train():
        ref.start()
        evaluate("nested")
        ref.stop_and_update_metrics(ref_metrics["train"])

    def predict():
        ref.start()
        ref.stop_and_update_metrics(ref_metrics["test"])

    __init__()
    train()
    evaluate("eval")
    predict()

    our_metrics: dict[str, dict] = {"train": {}, "eval": {}, "nested": {}, "test": {}}
    ours.start("init")
    ours.stop("init")
    ours.start("train")
    ours.start("eval")
    ours.stop("eval", our_metrics["nested"])
    ours.stop("train", our_metrics["train"])
    ours.start("eval")
    ours.stop("eval", our_metrics["eval"])
    ours.start("test")
    ours.stop("test", our_metrics["test"])
    assert ref_metrics["nested"] == {} and "init_mem_cpu_alloc_delta" in ref_metrics["train"]
    assert {k: list(v) for k, v in our_metrics.items()} == {k: list(v) for k, v in ref_metrics.items()}


class _FakeAccelerator:
    """Allocator counters that a test moves by hand, standing in for torch.cuda on this CPU-only machine."""

    def __init__(self) -> None:
        self.now, self.max = 1000, 1000

    def allocate(self, size: int) -> None:
        self.now += size
        self.max = max(self.max, self.now)

    def reset_peak(self) -> None:
        self.max = self.now


@pytest.mark.parametrize("has_peak", [True, False], ids=["cuda-like", "mps-like"])
def test_gpu_numbers_with_an_accelerator(monkeypatch, has_peak):
    fake = _FakeAccelerator()
    device = memory._DeviceMemory(lambda: fake.now, (lambda: fake.max) if has_peak else None,
                                  fake.reset_peak, lambda: None)
    monkeypatch.setattr(memory, "_find_device_memory", lambda: device)
    tracker = MemoryTracker(skip_memory_metrics=False)
    tracker.start("init")
    fake.allocate(500)
    tracker.stop("init")
    metrics: dict = {}
    tracker.start("train")
    fake.allocate(300)
    fake.allocate(-200)
    tracker.stop("train", metrics)
    assert list(metrics) == [*_names("init", True), *_names("train", True), "before_init_mem_cpu",
                             "before_init_mem_gpu"]
    assert metrics["before_init_mem_gpu"] == 1000
    assert metrics["init_mem_gpu_alloc_delta"] == 500 and metrics["train_mem_gpu_alloc_delta"] == 100
    # Peak minus end; a backend without a peak counter reports the reference's placeholder string.
    assert metrics["train_mem_gpu_peaked_delta"] == (200 if has_peak else "Not available")
    assert metrics["init_mem_gpu_peaked_delta"] == (0 if has_peak else "Not available")
