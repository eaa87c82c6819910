"""The engine seam (``trainwell.backend.engine``): one object per run says how the model is prepared, stepped and
checkpointed, chosen once from the registry ``trainwell.backend.engines.ENGINES``.

Single-process CPU tests: the engine a plain run gets, the registry, a new engine added as one class and one
registry row (trained, checkpointed and resumed bitwise), the DeepSpeed and tensor-parallel engines' own parts
built over a CPU Accelerator, and a guard that nothing outside ``trainwell/backend`` asks which engine runs. The
engines at work on several processes are in test_fsdp.py, test_deepspeed.py and test_parallelism.py.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
import torch

import trainwell
from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.backend import engines, sharded
from trainwell.backend.data_parallel import DataParallel
from trainwell.backend.deepspeed import DeepSpeed
from trainwell.backend.fsdp import FSDP2
from trainwell.backend.precision import Precision
from trainwell.backend.tensor_parallel import TensorParallel
from trainwell.utils.model import unwrap


def _trainer(out_dir, **kwargs) -> Trainer:
    return Trainer(model=RegressionModel(), args=make_args(out_dir, **kwargs), train_dataset=RegressionDataset())


def _runtime_of(trainer: Trainer, **args) -> types.SimpleNamespace:
    """What an engine reads of its runtime, over the trainer's CPU Accelerator, with arguments changed."""
    changed = types.SimpleNamespace(**{**trainer.args.__dict__, **args})
    return types.SimpleNamespace(accelerator=trainer.accelerator, args=changed, distributed=False)


def test_a_plain_run_gets_the_data_parallel_engine(out_dir):
    trainer = _trainer(out_dir)
    engine = trainer.runtime.engine
    assert type(engine) is DataParallel and engine.name == "data_parallel"
    # the reference's attributes come from the engine
    assert not trainer.is_deepspeed_enabled and not trainer.is_fsdp_enabled and trainer.place_model_on_device
    # its precision path: torch's own backward and clipping, inputs as they come
    assert engine.direct_gradients and trainer.precision.direct and trainer.runtime.input_dtype is None
    assert not engine.every_process_writes and not engine.one_folder


def test_the_registry_asks_the_engines_in_order_and_ends_with_the_catch_all(out_dir):
    assert engines.ENGINES[-1] is DataParallel and DataParallel.runs(object())
    names = [cls.name for cls in engines.ENGINES]
    assert len(set(names)) == len(names) and all(cls.label for cls in engines.ENGINES)
    accelerator = _trainer(out_dir).accelerator  # one CPU process: none of the others runs it
    assert [cls for cls in engines.ENGINES if cls.runs(accelerator)] == [DataParallel]
    # the launcher's variables the Accelerator building forgets between Trainers are the engines' own
    assert set(engines._ENGINE_VARIABLES) == {FSDP2.launch_variable, DeepSpeed.launch_variable}


class OptimizerShards(DataParallel):
    """A new engine, as docs/distributed.md adds one: data parallel, with the optimizer checkpointed as DCP shards.

    Counts what the loop and the checkpoint code ask of it.
    """

    name = "optimizer_shards"
    label = "optimizer shards"
    every_process_writes = True

    def __init__(self, runtime):
        super().__init__(runtime)
        self.calls = {"prepare": 0, "micro_batch": 0, "drop_gradients": 0, "save_state": 0, "load_state": 0}

    @classmethod
    def runs(cls, accelerator):
        return True

    def prepare(self, model, optimizer, scheduler, num_training_steps):
        self.calls["prepare"] += 1
        return super().prepare(model, optimizer, scheduler, num_training_steps)

    def micro_batch(self, model, last):
        self.calls["micro_batch"] += 1
        return super().micro_batch(model, last)

    def drop_gradients(self, params):
        self.calls["drop_gradients"] += 1
        super().drop_gradients(params)

    def save_state(self, model, optimizer, directory):
        self.calls["save_state"] += 1
        sharded.save_optimizer_shards(unwrap(model), optimizer, directory)
        return True

    def load_state(self, model, optimizer, checkpoint, full_state):
        self.calls["load_state"] += 1
        return super().load_state(model, optimizer, checkpoint, full_state)


