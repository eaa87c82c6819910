"""Optuna behind ``hyperparameter_search``.

Owns the study (``optuna.create_study`` with the search's extra keyword arguments; ``timeout``, ``n_jobs``,
``gc_after_trial`` and ``catch`` go to ``Study.optimize``), the objective (one ``Trainer.train`` per trial, then
an evaluation when training did not evaluate), pruning (the objective of each evaluation is reported; a trial
Optuna prunes ends with ``optuna.TrialPruned`` after ``on_train_end``), and the best run(s).

Beyond the reference: a study kept in storage (``storage="sqlite:///..."``, ``load_if_exists=True``) that was
interrupted has trials left RUNNING. They are marked failed and queued again with their hyperparameters and
folder, and run first, resuming from the last checkpoint in that folder instead of starting over.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trainwell.args.storage import local_output_dir
from trainwell.checkpoint.resume import get_last_checkpoint
from trainwell.outputs import BestRun

logger = logging.getLogger(__name__)

FOLDER = "trainwell_run_name"  # user attribute: the trial's folder under output_dir
RESUMES = "trainwell_resumes"  # user attribute of a queued trial: the folder of the interrupted trial it continues


def run(trainer: Any, n_trials: int, direction: str | list[str], **kwargs: Any) -> BestRun | list[BestRun]:
    import optuna

    if trainer.runtime.num_processes > 1:
        raise NotImplementedError(
            "hyperparameter_search with optuna runs in one process in trainwell: launch the search without "
            "torchrun/accelerate, or give each trial several processes through Ray Tune's resources_per_trial."
        )
    optimize = {key: kwargs.pop(key) for key in ("timeout", "n_jobs", "gc_after_trial", "catch") if key in kwargs}
    directions = direction if isinstance(direction, list) else None
    study = optuna.create_study(direction=None if directions else direction, directions=directions, **kwargs)
    _requeue_interrupted(study)

    def objective(trial: Any) -> Any:
        trainer.objective = None
        name = run_name(trainer, trial)
        trial.set_user_attr(FOLDER, name)
        checkpoint = None
        if trial.user_attrs.get(RESUMES):
            checkpoint = get_last_checkpoint(os.path.join(local_output_dir(trainer.args), name))
            logger.info("Trial %d continues the interrupted trial in %s from %s.", trial.number, name, checkpoint)
        trainer.train(resume_from_checkpoint=checkpoint, trial=trial)
        if trainer.objective is None:  # training never evaluated
            trainer.objective = trainer.compute_objective(trainer.evaluate())
        return trainer.objective

    study.optimize(objective, n_trials=n_trials, **optimize)
    if directions is None:
        best = study.best_trial
        return BestRun(str(best.number), best.value, best.params)
    return [BestRun(str(best.number), best.values, best.params) for best in study.best_trials]


def report(trainer: Any, trial: Any, step: int, metrics: dict[str, float]) -> None:
    """Report the objective of an evaluation; raise ``optuna.TrialPruned`` when Optuna prunes the trial."""
    import optuna

    study = getattr(trial, "study", None)  # an optuna.Trial; a FixedTrial has no study and nothing to report to
    if study is None or len(study.directions) > 1:  # Optuna does not prune multi-objective studies
        return
    trial.report(trainer.objective, step)
    if trial.should_prune():
        trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
        raise optuna.TrialPruned(f"pruned at step {step} (objective {trainer.objective})")


def run_name(trainer: Any, trial: Any) -> str:
    attrs = getattr(trial, "user_attrs", {})
    if attrs.get(RESUMES):
        return attrs[RESUMES]
    return trainer.hp_name(trial) if trainer.hp_name is not None else f"run-{trial.number}"


def _requeue_interrupted(study: Any) -> None:
    """Mark the RUNNING trials of a loaded study (left by a killed search) failed, and queue them again."""
    from optuna.trial import TrialState

    for stale in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        folder = stale.user_attrs.get(FOLDER)
        # through the storage, not Study.tell: tell runs the sampler's after_trial, which may stop the study
        study._storage.set_trial_state_values(stale._trial_id, state=TrialState.FAIL)
        study.enqueue_trial(stale.params, user_attrs={RESUMES: folder} if folder else None,
                            skip_if_exists=False)
        logger.warning("Trial %d of study %r was interrupted: it runs again%s.", stale.number, study.study_name,
                       f", resuming from its checkpoints in {folder}" if folder else "")
