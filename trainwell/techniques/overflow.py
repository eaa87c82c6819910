"""The underflow/overflow debugger behind ``TrainingArguments(debug="underflow_overflow")``.

This module owns :class:`DebugUnderflowOverflow` (the reference's ``transformers.debug_utils`` class: same name,
constructor arguments, attributes and printed report), the :class:`DebugOption` enum of ``debug`` values, and
the two per-tensor helpers :func:`get_abs_min_max` and :func:`detect_overflow`.

How it works: a forward hook on every module of the model records one *frame* per ``forward`` call (the module's
qualified name and class, then the abs min / abs max of its own parameters, its positional inputs and its
outputs) into a rolling buffer of the last ``max_frames_to_save`` frames. When any of those tensors holds inf or
nan, the buffer is printed with the batch number and a ValueError stops training. A forward of the top model
ends a batch and advances ``batch_number``. Batches listed in ``trace_batch_nums`` are printed frame by frame
instead, with detection off; ``abort_after_batch_num`` raises once that batch's forward has finished.

Unlike the reference, which leaves its hooks on the model for good, :meth:`DebugUnderflowOverflow.detach`
removes them (the object is also a context manager that detaches on exit).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainwell.outputs import ExplicitEnum


class DebugOption(ExplicitEnum):
    """The values ``TrainingArguments.debug`` accepts (a ``str`` enum: members compare equal to their value)."""

    UNDERFLOW_OVERFLOW = "underflow_overflow"
    TPU_METRICS_DEBUG = "tpu_metrics_debug"


def get_abs_min_max(var: torch.Tensor, ctx: str) -> str:
    """One report line: ``"<abs min> <abs max> <ctx>"``, each number as ``%8.2e``.

    Bool tensors are measured as 0/1 and an empty tensor is reported as such (the reference fails on both).
    """
    if var.numel() == 0:
        return f"{'empty':>17} {ctx}"
    magnitude = (var.to(torch.uint8) if var.dtype == torch.bool else var).abs()
    return f"{magnitude.min().item():8.2e} {magnitude.max().item():8.2e} {ctx}"


def detect_overflow(var: torch.Tensor, ctx: str) -> bool:
    """True when ``var`` holds a nan or an inf; prints ``"<ctx> has nans"`` / ``"<ctx> has infs"`` for each kind."""
    found = False
    if torch.isnan(var).any().item():
        print(f"{ctx} has nans")
        found = True
    if torch.isinf(var).any().item():
        print(f"{ctx} has infs")
        found = True
    return found


class DebugUnderflowOverflow:
    """Trace abs min/max of every module's weights, inputs and outputs; stop at the first inf/nan.

    Args:
        model: the model to watch. Hooks go on it and on every submodule, as soon as the object is built.
        max_frames_to_save: how many of the most recent frames the report shows (default 21).
        trace_batch_nums: batch numbers (0-based) whose every frame is printed as it is recorded; inf/nan does
            not raise during those batches.
        abort_after_batch_num: raise a ValueError as soon as the forward of this batch has finished.

    The report goes to stdout (``print``), as with the reference, because it is meant to be read above the
    traceback. Only positional inputs are seen by forward hooks: a model called with keyword arguments (as the
    Trainer calls it) shows no inputs in its own frame; outputs that are neither tensors nor tuples (e.g. a
    ``ModelOutput``) are listed as "not a tensor". Both as in the reference.
    """

    def __init__(
        self,
        model: nn.Module,
        max_frames_to_save: int = 21,
        trace_batch_nums: Iterable[int] | None = None,
        abort_after_batch_num: int | None = None,
    ) -> None:
        self.model = model
        self.trace_batch_nums = list(trace_batch_nums) if trace_batch_nums is not None else []
        self.abort_after_batch_num = abort_after_batch_num
        # Bounded: only the frames leading up to an inf/nan are worth printing, and memory must not grow.
        self.frames: collections.deque[str] = collections.deque(maxlen=max_frames_to_save)
        self.frame: list[str] = []
        self.batch_number = 0
        self.total_calls = 0
        self.detected_overflow = False
        self.prefix = " " * 17  # aligns module headers past the two number columns
        self._handles: list[RemovableHandle] = []
        self.analyse_model()
        self.register_forward_hook()

    # -- frames -----------------------------------------------------------------------------------------------

    def expand_frame(self, line: str) -> None:
        """Add one line to the frame being built."""
        self.frame.append(line)

    def save_frame(self, frame: str | None = None) -> None:
        """Close the current frame (after adding ``frame`` to it, if given) and push it onto the buffer."""
        if frame is not None:
            self.expand_frame(frame)
        self.frames.append("\n".join(self.frame))
        self.frame = []

    def reset_saved_frames(self) -> None:
        """Forget the buffered frames."""
        self.frames.clear()

    def trace_frames(self) -> None:
        """Print the buffered frames (trace mode) and forget them."""
        print("\n".join(self.frames))
        self.reset_saved_frames()

    def dump_saved_frames(self) -> None:
        """Print the inf/nan report: the batch number, then the buffered frames under a column header."""
        print(f"\nDetected inf/nan during batch_number={self.batch_number}")
        print(f"Last {len(self.frames)} forward frames:")
        print(f"{'abs min':8} {'abs max':8} metadata")
        print("\n".join(self.frames))
        print("\n\n")
        self.reset_saved_frames()

    def batch_start_frame(self) -> None:
        """Open a batch: a banner and the column header, at the top of the next frame."""
        self.expand_frame(f"\n\n{self.prefix} *** Starting batch number={self.batch_number} ***")
        self.expand_frame(f"{'abs min':8} {'abs max':8} metadata")

    def batch_end_frame(self) -> None:
        """A closing banner for the batch just finished (kept for API parity; the hook does not add it)."""
        self.expand_frame(f"{self.prefix} *** Finished batch number={self.batch_number - 1} ***\n\n")

    # -- analysis ---------------------------------------------------------------------------------------------

    def analyse_model(self) -> None:
        """Map every module to its qualified name (a module reachable by two names keeps the first)."""
        self.module_names: dict[nn.Module, str] = {m: name for name, m in self.model.named_modules()}

    def analyse_variable(self, var: Any, ctx: str) -> None:
        """Add ``var``'s line to the frame, and flag an overflow when it is a tensor holding inf/nan."""
        if torch.is_tensor(var):
            self.expand_frame(get_abs_min_max(var, ctx))
            if detect_overflow(var, ctx):
                self.detected_overflow = True
        elif var is None:
            self.expand_frame(f"{'None':>17} {ctx}")
        else:
            self.expand_frame(f"{'not a tensor':>17} {ctx}")

    def create_frame(self, module: nn.Module, input: Any, output: Any) -> None:
        """Record one forward call: header, own parameters, positional inputs, outputs (tuples unpacked twice)."""
        self.expand_frame(f"{self.prefix} {self.module_names[module]} {module.__class__.__name__}")
        for name, param in module.named_parameters(recurse=False):
            self.analyse_variable(param, name)
        if isinstance(input, tuple):
            for i, x in enumerate(input):
                self.analyse_variable(x, f"input[{i}]")
        else:
            self.analyse_variable(input, "input")
        if isinstance(output, tuple):
            for i, x in enumerate(output):
                if isinstance(x, tuple):
                    for j, y in enumerate(x):
                        self.analyse_variable(y, f"output[{i}][{j}]")
                else:
                    self.analyse_variable(x, f"output[{i}]")
        else:
            self.analyse_variable(output, "output")
        self.save_frame()

    # -- hooks ------------------------------------------------------------------------------------------------

    def register_forward_hook(self) -> None:
        """Hook every module of the model once (idempotent: a second call adds nothing while attached)."""
        if self._handles:
            return
        self._handles = [m.register_forward_hook(self.forward_hook) for m in self.module_names]

    def detach(self) -> None:
        """Remove every hook this debugger registered; the model runs untraced afterwards. Safe to call twice."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def attached(self) -> bool:
        """True while the hooks are on the model."""
        return bool(self._handles)

    def __enter__(self) -> DebugUnderflowOverflow:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.detach()

    def forward_hook(self, module: nn.Module, input: Any, output: Any) -> None:
        """Record ``module``'s frame; report and raise on inf/nan; count batches; honour the trace/abort options.

        The top model's own forward finishes last in a batch, so its hook is where the batch counter advances.
        """
        trace_mode = self.batch_number in self.trace_batch_nums
        if trace_mode:
            self.reset_saved_frames()
        if self.total_calls == 0:
            self.batch_start_frame()
        self.total_calls += 1
        batch_finished = module is self.model
        if batch_finished:
            self.batch_number += 1
        self.create_frame(module, input, output)
        if trace_mode:
            self.trace_frames()
        if batch_finished:
            self.batch_start_frame()
        # The flag is sticky: an inf/nan seen while tracing (detection off) aborts at the first untraced frame.
        if self.detected_overflow and not trace_mode:
            self.dump_saved_frames()
            raise ValueError(
                f"DebugUnderflowOverflow: inf/nan detected at '{self.module_names[module]}' "
                f"({type(module).__name__}) during batch_number={self.batch_number}; "
                "stopping, since training cannot recover from it. The frames printed above show the abs min/max "
                "values that led up to it."
            )
        if self.abort_after_batch_num is not None and self.batch_number > self.abort_after_batch_num:
            raise ValueError(
                f"DebugUnderflowOverflow: stopping after {self.batch_number} batches, as asked by "
                f"abort_after_batch_num={self.abort_after_batch_num}."
            )
