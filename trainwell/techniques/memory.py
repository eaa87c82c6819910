"""Memory metrics for ``TrainingArguments(skip_memory_metrics=False)``.

This module owns :class:`MemoryTracker`: per Trainer stage (``init``, ``train``, ``eval``, ``test``) it measures how
much host memory (process RSS, via psutil) and accelerator memory (torch's allocator counters) the stage left
allocated, and how far usage peaked above what it ended at. The numbers are written into the stage's metrics dict
under the reference's names::

    {stage}_mem_cpu_alloc_delta   {stage}_mem_cpu_peaked_delta
    {stage}_mem_gpu_alloc_delta   {stage}_mem_gpu_peaked_delta      (only when an accelerator is present)
    before_init_mem_cpu           before_init_mem_gpu               (with the init numbers)

The names never carry the caller's ``metric_key_prefix``. ``alloc_delta`` is end minus start; ``peaked_delta`` is
peak minus end (never negative), so the memory a stage needed at its worst is the sum of the two.

psutil is a dependency of accelerate, which trainwell requires, so it is always there in a normal install; it is
still imported only when tracking is on, and a broken environment gets an ImportError naming the fix.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

STAGE_INIT = "init"
STAGE_TRAIN = "train"
STAGE_EVAL = "eval"
STAGE_TEST = "test"
STAGES: tuple[str, ...] = (STAGE_INIT, STAGE_TRAIN, STAGE_EVAL, STAGE_TEST)

#: ``METRIC_FORMAT.format(stage="train", device="cpu", kind="alloc")`` -> ``"train_mem_cpu_alloc_delta"``.
METRIC_FORMAT = "{stage}_mem_{device}_{kind}_delta"
BEFORE_INIT_CPU = "before_init_mem_cpu"
BEFORE_INIT_GPU = "before_init_mem_gpu"
#: What ``*_mem_gpu_peaked_delta`` holds on a backend without a peak counter (MPS), as the reference reports it.
PEAK_NOT_AVAILABLE = "Not available"


@dataclass(frozen=True)
class _DeviceMemory:
    """The allocator counters of one torch accelerator backend; ``peak`` is None where the backend has none."""

    allocated: Callable[[], int]
    peak: Callable[[], int] | None
    reset_peak: Callable[[], None] | None
    empty_cache: Callable[[], None] | None


def _find_device_memory() -> _DeviceMemory | None:
    """The first available accelerator's counters, or None on a CPU-only machine (then no gpu metrics at all)."""
    import torch

    # Out-of-tree backends (mlu, musa, npu, hpu) appear on ``torch`` only once their extension is imported, which
    # accelerate does when it finds one; an absent attribute simply means the backend is not there.
    for name in ("cuda", "mlu", "musa", "xpu", "npu", "hpu"):
        backend = getattr(torch, name, None)
        is_available = getattr(backend, "is_available", None)
        if is_available is None or not is_available():
            continue
        # HPU keeps all device memory reserved for the process, so it has no cache worth emptying.
        empty_cache = None if name == "hpu" else getattr(backend, "empty_cache", None)
        return _DeviceMemory(backend.memory_allocated, backend.max_memory_allocated,
                             backend.reset_peak_memory_stats, empty_cache)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return _DeviceMemory(torch.mps.current_allocated_memory, None, None, torch.mps.empty_cache)
    return None


class _PeakSampler:
    """Samples a memory reading on a daemon thread until stopped, keeping the highest value seen."""

    def __init__(self, read: Callable[[], int], first: int) -> None:
        self._read = read
        self.peak = first
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainwell-memory-peak", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # One sample per millisecond: the reference samples in a tight loop, which takes the GIL from the training
        # thread for the whole stage; a buffer that lives less than a millisecond is missed here, a step's are not.
        while not self._done.wait(0.001):
            self.peak = max(self.peak, self._read())

    def stop(self) -> int:
        """Stops the thread and returns the peak, including one last reading taken now."""
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._read())
        return self.peak


@dataclass(frozen=True)
class _StageMemory:
    begin: int
    end: int
    alloc: int
    peaked: int | str


