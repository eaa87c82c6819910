"""Evaluation and prediction: ``evaluate()``, ``predict()``, the evaluation loop and one prediction step.

Owns the default bodies of the Trainer's ``evaluate``, ``predict``, ``evaluation_loop`` and
``prediction_step``: walking an evaluation data loader with ``prediction_step`` per batch (through the
Trainer, so overrides are honoured), ``preprocess_logits_for_metrics`` per batch, gathering across
processes, moving outputs to the host and computing metrics — once at the end, or per batch with
``batch_eval_metrics`` — then the speed metrics and the ``on_evaluate``/``on_predict`` events.

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

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from trainwell.data.loaders import has_length
from trainwell.data.sharding import step_counts
from trainwell.loop.accumulation import find_batch_size
from trainwell.loop.gather import LocalGatherer, OutputAccumulator, make_gatherer, to_numpy
from trainwell.loop.metric_checks import check_compute_metrics, checked_metrics
from trainwell.loop.progress import has_train_eval_modes
from trainwell.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput
from trainwell.utils import model as model_utils
from trainwell.utils.metrics import finite_mean, speed_metrics, to_python

if TYPE_CHECKING:
    from trainwell.hooks import TrainerHooks

# Index of each output in the per-step list that is gathered and accumulated.
LOSSES, PREDS, LABELS, INPUTS = range(4)


def evaluate(hooks: TrainerHooks, eval_dataset: Any, ignore_keys: list[str] | None, prefix: str) -> dict[str, float]:
    """Metrics of one evaluation, each prefixed ``{prefix}_``; a dict of datasets evaluates each one."""
    given = eval_dataset is not None
    dataset = eval_dataset if given else hooks.eval_dataset
    if isinstance(dataset, dict):
        metrics: dict[str, float] = {}
        for name, data in dataset.items():
            metrics.update(hooks.evaluate(data if given else name, ignore_keys, f"{prefix}_{name}"))
        return metrics
    dataloader = hooks.get_eval_dataloader(eval_dataset)
    start = time.time()
    output = hooks.evaluation_loop(
        dataloader, "Evaluation", prediction_loss_only=True if hooks.compute_metrics is None else None,
        ignore_keys=ignore_keys, metric_key_prefix=prefix,
    )
    metrics = dict(output.metrics)
    metrics.update(_speed(hooks, prefix, start, output.num_samples))
    hooks.log(metrics)  # adds epoch (and token counts) to metrics: evaluate() returns them, as the reference's
    hooks.control = hooks.callback_handler.on_evaluate(hooks.args, hooks.state, hooks.control, metrics=metrics)
    return metrics


def predict(hooks: TrainerHooks, test_dataset: Any, ignore_keys: list[str] | None, prefix: str) -> PredictionOutput:
    """Predictions (in dataset order), label ids when present, and ``{prefix}_`` metrics."""
    dataloader = hooks.get_test_dataloader(test_dataset)
    start = time.time()
    output = hooks.evaluation_loop(dataloader, "Prediction", ignore_keys=ignore_keys, metric_key_prefix=prefix)
    metrics = dict(output.metrics)
    metrics.update(_speed(hooks, prefix, start, output.num_samples))
    hooks.control = hooks.callback_handler.on_predict(hooks.args, hooks.state, hooks.control, metrics=metrics)
    return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=metrics)


def _speed(hooks: TrainerHooks, prefix: str, start: float, num_samples: int) -> dict[str, float]:
    batch = hooks.args.eval_batch_size * hooks.runtime.data_parallel_size
    return speed_metrics(prefix, start, num_samples=num_samples, num_steps=-(-num_samples // batch))


def evaluation_loop(
    hooks: TrainerHooks,
    dataloader: Any,
    description: str,
    prediction_loss_only: bool | None,
    ignore_keys: list[str] | None,
    metric_key_prefix: str,
) -> EvalLoopOutput:
    """Evaluate ``dataloader``; see the module docstring for what is kept and where."""
    args = hooks.args
    check_compute_metrics(hooks.compute_metrics, args.batch_eval_metrics)
    if prediction_loss_only is None:
        prediction_loss_only = args.prediction_loss_only
    model = model_for_evaluation(hooks)
    model.eval()
    if has_train_eval_modes(getattr(hooks.optimizer, "optimizer", hooks.optimizer)):
        hooks.optimizer.eval()  # schedule-free optimizers evaluate with their averaged weights
    hooks.callback_handler.eval_dataloader = dataloader
    run = _EvalRun(hooks, dataloader, description, prediction_loss_only)
    # Under fp16/bf16 the forward runs in the autocast it trains in and returns float32 outputs, also before
    # training, when Accelerate has not wrapped the model's forward yet (as the reference, which prepares the model
    # for evaluation): compute_loss overrides and compute_loss_func see what they see in training. A *_full_eval
    # copy already has its dtype.
    as_trained = hooks.precision.eval_dtype is None
    with hooks.precision.as_prepared(model) if as_trained else contextlib.nullcontext():
        for step, (item, is_last) in enumerate(_with_last(dataloader)):
            hooks.heartbeat.beats += 1  # step_timeout's progress counter
            run.step(model, step, item, is_last, ignore_keys)
            hooks.control = hooks.callback_handler.on_prediction_step(args, hooks.state, hooks.control)
    return run.finish(metric_key_prefix)


def model_for_evaluation(hooks: TrainerHooks) -> torch.nn.Module:
    """The training wrapper during training; a half-precision copy with ``*_full_eval``; else the model
    (compiled, with ``torch_compile``, as training compiles it)."""
    copy = hooks.precision.evaluation_copy(model_utils.unwrap(hooks.model))
    if copy is not None:
        return copy
    if hooks.is_in_train or hooks.model_wrapped is not hooks.model:
        return hooks.model_wrapped
    return hooks.runtime.compiled(hooks.model)


def prediction_step(
    hooks: TrainerHooks, model: torch.nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
    ignore_keys: list[str] | None,
) -> tuple[torch.Tensor | None, Any, Any]:
    """(loss, logits, labels) of one batch, without gradients; the loss when the batch has every label."""
    label_names = hooks.label_names
    has_labels = bool(label_names) and all(inputs.get(k) is not None for k in label_names)
    return_loss = inputs.get("return_loss", None)
    if return_loss is None:
        return_loss = hooks.can_return_loss
    with_loss = has_labels or (not label_names and bool(return_loss))
    inputs = hooks._prepare_inputs(inputs)
    if ignore_keys is None:
        config = getattr(model_utils.unwrap(model), "config", None)
        ignore_keys = list(getattr(config, "keys_to_ignore_at_inference", ["past_key_values"])) if config else []
    labels = None
    if with_loss:
        labels = tuple(inputs.get(name) for name in label_names)
        labels = labels[0] if len(labels) == 1 else (labels or None)
    with torch.no_grad():
        if with_loss:
            with hooks.compute_loss_context_manager():
                loss, outputs = hooks.compute_loss(model, inputs, return_outputs=True)
            loss = loss.detach().mean()
            logits = model_utils.output_items(outputs, ignore_keys)
            if isinstance(outputs, (tuple, list)):
                logits = logits[1:]
        else:
            loss = None
            logits = model_utils.output_items(model_utils.call_forward(model, inputs), ignore_keys)
    if prediction_loss_only:
        return loss, None, None
    logits = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in logits)
    logits = logits[0] if len(logits) == 1 else (logits or None)
    labels = labels.detach() if isinstance(labels, torch.Tensor) else labels
    return loss, logits, labels


class _EvalRun:
    """The state of one evaluation: accumulators, the device-side stage, per-batch metrics."""

    def __init__(self, trainer: TrainerHooks, dataloader: Any, description: str, loss_only: bool) -> None:
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
        # the samples of a batch, as the loader counts them (a batch may hold several rows per sample)
        self.loader_batch = getattr(dataloader, "batch_size", None)
        self.local = isinstance(self.gather, LocalGatherer)
        self.samples_left = expected

    def step(self, model: torch.nn.Module, step: int, item: Any, is_last: bool, ignore_keys: Any) -> None:
        trainer = self.trainer
        inputs, counts = step_counts(self.dataloader, step, item)
        rows = find_batch_size(inputs) or 0
        self.observed += sum(counts) if counts is not None else rows
        loss, logits, labels = trainer.prediction_step(model, inputs, self.loss_only, ignore_keys=ignore_keys)
        if logits is not None and trainer.preprocess_logits_for_metrics is not None:
            logits = trainer.preprocess_logits_for_metrics(logits, labels)
        # One loss entry per sample, so a short last batch weighs what it holds in the mean.
        losses = None if loss is None else loss.detach().float().reshape(1).repeat(self._samples(rows))
        main = self._metric_inputs(inputs) if self.include_inputs else None
        parts = self.gather([losses, logits, labels, main], counts)
        if self.batch_metrics:
            self._batch_metrics(parts, is_last)
        if not self.keep_outputs:
            parts = [parts[LOSSES], None, None, None]
        self.stage.append(parts)
        if len(self.stage) >= self.flush_every:
            self._flush()

    def _samples(self, rows: int) -> int:
        """The samples of this batch, each one loss entry: the loader's batch size (the dataset's rest on the
        last batch of one process), as the reference counts them, so that a batch of two rows per sample (TRL's
        reward pairs) weighs its samples, not its rows; the batch's rows where the loader has no batch size, or
        the dataset no length (where the reference weighs a short last batch as a full one)."""
        size = self.loader_batch
        if not self.local:  # several processes: the gatherer drops the padding rows of the last batch
            return size or rows
        if not size or self.samples_left is None:  # no length: the last batch's own rows, not a full batch
            return rows
        samples = min(size, self.samples_left)
        self.samples_left -= samples
        return samples if samples > 0 else rows

    def _metric_inputs(self, inputs: Any) -> Any:
        """The model's main input (``main_input_name``; without one, the first tensor that is not a label)."""
        trainer = self.trainer
        if not isinstance(inputs, Mapping):
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
            self.metrics = checked_metrics(result, self.trainer.compute_metrics)

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
            metrics = checked_metrics(trainer.compute_metrics(prediction), trainer.compute_metrics)
        metrics = to_python(dict(metrics))
        if losses is not None and len(losses):
            metrics[f"{prefix}_loss"] = finite_mean(losses, args.logging_nan_inf_filter)
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
    """Every key as ``{prefix}_{key}``, in the reference's order: keys that already carry the prefix (the loss
    among them) keep their places, the others follow, renamed, in their order; a renamed key that is already
    there (``loss`` from ``compute_metrics``) replaces that value in place."""
    out = {k: v for k, v in metrics.items() if k.startswith(f"{prefix}_")}
    for key, value in metrics.items():
        if not key.startswith(f"{prefix}_"):
            out[f"{prefix}_{key}"] = value
    return out
