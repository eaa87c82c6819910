"""What happens at a step or epoch boundary: log, then evaluate, then save, as the control flags say.

Owns the default bodies of the Trainer's ``log``, ``_maybe_log_save_evaluate``, ``_evaluate`` and
``_determine_best_metric``: the training loss averaged over the steps since the last log (summed over
processes: one collective, at log steps only), the evaluation during training (with a metric-driven
scheduler stepped on its metric), the best metric and step, ``save_strategy="best"``, and the checkpoint.
Every action goes through the Trainer's hooks (``log``, ``evaluate``, ``_save_checkpoint``...), so subclass
overrides are honoured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainwell.backend.runtime import mean_loss_sum
from trainwell.events.monitor import greater_is_better, is_improvement, metric_key
from trainwell.loop.metric_checks import is_metric_number
from trainwell.optim.schedulers import steps_on_metrics
from trainwell.utils import batch_size
from trainwell.utils.errors import short_repr
from trainwell.utils.metrics import speed_metrics

if TYPE_CHECKING:
    from trainwell.hooks import TrainerHooks
    from trainwell.loop.progress import LossTracker


def log(hooks: TrainerHooks, logs: dict[str, float], start_time: float | None = None) -> None:
    """Add ``epoch`` (and the token counts) to ``logs``, record a copy with ``step`` in ``state.log_history``
    and fire ``on_log`` with ``logs``.

    As with the reference, the caller's dict is updated in place: what ``evaluate()`` returns, and what a
    subclass that logs its own metrics returns (the example scripts' ``QuestionAnsweringTrainer``), carries
    the ``epoch`` it was logged with.
    """
    state, run = hooks.state, hooks.training_run
    if state.epoch is not None:
        logs["epoch"] = state.epoch
    if hooks.args.include_num_input_tokens_seen != "no":
        if run is not None:
            run.flush_tokens(hooks)
        logs["num_input_tokens_seen"] = state.num_input_tokens_seen
        if start_time is not None and run is not None:
            seen = state.num_input_tokens_seen - run.initial_tokens_seen
            logs.update(speed_metrics("train", start_time, num_tokens=seen))
    state.log_history.append({**logs, "step": state.global_step})
    # the log-time features (the live log, rollback_on_spike's watch) are callbacks the wiring adds
    hooks.control = hooks.callback_handler.on_log(hooks.args, state, hooks.control, logs)


def maybe_log_save_evaluate(
    hooks: TrainerHooks, tr_loss: LossTracker, grad_norm: Any, model: Any, trial: Any,
    ignore_keys_for_eval: Any, start_time: float, learning_rate: float | None = None,
) -> None:
    """Log the loss since the last log, evaluate, then save, each when its control flag is set."""
    control, state = hooks.control, hooks.state
    run = hooks.training_run
    throughput = run.throughput  # log_throughput's window in progress
    applier = run.applier  # skip_nonfinite_steps: its count joins the log's one read
    if control.should_log and state.global_step > tr_loss.last_logged_step:
        loss_sum, grad_norm, skips = tr_loss.read_window(lambda total: mean_loss_sum(hooks.runtime, total), grad_norm,
                                                         applier.unread())
        tr_loss.add_logged(loss_sum)
        logs: dict[str, float] = {"loss": loss_sum / (state.global_step - tr_loss.last_logged_step)}
        if grad_norm is not None:
            logs["grad_norm"] = grad_norm
        if learning_rate is not None:
            logs["learning_rate"] = learning_rate
        skipped = applier.settle(skips, for_log=True)
        if skipped:
            logs["skipped_nonfinite_steps"] = skipped
        logs.update(throughput.take())  # log_throughput's figures (none when it is off)
        tr_loss.last_logged_step = state.global_step
        hooks.store_flos()
        hooks.log(logs, start_time)
    if not (hooks.control.should_evaluate or hooks.control.should_save):
        return  # most steps
    # evaluating and saving is not training time for log_throughput
    with throughput.paused():
        if hooks.control.should_evaluate:
            metrics = hooks._evaluate(trial, ignore_keys_for_eval)
            is_new_best = hooks._determine_best_metric(metrics, trial)
            if hooks.args.save_strategy == "best":
                hooks.control.should_save = is_new_best
        if hooks.control.should_save:
            applier.settle_now()  # skipped steps move the schedule back before it is saved (docs/resilience.md)
            hooks.heartbeat.beats += 1  # step_timeout: a save is progress, at its start and at its end
            hooks._save_checkpoint(model, trial)
            hooks.heartbeat.beats += 1
            hooks.control = hooks.callback_handler.on_save(hooks.args, hooks.state, hooks.control)


def evaluate_in_training(hooks: TrainerHooks, ignore_keys_for_eval: Any, skip_scheduler: bool) -> dict[str, float]:
    """``evaluate()`` during training; a metric-driven scheduler (plateau) then steps on the chosen metric."""
    args = hooks.args
    try:
        metrics = hooks.evaluate(ignore_keys=ignore_keys_for_eval)
    except RuntimeError as err:  # an evaluation that runs out of memory is no reason to shrink the training batch
        if args.auto_find_batch_size and batch_size.is_out_of_memory(err):
            raise batch_size.eval_out_of_memory(err) from err
        raise
    if steps_on_metrics(hooks.lr_scheduler) and not skip_scheduler and args.metric_for_best_model:
        hooks.lr_scheduler.step(_metric(metrics, metric_key(args)))
    return metrics


def determine_best_metric(hooks: TrainerHooks, metrics: dict[str, float]) -> bool:
    """Update ``best_metric``/``best_global_step``; True when this evaluation is the best so far."""
    args, state = hooks.args, hooks.state
    if args.metric_for_best_model is None:
        return False
    value = float(_metric(metrics, metric_key(args), args.metric_for_best_model))
    if is_improvement(value, state.best_metric, greater_is_better(args)):
        state.best_metric = value
        state.best_global_step = state.global_step
        return True
    return False


def _metric(metrics: dict[str, Any], key: str, name: str | None = None) -> Any:
    """``metrics[key]``: a KeyError naming metric_for_best_model and the metrics produced when it is missing, a
    TypeError when it is not a number."""
    shown = f"metric_for_best_model={name!r}" if name else f"metric_for_best_model (as {key!r})"
    bare = key[len("eval_"):] if key.startswith("eval_") else key
    if key not in metrics:
        raise KeyError(
            f"{shown}: the evaluation produced no {key!r}; it produced {', '.join(sorted(metrics)) or 'nothing'}. "
            f"Set metric_for_best_model to one of those (the 'eval_' prefix is optional), or return {bare!r} from "
            "compute_metrics."
        )
    value = metrics[key]
    if not is_metric_number(value):
        raise TypeError(
            f"{shown}: the evaluation's {key!r} is {short_repr(value, 60)} ({type(value).__name__}), but the best "
            f"model is chosen by comparing numbers. Return a number for {bare!r} from compute_metrics, or choose "
            "another metric_for_best_model."
        )
    return value
