"""The DeepSpeed engine: ZeRO through Accelerate, with its config, plugin, full weights and own checkpoints.

Owns :class:`DeepSpeed` (the engine of ``trainwell.backend.engines.ENGINES``) and what ``deepspeed=...`` (a dict, a
JSON string or a JSON file path) or ``accelerate launch --use_deepspeed`` turns into: Accelerate's
``DeepSpeedPlugin`` over the config with the reference's ``"auto"`` values filled from the arguments (micro batch,
accumulation, global batch, clipping, optimizer and scheduler hyperparameters, fp16/bf16, the ZeRO bucket sizes
from the model's hidden size), and a ``ValueError`` listing every value the config sets that contradicts the
arguments, as the reference does. Also: the full weights of a ZeRO model for ``save_model`` (gathered to the first
process, stage 3 included), and the DeepSpeed checkpoint (``engine.save_checkpoint`` / ``load_checkpoint``) that
holds the partitioned model and optimizer.

The run itself goes through Accelerate's DeepSpeed engine: trainwell keeps scaling each micro-batch's loss by its
share of the window (``scale_wrt_gas=False`` tells DeepSpeed not to divide it again) and marks the last
micro-batch of a window, where DeepSpeed clips, steps and zeroes (:meth:`DeepSpeed.micro_batch`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainwell.backend.engine import Engine
from trainwell.utils import filehash

LATEST = "latest"  # the file DeepSpeed's save_checkpoint writes last, naming its global_step{N}/ folder

# The config keys the reference fills from the arguments ("auto") and checks against them otherwise.
_HIDDEN_SIZE_KEYS = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                     "zero_optimization.stage3_param_persistence_threshold")


class DeepSpeed(Engine):
    """DeepSpeed runs the model: it clips, steps and zeroes inside the last micro-batch's backward, keeps a
    half-precision model without autocast, and checkpoints the partitioned model and optimizer itself."""

    name = "deepspeed"
    label = "DeepSpeed"
    launch_variable = "ACCELERATE_USE_DEEPSPEED"
    argument = "deepspeed=..."
    is_deepspeed_enabled = True
    places_model = False
    syncs_forward = True
    every_process_writes = True
    own_checkpoint_file = LATEST
    own_checkpoint_hint = "its zero_to_fp32.py turns it into full weights for a fresh start"
    #: DeepSpeed divides a micro-batch's loss by the accumulation steps unless told not to: trainwell already
    #: scaled it by the micro-batch's share of the window (``trainwell.loop.accumulation``)
    backward_kwargs = {"scale_wrt_gas": False}
    steps_its_own_optimizer = True

    def __init__(self, runtime: Any) -> None:
        super().__init__(runtime)
        mixed = str(self.accelerator.mixed_precision)
        self.skips_steps = mixed == "fp16"  # DeepSpeed's own loss scaling skips the step of an overflow
        self.input_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed)
        self._gradient_state = self.accelerator.gradient_state

    @classmethod
    def runs(cls, accelerator: Any) -> bool:
        from accelerate.utils import DistributedType

        return accelerator.distributed_type == DistributedType.DEEPSPEED

    @classmethod
    def plugin(cls, args: Any) -> dict[str, Any]:
        """Accelerate's DeepSpeed plugin for ``deepspeed=`` (or ``accelerate launch --use_deepspeed``), its
        ``"auto"`` values filled from the arguments known now."""
        if not cls.asked(args):
            return {}
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise ImportError("DeepSpeed was asked for but the deepspeed package is not installed: pip install "
                              "deepspeed")
        plugin = make_plugin(load_config(args.deepspeed) if args.deepspeed else None)
        fill_from_arguments(plugin.deepspeed_config, args)
        return {"deepspeed_plugin": plugin}

    @classmethod
    def asked(cls, args: Any) -> bool:
        return bool(args.deepspeed) or super().asked(args)

    def prepare(self, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                num_training_steps: int) -> tuple[torch.nn.Module, Any, Any]:
        return prepare_engine(self.accelerator, self.args, model, optimizer, scheduler, num_training_steps)

    def micro_batch(self, model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
        """Marks the window's last micro-batch, after whose backward DeepSpeed clips, steps and zeroes (Accelerate's
        gradient state carries the flag to the engine); DeepSpeed itself skips the all-reduce of the others."""
        self._gradient_state._set_sync_gradients(last)
        return self._no_context

    def drop_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Nothing: DeepSpeed zeroed them in the window's last backward (its optimizer's ``step`` is a no-op)."""

    def check_batch_search(self) -> None:
        raise ValueError(
            "auto_find_batch_size does not drive DeepSpeed (its micro-batch is fixed in the DeepSpeed config): set "
            "train_micro_batch_size_per_gpu there, or leave auto_find_batch_size off."
        )

    def reference_engine(self, model: torch.nn.Module) -> Any:
        return model  # the prepared model is DeepSpeed's engine

    # ------------------------------------------------------------------------------------------ checkpoints
    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        if not _is_engine(model):
            return None  # save_model() before train() prepared it: the module is whole on every process
        return full_state_dict(model)

    def checkpoint_keeps_model(self, model: torch.nn.Module, save_only_model: bool) -> bool:
        # A ZeRO-3 checkpoint's model is in DeepSpeed's checkpoint (partitioned), unless save_only_model skips that
        return _is_engine(model) and zero_stage(model) >= 3 and not save_only_model

    def save_state(self, model: torch.nn.Module, optimizer: Any, directory: str) -> bool:
        save_checkpoint(model, directory)  # every process writes its partitions
        return True

    def load_state(self, model: torch.nn.Module, optimizer: Any, checkpoint: str, full_state: Path) -> bool:
        load_checkpoint(model, checkpoint)
        return True

    @classmethod
    def load_own_weights(cls, model: torch.nn.Module, checkpoint: str) -> None:
        """Into DeepSpeed's engine (``load_best_model_at_end`` under ZeRO-3); before the engine exists, nothing:
        it loads them with the optimizer (the resume's optimizer phase)."""
        if hasattr(model, "load_checkpoint"):
            load_weights(model, checkpoint)


