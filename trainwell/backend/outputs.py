"""The float32 cast of a mixed-precision model's outputs: made where someone can see the outputs, and only there.

Under fp16/bf16 autocast Accelerate's ``prepare_model`` replaces the model's ``forward`` by autocast plus a cast of
every half-precision output to float32 (``ConvertOutputsToFp32``), and the reference Trainer hands those float32
outputs to a ``compute_loss`` override, to ``compute_loss_func``, to forward hooks and to ``prediction_step``.
In the default training path nobody sees them: the loss is taken out and the rest is dropped. There the cast is a
pass over the logits that a hand-written loop does not make: for GPT-2 small at batch 8 x 1024, 412M logits read
in bf16 and written in float32 (2.4 GB of memory traffic and a 1.6 GB allocation per step).

:class:`OutputCast` takes Accelerate's wrapper over (same chain of ``__wrapped__``, so ``unwrap_model`` still
finds the original ``forward``) and skips the cast while :meth:`OutputCast.unobserved` runs a forward, unless a
forward hook is registered (it would see the outputs). The loss, the one output kept, is cast by the caller.

:func:`as_prepared` gives a model that training has not prepared yet the same forward for an evaluation (as the
reference, which prepares it for evaluation): autocast, and float32 outputs.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")
HALF = (torch.float16, torch.bfloat16)
_NO_HOOKS: dict = {}


def _accelerate_cast(forward: Any) -> Any:
    """The ``ConvertOutputsToFp32`` under a ``forward`` Accelerate (or :class:`OutputCast`) installed, or None."""
    from accelerate.utils.operations import ConvertOutputsToFp32

    cast = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
    return cast if isinstance(cast, ConvertOutputsToFp32) else None


def _chain(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` and the modules it wraps (DDP's ``module``, a compiled module's ``_orig_mod``)."""
    seen: set[int] = set()
    while isinstance(model, torch.nn.Module) and id(model) not in seen:
        seen.add(id(model))
        yield model
        inner = model._modules.get("_orig_mod") or model._modules.get("module")
        if inner is None:
            return
        model = inner


def has_output_cast(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or a module it wraps) runs a forward whose outputs are cast to float32."""
    return any(_accelerate_cast(m.__dict__.get("forward")) is not None for m in _chain(model))


class OutputCast:
    """The float32 cast of one prepared model's outputs, skipped while :meth:`unobserved` runs a forward."""

    def __init__(self, module: torch.nn.Module, watched: list[torch.nn.Module], cast: Any, bound: bool) -> None:
        self.skipping = False
        autocast_forward = cast.model_forward  # Accelerate's forward under autocast, without the cast
        convert = cast.__call__
        # forward hooks of the module and of the wrappers around it see its outputs: the cast stays for them
        hooks = [m._forward_hooks for m in watched]
        everywhere = getattr(torch.nn.modules.module, "_global_forward_hooks", _NO_HOOKS)
        switch = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            if switch.skipping and not (everywhere or any(hooks)):
                return autocast_forward(*args, **kwargs)
            return convert(*args, **kwargs)

        forward.__wrapped__ = cast  # type: ignore[attr-defined]  # unwrap_model(keep_fp32_wrapper=False) walks it
        module.forward = types.MethodType(forward, module) if bound else forward

    @classmethod
    def take_over(cls, model: torch.nn.Module) -> OutputCast | None:
        """Replace Accelerate's output cast on ``model`` (or the module it wraps) by one that can be skipped; None
        when there is none (full precision, FSDP2's and DeepSpeed's own precision)."""
        watched = []
        for module in _chain(model):
            watched.append(module)
            forward = module.__dict__.get("forward")
            cast = _accelerate_cast(forward)
            if cast is not None:
                return cls(module, watched, cast, isinstance(forward, types.MethodType))
        return None

    def unobserved(self, call: Callable[[], T]) -> T:
        """``call()`` (a forward whose outputs nobody but the loss reads), without the cast of its outputs."""
        self.skipping = True
        try:
            return call()
        finally:
            self.skipping = False


def float32_loss(loss: Any) -> Any:
    """The loss as the cast would have made it: a half-precision tensor in float32 (the reference's dtype)."""
    return loss.float() if isinstance(loss, torch.Tensor) and loss.dtype in HALF else loss


@contextlib.contextmanager
def as_prepared(model: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """While the block runs, ``model.forward`` runs under ``autocast()`` and returns float32 outputs, as a prepared
    model's does; a model that has such a forward already is left alone."""
    if has_output_cast(model):
        with autocast():
            yield
        return
    from accelerate.utils.operations import convert_to_fp32

    own = model.__dict__.get("forward")
    inner = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        with autocast():
            outputs = inner(*args, **kwargs)
        return convert_to_fp32(outputs)

    model.forward = forward
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own