@pytest.fixture
def registered(monkeypatch):
    """OptimizerShards as the registry row before the catch-all."""
    monkeypatch.setattr(engines, "ENGINES", (*engines.ENGINES[:-1], OptimizerShards, DataParallel))


def _weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_a_new_engine_is_one_class_and_one_registry_row(tmp_path, registered):
    kwargs = dict(max_steps=6, per_device_train_batch_size=8, gradient_accumulation_steps=2, save_strategy="steps",
                  save_steps=3, learning_rate=0.05)
    full = _trainer(str(tmp_path / "full"), **kwargs)
    engine = full.runtime.engine
    assert type(engine) is OptimizerShards and full.place_model_on_device  # a data-parallel subclass
    full.train()
    # the loop and the checkpoint code went through it: 6 steps of 2 micro-batches, 2 checkpoints
    assert engine.calls == {"prepare": 1, "micro_batch": 12, "drop_gradients": 6, "save_state": 2, "load_state": 0}
    checkpoint = tmp_path / "full" / "checkpoint-3"
    assert sharded.has_shards(checkpoint, sharded.OPTIMIZER_DIR) and not (checkpoint / "optimizer.pt").exists()

    resumed = _trainer(str(tmp_path / "resumed"), **kwargs)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.runtime.engine.calls["load_state"] == 1
    assert all(torch.equal(a, b) for a, b in zip(_weights(resumed), _weights(full)))


def test_another_engine_resumes_the_new_engines_checkpoint(tmp_path, registered, monkeypatch):
    """The data-parallel engine reads optimizer shards too: the form of a checkpoint decides how it is read."""
    kwargs = dict(max_steps=6, per_device_train_batch_size=8, save_strategy="steps", save_steps=3)
    full = _trainer(str(tmp_path / "full"), **kwargs)
    full.train()
    monkeypatch.setattr(engines, "ENGINES", (DataParallel,))
    resumed = _trainer(str(tmp_path / "resumed"), **kwargs)
    assert type(resumed.runtime.engine) is DataParallel
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert all(torch.equal(a, b) for a, b in zip(_weights(resumed), _weights(full)))


@pytest.mark.parametrize("bf16", [False, True])
def test_the_deepspeed_engines_step_over_a_cpu_accelerator(out_dir, bf16):
    """DeepSpeed marks the window's last micro-batch, leaves the gradients to DeepSpeed, feeds half-precision
    inputs and cannot search batch sizes (its own runs are in test_deepspeed.py)."""
    trainer = _trainer(out_dir, bf16=bf16)
    engine = DeepSpeed(_runtime_of(trainer))
    model = trainer.model
    with engine.micro_batch(model, last=False):
        assert not trainer.accelerator.gradient_state.sync_gradients
    with engine.micro_batch(model, last=True):
        assert trainer.accelerator.gradient_state.sync_gradients
    model.a.grad = torch.ones(())
    engine.drop_gradients([model.a])
    assert model.a.grad is not None  # DeepSpeed zeroed them itself, in the last backward
    assert engine.input_dtype == (torch.bfloat16 if bf16 else None) and engine.reference_engine(model) is model
    precision = Precision(trainer.accelerator, trainer.args, engine)
    assert not precision.direct and precision._backward_kwargs == {"scale_wrt_gas": False}
    with pytest.raises(ValueError, match="auto_find_batch_size does not drive DeepSpeed"):
        engine.check_batch_search()
    with pytest.raises(NotImplementedError, match="save_async=True is not supported under DeepSpeed"):
        DeepSpeed(_runtime_of(trainer, save_async=True))


def test_save_model_before_train_under_deepspeed_writes_the_modules_weights(out_dir, tmp_path):
    """Before train() the model is not DeepSpeed's engine yet: save_model writes the module's own weights (the
    reference asks a missing engine for its state and raises)."""
    trainer = _trainer(out_dir)
    trainer.runtime.engine = engine = DeepSpeed(_runtime_of(trainer))
    assert engine.full_state_dict(trainer.model) is None
    assert not engine.checkpoint_keeps_model(trainer.model, save_only_model=False)
    trainer.save_model(str(tmp_path / "saved"))
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "saved" / "model.safetensors")
    assert {k: v.tolist() for k, v in saved.items()} == {k: v.tolist() for k, v in trainer.model.state_dict().items()}


