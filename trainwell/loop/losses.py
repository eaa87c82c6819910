"""Loss functions the Trainer applies itself (label smoothing) and the body of ``Trainer.compute_loss``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from trainwell.utils import model as model_utils


def logits_of(outputs: Any) -> torch.Tensor:
    """The logits of a model output: ``outputs["logits"]``, ``outputs.logits`` or the first element."""
    if isinstance(outputs, Mapping):
        return outputs["logits"] if "logits" in outputs else next(iter(outputs.values()))
    if isinstance(outputs, (tuple, list)):
        return outputs[0]
    if dataclasses.is_dataclass(outputs) or hasattr(outputs, "logits"):
        return outputs.logits
    return outputs


def label_smoothed_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float,
    shift_labels: bool = False,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Cross-entropy with label smoothing: ``(1 - ε) · NLL + ε · mean_over_classes(−log p)``.

    Both terms are averaged over the positions whose label is not ``ignore_index`` — or divided by
    ``num_items_in_batch`` when given, so that gradient accumulation weights every token of the window equally.
    """
    if shift_labels:
        logits = logits[..., :-1, :].contiguous()
        labels = labels[..., 1:].contiguous()
    log_probs = -torch.nn.functional.log_softmax(logits.float(), dim=-1)
    if labels.dim() == log_probs.dim() - 1:
        labels = labels.unsqueeze(-1)
    padding = labels.eq(ignore_index)
    safe_labels = labels.clamp(min=0)  # -100 is not a valid gather index; masked out below
    nll = log_probs.gather(dim=-1, index=safe_labels).masked_fill(padding, 0.0)
    smoothed = log_probs.sum(dim=-1, keepdim=True).masked_fill(padding, 0.0)
    active = num_items_in_batch if num_items_in_batch is not None else padding.numel() - padding.long().sum()
    nll_loss = nll.sum() / active
    smoothed_loss = smoothed.sum() / (active * log_probs.shape[-1])
    return (1 - epsilon) * nll_loss + epsilon * smoothed_loss


class LabelSmoother:
    """The reference's label-smoothing loss object: ``LabelSmoother(epsilon)(model_output, labels, shift_labels)``.

    Uses :func:`label_smoothed_loss` on the output's logits (``model_output["logits"]`` or its first element).
    """

    def __init__(self, epsilon: float = 0.1, ignore_index: int = -100) -> None:
        self.epsilon, self.ignore_index = epsilon, ignore_index

    def __call__(self, model_output: Any, labels: torch.Tensor, shift_labels: bool = False) -> torch.Tensor:
        return label_smoothed_loss(logits_of(model_output), labels, self.epsilon, shift_labels=shift_labels,
                                   ignore_index=self.ignore_index)


def compute_loss(trainer: Any, model: torch.nn.Module, inputs: Mapping[str, Any], return_outputs: bool,
                 num_items_in_batch: torch.Tensor | int | None) -> Any:
    """``Trainer.compute_loss``: ``compute_loss_func``, label smoothing, or the model's own loss.

    ``num_items_in_batch`` goes to a model that accepts it and to ``compute_loss_func``; ``inputs`` is never
    modified (a copy is made when labels are taken out or a keyword is added).
    """
    labels = None
    if (trainer.label_smoother is not None or trainer.compute_loss_func is not None) and "labels" in inputs:
        inputs = dict(inputs)
        labels = inputs.pop("labels")
    if trainer.model_accepts_loss_kwargs and num_items_in_batch is not None:
        inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
    if not return_outputs and trainer.compute_loss_func is None and trainer.precision.output_cast is not None:
        # Only the loss leaves: the float32 cast of every other output (Accelerate's, under fp16/bf16) would be a
        # pass over the logits that nobody sees (label smoothing casts the logits it reads itself)
        return trainer.precision.unobserved_loss(lambda: model_utils.call_forward(model, inputs),
                                                 lambda outputs: _loss_of(trainer, outputs, labels, num_items_in_batch))
    outputs = model_utils.call_forward(model, inputs)
    loss = _loss_of(trainer, outputs, labels, num_items_in_batch)
    return (loss, outputs) if return_outputs else loss


def _loss_of(trainer: Any, outputs: Any, labels: Any, num_items_in_batch: torch.Tensor | int | None) -> Any:
    """The loss of ``outputs``: ``compute_loss_func``'s, label smoothing's (``labels`` taken out of the batch), or the
    model's own."""
    if trainer.compute_loss_func is not None:
        return trainer.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
    if labels is not None:
        return label_smoothed_loss(logits_of(outputs), labels, trainer.label_smoother,
                                   shift_labels=trainer.model_info.shifts_labels, num_items_in_batch=num_items_in_batch)
    return model_utils.extract_loss(outputs)
