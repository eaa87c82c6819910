"""Training techniques switched on by TrainingArguments fields, one module each.

- ``memory``: memory metrics (``skip_memory_metrics=False``).
- ``neftune``: NEFTune noise on the input embeddings (``neftune_noise_alpha``).
- ``overflow``: the inf/nan debugger (``debug="underflow_overflow"``) and the ``DebugOption`` enum.
- ``liger``: Liger kernels (``use_liger_kernel``).
- ``ema``: :class:`EMA`, an exponential moving average of the weights, a callback
  (``from trainwell.techniques import EMA``; ``Trainer(..., callbacks=[EMA(decay=0.999)])``).

:func:`during_training` switches on, for one ``train()`` call, those that act on the model. Each module is imported
only when its technique is asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "EMA":  # imported when asked for, as every technique
        from trainwell.techniques.ema import EMA

        return EMA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def during_training(trainer: Any) -> Iterator[None]:
    """Liger kernels, NEFTune noise and the underflow/overflow debugger for one ``train()``: set up on the unwrapped
    model before training, NEFTune's hook and the debugger's hooks removed afterwards, also when training fails
    (Liger's patches stay, as in the reference)."""
    args, model = trainer.args, trainer.model
    handle = debugger = None
    if args.use_liger_kernel:
        from trainwell.techniques.liger import apply_liger_kernel

        apply_liger_kernel(model, args.liger_kernel_config)
    try:
        if trainer.neftune_noise_alpha is not None:
            from trainwell.techniques.neftune import activate_neftune

            handle = trainer.neftune_hook_handle = activate_neftune(model, trainer.neftune_noise_alpha)
        if "underflow_overflow" in args.debug:
            from trainwell.techniques.overflow import DebugUnderflowOverflow

            debugger = DebugUnderflowOverflow(model)
        yield
    finally:
        if handle is not None:
            from trainwell.techniques.neftune import deactivate_neftune

            deactivate_neftune(model, handle)
        if debugger is not None:
            debugger.detach()
