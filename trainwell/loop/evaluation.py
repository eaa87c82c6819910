"""The evaluation / prediction loop.

Owns walking an evaluation data loader: ``Trainer.prediction_step`` per batch (so overrides are honoured),
``preprocess_logits_for_metrics`` per batch, gathering across processes, moving outputs to the host and
computing metrics — once at the end, or per batch with ``batch_eval_metrics``.

Memory model (see ``docs/evaluation.md``): gathered outputs wait on the device for at most
``eval_accumulation_steps`` batches (1 when unset), then each output is written into one host array
allocated at its final size (``trainwell.loop.gather.OutputAccumulator``). Time is linear in the number of
samples and the host peak is the kept predictions plus about one batch; with a per-batch
``preprocess_logits_for_metrics`` that reduces logits, or with ``batch_eval_metrics``, it does not grow
with the number of samples at all.

In a distributed run, trainwell's own sharding (``trainwell.data.sharding``) tells the gatherer how many rows
of each process are real, so metrics and ``eval_loss`` cover exactly the dataset's samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
import torch

from trainwell.data.loaders import has_length
from trainwell.data.sharding import step_counts
from trainwell.loop.accumulation import find_batch_size
from trainwell.loop.gather import OutputAccumulator, make_gatherer, to_numpy
from trainwell.outputs import EvalLoopOutput, EvalPrediction
from trainwell.utils import model as model_utils
from trainwell.utils.metrics import finite_mean, to_python

if TYPE_CHECKING:
    from trainwell.trainer import Trainer

# Index of each output in the per-step list that is gathered and accumulated.
LOSSES, PREDS, LABELS, INPUTS = range(4)


def evaluation_loop(
    trainer: Trainer,
    dataloader: Any,
    description: str,
    prediction_loss_only: bool | None,
    ignore_keys: list[str] | None,
    metric_key_prefix: str,
) -> EvalLoopOutput:
    """Evaluate ``dataloader``; see the module docstring for what is kept and where."""
    from trainwell.trainer_data import check_compute_metrics

    args = trainer.args
    check_compute_metrics(trainer.compute_metrics, args.batch_eval_metrics)
    if prediction_loss_only is None:
        prediction_loss_only = args.prediction_loss_only
    model = trainer._model_for_evaluation()
    model.eval()
    if trainer._optimizer_has_modes:
        trainer.optimizer.eval()  # schedule-free optimizers evaluate with their averaged weights
    trainer.callback_handler.eval_dataloader = dataloader
    run = _EvalRun(trainer, dataloader, description, prediction_loss_only)
    for step, (item, is_last) in enumerate(_with_last(dataloader)):
        run.step(model, step, item, is_last, ignore_keys)
        trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)
    return run.finish(metric_key_prefix)


class _EvalRun:
    """The state of one evaluation: accumulators, the device-side stage, per-batch metrics."""

    def __init__(self, trainer: Trainer, dataloader: Any, description: str, loss_only: bool) -> None:
        args = trainer.args
        self.trainer = trainer
        self.dataloader = dataloader
        self.loss_only = loss_only
        include = set(args.include_for_metrics or [])
        self.include_inputs = "inputs" in include and not loss_only
        self.include_loss = "loss" in include
        self.batch_metrics = bool(args.batch_eval_metrics) and trainer.compute_metrics is not None
        # Per-batch metrics keep nothing, except for predict(), whose caller wants the predictions back.
        self.keep_outputs = not self.batch_metrics or description == "Prediction"
        self.flush_every = args.eval_accumulation_steps or 1
        self.gather = make_gatherer(trainer.runtime, dataloader, bool(args.eval_use_gather_object))
        dataset = getattr(dataloader, "dataset", None)
        expected = len(dataset) if has_length(dataset) else None
        concat = bool(args.eval_do_concat_batches)
        self.outputs = [OutputAccumulator(expected_rows=expected)] + [
            OutputAccumulator(expected_rows=expected, concat=concat) for _ in range(3)
        ]
        self.stage: list[list[Any]] = []
        self.metrics: dict[str, Any] | None = None
        self.observed = 0

    def step(self, model: torch.nn.Module, step: int, item: Any, is_last: bool, ignore_keys: Any) -> None:
        trainer = self.trainer
        inputs, counts = step_counts(self.dataloader, step, item)
        rows = find_batch_size(inputs) or 0
        self.observed += sum(counts) if counts is not None else rows
        loss, logits, labels = trainer.prediction_step(model, inputs, self.loss_only, ignore_keys=ignore_keys)
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            logits = trainer.preprocess_logits_for_metrics(logits, labels)
        # One loss entry per sample, so a short last batch weighs what it holds in the mean.
        losses = None if loss is None else loss.detach().float().reshape(1).repeat(rows)
        main = self._metric_inputs(inputs) if self.include_inputs else None
        parts = self.gather([losses, logits, labels, main], counts)
        if self.batch_metrics:
            self._batch_metrics(parts, is_last)
        if not self.keep_outputs:
            parts = [parts[LOSSES], None, None, None]
        self.stage.append(parts)
        if len(self.stage) >= self.flush_every:
            self._flush()

    def _metric_inputs(self, inputs: Any) -> Any:
        """The model's main input (``main_input_name``; without one, the first tensor that is not a label)."""
        trainer = self.trainer
        if not isinstance(inputs, dict):
            return trainer._prepare_inputs(inputs)
        name = getattr(model_utils.unwrap(trainer.model), "main_input_name", None)
        if name not in inputs:
            labels = set(trainer.label_names or [])
            tensors = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
            name = next((k for k in tensors if k not in labels), tensors[0] if tensors else None)
        return None if name is None else trainer._prepare_inputs(inputs[name])

    def _batch_metrics(self, parts: list[Any], is_last: bool) -> None:
        if parts[PREDS] is None or parts[LABELS] is None:
            return
        prediction = EvalPrediction(
            predictions=parts[PREDS], label_ids=parts[LABELS],
            inputs=parts[INPUTS] if self.include_inputs else None,
            losses=parts[LOSSES] if self.include_loss else None,
        )
        result = self.trainer.compute_metrics(prediction, compute_result=is_last)
        if is_last:
            self.metrics = dict(result) if result is not None else {}

    def _flush(self) -> None:
        """Move the staged batches to the host (one device sync for the whole stage)."""
        for parts in self.stage:
            for accumulator, value in zip(self.outputs, parts):
                accumulator.add(to_numpy(value))
        self.stage.clear()

    def finish(self, prefix: str) -> EvalLoopOutput:
        self._flush()
        losses, preds, labels, inputs = (acc.result() for acc in self.outputs)
        trainer, args = self.trainer, self.trainer.args
        metrics = self.metrics or {}
        if not self.batch_metrics and trainer.compute_metrics is not None and preds is not None and labels is not None:
            prediction = EvalPrediction(
                predictions=preds, label_ids=labels, inputs=inputs if self.include_inputs else None,
                losses=losses if self.include_loss else None,
            )
            metrics = trainer.compute_metrics(prediction)
        metrics = to_python(dict(metrics or {}))
        if losses is not None and len(losses):
            metrics["loss"] = finite_mean(np.asarray(losses, dtype=np.float64).tolist(), args.logging_nan_inf_filter)
        dataset = getattr(self.dataloader, "dataset", None)
        num_samples = len(dataset) if has_length(dataset) else self.observed
        return EvalLoopOutput(predictions=preds, label_ids=labels, metrics=_prefixed(metrics, prefix),
                              num_samples=num_samples)


def _with_last(iterable: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """``(item, is_last)`` pairs, looking one item ahead (works for loaders without a length)."""
    iterator = iter(iterable)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for upcoming in iterator:
        yield current, False
        current = upcoming
    yield current, True


def _prefixed(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Every key as ``{prefix}_{key}`` (keys that already carry the prefix are left alone)."""
    return {k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v for k, v in metrics.items()}
