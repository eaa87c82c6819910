"""What one ``train()`` call keeps between steps: the loss since the last log, token and flop counts, and
the positions it started from.

Owns :class:`TrainingRun` (set as ``trainer.training_run`` by the fit loop, read by ``log`` and the log/save
boundary) and :class:`LossTracker`. The durable record of a run is ``TrainerState`` (``trainwell.state``); this
object holds what is only meaningful while the run goes on. Of it, only the log window in progress enters a
checkpoint (``"log_window"``: :attr:`TrainingRun.log_window`, the provider the fit loop hands the checkpointer).

Hot-path rule: counts stay device tensors on an accelerator until a log step reads them (one sync per log,
none per step).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from trainwell.backend.runtime import gather_loss_sum
from trainwell.checkpoint.checkpointer import Provider
from trainwell.loop.guard import StepGuard, step_applier
from trainwell.utils.throughput import NoThroughput, ThroughputWindow, non_embedding_parameters, peak_flops

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from trainwell.data.train_loader import TrainFeed
    from trainwell.hooks import TrainerHooks
    from trainwell.loop.plan import StepPlan


def reads_are_free(device: torch.device) -> bool:
    """Whether reading a tensor of ``device`` on the host costs nothing: on the CPU it is a memory read, on an
    accelerator a sync that stalls the queue of kernels (the contract tests switch this off to hold the
    accelerator path to zero reads per step on a CPU)."""
    return device.type == "cpu"


def read_together(values: list[Any]) -> list[float | None]:
    """``values`` (device tensors, numbers or None) as Python floats, with one host transfer for all the tensors:
    each ``.item()`` would be a sync of its own. float32 keeps every value exact (losses are read as float32,
    counts stay far below 2**24)."""
    out: list[Any] = list(values)
    tensors = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    if tensors:
        full = [values[i].full_tensor() if hasattr(values[i], "full_tensor") else values[i] for i in tensors]
        device = full[0].device  # a DTensor's (FSDP2's gradient norm) full value, then one stack and one read
        read = torch.stack([v.detach().to(device, torch.float32).reshape(()) for v in full]).tolist()
        for i, value in zip(tensors, read, strict=True):
            out[i] = value
    return [None if v is None else float(v) for v in out]


class LossTracker:
    """Sums the (already scaled) micro-batch losses between two log steps.

    On the CPU a Python float is cheapest (reading a CPU tensor is not a device sync); on an accelerator the
    sum stays a device tensor and is read only by :meth:`take`, at a log step.
    """

    def __init__(self, device: torch.device, nan_inf_filter: bool, last_logged_step: int = 0) -> None:
        self.on_host = reads_are_free(device)
        self.nan_inf_filter = nan_inf_filter
        self.device = device
        self.total: Any = 0.0 if self.on_host else torch.zeros((), device=device)
        self.logged_total = 0.0  #: every loss taken so far in this train() call
        self.last_logged_step = last_logged_step  #: the global step of the last loss log
        self.added = 0  #: losses added since the last take
        #: non-finite losses seen in this train() call, on the host path (skip_nonfinite_steps' guard compares it)
        self.nonfinite_seen = 0
        self.finite: Any = 0  #: of those, the finite ones (a device tensor on an accelerator)
        self.empty: Any = 0  #: micro-batches since the last take whose labels are all -100 (when counted)
        self.warned: set[str] = set()
        self._carried = False  #: the window began in an earlier call (restore_window)
        #: skip_nonfinite_steps guards the optimizer step: a non-finite loss leaves the weights as they were
        self.guarded = False

    def add(self, loss: torch.Tensor, steps_since_log: int) -> None:
        # A non-finite loss is replaced by the mean loss per step since the last log, as the reference does.
        self.added += 1
        if self.on_host:
            value = float(loss)
            if math.isfinite(value):
                self.finite += 1
            else:
                self.nonfinite_seen += 1
                if self.nan_inf_filter:
                    value = self.total / (1 + steps_since_log)
            self.total += value
            return
        # isfinite in two kernels (x - x is 0 exactly for a finite x, NaN otherwise; torch.isfinite takes four),
        # and a count of the finite ones in one more: no sync, read at the log step
        finite = (loss - loss) == 0
        self.finite = self.finite + finite
        if self.nan_inf_filter:
            fallback = self.total / (1 + steps_since_log)
            self.total = self.total + torch.where(finite, loss.to(self.total.dtype), fallback)
        else:
            self.total = self.total + loss

    def count_empty(self, micro_items: list[Any]) -> None:
        """Note the micro-batches of a window with no loss items (every label -100); no host sync."""
        for items in micro_items:
            self.empty = self.empty + (items == 0)

    def window(self, mean_over_processes: Any) -> dict[str, Any]:
        """What a checkpoint keeps of the log window in progress, so the first log after a resume averages the
        same steps as the uninterrupted run's: the loss sum since the last log (``mean_over_processes`` of it: a
        collective, as at a log step) and that log's step."""
        return {"loss_sum": mean_over_processes(self.total), "last_logged_step": self.last_logged_step}

    def restart_window(self, step: int) -> None:
        """Start the log window afresh at ``step``, dropping what it held (the steps a rollback skips past end it:
        the next log averages only steps trained after them)."""
        self._take_total()
        self.last_logged_step = step
        self.added, self.finite, self.empty = 0, 0, 0

    def restore_window(self, saved: dict[str, Any]) -> None:
        """Continue the saved log window. Its losses belong to the earlier call, so ``logged_total`` (this call's
        ``train_loss``) leaves them out."""
        loss_sum = float(saved["loss_sum"])
        self.total = loss_sum if self.on_host else torch.tensor(loss_sum, device=self.device)
        self._carried = True  # the window holds the earlier call's losses: a mean exists whatever comes next
        self.last_logged_step = int(saved["last_logged_step"])
        self.logged_total -= loss_sum

    def add_logged(self, loss_sum: float) -> None:
        """Count a logged window's loss sum into ``logged_total`` (``train_loss``). A window without one finite loss,
        logged as NaN under ``logging_nan_inf_filter`` (:meth:`read_window`), counts 0, as the reference's does."""
        self.logged_total += 0.0 if self.nan_inf_filter and math.isnan(loss_sum) else loss_sum

    def take(self) -> torch.Tensor | float:
        """The sum since the last take (a sync point on an accelerator), resetting it."""
        value = self._take_total()
        self._check_window(*read_together([self.finite, self.empty]))
        return value

    def read_window(self, reduce: Callable[[Any], Any], *extras: Any) -> list[float | None]:
        """Take the window at a log step: its loss sum through ``reduce`` (the mean over processes), then
        ``extras`` (the gradient norm), read to the host in one transfer with the window's own counts.

        With ``logging_nan_inf_filter``, a window whose every loss was NaN/inf has no mean to stand in for them:
        its sum is NaN (the reference logs 0.0, a loss no step had, which hides the failure from
        ``rollback_on_spike`` and from the reader). The NaN goes through ``reduce``, so every process logs it."""
        total = self._take_total()
        if self.nan_inf_filter and self.added and not self._carried:
            total = _nan_unless_any(total, self.finite)
        *values, finite, empty = read_together([reduce(total), *extras, self.finite, self.empty])
        self._check_window(finite, empty)
        return values

    def _take_total(self) -> torch.Tensor | float:
        value, self._carried = self.total, False
        self.total = 0.0 if self.on_host else torch.zeros((), device=self.device)
        return value

    def _check_window(self, finite: float, empty: float) -> None:
        """Warn (once per run) when every loss of the window was NaN/inf, or some batches had no labels."""
        added, empty = self.added, int(empty)
        nonfinite = added - int(finite)
        self.added, self.finite, self.empty = 0, 0, 0
        since = f"since step {self.last_logged_step}"
        if added and nonfinite == added and "nonfinite" not in self.warned:
            self.warned.add("nonfinite")
            filtered = ("so the logged loss is NaN (logging_nan_inf_filter has no finite loss to average in their "
                        "place)" if self.nan_inf_filter else "the logged loss is NaN/inf")
            weights = ("skip_nonfinite_steps did not apply those steps, so the weights are as before them"
                       if self.guarded else "The weights are likely NaN now")
            warnings.warn(
                f"The training loss was NaN or infinite on every one of the {added} micro-batches {since}: "
                f"{filtered}. {weights}. Lower learning_rate, set max_grad_norm (e.g. 1.0), use bf16 instead of "
                "fp16, and check the data (a batch whose labels are all -100 has a NaN mean loss).",
                RuntimeWarning, stacklevel=2)
        if empty and "empty" not in self.warned:
            self.warned.add("empty")
            warnings.warn(
                f"{empty} of the {added} micro-batches {since} had every label -100 (ignored): they train nothing, "
                "and a model that averages its loss returns NaN for them. Check the labels: truncation "
                "(max_length) cutting off every target, or a completion-only collator that did not find its "
                "response template.", RuntimeWarning, stacklevel=2)


