"""An exponential moving average of the model's weights (``Trainer(..., callbacks=[EMA(decay=0.999)])``).

After every optimizer step each trainable parameter's average moves towards it: ``average += (1 - decay) *
(weight - average)``, one ``torch._foreach_lerp_`` over all of them on their device (no host read, nothing
allocated: a few fused kernels per step, and one more copy of the trainable weights in memory). The average is a
piece of every checkpoint (``ema.safetensors``, through ``trainwell.checkpoint.pieces``): saved by synchronous and
``save_async`` saves, restored on resume once the model and optimizer are, so a resumed run's average equals the
uninterrupted run's bit for bit. Under DDP every process averages the same weights; under FSDP2 (and tensor
parallelism) each process averages its local shards and writes them as its own file (``ema_{rank}.safetensors``),
read back on resume by as many processes.

Evaluation during training can use the average (``use_for_eval``), and the model can end training holding it
(``use_for_final_model``), so that ``trainer.save_model()``, ``evaluate()`` and ``predict()`` after ``train()`` use
it; :meth:`EMA.averaged_weights` swaps it in for any other use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from trainwell.checkpoint.pieces import checkpoint_piece
from trainwell.events.callback import TrainerCallback


class EMA(TrainerCallback):
    """An exponential moving average of the trainable weights, updated after every optimizer step.

    ``decay``: how much of the average each step keeps, in [0, 1] (0.999: the average spans about the last 1,000
    steps). ``use_for_eval``: the evaluations that ``eval_strategy`` (or a callback before this one) asks for during
    training run on the averaged weights, the training weights put back before training goes on.
    ``use_for_final_model``: when training ends, the model's weights are replaced by their average (the last
    checkpoint keeps the training weights, to resume from); it cannot be combined with ``load_best_model_at_end``,
    which chooses the final weights too.

    The average has each parameter's dtype and device (a bf16 parameter's average is bf16: small steps may round
    away; keep float32 weights for a long average). Buffers (a BatchNorm's running statistics) are not averaged.
    """

    #: the file of every checkpoint that holds the average: one per process where the engine shards the model
    checkpoint_piece = checkpoint_piece("ema", "ema.safetensors", sharded=True)

    def __init__(self, decay: float = 0.999, use_for_eval: bool = False, use_for_final_model: bool = False) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA(decay={decay!r}): pass a number in [0, 1], the share of the average each step "
                             "keeps, e.g. 0.999.")
        for flag, value in (("use_for_eval", use_for_eval), ("use_for_final_model", use_for_final_model)):
            if not isinstance(value, bool):
                raise TypeError(f"EMA({flag}={value!r}): pass True or False.")
        self.decay, self.use_for_eval, self.use_for_final_model = float(decay), use_for_eval, use_for_final_model
        self._names: list[str] = []
        self._weights: list[torch.Tensor] = []  # the trainable parameters' tensors (local shards), updated in place
        self._average: list[torch.Tensor] = []
        self._restored: dict[str, torch.Tensor] | None = None  # a checkpoint's average, laid out at on_train_begin
        self._training_weights: list[torch.Tensor] | None = None  # held while the average is swapped in

    # ------------------------------------------------------------------------------------------- the state
    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The averaged tensors by parameter name (under FSDP2: this process's shards of them), live: copy them to
        keep them. None before training began (nothing is averaged yet)."""
        if self._restored is not None:
            return self._restored
        return dict(zip(self._names, self._average)) if self._names else None

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from ``state`` (:meth:`state_dict`'s): taken when training begins, checked against the model's
        trainable parameters then (names, shapes, dtypes)."""
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise TypeError(f"EMA.load_state_dict takes a dictionary of tensors by parameter name, not "
                            f"{type(state).__name__}.")
        self._restored = state

    # ------------------------------------------------------------------------------------------- the events
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.use_for_final_model and args.load_best_model_at_end:
            raise ValueError("EMA(use_for_final_model=True) and load_best_model_at_end=True both choose the weights "
                             "the model ends training with: keep one of them.")
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if any(hasattr(p, "ds_id") for _, p in named):
            raise ValueError("EMA cannot average the weights under DeepSpeed: its parameters are the engine's "
                             "(partitioned under ZeRO-3). Train without DeepSpeed, or without EMA.")
        self._training_weights = None  # an attempt that failed while evaluating: the weights were restored since
        self._names = [name for name, _ in named]
        self._weights = [_local(p) for _, p in named]
        restored, self._restored = self._restored, None
        if restored is None:
            self._average = [w.clone() for w in self._weights]
        else:
            self._average = _laid_out(restored, self._names, self._weights)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._weights:
            with torch.no_grad():
                torch._foreach_lerp_(self._average, self._weights, 1.0 - self.decay)
        if self.use_for_eval and control.should_evaluate:
            self._swap_in()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.use_for_eval and control.should_evaluate:
            self._swap_in()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._swap_out()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._swap_out()
        if self.use_for_final_model and self._weights:
            with torch.no_grad():
                torch._foreach_copy_(self._weights, self._average)

    @contextlib.contextmanager
    def averaged_weights(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own again after it (``with
        ema.averaged_weights(): trainer.evaluate()``); after at least one ``train()`` began."""
        if not self._weights:
            raise RuntimeError("EMA.averaged_weights(): nothing is averaged yet; call it after train() began.")
        self._swap_in()
        try:
            yield
        finally:
            self._swap_out()

    def _swap_in(self) -> None:
        if self._training_weights is None and self._weights:
            with torch.no_grad():
                self._training_weights = [w.clone() for w in self._weights]
                torch._foreach_copy_(self._weights, self._average)

    def _swap_out(self) -> None:
        if self._training_weights is not None:
            with torch.no_grad():
                torch._foreach_copy_(self._weights, self._training_weights)
            self._training_weights = None


def _local(parameter: torch.Tensor) -> torch.Tensor:
    """The tensor a parameter's values live in on this process, sharing its memory: its local shard for a DTensor
    (FSDP2, tensor parallelism), else itself, detached."""
    detached = parameter.detach()
    return detached.to_local() if hasattr(detached, "to_local") else detached


def _laid_out(saved: dict[str, torch.Tensor], names: list[str], weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """A checkpoint's average on the devices of ``weights``; ValueError naming what differs from the model's."""
    missing, extra = [n for n in names if n not in saved], sorted(set(saved) - set(names))
    if missing or extra:
        raise ValueError(f"The checkpoint's EMA does not match the model's trainable parameters: missing {missing[:3]}"
                         f", unexpected {extra[:3]}. Resume with the model (and the trainable parameters) that wrote "
                         "it.")
    for name, weight in zip(names, weights):
        if saved[name].shape != weight.shape or saved[name].dtype != weight.dtype:
            raise ValueError(f"The checkpoint's EMA of {name} is {tuple(saved[name].shape)} {saved[name].dtype}, the "
                             f"parameter {tuple(weight.shape)} {weight.dtype}: resume with the model, dtype and "
                             "number of processes that wrote it.")
    return [saved[name].to(weight.device, copy=True) for name, weight in zip(names, weights)]
