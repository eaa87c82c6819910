"""Throughput a person can read: tokens per second over a log window and the model FLOPs utilization (MFU).

Owns the peak table of known accelerators and the window arithmetic; the fit loop feeds it host-side counts
only (token counts from tensor shapes, wall time), so logging throughput adds no kernel and no sync per step.

MFU here is torchtitan's and nanoGPT's estimate: 6 x non-embedding parameters x tokens per second (forward and
backward of the matrix multiplies, attention's own share left out), divided by the dense peak of one device in
the training precision. It reads low for long sequences, where attention's share grows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

# Dense tensor-core peaks in FLOP/s per device for bf16/fp16 (no sparsity), from the vendors' data sheets.
# Matched against torch.cuda.get_device_name() in this order (the first substring that occurs wins).
_PEAKS_16BIT: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
)


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The dense peak of ``device`` in FLOP/s for ``precision`` ('bf16' or 'fp16'); None when unknown (a CPU,
    full precision, or a card missing from the table)."""
    if device.type != "cuda" or precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in _PEAKS_16BIT if key in name), None)


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters outside ``nn.Embedding`` modules (each counted once, shared ones too; DTensors by full size)."""
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if id(param) not in seen and id(param) not in embeddings:
            seen.add(id(param))
            total += param.numel()
    return total


class NoThroughput:
    """``log_throughput`` off: nothing counted, nothing logged (the same calls as :class:`ThroughputWindow`)."""

    def add(self, tokens: int) -> None:
        """Nothing to count."""

    def paused(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def take(self) -> dict[str, Any]:
        return {}


class ThroughputWindow:
    """Counts tokens and training time between two logs; time spent evaluating or saving is left out."""

    clock = staticmethod(time.perf_counter)  #: seconds (a class attribute, so a test can drive it)

    def __init__(self, parameters: int, peak: float | None, data_parallel: int = 1, model_parallel: int = 1) -> None:
        self.parameters, self.peak = parameters, peak
        self.data_parallel, self.model_parallel = data_parallel, model_parallel
        self.tokens = 0
        self.started = self.clock()
        self.excluded = 0.0  #: seconds of the window spent in :meth:`paused` blocks

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time the block takes (an evaluation, a save) out of the window's training time."""
        began = self.clock()
        try:
            yield
        finally:
            self.excluded += self.clock() - began

    def take(self) -> dict[str, Any]:
        """``tokens_per_second`` (all processes) and, where the peak is known, ``mfu`` (a fraction) of the window
        since the last take; then a new window starts."""
        now = self.clock()
        seconds = max(now - self.started - self.excluded, 1e-9)
        per_process = self.tokens / seconds  # the processes of a model-parallel group share their batch
        logs: dict[str, Any] = {"tokens_per_second": round(per_process * self.data_parallel, 3)}
        if self.peak and self.parameters:
            logs["mfu"] = round(6 * self.parameters * per_process / self.model_parallel / self.peak, 5)
        self.tokens, self.started, self.excluded = 0, now, 0.0
        return logs