class MemoryTracker:
    """Tracks host and accelerator memory per Trainer stage and adds the numbers to that stage's metrics.

    Usage, with one tracker per Trainer::

        tracker = MemoryTracker(args.skip_memory_metrics)
        tracker.start("train")
        ...
        tracker.stop("train", metrics)   # adds train_mem_* (and, the first time, init_mem_* / before_init_mem_*)

    While a stage is active, ``start``/``stop`` of another stage (an ``evaluate()`` run inside ``train()``) are
    ignored, and so is the metrics dict they pass: the nested stage gets no memory metrics and the outer
    measurement continues untouched. A re-entrant start of the active stage is ignored too; only the outermost
    ``stop`` ends it. ``stop`` with no active stage does nothing, so it is safe to call again from a ``finally``.

    ``init`` has no metrics dict of its own (``stop("init")``): its numbers go into the first metrics dict that a
    later non-nested ``stop`` updates. With ``skip_memory_metrics=True`` every method returns at once: no thread,
    no psutil import, no torch calls.
    """

    def __init__(self, skip_memory_metrics: bool = True) -> None:
        self.skip_memory_metrics = skip_memory_metrics
        self._stage: str | None = None
        self._depth = 0
        self._init_reported = False
        self._cpu: dict[str, _StageMemory] = {}
        self._gpu: dict[str, _StageMemory] = {}
        if skip_memory_metrics:
            return
        try:
            import psutil
        except ImportError as err:  # pragma: no cover - accelerate depends on psutil
            raise ImportError("skip_memory_metrics=False needs psutil: pip install psutil") from err
        self._process = psutil.Process()
        self._device = _find_device_memory()

    @property
    def enabled(self) -> bool:
        """Whether memory is tracked at all (``skip_memory_metrics`` is False)."""
        return not self.skip_memory_metrics

    @property
    def stage(self) -> str | None:
        """The stage being measured now, or None."""
        return self._stage

    def _rss(self) -> int:
        return self._process.memory_info().rss

    @contextlib.contextmanager
    def track(self, stage: str) -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
        """``with tracker.track("eval") as add: return add(metrics)``: measure the block; the metrics handed to
        ``add`` get the stage's numbers when the block ends (none when it raises, and the stage is closed)."""
        self.start(stage)
        given: list[dict[str, Any]] = []

        def add(metrics: dict[str, Any]) -> dict[str, Any]:
            given.append(metrics)
            return metrics

        try:
            yield add
        finally:
            self.stop(stage, given[-1] if given else None)

    def start(self, stage: str) -> None:
        """Begins measuring ``stage`` unless another stage is already being measured (then this is ignored)."""
        _check_stage(stage)
        if not self.enabled:
            return
        if self._stage is not None:
            self._depth += self._stage == stage
            return
        self._stage, self._depth = stage, 1
        # Collect garbage and empty the allocator cache first so that the start reflects live objects only.
        gc.collect()
        device = self._device
        if device is not None:
            if device.reset_peak is not None:
                device.reset_peak()
            if device.empty_cache is not None:
                device.empty_cache()
            self._gpu_begin = device.allocated()
        self._cpu_begin = self._rss()
        self._sampler = _PeakSampler(self._rss, self._cpu_begin)

    def stop(self, stage: str, metrics: dict[str, Any] | None = None) -> None:
        """Ends measuring ``stage`` and, when ``metrics`` is given, adds the memory metrics to it in place.

        Ignored when ``stage`` is not the active stage (nested call) or when nothing is active.
        """
        _check_stage(stage)
        if not self.enabled or self._stage != stage:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        self._finish(stage)
        self._stage = None
        if metrics is not None:
            self._update(stage, metrics)

    def _finish(self, stage: str) -> None:
        """Records the stage's numbers: stop sampling, collect garbage, read the counters."""
        cpu_peak = self._sampler.stop()
        gc.collect()
        device = self._device
        if device is not None:
            if device.empty_cache is not None:
                device.empty_cache()
            end = device.allocated()
            peaked = PEAK_NOT_AVAILABLE if device.peak is None else max(0, device.peak() - end)
            self._gpu[stage] = _StageMemory(self._gpu_begin, end, end - self._gpu_begin, peaked)
        end = self._rss()
        self._cpu[stage] = _StageMemory(self._cpu_begin, end, end - self._cpu_begin, max(0, cpu_peak - end))

    def _update(self, stage: str, metrics: dict[str, Any]) -> None:
        # The first update also carries init's numbers, since Trainer construction returns no metrics.
        stages = [stage]
        if not self._init_reported:
            self._init_reported = True
            if stage != STAGE_INIT:
                stages.insert(0, STAGE_INIT)
        for name in stages:
            for kind in ("alloc", "peaked"):
                for device, records in (("cpu", self._cpu), ("gpu", self._gpu)):
                    if name in records:
                        metrics[METRIC_FORMAT.format(stage=name, device=device, kind=kind)] = getattr(
                            records[name], kind)
        if stages[0] == STAGE_INIT and STAGE_INIT in self._cpu:
            metrics[BEFORE_INIT_CPU] = self._cpu[STAGE_INIT].begin
            if STAGE_INIT in self._gpu:
                metrics[BEFORE_INIT_GPU] = self._gpu[STAGE_INIT].begin


def _check_stage(stage: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"unknown memory-tracking stage {stage!r}; expected one of {STAGES}")