def _nan_unless_any(total: Any, finite: Any) -> Any:
    """``total``, or NaN when ``finite`` (the count of finite losses in the window) is 0; at a log step only (on
    an accelerator: two scalar kernels, no sync)."""
    if isinstance(total, float) and not isinstance(finite, torch.Tensor):
        return total if finite else math.nan
    if not isinstance(finite, torch.Tensor):
        return total if finite else torch.full_like(total, math.nan)
    return torch.where(finite > 0, total, math.nan)


class TrainingRun:
    """The ``train()`` call in progress: its plan, data feed, start and running counts (the background checkpoint
    writer is the run's checkpointer's: ``trainer.checkpointer.writer``)."""

    def __init__(self, hooks: TrainerHooks, plan: StepPlan, feed: TrainFeed) -> None:
        state, args, runtime = hooks.state, hooks.args, hooks.runtime
        self.plan = plan
        self.feed = feed
        self.start_time = time.time()
        self.initial_global_step = state.global_step
        self.initial_tokens_seen = state.num_input_tokens_seen
        self.losses = LossTracker(runtime.device, args.logging_nan_inf_filter, last_logged_step=state.global_step)
        #: how an optimizer step is applied: plainly, loss-scaled, or guarded (``skip_nonfinite_steps``), bound once
        self.applier = step_applier(hooks, self.losses)
        self.losses.guarded = isinstance(self.applier, StepGuard)
        #: the log window in progress, as a checkpoint keeps it: its loss sum averaged over processes (a collective,
        #: as at a log step); a resume continues it
        self.log_window = Provider(lambda: self._window(lambda total: gather_loss_sum(runtime, total)),
                                   self._continue_window)
        self.tokens_pending: Any = 0
        self.token_mode = args.include_num_input_tokens_seen
        #: ``log_throughput``: tokens (from shapes, no kernel) and training time of the log window in progress
        self.throughput = _throughput_window(hooks) if args.log_throughput else NoThroughput()
        self.measures_throughput = bool(args.log_throughput)
        self.counts_tokens = self.token_mode != "no" or self.measures_throughput
        self.main_input = hooks.model_info.main_input_name
        optimizer = getattr(hooks.optimizer, "optimizer", hooks.optimizer)
        #: schedule-free optimizers keep separate train/eval weights: ``train()``/``eval()`` switch them
        self.optimizer_has_modes = has_train_eval_modes(optimizer)
        self._closers: list[Callable[[], None]] = []

    def on_close(self, close: Callable[[], None]) -> None:
        """Have ``close`` called when this ``train()`` call ends, however it ends (an error included): the seam for
        what a callback starts for one call (the live log's system-metrics thread), as ``on_train_end`` is not
        reached when training raises."""
        self._closers.append(close)

    def close(self) -> None:
        """The end of the call: the step applier's flags taken off the optimizer, then each ``on_close`` callable,
        newest first; one that raises is logged and the others still run."""
        self.applier.close()
        while self._closers:
            close = self._closers.pop()
            try:
                close()
            except Exception:  # noqa: BLE001 - cleaning up must not hide the error that ended training
                logger.exception("Closing %r at the end of train() failed.", close)

    @property
    def guard(self) -> StepGuard | None:
        """``skip_nonfinite_steps``' guard, for inspection (None: the steps are not guarded)."""
        return self.applier if isinstance(self.applier, StepGuard) else None

    def _window(self, mean_over_processes: Any) -> dict[str, Any]:
        return self.losses.window(mean_over_processes)

    def _continue_window(self, saved: Any) -> None:
        if isinstance(saved, dict):  # anything else is not a log window trainwell wrote: the window starts afresh
            self.losses.restore_window(saved)
            # a checkpoint written before the guard's count had its own row ("skipped_steps") kept it here
            self.applier.load_state_dict(saved.get("skipped_nonfinite_steps"))

    def count_tokens(self, inputs: Any) -> None:
        """Add one micro-batch's input tokens (``include_num_input_tokens_seen``) to the pending count."""
        main = inputs.get(self.main_input) if isinstance(inputs, Mapping) else None
        if not isinstance(main, torch.Tensor):
            return
        if self.measures_throughput:
            self.throughput.add(main.numel())
        if self.token_mode == "no":
            return
        mask = inputs.get("attention_mask")
        if self.token_mode == "non_padding" and isinstance(mask, torch.Tensor):
            self.tokens_pending = self.tokens_pending + mask.sum()  # stays on device until a log reads it
        else:
            self.tokens_pending = self.tokens_pending + main.numel()

    def flush_tokens(self, hooks: TrainerHooks) -> None:
        """Move the pending token count, summed over processes, into ``state.num_input_tokens_seen``."""
        pending = self.tokens_pending
        if isinstance(pending, torch.Tensor) or pending:
            runtime = hooks.runtime
            total = torch.as_tensor(pending, device=runtime.device).reshape(())
            hooks.state.num_input_tokens_seen += int(runtime.reduce_data_sum(total).item())
            self.tokens_pending = 0


def _throughput_window(hooks: TrainerHooks) -> ThroughputWindow:
    runtime = hooks.runtime
    peak = peak_flops(runtime.device, runtime.precision.mode)
    return ThroughputWindow(non_embedding_parameters(hooks.model), peak, runtime.data_parallel_size,
                            runtime.model_parallel_size)


def has_train_eval_modes(optimizer: Any) -> bool:
    """Whether an optimizer has ``train()``/``eval()`` (schedule-free optimizers average weights for eval)."""
    return callable(getattr(optimizer, "train", None)) and callable(getattr(optimizer, "eval", None))