def load_config(value: Any) -> dict[str, Any]:
    """A private copy of the config given as a dict, a JSON object string or a JSON file path."""
    if isinstance(value, str):
        if value.lstrip().startswith("{"):
            value = json.loads(value)
        elif not os.path.isfile(value):
            raise ValueError(f"deepspeed={value!r}: no such file. Pass a dict, a JSON object, or a JSON file path.")
        else:
            with open(value, encoding="utf-8") as fh:
                value = json.load(fh)
    if not isinstance(value, dict):
        raise ValueError(f"deepspeed={value!r}: the DeepSpeed config must be a JSON object (a dict).")
    return copy.deepcopy(value)


class Filler:
    """Fills ``"auto"`` entries of a DeepSpeed config and collects the entries that contradict the arguments."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.mismatches: list[str] = []

    def _node(self, dotted: str) -> tuple[dict[str, Any] | None, str]:
        *parents, key = dotted.split(".")
        node: Any = self.config
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        return (node if isinstance(node, dict) else None), key

    def fill(self, dotted: str, value: Any, argument: str | None = None) -> None:
        """``"auto"`` becomes ``value``; another value that differs from it is a mismatch named after ``argument``."""
        node, key = self._node(dotted)
        if node is None:
            return
        current = node.get(key)
        if current == "auto":
            node[key] = value
        elif argument is not None and current is not None and current != value:
            self.mismatches.append(f"- DeepSpeed {dotted}={current!r}, but {argument}={value!r}")

    def is_auto(self, dotted: str) -> bool:
        node, key = self._node(dotted)
        return node is not None and node.get(key) == "auto"

    def check(self) -> None:
        if self.mismatches:
            raise ValueError(
                "The DeepSpeed config contradicts the TrainingArguments:\n" + "\n".join(self.mismatches)
                + "\nSet these DeepSpeed values to \"auto\" (filled from the arguments), or change the arguments."
            )


def fill_from_arguments(config: dict[str, Any], args: Any) -> None:
    """The ``"auto"`` values known when the Trainer is built (raises on a contradiction)."""
    filler = Filler(config)
    filler.fill("train_micro_batch_size_per_gpu", args.per_device_train_batch_size, "per_device_train_batch_size")
    filler.fill("gradient_accumulation_steps", args.gradient_accumulation_steps, "gradient_accumulation_steps")
    filler.fill("gradient_clipping", args.max_grad_norm, "max_grad_norm")
    filler.fill("optimizer.params.lr", args.learning_rate, "learning_rate")
    filler.fill("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1, adam_beta2")
    filler.fill("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    filler.fill("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    filler.fill("scheduler.params.warmup_min_lr", 0)
    filler.fill("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
    precision = args.mixed_precision or "no"
    filler.fill("fp16.enabled", precision == "fp16", "fp16")
    filler.fill("bf16.enabled", precision == "bf16", "bf16")
    if args.save_on_each_node:  # DeepSpeed assumes storage shared by the nodes unless told otherwise
        config.setdefault("checkpoint", {})["use_node_local_storage"] = True
    filler.check()


def fill_for_run(config: dict[str, Any], args: Any, model: Any, num_processes: int, num_training_steps: int) -> None:
    """The ``"auto"`` values known when training starts: global batch, bucket sizes, schedule length."""
    filler = Filler(config)
    micro = config.get("train_micro_batch_size_per_gpu", args.per_device_train_batch_size)
    ga = config.get("gradient_accumulation_steps", args.gradient_accumulation_steps)
    global_batch = micro * ga * num_processes
    filler.fill("train_batch_size", global_batch, "per_device_train_batch_size x accumulation x processes")
    auto_sizes = [key for key in _HIDDEN_SIZE_KEYS if filler.is_auto(key)]
    if auto_sizes:
        hidden = _hidden_size(model)
        if hidden is None:
            raise ValueError(
                f"The DeepSpeed config asks for {auto_sizes} = \"auto\", which is derived from the model's hidden "
                f"size, but {type(model).__name__} has no config.hidden_size. Put numbers there instead of \"auto\"."
            )
        filler.fill("zero_optimization.reduce_bucket_size", hidden * hidden)
        filler.fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))
        filler.fill("zero_optimization.stage3_param_persistence_threshold", 10 * hidden)
    filler.fill("scheduler.params.total_num_steps", num_training_steps, "the run's steps")
    filler.fill("scheduler.params.warmup_num_steps", max(1, args.get_warmup_steps(num_training_steps)), "warmup_steps")
    filler.check()


def _hidden_size(model: Any) -> int | None:
    config = getattr(model, "config", None)
    for holder in (config, getattr(config, "text_config", None)):
        if hasattr(holder, "hidden_size"):
            return int(holder.hidden_size)
        if hasattr(holder, "hidden_sizes"):
            return int(max(holder.hidden_sizes))
    return None


def make_plugin(config: dict[str, Any] | None) -> Any:
    """Accelerate's ``DeepSpeedPlugin`` over ``config`` (None: from ``accelerate launch``'s environment).

    Accelerate's plugin imports ``transformers`` when it is selected, to tell ``from_pretrained`` about ZeRO-3
    (so that a model built after the Trainer is partitioned at creation). Without ``transformers`` installed
    there is no such model to tell, and trainwell never needs ``transformers``: the plugin then skips that step.
    """
    from accelerate.utils import DeepSpeedPlugin

    class Plugin(DeepSpeedPlugin):
        def set_deepspeed_weakref(self) -> None:
            import importlib.util

            if importlib.util.find_spec("transformers") is not None:
                super().set_deepspeed_weakref()

    return Plugin(hf_ds_config=config) if config is not None else Plugin()


def prepare_engine(
    accelerator: Any, args: Any, model: Any, optimizer: Any, scheduler: Any, num_training_steps: int
) -> tuple[Any, Any, Any]:
    """DeepSpeed's engine for ``model``, with the Trainer's optimizer and scheduler, or DeepSpeed's own ones when
    its config names them (built from the Trainer's parameter groups, learning rate and schedule length)."""
    from accelerate.utils import DummyOptim, DummyScheduler

    config = accelerator.state.deepspeed_plugin.deepspeed_config
    fill_for_run(config, args, model, accelerator.num_processes, num_training_steps)
    if "optimizer" in config:
        optimizer = DummyOptim(optimizer.param_groups, lr=args.learning_rate, weight_decay=args.weight_decay)
    if "scheduler" in config:
        warmup = max(1, args.get_warmup_steps(num_training_steps))
        scheduler = DummyScheduler(optimizer, total_num_steps=num_training_steps, warmup_num_steps=warmup)
    return tuple(accelerator.prepare(model, optimizer, scheduler))


def active_zero_stage() -> int | None:
    """The ZeRO stage of the DeepSpeed configuration Accelerate holds in this process (None without one)."""
    import sys

    if "accelerate" not in sys.modules:
        return None
    from accelerate.state import AcceleratorState

    if not AcceleratorState._shared_state:
        return None
    plugin = getattr(AcceleratorState(), "deepspeed_plugin", None)
    return None if plugin is None else int(plugin.zero_stage)


def _is_engine(model: Any) -> bool:
    """Whether ``model`` is DeepSpeed's engine (``train()`` prepared it), not yet the user's module."""
    return hasattr(model, "zero_optimization_stage")


def zero_stage(engine: Any) -> int:
    return int(engine.zero_optimization_stage())


def full_state_dict(engine: Any) -> dict[str, Any]:
    """The full weights on the first process (``{}`` elsewhere); a collective under ZeRO-3, which gathers them
    layer by layer to the first process."""
    if zero_stage(engine) >= 3:
        state = engine._zero3_consolidated_16bit_state_dict()  # DeepSpeed's own layer-by-layer gather
        return dict(state) if state is not None else {}
    if engine.global_rank != 0:
        return {}
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}


