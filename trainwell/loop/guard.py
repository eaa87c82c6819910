"""``skip_nonfinite_steps``: an optimizer step whose loss or gradient norm is NaN or infinite is not applied, and
no step reads a device tensor on the host to decide it.

Owns the ways an optimizer step is applied, bound once per ``train()`` call by :func:`step_applier` (as a
precision plugin owns the optimizer step): :class:`PlainStep` (``optimizer.step()``), :class:`ScaledStep` (an fp16
grad scaler, or DeepSpeed's loss scaler, may skip an overflowing step) and :class:`StepGuard`. The optimizer step
(``trainwell.loop.step``) calls ``apply`` once per step and steps the scheduler unless it returns True; each also
owns its count of skipped steps read at a log (``unread``, ``settle``) and its checkpoint row (``"skipped_steps"``:
skips read at a save and not logged yet). The decision
is a device tensor, ``found`` (1.0: skip, 0.0: apply), computed from the gradient norm the step has taken anyway
(for clipping, or for the logs when clipping is off) plus, in a single process, the window's summed loss: a sum of
numbers is finite only when each one is, so ``x * 0 != 0`` is the whole check (three scalar kernels, no pass over
the gradients). With several processes the norm alone decides: it is the norm of the all-reduced gradients, the
same on every process (a process's non-finite loss makes them non-finite), so every process decides alike.

How a step is not applied:

* an optimizer that takes ``found_inf`` (torch's fused Adam, AdamW, SGD and Adagrad: ``_step_supports_amp_scaling``,
  as ``torch.amp.GradScaler`` uses it) gets ``found`` as its ``found_inf`` attribute, once: its kernel leaves the
  parameters and moments alone and takes its step count back, on the device;
* any other optimizer is guarded by a copy: the parameters and their optimizer state on the same device are copied
  before the step into buffers kept between steps, and put back with ``torch.where`` after it (memory for one
  copy of them, and a kernel per tensor: the fused optimizers, the default ``adamw_torch_fused`` among them, need
  neither); state the step creates (its first) is left at zero, as lazily created moments start. State an optimizer
  keeps on the host (torch's non-capturable ``step`` counts when the parameters are
  on an accelerator) moves on;
* under a grad scaler (fp16) the scaler already skips such steps; its skips are counted the same way.

On the CPU, where reading a tensor is a memory read and not a sync (``LossTracker.on_host``: the loss tracker reads
each loss there already), the guard decides on the host instead, at no kernel: the window's losses were finite (the
tracker saw them) and the norm is (one read of a number the step has anyway); a step found non-finite is not taken at
all, as the reference's fp16 skip leaves it (``decide`` returns False), and the count is a Python int. Parameters
and state match the device path's; only the state of a skipped first step differs: never created, where the device
path creates it at zero (the next step's arithmetic is the same).

The skipped steps are counted on the device and read at the next log, in the log's one host transfer
(``LossTracker.read_window``), which logs them as ``skipped_nonfinite_steps``. The learning-rate schedule then
moves back by that many steps (``trainwell.optim.schedulers.rewind``), so from that log on it stands where the
reference's fp16 skip leaves it (its scheduler does not step on a skipped step); between the skip and the log it
runs one step ahead per skip. A save settles the count too, so a checkpoint holds the schedule of the
uninterrupted run. The step's RNG draws (dropout) are taken, as in the reference's skip.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch

from trainwell.optim.schedulers import rewind

if TYPE_CHECKING:
    from trainwell.hooks import TrainerHooks
    from trainwell.loop.progress import LossTracker

logger = logging.getLogger(__name__)


def takes_found_inf(optimizer: Any) -> bool:
    """Whether ``optimizer``'s step reads a ``found_inf`` attribute and skips itself on the device (torch's fused
    optimizers: the flag ``torch.amp.GradScaler`` checks)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


