"""NEFTune (noisy embeddings for fine-tuning), switched on by ``TrainingArguments(neftune_noise_alpha=...)``.

This module owns the forward hook that adds uniform noise to a model's input-embedding output while the
embedding module is in train mode, and the activate / deactivate pair the Trainer calls around ``train()``.
The noise for an output of shape ``(batch, seq_len, hidden)`` is drawn from ``U(-b, b)`` with
``b = alpha / sqrt(seq_len * hidden)`` (https://arxiv.org/abs/2310.05914).

Reproducibility contract: the hook makes exactly the same draws from the global torch RNG as the reference's
``transformers.integrations.neftune`` hook (one ``uniform_`` over a tensor shaped and typed like the output,
with the bound computed in float32 the same way), so at the same seed the noisy embeddings are bitwise equal.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

#: Attribute set on the embedding module while NEFTune is active (the reference's name, so code that reads it
#: or registers :func:`neftune_post_forward_hook` by hand keeps working).
ALPHA_ATTR = "neftune_noise_alpha"
_PEFT_CLASSES = ("PeftModel", "PeftMixedModel")


def neftune_noise_bound(alpha: float, seq_len: int, hidden: int) -> float:
    """``alpha / sqrt(seq_len * hidden)``, rounded the way the reference computes it.

    The reference divides a Python float by a float32 tensor holding ``sqrt(seq_len * hidden)``; the bound
    therefore carries float32 rounding, and a bound computed in double precision would shift the noise in its
    last bits. The same tensor arithmetic is used here (on the CPU, so it never synchronises a device).
    """
    return float(alpha / torch.sqrt(torch.tensor(seq_len * hidden)))


def neftune_post_forward_hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
    """Forward hook: in train mode, return ``output`` plus uniform noise; in eval mode, ``output`` unchanged.

    ``alpha`` is read from ``module.neftune_noise_alpha`` on every call (so changing it mid-training takes
    effect, as with the reference). ``seq_len`` and ``hidden`` are the output's last two dimensions.
    """
    if not module.training:
        return output
    if not isinstance(output, torch.Tensor) or output.dim() < 2:
        raise TypeError(
            f"neftune_noise_alpha: the input embeddings ({type(module).__name__}) returned "
            f"{type(output).__name__} {tuple(getattr(output, 'shape', ()))}; NEFTune needs a tensor of shape "
            "(batch, seq_len, hidden)."
        )
    bound = neftune_noise_bound(getattr(module, ALPHA_ATTR), output.size(-2), output.size(-1))
    # uniform_ overwrites every element, so the buffer needs no zero fill; the draws are what count for the RNG.
    return output + torch.empty_like(output).uniform_(-bound, bound)


class NeftuneHandle:
    """What :func:`activate_neftune` returns: the hooked embedding module and its hook.

    ``remove()`` takes the hook off and deletes ``neftune_noise_alpha`` from the module; it may be called more
    than once. The handle is also a context manager that removes on exit, error or not.
    """

    def __init__(self, module: nn.Module, hook: RemovableHandle) -> None:
        self.module = module
        self.hook = hook
        self.active = True

    def remove(self) -> None:
        """Detach NEFTune from the embedding module (idempotent)."""
        if not self.active:
            return
        self.hook.remove()
        if ALPHA_ATTR in vars(self.module):
            delattr(self.module, ALPHA_ATTR)
        self.active = False

    def __enter__(self) -> NeftuneHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"NeftuneHandle({type(self.module).__name__}, {state})"


def _check_alpha(alpha: Any) -> float:
    """``alpha`` as a float; ValueError unless it is a positive finite real number."""
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"neftune_noise_alpha must be a positive finite number (e.g. 5.0), got {alpha!r}.")
    return float(alpha)


def _strip_wrappers(model: Any) -> Any:
    """Peel torch.compile (``_orig_mod``) and DDP/FSDP/DeepSpeed (``.module``) wrappers off ``model``.

    ``.module`` is followed only when the object has no ``get_input_embeddings`` of its own, so a user model
    that happens to keep a submodule called ``module`` is not mistaken for a wrapper.
    """
    while True:
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module) and not callable(getattr(model, "get_input_embeddings", None)):
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _is_peft_model(model: Any) -> bool:
    """True for a PEFT ``PeftModel`` / ``PeftMixedModel`` (by class name: peft is never imported)."""
    return any(cls.__name__ in _PEFT_CLASSES for cls in type(model).__mro__)


def find_input_embeddings(model: Any, accelerator: Any = None) -> nn.Module:
    """The module ``get_input_embeddings()`` returns, after unwrapping, or a ValueError that says what to do.

    ``accelerator`` (optional, as in the reference) unwraps with ``accelerator.unwrap_model`` first. A PEFT
    model is looked through to ``base_model.model``, as the reference does.
    """
    owner = _strip_wrappers(accelerator.unwrap_model(model) if accelerator is not None else model)
    if _is_peft_model(owner):
        owner = getattr(getattr(owner, "base_model", None), "model", owner)
    getter = getattr(owner, "get_input_embeddings", None)
    embeddings = None
    if callable(getter):
        try:
            embeddings = getter()
        except NotImplementedError:  # transformers' base class raises this when a model defines none
            embeddings = None
    if not isinstance(embeddings, nn.Module):
        found = "no get_input_embeddings()" if not callable(getter) else f"get_input_embeddings() -> {embeddings!r}"
        raise ValueError(
            f"neftune_noise_alpha is set, but {type(owner).__name__} has {found}: NEFTune adds its noise to the "
            "output of the input-embedding module. Give the model a get_input_embeddings() method that returns "
            "its token embedding nn.Module, or leave neftune_noise_alpha unset (None)."
        )
    return embeddings


def activate_neftune(model: Any, neftune_noise_alpha: float, accelerator: Any = None) -> NeftuneHandle:
    """Hook NEFTune noise onto ``model``'s input embeddings; return the handle that removes it.

    Raises ValueError for a bad ``neftune_noise_alpha``, for a model whose input embeddings cannot be found
    (see :func:`find_input_embeddings`), and when NEFTune is already active on those embeddings (two hooks
    would add the noise twice). Pass the handle to :func:`deactivate_neftune` (or call ``handle.remove()``, or
    use it in a ``with`` block) when training ends, including when it ends with an exception.
    """
    alpha = _check_alpha(neftune_noise_alpha)
    embeddings = find_input_embeddings(model, accelerator)
    if hasattr(embeddings, ALPHA_ATTR):
        raise ValueError(
            f"NEFTune is already active on {type(embeddings).__name__} (it has a {ALPHA_ATTR} attribute): "
            "deactivate it before activating it again."
        )
    setattr(embeddings, ALPHA_ATTR, alpha)
    return NeftuneHandle(embeddings, embeddings.register_forward_hook(neftune_post_forward_hook))


def deactivate_neftune(model: Any, hook_handle: NeftuneHandle | RemovableHandle, accelerator: Any = None) -> None:
    """Remove NEFTune: the hook, and ``neftune_noise_alpha`` from the embedding module. Safe to call twice.

    Accepts the :class:`NeftuneHandle` from :func:`activate_neftune`, or a plain ``RemovableHandle`` (then the
    embeddings are found again from ``model`` to delete the attribute, as the reference does).
    """
    if isinstance(hook_handle, NeftuneHandle):
        hook_handle.remove()
        return
    hook_handle.remove()
    embeddings = find_input_embeddings(model, accelerator)
    if ALPHA_ATTR in vars(embeddings):
        delattr(embeddings, ALPHA_ATTR)


@contextlib.contextmanager
def neftune(model: Any, neftune_noise_alpha: float | None, accelerator: Any = None) -> Iterator[NeftuneHandle | None]:
    """``with neftune(model, alpha): ...`` keeps NEFTune on for the block and removes it on exit, error or not.

    ``neftune_noise_alpha=None`` makes the block a no-op (yields None), so a caller can pass
    ``args.neftune_noise_alpha`` straight through.
    """
    if neftune_noise_alpha is None:
        yield None
        return
    with activate_neftune(model, neftune_noise_alpha, accelerator) as handle:
        yield handle
