"""Numeric precision of one Trainer: autocast, backward, the fp16 grad scaler, clipping and the eval dtype.

Owns everything that depends on ``mixed_precision`` (``fp16``/``bf16`` or full precision): the autocast
context, ``backward`` (through the grad scaler when there is one), unscaling before the gradient norm is
taken and clipped, whether the last optimizer step was skipped (an fp16 overflow: the scheduler must not
step then), the dtype of ``fp16_full_eval``/``bf16_full_eval``, TF32 matmuls, and the scaler's state for a
checkpoint (``state_dict``/``load_state_dict``). Nothing outside ``trainwell.backend`` touches the scaler.

Autocast is Accelerate's: a model prepared by the engine (``Runtime.prepare``) runs its ``forward`` under it (as
in the reference Trainer), and :meth:`Precision.autocast` gives the same context for code that runs a model
Accelerate did not prepare. The scaler is the one Accelerate built (its optimizer wrapper steps through it). What
the engine changes (DeepSpeed's own loss scaling, backward arguments, whether torch can be called directly) comes
from the engine (``trainwell.backend.engine.Engine``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from trainwell.backend import outputs

if TYPE_CHECKING:
    from trainwell.backend.engine import Engine

logger = logging.getLogger(__name__)


def note_cpu_fp16(mode: str, device: Any) -> None:
    """fp16 on a CPU trains in float32, as on the reference (Accelerate runs neither fp16 autocast nor a grad scaler
    there): said once per process, so 45 example scripts that set ``fp16=True`` run on a laptop, and nobody thinks
    their CPU run was in half precision."""
    if mode == "fp16" and getattr(device, "type", device) == "cpu":
        _say_fp16_does_nothing_on_a_cpu()


@functools.cache
def _say_fp16_does_nothing_on_a_cpu() -> None:
    logger.warning(
        "fp16=True (mixed_precision='fp16') does nothing on a CPU: there is no fp16 autocast or grad scaler there, so "
        "this run trains in float32, as the reference does. Use bf16=True for mixed precision on a CPU, or train on "
        "a GPU."
    )


def clipping_limit(max_grad_norm: float | None) -> float:
    """The ``max_norm`` :meth:`Precision.clip_grad_norm_` takes for ``max_grad_norm``: inf (measure the norm, clip
    nothing) when it is None or not above 0, as the reference's ``max_grad_norm=0`` turns clipping off."""
    return max_grad_norm if max_grad_norm and max_grad_norm > 0 else math.inf


class Precision:
    """The precision policy of one run, built once from the arguments by ``Runtime``.

    ``mode`` is Accelerate's ``mixed_precision`` (``"no"``, ``"fp16"``, ``"bf16"``). ``direct`` is True when
    backward and clipping can call torch directly (no scaler, and an engine that adds nothing to them:
    ``engine.direct_gradients``): Accelerate's versions re-check optional packages on every call, which costs more
    than a tiny model's whole step.
    """

    def __init__(self, accelerator: Any, args: Any, engine: Engine) -> None:
        self._accelerator = accelerator
        self._scaler = accelerator.scaler
        self.mode: str = str(accelerator.mixed_precision)
        self.direct: bool = self._scaler is None and engine.direct_gradients
        #: fp16 with an engine that adds nothing to backward and clipping: the grad scaler is called directly, as a
        #: hand-written loop calls it (Accelerate's backward divides the loss by its accumulation steps, always 1
        #: here: a kernel per micro-batch; its clipping with clipping off multiplies every gradient by 1.0)
        self.scaled_direct: bool = self._scaler is not None and engine.direct_gradients
        #: only fp16 ever skips a step (an overflow: Accelerate's grad scaler, or an engine's own loss scaling)
        self.can_skip_steps: bool = self._scaler is not None or engine.skips_steps
        self._backward_kwargs = engine.backward_kwargs
        #: the dtype of a ``fp16_full_eval`` / ``bf16_full_eval`` evaluation copy, None to evaluate as trained
        self.eval_dtype: torch.dtype | None = (
            torch.float16 if args.fp16_full_eval else torch.bfloat16 if args.bf16_full_eval else None
        )
        #: the float32 cast of the prepared model's outputs (``trainwell.backend.outputs``), None without one
        self.output_cast: outputs.OutputCast | None = None
        if getattr(args, "tf32", None) is not None and accelerator.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
            torch.backends.cudnn.allow_tf32 = bool(args.tf32)

    # ------------------------------------------------------------------------------------- forward
    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of ``mode`` (a no-op in full precision)."""
        if self.mode not in ("fp16", "bf16"):
            return contextlib.nullcontext()
        return self._accelerator.autocast()

    def prepared(self, model: torch.nn.Module) -> None:
        """Take over the output cast Accelerate put on the prepared ``model`` (none in full precision)."""
        if self.mode in ("fp16", "bf16"):
            self.output_cast = outputs.OutputCast.take_over(model)

    def unobserved_loss(self, forward: Callable[[], Any], extract: Callable[[Any], Any]) -> Any:
        """``extract(forward())``, the loss of a forward whose other outputs nobody sees: without the float32 cast
        of every output (a pass over the logits a hand-written loop does not make), the loss cast alone."""
        if self.output_cast is None:
            return extract(forward())
        return outputs.float32_loss(extract(self.output_cast.unobserved(forward)))

    def as_prepared(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """An evaluation's context: the forward under autocast with float32 outputs, as a prepared model's (also
        before training has prepared it, as the reference prepares it for evaluation); nothing in full precision."""
        if self.mode not in ("fp16", "bf16"):
            return contextlib.nullcontext()
        return outputs.as_prepared(model, self._accelerator.autocast)

    def evaluation_copy(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """A copy of ``model`` in ``eval_dtype`` for ``*_full_eval``; None when evaluation runs as trained.

        A copy, so the trained weights are never cast in place (the reference casts them, and a later
        ``train()`` then fails on a dtype mismatch).
        """
        if self.eval_dtype is None:
            return None
        return copy.deepcopy(model).to(dtype=self.eval_dtype)

    # ------------------------------------------------------------------------------------- backward
    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` (scaled first under fp16)."""
        if self.direct:
            loss.backward()
        elif self.scaled_direct:
            self._scaler.scale(loss).backward()
        else:
            self._accelerator.backward(loss, **self._backward_kwargs)

    def clip_grad_norm_(self, parameters: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """Unscale fp16 gradients, clip them to ``max_norm`` and return the total norm, as a tensor (no host sync).

        ``max_norm=inf`` (clipping off) still returns the norm, which the logs report as the reference's do, but
        never multiplies every gradient by 1.0 as ``clip_grad_norm_`` would: a pass over the gradients that a
        hand-written loop does not make.
        """
        if self.scaled_direct:
            self._accelerator.unscale_gradients()  # the optimizer's step then uses the unscaled gradients as they are
        if self.direct or self.scaled_direct:
            if math.isinf(max_norm):
                return torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return self._accelerator.clip_grad_norm_(parameters, max_norm)

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped because fp16 gradients overflowed."""
        return self.can_skip_steps and self._accelerator.optimizer_step_was_skipped

    # ------------------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any] | None:
        """The grad scaler's state (``scaler.pt`` in a checkpoint); None when there is no scaler."""
        return None if self._scaler is None else self._scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._scaler is not None:
            self._scaler.load_state_dict(state)