def save_checkpoint(engine: Any, directory: str) -> None:
    """DeepSpeed's checkpoint of the engine (model, partitioned optimizer, its scheduler) into ``directory``.

    Each process's files are checksummed as DeepSpeed writes them (its ``torch.save`` calls go through
    ``trainwell.utils.filehash``), for the checkpoint's manifest.
    """
    with hashed_saves():
        engine.save_checkpoint(directory)


@contextlib.contextmanager
def hashed_saves() -> Iterator[None]:
    """Every ``torch.save`` to a path in the block writes through ``filehash.open_for_write``."""
    import torch

    real = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(f, (str, os.PathLike)):
            return real(obj, f, *args, **kwargs)
        with filehash.open_for_write(f) as fh:
            real(obj, fh, *args, **kwargs)

    torch.save = save
    try:
        yield
    finally:
        torch.save = real


def load_checkpoint(engine: Any, directory: str) -> None:
    """DeepSpeed's checkpoint in ``directory`` into the engine: model, partitioned optimizer and its scheduler."""
    with weights_only_loads():
        engine.load_checkpoint(directory, load_module_strict=True, load_optimizer_states=True,
                               load_lr_scheduler_states=True)


def load_weights(engine: Any, directory: str) -> None:
    """Only the model of DeepSpeed's checkpoint in ``directory`` (``load_best_model_at_end`` under ZeRO-3)."""
    with weights_only_loads():
        engine.load_checkpoint(directory, load_optimizer_states=False, load_lr_scheduler_states=False)


