"""Ray Tune behind ``hyperparameter_search``: the engine to move to when trials outgrow one machine.

Owns the run (``ray.tune.run`` with the search's extra keyword arguments, one CPU per trial unless
``resources_per_trial`` says otherwise, and a progress table of the objective), the trainable (the Trainer,
pickled without its model, trains one trial per Ray worker from ``model_init``), the reports (the objective and
metrics after each evaluation, with a checkpoint when the run saves there, so Ray's schedulers can stop,
pause and resume trials) and the best run. As in the reference, the trial's ``config`` is its hyperparameters
and ``RAY_SCOPE`` (default ``last``) picks which report of each trial is compared.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from trainwell.backend import runtime as wiring_runtime
from trainwell.outputs import PREFIX_CHECKPOINT_DIR, BestRun


def run(trainer: Any, n_trials: int, direction: str | list[str], **kwargs: Any) -> BestRun:
    import ray.tune

    if isinstance(direction, list):
        raise ValueError("hyperparameter_search with Ray Tune optimizes one objective: pass direction='minimize' or "
                         "'maximize' (Optuna handles several).")
    _check_scheduler(trainer, kwargs.get("scheduler"))
    kwargs.setdefault("resources_per_trial", {"cpu": 1, **({"gpu": 1} if trainer.args.n_gpu > 0 else {})})
    if "progress_reporter" not in kwargs:
        kwargs["progress_reporter"] = ray.tune.CLIReporter(metric_columns=["objective"])
    # The Trainer travels to Ray's workers pickled: without its model (each trial builds one with model_init) and
    # without callbacks that hold open writers; both come back when the search ends.
    # and without its runtime (Accelerate's process-wide state, weak references to live loaders among it), which
    # each worker builds for itself from the arguments.
    model, wrapped = trainer.model, trainer.model_wrapped
    unpicklable = [cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == "TensorBoardCallback"]
    for callback in unpicklable:
        trainer.remove_callback(callback)
    trainer.model = trainer.model_wrapped = None
    local = {name: trainer.__dict__.pop(name) for name in wiring_runtime.RUNTIME_ATTRIBUTES}
    try:
        trainable = ray.tune.with_parameters(_objective, local_trainer=trainer)
        analysis = ray.tune.run(trainable, config=trainer.hp_space(None), num_samples=n_trials, **kwargs)
    finally:
        trainer.__dict__.update(local)
        trainer.model, trainer.model_wrapped = model, wrapped
        for callback in unpicklable:
            trainer.add_callback(callback)
    best = analysis.get_best_trial(metric="objective", mode=direction[:3], scope=os.getenv("RAY_SCOPE", "last"))
    return BestRun(best.trial_id, best.last_result["objective"], best.config, analysis)


def _objective(config: dict[str, Any], local_trainer: Any) -> None:
    """One trial on a Ray worker: train (from Ray's checkpoint when Ray restarts the trial), then report."""
    import ray.tune

    if "runtime" not in local_trainer.__dict__:
        wiring_runtime.attach_runtime(local_trainer)
    local_trainer.objective = None
    checkpoint = ray.tune.get_checkpoint()
    if checkpoint:
        # A restarted trial whose training is already complete would otherwise evaluate and report again.
        local_trainer.objective = "objective"
        with checkpoint.as_directory() as folder:
            path = next(Path(folder).glob(f"{PREFIX_CHECKPOINT_DIR}*")).as_posix()
            local_trainer.train(resume_from_checkpoint=path, trial=config)
    else:
        local_trainer.train(trial=config)
    if local_trainer.objective is None:  # training never evaluated: evaluate once and report it
        metrics = local_trainer.evaluate()
        local_trainer.objective = local_trainer.compute_objective(metrics)
        metrics.update({"objective": local_trainer.objective, "done": True})
        with tempfile.TemporaryDirectory() as folder:
            local_trainer._tune_save_checkpoint(checkpoint_dir=folder)
            ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(folder))


def report(trainer: Any, trial: Any, step: int, metrics: dict[str, float]) -> None:
    """Report an evaluation's metrics and objective to Ray, with a checkpoint when the run saves at this step."""
    import ray.tune

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if trainer.control.should_save:
            trainer._tune_save_checkpoint(checkpoint_dir=folder)
            checkpoint = ray.tune.Checkpoint.from_directory(folder)
        ray.tune.report({**metrics, "objective": trainer.objective}, checkpoint=checkpoint)


def run_name(trainer: Any, trial: Any) -> str:
    import ray.tune

    return trainer.hp_name(trial) if trainer.hp_name is not None else f"run-{ray.tune.get_context().get_trial_id()}"


def _check_scheduler(trainer: Any, scheduler: Any) -> None:
    """Schedulers that act on intermediate reports have none to act on without evaluation during training."""
    from ray.tune.schedulers import ASHAScheduler, HyperBandForBOHB, MedianStoppingRule, PopulationBasedTraining

    if not isinstance(scheduler, (ASHAScheduler, MedianStoppingRule, HyperBandForBOHB, PopulationBasedTraining)):
        return
    if trainer.args.eval_strategy == "no":
        raise RuntimeError(
            f"The Ray Tune scheduler {type(scheduler).__name__} stops and compares trials on the results they report "
            "during training, but eval_strategy='no' reports none: set eval_strategy='steps' (or 'epoch'), or use "
            "another scheduler."
        )