class PlainStep:
    """``optimizer.step()``, never skipped; nothing counted, nothing to save. The base of the step appliers."""

    #: whether ``apply`` needs the window's summed loss (a device tensor the optimizer step then adds up)
    needs_window_loss = False

    def __init__(self, hooks: TrainerHooks) -> None:
        self._hooks = hooks  # the optimizer is read at each step: a callback may have replaced it

    def apply(self, grad_norm: Any, window_loss: Any) -> bool:
        """Apply the step (the gradients are clipped); True when it was skipped (the scheduler then stays)."""
        self._hooks.optimizer.step()
        return False

    def unread(self) -> torch.Tensor | int | None:
        """What to read at a log with the log's other values (None: nothing)."""
        return None

    def settle(self, read: float | None, for_log: bool) -> int:
        """The skipped steps to log, given ``read`` (the value of :meth:`unread` read on the host)."""
        return 0

    def settle_now(self) -> None:
        """Read the count now, before a checkpoint is written (a host read: saves only)."""

    def finish(self) -> int:
        """The skips of this ``train()`` call."""
        return 0

    def close(self) -> None:
        """The run is over: take back what the applier put on the optimizer."""

    def state_dict(self) -> int | None:
        """The checkpoint row ``"skipped_steps"``: skips read at a save, not logged yet (None: nothing to save)."""
        return None

    def load_state_dict(self, pending: Any) -> None:
        """Resume the row ``"skipped_steps"`` (or the count an older checkpoint kept in its log window)."""


class ScaledStep(PlainStep):
    """``optimizer.step()`` under a loss scaler that skips an overflowing step itself (fp16, DeepSpeed)."""

    def apply(self, grad_norm: Any, window_loss: Any) -> bool:
        self._hooks.optimizer.step()
        return self._hooks.precision.step_was_skipped


def step_applier(hooks: TrainerHooks, losses: LossTracker) -> PlainStep:
    """The step applier of one ``train()`` call: the guard ``skip_nonfinite_steps`` asks for, else a scaled or a
    plain step."""
    guard = StepGuard.of(hooks, losses)
    if guard is not None:
        return guard
    return ScaledStep(hooks) if hooks.precision.can_skip_steps else PlainStep(hooks)


