"""Hyperparameter search: ``Trainer.hyperparameter_search`` on Optuna and Ray Tune.

Owns what happens around the trials, as in the reference: the backend (optuna when installed, else Ray Tune; a
missing one names its ``pip install``), the default search spaces and objective, a trial's hyperparameters
applied to the arguments (cast to each argument's type, then validated), the trial's folder (``run-{id}`` or
``hp_name(trial)`` under ``output_dir``) and the objective reported after each evaluation (Optuna prunes
there). Each backend's loop lives in its module (``optuna_backend``, ``ray_backend``), imported only when used.

Every trial is a normal ``train()`` writing normal checkpoints into its folder, so its curves open in
``trainwell report`` and an interrupted Optuna search resumes its unfinished trials from them.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

from trainwell.args.storage import local_output_dir
from trainwell.outputs import BestRun, ExplicitEnum, enum_value
from trainwell.utils.packages import installed as _installed
from trainwell.utils.packages import is_optuna_available, is_ray_available, is_ray_tune_available  # noqa: F401

logger = logging.getLogger(__name__)


class HPSearchBackend(ExplicitEnum):
    OPTUNA = "optuna"
    RAY = "ray"
    WANDB = "wandb"


# backend -> (module to check, what to pip install, trainwell module that runs it)
_BACKENDS = {
    HPSearchBackend.OPTUNA: ("optuna", "optuna", "trainwell.search.optuna_backend"),
    HPSearchBackend.RAY: ("ray.tune", "'ray[tune]'", "trainwell.search.ray_backend"),
}
# Arguments that shape the Trainer's runtime when it is built (devices, precision, engines): a trial cannot change
# them, since every trial shares that runtime. Searching over one is an error instead of a silent no-op.
FIXED_AT_CONSTRUCTION = frozenset({
    "bf16", "fp16", "tf32", "use_cpu", "fsdp", "fsdp_config", "deepspeed", "torch_compile", "torch_compile_backend",
    "torch_compile_mode", "accelerator_config", "ddp_backend", "output_dir", "report_to", "push_to_hub",
})


def default_hp_search_backend() -> str:
    """``"optuna"`` when installed, else ``"ray"``; an error naming the installs when neither is."""
    for backend, (module, _, _) in _BACKENDS.items():
        if _installed(module):
            return backend.value
    raise RuntimeError(
        "hyperparameter_search needs a search backend and none is installed: pip install optuna "
        "(or pip install 'ray[tune]')."
    )


def resolve_backend(backend: str | HPSearchBackend | None) -> HPSearchBackend:
    """The backend to run: checked against the known ones and installed, each failure naming the fix."""
    name = default_hp_search_backend() if backend is None else enum_value(backend)
    try:
        chosen = HPSearchBackend(name)
    except ValueError:
        raise ValueError(
            f"hyperparameter_search(backend={backend!r}): use 'optuna' or 'ray' (or leave it unset)."
        ) from None
    if chosen is HPSearchBackend.WANDB:
        raise NotImplementedError(
            "hyperparameter_search(backend='wandb'): W&B sweeps run on the W&B service, which trainwell does not "
            "drive; use backend='optuna' or 'ray' (both run locally, and W&B can still log each trial)."
        )
    module, pip, _ = _BACKENDS[chosen]
    if not _installed(module):
        raise ImportError(f"hyperparameter_search(backend='{chosen.value}') needs {module}: pip install {pip}")
    return chosen


def default_compute_objective(metrics: dict[str, float]) -> float:
    """The evaluation loss when the evaluation has no other metric, else the sum of its metrics (the reference's
    default; speed metrics and ``epoch`` are left out)."""
    rest = {k: v for k, v in metrics.items()
            if k not in ("eval_loss", "epoch") and not k.endswith(("_runtime", "_per_second"))}
    return metrics.get("eval_loss") if not rest else sum(rest.values())


def default_hp_space_optuna(trial: Any) -> dict[str, Any]:
    """The reference's default Optuna space: learning rate, epochs, seed and batch size."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16, 32, 64]),
    }


def default_hp_space_ray(trial: Any) -> dict[str, Any]:
    """The reference's default Ray Tune space (the same four hyperparameters)."""
    from ray import tune

    return {
        "learning_rate": tune.loguniform(1e-6, 1e-4),
        "num_train_epochs": tune.choice(list(range(1, 6))),
        "seed": tune.uniform(1, 40),
        "per_device_train_batch_size": tune.choice([4, 8, 16, 32, 64]),
    }


_DEFAULT_SPACES = {HPSearchBackend.OPTUNA: default_hp_space_optuna, HPSearchBackend.RAY: default_hp_space_ray}


