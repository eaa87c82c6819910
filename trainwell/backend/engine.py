"""The engine seam: what differs between the ways Accelerate can run a model, as one object per run.

Owns :class:`Engine`, the base of the engines listed in ``trainwell.backend.engines.ENGINES`` (one data-parallel,
FSDP2, tensor-parallel and DeepSpeed engine today, each in its own module). ``Runtime`` asks the list once which
engine runs the Accelerator it built; from then on the Trainer, the loops and the checkpoint code ask the engine
and never which engine it is (Lightning Fabric's strategies are the model):

* choosing: the Accelerate plugin the engine needs from the arguments (:meth:`Engine.plugin`), whether the
  arguments or the launcher asked for it (:meth:`Engine.asked`), whether Accelerate runs it (:meth:`Engine.runs`);
* the step: preparing model, optimizer and scheduler (:meth:`Engine.prepare`), a micro-batch's context
  (:meth:`Engine.micro_batch`), dropping the gradients after the optimizer step (:meth:`Engine.drop_gradients`),
  and the precision path (``direct_gradients``, ``backward_kwargs``, ``skips_steps``, ``input_dtype``, read by
  ``trainwell.backend.precision.Precision`` and ``Runtime``);
* checkpoints: the full weights for ``save_model`` (:meth:`Engine.full_state_dict`), and the model's and
  optimizer's state in the engine's own form (:meth:`Engine.save_state` / :meth:`Engine.load_state`). File
  names, the manifest, atomic publishing and the plain ``optimizer.pt`` stay in ``trainwell.checkpoint``;
* the reference Trainer's public attributes about the engine (``is_deepspeed_enabled``, ...).

The base class holds the defaults: an engine that keeps the model whole on each process, needs no plugin and has
no checkpoint state of its own. A new engine is a subclass in its own module and a row in ``ENGINES``
(docs/distributed.md shows one).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from trainwell.backend import sharded
from trainwell.utils.model import unwrap

if TYPE_CHECKING:
    from trainwell.backend.runtime import Runtime


def launched_with(variable: str) -> bool:
    """Whether ``accelerate launch`` (or ``accelerate config``) set the environment ``variable`` to true."""
    return os.environ.get(variable, "false").lower() in ("true", "1")


class Engine:
    """One way Accelerate runs the model (plain or DDP, FSDP2, tensor parallelism, DeepSpeed), for one ``Runtime``.

    Subclasses set ``name`` and the class attributes below that differ, implement :meth:`runs`, and override the
    methods whose default (documented on each) does not fit.
    """

    #: the engine's name (``trainer.runtime.engine.name``), and how messages name it
    name: ClassVar[str]
    label: ClassVar[str]
    #: the environment variable ``accelerate launch`` sets to ask for this engine (it outlives the Accelerator that
    #: read it: ``trainwell.backend.engines`` resets it between Trainers), None when there is none
    launch_variable: ClassVar[str | None] = None
    #: the argument that asks for the engine, as an error names it (``"fsdp=True"``)
    argument: ClassVar[str] = ""
    #: the reference Trainer's ``is_deepspeed_enabled`` / ``is_fsdp_enabled`` (read by libraries such as TRL)
    is_deepspeed_enabled: ClassVar[bool] = False
    is_fsdp_enabled: ClassVar[bool] = False
    #: the Trainer moves the model to the device itself (the reference's ``place_model_on_device``); an engine
    #: that shards or partitions the model places it while preparing it
    places_model: ClassVar[bool] = True
    #: a forward needs every process (parameters gathered layer by layer), so ``generate()`` runs with
    #: ``synced_gpus`` and no process stops early
    syncs_forward: ClassVar[bool] = False
    #: every process writes its part of a checkpoint (shards, partitions) into the writer's folder, through the
    #: engine: checkpoints need a folder every process sees, and cannot be staged for ``save_async``
    every_process_writes: ClassVar[bool] = False
    #: the checkpoint's engine state is one folder of every process's shards and their metadata (DCP), which a
    #: copy on each node (``save_on_each_node``) cannot be
    one_folder: ClassVar[bool] = False
    #: a file that marks a checkpoint holding state of this engine's that no other engine reads (DeepSpeed's
    #: ``latest``): such a checkpoint resumes under this engine only, and this engine resumes no other. None: any
    #: engine reads this engine's checkpoints
    own_checkpoint_file: ClassVar[str | None] = None
    #: what else to do with such a checkpoint, for the error that refuses it
    own_checkpoint_hint: ClassVar[str] = ""
    #: the keyword arguments of Accelerate's ``backward`` under this engine
    backward_kwargs: ClassVar[dict[str, Any]] = {}
    #: the engine clips and steps the optimizer itself, inside the window's last backward (DeepSpeed): the
    #: Trainer's optimizer step is a no-op there, so ``skip_nonfinite_steps`` cannot guard it
    steps_its_own_optimizer: ClassVar[bool] = False

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.accelerator = runtime.accelerator
        self.args = runtime.args
        self.distributed: bool = runtime.distributed
        self._no_context = contextlib.nullcontext()
        #: backward and clipping may call torch directly when there is no grad scaler (the engine adds nothing to
        #: them); Accelerate's versions re-check optional packages on every call, which costs more than a tiny
        #: model's whole step
        self.direct_gradients: bool = False
        #: the engine's own fp16 loss scaling can skip an optimizer step (an overflow): the scheduler must not step
        self.skips_steps: bool = False
        #: the dtype floating-point inputs take (None: as they come, autocast does the rest)
        self.input_dtype: torch.dtype | None = None
        if self.args.save_async and self.every_process_writes:
            raise NotImplementedError(
                f"save_async=True is not supported under {self.label} yet: its checkpoints are written by every "
                "process through the engine. Set save_async=False (or train without the engine)."
            )

    # ------------------------------------------------------------------------------------------ choosing
    @classmethod
    def runs(cls, accelerator: Any) -> bool:
        """Whether this engine runs ``accelerator`` (``ENGINES`` is asked in order: the first that says yes runs
        the model)."""
        raise NotImplementedError(f"{cls.__name__}.runs: every engine says when it runs")

    @classmethod
    def plugin(cls, args: Any) -> dict[str, Any]:
        """The keyword arguments of ``Accelerator(...)`` the engine needs for ``args`` (its plugin); by default none."""
        return {}

    @classmethod
    def asked(cls, args: Any) -> bool:
        """Whether the arguments or the launcher ask for this engine (it is then an error if Accelerate does not run
        it); by default, the launcher's ``launch_variable``."""
        return cls.launch_variable is not None and launched_with(cls.launch_variable)

    # ------------------------------------------------------------------------------------------ the step
    def prepare(self, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                num_training_steps: int) -> tuple[torch.nn.Module, Any, Any]:
        """The model, optimizer and scheduler for training, as the engine runs them; by default both go through
        Accelerate's ``prepare`` together (a sharding engine swaps the optimizer's parameters for the shards)."""
        model, optimizer = self.accelerator.prepare(model, optimizer)
        return model, optimizer, scheduler

    def micro_batch(self, model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """The context of one micro-batch's backward (``last``: the window's last); by default, no gradient
        all-reduce until the last micro-batch of the window."""
        if last or not self.distributed:
            return self._no_context
        return self.accelerator.no_sync(model)

    def drop_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """After the optimizer step: free the gradients (``model.zero_grad()`` would walk the module tree again)."""
        for param in params:
            param.grad = None

    def check_batch_search(self) -> None:
        """``auto_find_batch_size``: raise when the engine cannot change the micro-batch between attempts; by
        default it can."""

    def reference_engine(self, model: torch.nn.Module) -> Any:
        """What the reference's ``Trainer.deepspeed`` holds once ``model`` is prepared; None but under DeepSpeed."""
        return None

    # ------------------------------------------------------------------------------------------ checkpoints
    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The full weights of the prepared ``model`` for ``save_model``, on the writer process (``{}`` on the
        others; a collective where the engine gathers them); None when the model's own ``state_dict`` is complete
        (the default)."""
        return None

    def checkpoint_keeps_model(self, model: torch.nn.Module, save_only_model: bool) -> bool:
        """Whether a checkpoint holds the model in the engine's state (:meth:`save_state`) rather than as full
        weights; by default never."""
        return False

    def save_state(self, model: torch.nn.Module, optimizer: Any, directory: str) -> bool:
        """Write the engine's own state of the optimizer (and the model, see :meth:`checkpoint_keeps_model`) into
        the checkpoint ``directory``; every process calls it. False (the default): the engine keeps none, and the
        checkpoint holds the optimizer's full ``state_dict`` (``optimizer.pt``, written by ``trainwell.checkpoint``).
        """
        return False

    def load_state(self, model: torch.nn.Module, optimizer: Any, checkpoint: str, full_state: Path) -> bool:
        """Restore the optimizer (and the model, where it is there) from an engine state in ``checkpoint``; every
        process calls it. False when there is none: the caller then loads ``full_state`` (``optimizer.pt``, the
        optimizer's full ``state_dict``) if it exists.

        By default the optimizer shards of a sharding engine's checkpoint (``optimizer_0/``) are read when there
        are some: DCP reads them at any world size, into a model that is not sharded too.
        """
        if not sharded.has_shards(checkpoint, sharded.OPTIMIZER_DIR):
            return False
        sharded.load_optimizer_shards(unwrap(model), optimizer, checkpoint)
        return True

    @classmethod
    def load_own_weights(cls, model: torch.nn.Module, checkpoint: str) -> None:
        """The weights of a checkpoint that holds them only in this engine's state (``own_checkpoint_file``, no
        full weights), into ``model``: only called for an engine that sets ``own_checkpoint_file``."""
        raise NotImplementedError(f"{cls.__name__} sets no own_checkpoint_file: its checkpoints hold full weights")


class DTensorEngine(Engine):
    """The base of the engines that shard the model's parameters as DTensors over the processes (FSDP2 over the
    data-parallel mesh, tensor parallelism over its own): every process holds and writes its shards.

    The model and optimizer are prepared together (the optimizer's parameters become the shards); ``save_model``
    gathers the full weights to the first process; a checkpoint holds the optimizer as DCP shards
    (``trainwell.backend.sharded``), and a full ``optimizer.pt`` cannot be loaded into them.
    """

    places_model = False
    every_process_writes = True
    one_folder = True

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return sharded.full_model_state(unwrap(model))

    def save_state(self, model: torch.nn.Module, optimizer: Any, directory: str) -> bool:
        sharded.save_optimizer_shards(unwrap(model), optimizer, directory)
        return True

    def load_state(self, model: torch.nn.Module, optimizer: Any, checkpoint: str, full_state: Path) -> bool:
        if super().load_state(model, optimizer, checkpoint, full_state):
            return True
        if full_state.is_file():
            raise ValueError(
                f"{checkpoint} holds {full_state.name}, written by a run without {self.label}; under {self.label} "
                f"the optimizer is restored from its shards ({sharded.OPTIMIZER_DIR}/). Resume it without "
                f"{self.label}, or delete {full_state.name} to start the optimizer from scratch."
            )
        return False