def test_a_checkpoint_that_only_one_engine_reads_is_refused_by_the_others(out_dir, tmp_path):
    trainer = _trainer(out_dir)
    plain, deepspeed = trainer.runtime.engine, DeepSpeed(_runtime_of(trainer))
    written = tmp_path / "deepspeed-checkpoint"
    written.mkdir()
    (written / "latest").write_text("global_step3")
    assert engines.state_owner(written) is DeepSpeed and engines.state_owner(tmp_path) is None
    engines.check_checkpoint_engine(deepspeed, written)
    engines.check_checkpoint_engine(plain, tmp_path)
    with pytest.raises(ValueError, match="written with DeepSpeed and this run does not use it.*zero_to_fp32"):
        engines.check_checkpoint_engine(plain, written)
    with pytest.raises(ValueError, match="written without DeepSpeed and this run uses it"):
        engines.check_checkpoint_engine(deepspeed, tmp_path)


def test_a_dtensor_engine_refuses_a_full_optimizer_state(out_dir, tmp_path):
    trainer = _trainer(out_dir)
    engine = TensorParallel(_runtime_of(trainer))
    assert engine.every_process_writes and engine.one_folder and not engine.places_model
    model = RegressionModel()
    optimizer = torch.optim.AdamW(model.parameters())
    full_state = tmp_path / "optimizer.pt"
    assert not engine.load_state(model, optimizer, str(tmp_path), full_state)  # nothing saved: a fresh optimizer
    torch.save(optimizer.state_dict(), full_state)
    with pytest.raises(ValueError, match="holds optimizer.pt, written by a run without tensor parallelism"):
        engine.load_state(model, optimizer, str(tmp_path), full_state)


# ------------------------------------------------------------------------------------------------ the guard
PACKAGE = Path(trainwell.__file__).parent
_ENGINE_MODULES = {"trainwell.backend.engine", "trainwell.backend.data_parallel", "trainwell.backend.fsdp",
                   "trainwell.backend.tensor_parallel", "trainwell.backend.deepspeed"}
# Outside the backend, an engine's module is imported only for what is not about running it: the checkpoint
# table's name of DeepSpeed's `latest`, and the reference's is_deepspeed_zero3_enabled()
_ALLOWED = {"checkpoint/contents.py": {"trainwell.backend.deepspeed"},
            "integrations/__init__.py": {"trainwell.backend.deepspeed"}}
_ENGINE_CLASSES = {cls.__name__ for cls in engines.ENGINES}


def _engine_questions(tree: ast.AST) -> tuple[set[str], list[str]]:
    imported, asked = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {f"{node.module}.{a.name}" if node.module == "trainwell.backend" else node.module
                         for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "engine":
            asked.append(ast.unparse(node))  # runtime.engine.name: which engine runs
        elif isinstance(node, ast.Name) and node.id in _ENGINE_CLASSES:
            asked.append(node.id)  # isinstance(engine, DeepSpeed) and the like
    return imported & _ENGINE_MODULES, asked


def test_nothing_outside_the_backend_asks_which_engine_runs():
    """The loops, the checkpoint code and the Trainer ask the engine (its methods and attributes), never which one
    it is: a new engine changes nothing there."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("backend/"):
            continue
        imported, asked = _engine_questions(ast.parse(path.read_text()))
        assert imported <= _ALLOWED.get(rel, set()), f"{rel} imports an engine's module: {sorted(imported)}"
        assert not asked, f"{rel} asks which engine runs: {asked}"


def test_the_process_group_settings_reach_accelerate_only_where_a_group_can_be_made(out_dir, monkeypatch):
    """A lone process gets no InitProcessGroupKwargs (Accelerate's reading of one costs ~0.1 ms per Trainer); a
    process started by a launcher, or a chosen ddp_backend, gets them with ddp_timeout."""
    from accelerate.utils import InitProcessGroupKwargs

    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    args = make_args(out_dir, ddp_timeout=90)

    def group_kwargs(arguments):
        return [h for h in engines._kwargs_handlers(arguments) if isinstance(h, InitProcessGroupKwargs)]

    assert group_kwargs(args) == []
    assert group_kwargs(make_args(out_dir, ddp_backend="gloo"))[0].backend == "gloo"
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert group_kwargs(args)[0].timeout.total_seconds() == 90