def check_direction(direction: str | list[str]) -> None:
    directions = direction if isinstance(direction, list) else [direction]
    bad = [d for d in directions if d not in ("minimize", "maximize")]
    if bad or not directions:
        raise ValueError(
            f"hyperparameter_search(direction={direction!r}): each direction is 'minimize' or 'maximize' (a list of "
            "them for several objectives)."
        )


def search(trainer: Any, hp_space: Any, compute_objective: Any, n_trials: int, direction: str | list[str],
           backend: str | HPSearchBackend | None, hp_name: Any, kwargs: dict[str, Any]) -> BestRun | list[BestRun]:
    """``Trainer.hyperparameter_search``: run ``n_trials`` trials and return the best (one per Pareto-optimal
    trial for several directions)."""
    chosen = resolve_backend(backend)
    if trainer.model_init is None:
        raise RuntimeError(
            "hyperparameter_search needs the model passed as model_init (a function returning a fresh model), so "
            "that each trial starts from new weights: Trainer(model_init=..., ...)."
        )
    check_direction(direction)
    if not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"hyperparameter_search(n_trials={n_trials!r}): pass a positive integer.")
    trainer.hp_search_backend = chosen
    trainer.hp_space = _DEFAULT_SPACES[chosen] if hp_space is None else hp_space
    trainer.hp_name = hp_name
    trainer.compute_objective = default_compute_objective if compute_objective is None else compute_objective
    try:
        return importlib.import_module(_BACKENDS[chosen][2]).run(trainer, n_trials, direction, **kwargs)
    finally:
        trainer.hp_search_backend = None


def trial_params(trainer: Any, trial: Any) -> dict[str, Any]:
    """The hyperparameters a trial assigns: the space evaluated on an Optuna trial, or Ray's config dict."""
    if trainer.hp_search_backend is HPSearchBackend.OPTUNA:
        return trainer.hp_space(trial)
    return {k: v for k, v in dict(trial).items() if k != "wandb"}


def apply_trial(trainer: Any, trial: Any) -> None:
    """``Trainer._hp_search_setup``: set the trial's hyperparameters on ``trainer.args``.

    Each value is cast to the type of the argument's current value (a search space may give ``3.0`` for an int
    argument), an unknown name warns and is skipped (as in the reference), an argument fixed when the Trainer was
    built is an error, and the arguments are validated again.
    """
    if trainer.hp_search_backend is None or trial is None:
        return
    from trainwell.args import validate

    args = trainer.args
    params = trial_params(trainer, trial)
    fixed = sorted(FIXED_AT_CONSTRUCTION & set(params))
    if fixed:
        raise ValueError(
            f"The search space sets {', '.join(fixed)}, which the Trainer fixed when it was built (devices, "
            "precision, engines, output): search over them with one Trainer per value instead."
        )
    for key, value in params.items():
        if not hasattr(args, key):
            logger.warning("The search space sets %r, which is not a TrainingArguments field: skipped.", key)
            continue
        current = getattr(args, key)
        setattr(args, key, _cast(value, current))
    validate.validate_args(args)
    trainer._train_batch_size = args.train_batch_size
    logger.info("Trial: %s", params)


def _cast(value: Any, current: Any) -> Any:
    if current is None or isinstance(value, type(current)):
        return value
    if isinstance(current, bool):
        return str(value).lower() in ("1", "true", "yes") if isinstance(value, str) else bool(value)
    return type(current)(value)


def report(trainer: Any, trial: Any, step: int, metrics: dict[str, float]) -> None:
    """``Trainer._report_to_hp_search``: compute the objective and hand it to the backend (which may prune)."""
    if trainer.hp_search_backend is None or trial is None:
        return
    trainer.objective = trainer.compute_objective(dict(metrics))
    importlib.import_module(_BACKENDS[trainer.hp_search_backend][2]).report(trainer, trial, step, dict(metrics))


def output_dir(trainer: Any, trial: Any) -> str:
    """``Trainer._get_output_dir``: ``output_dir``, or a search trial's folder under it (:func:`run_name`)."""
    name = run_name(trainer, trial)
    local = local_output_dir(trainer.args)
    return local if name is None else os.path.join(local, name)


def run_name(trainer: Any, trial: Any) -> str | None:
    """The trial's folder name under ``output_dir``: ``hp_name(trial)``, else ``run-{trial id}`` (None outside a
    search; a resumed Optuna trial keeps the folder of the trial it resumes)."""
    if trainer.hp_search_backend is None or trial is None:
        return None
    return importlib.import_module(_BACKENDS[trainer.hp_search_backend][2]).run_name(trainer, trial)
