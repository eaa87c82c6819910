"""Trainer.hyperparameter_search on real Optuna: the best of two learning rates, pruning, storage, resuming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from tests.conftest import make_args
from trainwell import Trainer, TrainerCallback
from trainwell.search import default_compute_objective

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _trainer(out_dir, callbacks=(), **kwargs):
    settings = dict(max_steps=30, per_device_train_batch_size=8, eval_strategy="steps", eval_steps=10,
                    save_strategy="steps", save_steps=10, learning_rate=0.1)
    args = make_args(str(out_dir), **{**settings, **kwargs})
    return Trainer(model_init=lambda: RegressionModel(), args=args, train_dataset=RegressionDataset(length=64),
                   eval_dataset=RegressionDataset(length=32, seed=1), callbacks=list(callbacks))


def _lr_space(trial):
    return {"learning_rate": trial.suggest_categorical("learning_rate", [1e-5, 0.1])}


def test_optuna_finds_the_better_learning_rate(tmp_path):
    trainer = _trainer(tmp_path)
    sampler = optuna.samplers.GridSampler({"learning_rate": [1e-5, 0.1]})
    best = trainer.hyperparameter_search(hp_space=_lr_space, n_trials=2, direction="minimize", backend="optuna",
                                         sampler=sampler)
    assert best.hyperparameters == {"learning_rate": 0.1}
    other = json.loads((tmp_path / f"run-{1 - int(best.run_id)}" / "checkpoint-30" / "trainer_state.json").read_text())
    worse = [h["eval_loss"] for h in other["log_history"] if "eval_loss" in h][-1]
    assert best.objective < worse / 2  # 1e-5 barely moves the model from y = 0
    # each trial is a normal run in its own folder, with its checkpoints and its own trainer_state.json
    for run in ("run-0", "run-1"):
        assert sorted(os.listdir(tmp_path / run)) == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    state = json.loads((tmp_path / f"run-{best.run_id}" / "checkpoint-30" / "trainer_state.json").read_text())
    assert state["is_hyper_param_search"] and state["trial_params"] == {"learning_rate": 0.1}
    assert trainer.hp_search_backend is None  # the Trainer is back to plain training


def test_trial_values_are_cast_to_the_argument_type_and_hp_name_names_the_folder(tmp_path):
    seen = []

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen.append((args.num_train_epochs, args.seed, args.per_device_train_batch_size))

    def space(trial):
        return {"num_train_epochs": trial.suggest_int("num_train_epochs", 1, 1), "seed": 7.0,
                "per_device_train_batch_size": trial.suggest_categorical("bs", [4])}

    trainer = _trainer(tmp_path, callbacks=[Record()], max_steps=-1, eval_strategy="no", save_strategy="epoch")
    trainer.hyperparameter_search(hp_space=space, n_trials=1, hp_name=lambda t: f"trial-{t.number}-bs",
                                  compute_objective=lambda metrics: metrics["eval_loss"])
    assert seen == [(1.0, 7, 4)] and isinstance(seen[0][0], float) and isinstance(seen[0][1], int)
    assert sorted(os.listdir(tmp_path / "trial-0-bs")) == ["checkpoint-16"]  # 64 / 4: one epoch


class CountSteps(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_train_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_a_bad_trial_is_pruned_early(tmp_path):
    counter = CountSteps()
    trainer = _trainer(tmp_path, callbacks=[counter], max_steps=60)
    # the first two trials train well; the third (tiny learning rate) is worse than their median at step 10
    study_trials = iter([0.1, 0.1, 1e-6])
    best = trainer.hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": trial.suggest_float("learning_rate", 1e-6, 0.1, log=True)},
        n_trials=3, direction="minimize", sampler=_QueueSampler(study_trials),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    )
    assert best.hyperparameters["learning_rate"] == 0.1
    assert counter.steps[:2] == [60, 60] and counter.steps[2] == 10  # pruned at its first evaluation


class _QueueSampler(optuna.samplers.RandomSampler):
    """Suggests the learning rates in the given order (Optuna's own samplers would pick them at random)."""

    def __init__(self, values):
        super().__init__(seed=0)
        self.values = values

    def sample_independent(self, study, trial, param_name, param_distribution):
        return next(self.values)


def test_several_directions_give_the_pareto_front(tmp_path):
    def two(metrics):
        return metrics["eval_loss"], -metrics["eval_loss"]

    trainer = _trainer(tmp_path, max_steps=10, eval_steps=10, save_steps=10)
    best = trainer.hyperparameter_search(hp_space=_lr_space, compute_objective=two, n_trials=2,
                                         direction=["minimize", "maximize"],
                                         sampler=optuna.samplers.GridSampler({"learning_rate": [1e-5, 0.1]}))
    assert isinstance(best, list) and best[0].hyperparameters == {"learning_rate": 0.1}
    assert len(best[0].objective) == 2


_KILLED_SEARCH = """
import os, signal, sys
sys.path.insert(0, {root!r})
import optuna
from tests.test_search import _lr_space, _trainer
from trainwell import TrainerCallback

class KillAt(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 20:
            os.kill(os.getpid(), signal.SIGKILL)  # the search dies with its trial RUNNING in the study

_trainer({out!r}, callbacks=[KillAt()]).hyperparameter_search(
    hp_space=_lr_space, n_trials=1, storage={storage!r}, study_name="s", load_if_exists=True,
    sampler=optuna.samplers.GridSampler({{"learning_rate": [0.1]}}))
"""


def test_an_interrupted_study_resumes_its_trial_from_the_checkpoint(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    root = str(Path(__file__).resolve().parents[1])
    code = _KILLED_SEARCH.format(root=root, out=str(tmp_path / "out"), storage=storage)
    killed = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                            timeout=hang_timeout(300))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # the killed trial's lock file stays too (the kernel dropped its lock; the next run takes the file over)
    assert sorted(os.listdir(tmp_path / "out" / "run-0")) == [".trainwell.lock", "checkpoint-10", "checkpoint-20"]
    space = {"learning_rate": [0.1]}

    counter = CountSteps()
    again = _trainer(tmp_path / "out", callbacks=[counter])
    best = again.hyperparameter_search(hp_space=_lr_space, n_trials=1, storage=storage, study_name="s",
                                       load_if_exists=True, sampler=optuna.samplers.GridSampler(space))
    assert best.run_id == "1" and best.hyperparameters == {"learning_rate": 0.1}
    # the queued trial trained in run-0 from checkpoint-20: 10 more steps, not 30
    assert sorted(os.listdir(tmp_path / "out" / "run-0"))[-1] == "checkpoint-30"
    assert not (tmp_path / "out" / "run-1").exists()
    state = json.loads((tmp_path / "out" / "run-0" / "checkpoint-30" / "trainer_state.json").read_text())
    assert [h["step"] for h in state["log_history"] if "eval_loss" in h] == [10, 20, 30]
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]