# The classes DeepSpeed's checkpoints hold besides tensors and plain values (its optimizers' loss scaler, ZeRO
# stage, and the fragment addresses of ZeRO-1/2): records with no behaviour on unpickling.
_CHECKPOINT_CLASSES = ("deepspeed.runtime.fp16.loss_scaler:LossScaler",
                       "deepspeed.runtime.fp16.loss_scaler:DynamicLossScaler",
                       "deepspeed.runtime.zero.config:ZeroStageEnum",
                       "deepspeed.utils.tensor_fragment:fragment_address")


def _checkpoint_classes() -> list[type]:
    import importlib

    found = []
    for entry in _CHECKPOINT_CLASSES:
        module, _, name = entry.partition(":")
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # another DeepSpeed version: its files cannot hold the class either
            continue
    return found


@contextlib.contextmanager
def weights_only_loads() -> Iterator[None]:
    """Every ``torch.load`` in the block reads ``weights_only`` (plus DeepSpeed's record classes).

    DeepSpeed loads its checkpoints with ``weights_only=False``, so a crafted file in ``global_step{N}/`` would run
    code on resume; within this block such a file is refused with an error naming it instead.
    """
    import torch

    real, allowed = torch.load, _checkpoint_classes()

    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        try:
            with torch.serialization.safe_globals(allowed):
                return real(f, map_location, *args, **kwargs)
        except pickle.UnpicklingError as err:
            raise pickle.UnpicklingError(
                f"Refusing to load {f}: it holds objects other than tensors, plain values and DeepSpeed's checkpoint "
                "records, and unpickling them could run code from the file. Only load checkpoints you trust; to "
                f"resume anyway, delete this checkpoint folder and resume from an earlier one. Details: {err}"
            ) from err

    torch.load = load
    try:
        yield
    finally:
        torch.load = real