class StepGuard(PlainStep):
    """The non-finite guard of one ``train()`` call (see the module docstring).

    ``with_loss``: the window's loss takes part in the decision (a single process); ``scaler_skips``: a grad scaler
    skips non-finite steps itself, and the guard only counts its skips; ``losses``: the run's loss tracker, whose
    host path (the CPU) makes the guard decide on the host too.
    """

    def __init__(self, hooks: TrainerHooks, device: torch.device, with_loss: bool, scaler_skips: bool = False,
                 losses: LossTracker | None = None) -> None:
        super().__init__(hooks)
        optimizer = hooks.optimizer
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # the torch optimizer under Accelerate's wrapper
        self.scheduler = hooks.lr_scheduler
        self._with_loss = with_loss
        #: a grad scaler skips the non-finite steps itself: only its (host-known) skips are counted
        self._scaler_skips = scaler_skips
        #: the loss tracker reads every loss on the host (the CPU): decide there, with no kernel (module docstring)
        self.losses = losses if losses is not None and losses.on_host and not scaler_skips else None
        self._on_host = self.losses is not None
        self.needs_window_loss = with_loss and not self._on_host and not scaler_skips
        self._nonfinite_seen = 0  #: the tracker's count of non-finite losses at the last decision (host path)
        self.found = torch.zeros((), dtype=torch.float32, device=device)
        #: skipped since the count was last read (a device tensor; a Python int on the host path)
        self.count: torch.Tensor | int = 0 if self._on_host else torch.zeros((), dtype=torch.float32, device=device)
        self.pending = 0  #: skips read at a save, not logged yet
        self.total = 0  #: skips of this train() call read so far
        self._fused = not scaler_skips and not self._on_host and takes_found_inf(self.optimizer)
        #: the copy guard: the optimizer cannot skip a step itself
        self._copies = not scaler_skips and not self._fused and not self._on_host
        self._saved: list[torch.Tensor] = []
        self._guarded: list[torch.Tensor] = []
        self._fresh: list[torch.Tensor] = []
        self._warned_schedule = False
        if self._fused:
            # Read by the optimizer's step at every call (``getattr(self, "found_inf", None)``); written in place.
            self.optimizer.found_inf = self.found

    @classmethod
    def of(cls, hooks: TrainerHooks, losses: LossTracker | None = None) -> StepGuard | None:
        """The guard the arguments ask for; None when ``skip_nonfinite_steps`` is False, when the engine steps its
        own optimizer (DeepSpeed, whose fp16 loss scaler skips overflowing steps itself), or, at the default (None),
        when only the copy guard could skip the step: its copy of the parameters and optimizer state is a cost in
        memory and time that only an explicit True asks for."""
        setting = hooks.args.skip_nonfinite_steps
        if setting is False:
            return None
        runtime, precision = hooks.runtime, hooks.precision
        if runtime.engine.steps_its_own_optimizer:
            logger.info("skip_nonfinite_steps: %s runs its own optimizer step; its loss scaler decides which steps "
                        "to skip.", runtime.engine.label)
            return None
        if setting is None and not precision.can_skip_steps and not takes_found_inf(
                getattr(hooks.optimizer, "optimizer", hooks.optimizer)):
            logger.info("skip_nonfinite_steps: the optimizer (%s) cannot skip a step itself, so non-finite steps are "
                        "applied, as on the reference. Set skip_nonfinite_steps=True to guard it with a copy of the "
                        "parameters and optimizer state, or use a fused optimizer (optim='adamw_torch_fused').",
                        type(getattr(hooks.optimizer, "optimizer", hooks.optimizer)).__name__)
            return None
        return cls(hooks, runtime.device, with_loss=runtime.num_processes == 1, scaler_skips=precision.can_skip_steps,
                   losses=losses)

    # read-only, for inspection: how this guard skips a step
    on_host = property(lambda self: self._on_host, doc="decides on the host (the CPU), at no kernel")
    fused = property(lambda self: self._fused, doc="the optimizer skips itself, through its found_inf")
    copies = property(lambda self: self._copies, doc="the copy guard: parameters and state put back after a skip")

    # ------------------------------------------------------------------------------------------- one step
    def apply(self, grad_norm: Any, window_loss: Any) -> bool:
        """Apply the step unless it is non-finite (see the module docstring); True only for a grad scaler's skip
        (the device path's skips are taken out of the schedule at the next log or save, by :meth:`settle`)."""
        if self._scaler_skips:  # the scaler skips the step itself: count its skips (known on the host)
            self._hooks.optimizer.step()
            skipped = self._hooks.precision.step_was_skipped
            self.after_step(skipped)
            return skipped
        if self.decide(grad_norm, window_loss):
            self._hooks.optimizer.step()
        if self._copies:
            self.after_step()
        return False

    def decide(self, grad_norm: Any, window_loss: Any) -> bool:
        """Whether to take the optimizer step. On the device path: set ``found`` from this step's gradient norm and
        (single process) summed loss, and count it, with no host read and four scalar kernels (add, mul, ne, add_;
        the sum promotes a half-precision loss to the norm's float); the step is taken, and skips itself. On the
        host path: False for a non-finite step, which is counted, and no kernel."""
        if self._on_host:
            return self._decide_on_host(grad_norm)
        if self._with_loss:  # one process: a plain tensor norm, and the loss
            total = window_loss if grad_norm is None else grad_norm + window_loss
        elif hasattr(grad_norm, "full_tensor"):  # a DTensor norm (FSDP2, tensor parallel): its value on every process
            total = grad_norm.full_tensor()
        else:
            total = grad_norm
        if total is None:  # an engine that measured no norm, and no loss to look at: apply the step
            self.found.zero_()
            return True
        torch.ne(total * 0, 0, out=self.found)  # x * 0 is 0 for a finite x, NaN for NaN and +-inf
        self.count.add_(self.found)
        if self._copies:
            self._copy_before_step()
        return True

    def _decide_on_host(self, grad_norm: Any) -> bool:
        seen = self.losses.nonfinite_seen
        bad = self._with_loss and seen != self._nonfinite_seen  # a loss of this window was NaN or infinite
        self._nonfinite_seen = seen
        if not bad and grad_norm is not None:
            norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            bad = not math.isfinite(float(norm))  # the same value on every process (the reduced gradients')
        if bad:
            self.count += 1
        return not bad

    def after_step(self, scaler_skipped: bool = False) -> None:
        """Undo a skipped step (the copy guard), or count a grad scaler's skip (known on the host already)."""
        if self._scaler_skips:
            self.pending += int(scaler_skipped)
            self.total += int(scaler_skipped)
            return
        skip = self.found.bool()
        with torch.no_grad():
            for saved, current in zip(self._saved, self._guarded, strict=True):
                torch.where(skip, saved, current, out=current)
            if self._fresh:  # state the step created (its first): a skipped one leaves it as created, at zero
                zero = torch.zeros((), device=self.found.device)
                for t in self._created():
                    torch.where(skip, zero.to(t.dtype), t, out=t)
                self._fresh = []

    def _created(self) -> list[torch.Tensor]:
        state = self.optimizer.state
        return [t.to_local() if hasattr(t, "to_local") else t.detach() for p in self._fresh
                for t in state.get(p, {}).values() if isinstance(t, torch.Tensor) and t.device == p.device]

    def _copy_before_step(self) -> None:
        """Copy the parameters with gradients and their optimizer state (on their device) into reused buffers."""
        tensors = []
        state = self.optimizer.state
        self._fresh = []  # parameters without state yet: the step creates it
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                tensors.append(p)
                if not state.get(p):
                    self._fresh.append(p)
                tensors.extend(v for v in state.get(p, {}).values()
                               if isinstance(v, torch.Tensor) and v.device == p.device and v is not p)
        with torch.no_grad():
            # a DTensor (FSDP2, tensor parallel) is guarded through its shard: foreach ops have no sharding rule
            local = [t.to_local() if hasattr(t, "to_local") else t.detach() for t in tensors]
            if len(local) != len(self._saved) or any(
                    s.shape != t.shape or s.dtype != t.dtype for s, t in zip(self._saved, local, strict=True)):
                self._saved = [torch.empty_like(t) for t in local]  # the state grew (first step) or changed
            self._guarded = local
            torch._foreach_copy_(self._saved, local)

    # ------------------------------------------------------------------------------------------- reading the count
    def unread(self) -> torch.Tensor | int:
        """What to read at a log, with the log's other values (a device tensor, or the host count of a scaler)."""
        return self.pending if self._scaler_skips else self.count

    def settle(self, read: float | None, for_log: bool) -> int:
        """Take ``read`` (the value of :meth:`unread`, read on the host) into account: reset the device count, move
        the schedule back by the new skips, and return the skips to log (``for_log``) or keep them for the next
        log (a save)."""
        new = int(read or 0)
        if not self._scaler_skips and new:  # (a grad scaler's skips are counted in pending already, host-side)
            if self._on_host:
                self.count = 0
            else:
                self.count.zero_()
            self._rewind(new)
            self.pending += new
            self.total += new
        if not for_log:
            return 0
        logged, self.pending = self.pending, 0
        return logged

    def settle_now(self) -> None:
        """Read the count now (one host read) and keep it for the next log: before a checkpoint is written."""
        if self._scaler_skips:
            return
        self.settle(float(self.count), for_log=False)

    def finish(self) -> int:
        """The skips of this ``train()`` call (reads the count once, at the end of training)."""
        self.settle_now()
        return self.total

    def _rewind(self, steps: int) -> None:
        if self.scheduler is None or rewind(self.scheduler, steps) or self._warned_schedule:
            return
        self._warned_schedule = True
        logger.warning("skip_nonfinite_steps: %d step(s) were skipped, but the learning-rate scheduler %s cannot be "
                       "moved back; its schedule counts the skipped steps.", steps, type(self.scheduler).__name__)

    def close(self) -> None:
        """Take the ``found_inf`` attribute off the optimizer (the run is over)."""
        if self._fused and getattr(self.optimizer, "found_inf", None) is self.found:
            del self.optimizer.found_inf

    def state_dict(self) -> int | None:
        return self.pending or None  # a checkpoint with no pending skip has no entry (as before the row)

    def load_state_dict(self, pending: Any) -> None:
        if isinstance(pending, int) and pending > 0:
            self.pending = pending