def test_errors_name_the_fix(tmp_path):
    plain = Trainer(model=RegressionModel(), args=make_args(str(tmp_path)), train_dataset=RegressionDataset())
    with pytest.raises(RuntimeError, match="model_init"):
        plain.hyperparameter_search(n_trials=1)
    trainer = _trainer(tmp_path)
    with pytest.raises(ValueError, match="'optuna' or 'ray'"):
        trainer.hyperparameter_search(backend="hyperopt")
    with pytest.raises(NotImplementedError, match="W&B sweeps"):
        trainer.hyperparameter_search(backend="wandb")
    with pytest.raises(ValueError, match="'minimize' or 'maximize'"):
        trainer.hyperparameter_search(direction="down")
    with pytest.raises(ValueError, match="bf16, which the Trainer fixed"):
        trainer.hyperparameter_search(hp_space=lambda t: {"bf16": True}, n_trials=1)


def test_default_objective_is_the_reference_one():
    assert default_compute_objective({"eval_loss": 0.5, "epoch": 1.0, "eval_runtime": 2.0}) == 0.5
    assert default_compute_objective({"eval_loss": 0.5, "eval_acc": 0.75, "eval_f1": 0.25,
                                      "eval_samples_per_second": 9.0}) == 1.0


def test_ray_tune_finds_the_better_learning_rate(tmp_path):
    ray = pytest.importorskip("ray")
    tune = pytest.importorskip("ray.tune")
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    # a prepared loader left mid-iteration earlier in this process leaves a weak reference in Accelerate's
    # process-wide state (as earlier tests do in a full run): the Trainer must still travel to Ray's workers
    live_loader = iter(Accelerator(cpu=True).prepare_data_loader(DataLoader(list(range(4)))))
    next(live_loader)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        trainer = _trainer(tmp_path / "out")
        best = trainer.hyperparameter_search(
            hp_space=lambda _: {"learning_rate": tune.grid_search([1e-5, 0.1])}, n_trials=1, backend="ray",
            storage_path=str(tmp_path / "ray"), verbose=0,
        )
    finally:
        ray.shutdown()
    assert best.hyperparameters == {"learning_rate": 0.1}
    results = best.run_summary.results  # Ray's ExperimentAnalysis, as in the reference
    objectives = sorted(result["objective"] for result in results.values())
    assert best.objective == objectives[0] < objectives[1] / 2
    # each trial trained as a normal run in its own folder, and reported at each evaluation with a checkpoint
    assert sorted(os.listdir(tmp_path / "out" / f"run-{best.run_id}")) == [
        "checkpoint-10", "checkpoint-20", "checkpoint-30"]
    assert trainer.model is not None and trainer.hp_search_backend is None  # the Trainer is whole again
    assert trainer.runtime is not None and trainer.accelerator is trainer.runtime.accelerator
    del live_loader


def test_ray_errors_name_the_fix(tmp_path):
    pytest.importorskip("ray.tune")
    from ray.tune.schedulers import ASHAScheduler

    trainer = _trainer(tmp_path, eval_strategy="no")
    with pytest.raises(RuntimeError, match="Scheduler.*eval_strategy='steps'"):
        trainer.hyperparameter_search(backend="ray", scheduler=ASHAScheduler(metric="objective", mode="min"))
    with pytest.raises(ValueError, match="Ray Tune optimizes one objective"):
        trainer.hyperparameter_search(backend="ray", direction=["minimize", "maximize"])


def test_a_missing_backend_names_the_install(tmp_path, monkeypatch):
    import trainwell.search as search

    monkeypatch.setattr(search, "_installed", lambda module: False)
    trainer = _trainer(tmp_path)
    with pytest.raises(ImportError, match="pip install optuna"):
        trainer.hyperparameter_search(backend="optuna")
    with pytest.raises(ImportError, match=r"pip install 'ray\[tune\]'"):
        trainer.hyperparameter_search(backend="ray")
    with pytest.raises(RuntimeError, match=r"none is installed: pip install optuna \(or pip install 'ray\[tune\]'\)"):
        trainer.hyperparameter_search()
