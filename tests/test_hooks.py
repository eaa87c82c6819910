"""The Trainer's hook contract (``trainwell.hooks.TrainerHooks``): every hook a subclass overrides is called,
and the loops reach the Trainer through nothing else."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import trainwell
from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.hooks import TrainerHooks, hook_methods

TRAIN, EVALUATE, PREDICT, RESUME = "train", "evaluate", "predict", "resume"

# Where each hook must be called. A hook added to the contract without a row here fails
# test_every_hook_has_a_scenario, so the list cannot silently fall behind.
SCENARIOS: dict[str, tuple[str, ...]] = {
    "get_train_dataloader": (TRAIN, RESUME),
    "set_initial_training_values": (TRAIN, RESUME),
    "num_examples": (TRAIN,),
    "get_total_train_batch_size": (TRAIN,),
    "get_num_trainable_parameters": (TRAIN,),
    "call_model_init": (TRAIN, RESUME),
    "create_optimizer": (TRAIN, RESUME),
    "create_scheduler": (TRAIN, RESUME),
    "training_step": (TRAIN, RESUME),
    "compute_loss": (TRAIN, EVALUATE, PREDICT, RESUME),
    "compute_loss_context_manager": (TRAIN, EVALUATE, PREDICT),
    "autocast_smart_context_manager": (TRAIN, EVALUATE),
    "_prepare_inputs": (TRAIN, EVALUATE, PREDICT),
    "floating_point_ops": (TRAIN,),
    "store_flos": (TRAIN,),
    "_get_learning_rate": (TRAIN,),
    "log": (TRAIN, EVALUATE),
    "_maybe_log_save_evaluate": (TRAIN, RESUME),
    "_evaluate": (TRAIN,),
    "_determine_best_metric": (TRAIN,),
    "_load_best_model": (TRAIN,),
    "evaluate": (TRAIN, EVALUATE),
    "get_eval_dataloader": (TRAIN, EVALUATE),
    "get_test_dataloader": (PREDICT,),
    "evaluation_loop": (TRAIN, EVALUATE, PREDICT),
    "prediction_step": (TRAIN, EVALUATE, PREDICT),
    "_save_checkpoint": (TRAIN, RESUME),
    "_get_output_dir": (TRAIN,),
    "save_model": (TRAIN,),
    "_save": (TRAIN,),
    "_save_optimizer_and_scheduler": (TRAIN,),
    "_save_scaler": (TRAIN,),
    "_save_rng_state": (TRAIN,),
    "_load_from_checkpoint": (RESUME,),
    "_load_optimizer_and_scheduler": (RESUME,),
    "_load_scaler": (RESUME,),
    "_load_rng_state": (RESUME,),
    "_load_callback_state": (RESUME,),
    "_finish_current_push": (TRAIN,),
    "is_local_process_zero": (TRAIN,),
    "is_world_process_zero": (TRAIN,),
}


def test_every_hook_has_a_scenario():
    assert set(SCENARIOS) == set(hook_methods())


def test_every_hook_is_a_trainer_method_with_the_contract_signature():
    for name in hook_methods():
        contract = inspect.signature(getattr(TrainerHooks, name))
        actual = inspect.signature(getattr(Trainer, name))
        assert list(actual.parameters) == list(contract.parameters), name


def _args(out_dir, max_steps=4):
    return make_args(
        out_dir, max_steps=max_steps, per_device_train_batch_size=8, gradient_accumulation_steps=2, logging_steps=1,
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, load_best_model_at_end=True,
        metric_for_best_model="loss", restore_callback_states_from_checkpoint=True,
    )


def _run(trainer_cls, scenario, out_dir):
    data = {"train_dataset": RegressionDataset(length=32), "eval_dataset": RegressionDataset(length=32)}
    if scenario == RESUME:
        Trainer(model_init=lambda: RegressionModel(), args=_args(out_dir), **data).train()
        trainer = trainer_cls(model_init=lambda: RegressionModel(), args=_args(out_dir, max_steps=6), **data)
        trainer.train(resume_from_checkpoint=True)
        assert trainer.state.global_step == 6
        return
    trainer = trainer_cls(model_init=lambda: RegressionModel(), args=_args(out_dir), **data)
    if scenario == TRAIN:
        trainer.train()
    elif scenario == EVALUATE:
        trainer.evaluate()
    else:
        trainer.predict(RegressionDataset(length=8))


@pytest.mark.parametrize(("hook", "scenario"), [(h, s) for h, scenarios in SCENARIOS.items() for s in scenarios])
def test_an_override_of_each_hook_is_called(hook, scenario, out_dir):
    calls = []
    original = getattr(Trainer, hook)

    def override(self, *args, **kwargs):
        calls.append(hook)
        return original(self, *args, **kwargs)

    subclass = type(f"Overrides_{hook}", (Trainer,), {hook: override})
    _run(subclass, scenario, out_dir)
    assert calls, f"{scenario}: Trainer.{hook} overridden in a subclass was never called"


# ---------------------------------------------------------------------------------- the loops see the contract only
PACKAGE = Path(trainwell.__file__).parent
LOOP_MODULES = [*sorted((PACKAGE / "loop").glob("*.py")), PACKAGE / "checkpoint" / "contents.py",
                PACKAGE / "checkpoint" / "loading.py", PACKAGE / "checkpoint" / "resume.py",
                PACKAGE / "checkpoint" / "checkpointer.py"]
CONTRACT = set(hook_methods()) | set(TrainerHooks.__annotations__)


_NAMES = ("hooks", "trainer", "owner")  # how the loops and the checkpoint code name the Trainer


def _trainer_names(tree: ast.AST) -> set[int]:
    """ids of Attribute nodes whose value is the Trainer as the loops name it: hooks, trainer, owner, self.hooks..."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in _NAMES:
            found.add(id(node))
        elif isinstance(value, ast.Attribute) and value.attr in _NAMES and \
                isinstance(value.value, ast.Name) and value.value.id == "self":
            found.add(id(node))
    return found


@pytest.mark.parametrize("path", LOOP_MODULES, ids=lambda p: p.name)
def test_loops_use_only_the_contract(path):
    """Every attribute a loop module reads or calls on the Trainer is in ``TrainerHooks`` (no private state)."""
    tree = ast.parse(path.read_text())
    on_trainer = _trainer_names(tree)
    outside = sorted({node.attr for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and id(node) in on_trainer and node.attr not in CONTRACT})
    assert not outside, f"{path.name} uses Trainer attributes outside TrainerHooks: {outside}"


@pytest.mark.parametrize("name", ["contents.py", "loading.py"])
def test_the_contents_bodies_never_see_the_checkpointer(name):
    """The bodies of the save and load methods are handed what they need (the providers' states, the saved RNG
    states, the checkpoint's files); they never reach the run's checkpointer through the Trainer, and they read
    of the Trainer only what ``contents.Owner`` declares."""
    from trainwell.checkpoint.contents import CONTENTS, Owner

    tree = ast.parse((PACKAGE / "checkpoint" / name).read_text())
    on_trainer = _trainer_names(tree)
    read = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and id(node) in on_trainer}
    assert "checkpointer" not in read
    declared = set(Owner.__annotations__) | {n for n in vars(Owner) if not n.startswith("__")}
    named = {m for p in CONTENTS for m in (p.saved_by, p.restored_by) if m}  # called on the Trainer by name
    assert read - declared - named == set()
