"""The evaluation / prediction loop.

Owns walking an evaluation data loader: ``Trainer.prediction_step`` per batch (so overrides are honoured),
gathering across processes (dropping the samples Accelerate duplicated to even out the last batch), keeping
outputs on the host, and computing metrics once at the end. Outputs of different sequence lengths are
padded with ``-100``; each batch is concatenated exactly once (``trainwell.loop.gather``), so time is linear
in the number of samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from trainwell.data.loaders import has_length
from trainwell.loop.accumulation import find_batch_size
from trainwell.loop.gather import OutputAccumulator, to_numpy
from trainwell.outputs import EvalLoopOutput, EvalPrediction
from trainwell.utils.metrics import finite_mean, to_python

if TYPE_CHECKING:
    from trainwell.trainer import Trainer


def evaluation_loop(
    trainer: Trainer,
    dataloader: Any,
    description: str,
    prediction_loss_only: bool | None,
    ignore_keys: list[str] | None,
    metric_key_prefix: str,
) -> EvalLoopOutput:
    args = trainer.args
    if prediction_loss_only is None:
        prediction_loss_only = args.prediction_loss_only
    runtime = trainer.runtime
    model = trainer._model_for_evaluation()
    model.eval()
    if trainer._optimizer_has_modes:
        trainer.optimizer.eval()  # schedule-free optimizers evaluate with their averaged weights
    trainer.callback_handler.eval_dataloader = dataloader

    losses, preds, labels = OutputAccumulator(), OutputAccumulator(), OutputAccumulator()
    observed = 0
    for inputs in dataloader:
        batch_size = find_batch_size(inputs) or 0
        observed += batch_size
        loss, logits, label_ids = trainer.prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if loss is not None:
            # One entry per sample, so a short last batch weighs what it holds in the mean.
            losses.add(to_numpy(runtime.gather_for_metrics(loss.detach().reshape(1).repeat(batch_size))))
        if label_ids is not None:
            label_ids = runtime.pad_across_processes(label_ids)
        if logits is not None:
            logits = runtime.pad_across_processes(logits)
            if trainer.preprocess_logits_for_metrics is not None:
                logits = trainer.preprocess_logits_for_metrics(logits, label_ids)
            preds.add(to_numpy(runtime.gather_for_metrics(logits)))
        if label_ids is not None:
            labels.add(to_numpy(runtime.gather_for_metrics(label_ids)))
        trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)

    all_losses = losses.result()
    all_preds = preds.result()
    all_labels = labels.result()
    metrics: dict[str, Any] = {}
    if trainer.compute_metrics is not None and all_preds is not None and all_labels is not None:
        metrics = to_python(dict(trainer.compute_metrics(EvalPrediction(predictions=all_preds, label_ids=all_labels))))
    if all_losses is not None and len(all_losses):
        metrics["loss"] = finite_mean(np.asarray(all_losses, dtype=np.float64).tolist(), args.logging_nan_inf_filter)
    metrics = _prefixed(metrics, metric_key_prefix)
    num_samples = len(dataloader.dataset) if has_length(getattr(dataloader, "dataset", None)) else observed
    return EvalLoopOutput(predictions=all_preds, label_ids=all_labels, metrics=metrics, num_samples=num_samples)


def _prefixed(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Every key as ``{prefix}_{key}`` (keys that already carry the prefix are left alone)."""
    return {k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v for k, v in metrics.items()}
