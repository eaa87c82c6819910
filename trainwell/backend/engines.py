"""The engines, and the ``Accelerator`` they run on, built from ``TrainingArguments``.

Owns :data:`ENGINES`, the list of engines (``trainwell.backend.engine.Engine``: one module each), asked in order
which one runs the model, and the translation of the reference's arguments into Accelerate's objects: the process
group (``ddp_backend``, ``ddp_timeout``), DDP options, the data-loader configuration (``accelerator_config``),
mixed precision, ``torch_compile*`` (Accelerate's dynamo plugin), each engine's plugin (FSDP2's from
``fsdp``/``fsdp_config``, DeepSpeed's from ``deepspeed``), ``parallelism_config`` (its device mesh: data,
sharded-data and tensor parallelism). Settings that ``accelerate launch`` or ``accelerate config`` put in the
environment are honoured by Accelerate itself. ``Runtime`` keeps the result and its engine.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwell.args.launcher import accelerate_cpu, launched_processes, under_a_launcher
from trainwell.backend.data_parallel import DataParallel
from trainwell.backend.deepspeed import DeepSpeed
from trainwell.backend.engine import Engine
from trainwell.backend.fsdp import FSDP2
from trainwell.backend.precision import note_cpu_fp16
from trainwell.backend.tensor_parallel import TensorParallel

if TYPE_CHECKING:
    from trainwell.backend.runtime import Runtime

logger = logging.getLogger(__name__)

#: The engines, asked in this order which one runs the Accelerator (the first that says so runs the model); each
#: also adds its plugin to the Accelerator when the arguments ask for it. A new engine is a row here.
ENGINES: tuple[type[Engine], ...] = (DeepSpeed, FSDP2, TensorParallel, DataParallel)


def choose_engine(runtime: Runtime) -> Engine:
    """The engine that runs ``runtime``'s Accelerator (read once, when the Runtime is built)."""
    engine = next(cls for cls in ENGINES if cls.runs(runtime.accelerator))
    return engine(runtime)


def check_checkpoint_engine(engine: Engine, checkpoint: str | os.PathLike) -> None:
    """Refuse to resume ``checkpoint`` under ``engine`` when it holds state that only another engine reads
    (DeepSpeed's checkpoint), or lacks the state that only ``engine`` writes and reads."""
    problem = checkpoint_engine_problem(engine, _names_in(checkpoint))
    if problem is not None:
        raise ValueError(f"{checkpoint} {problem}")


def checkpoint_engine_problem(engine: Engine, files: Collection[str]) -> str | None:
    """Why a checkpoint holding the files ``files`` (names relative to it) cannot resume under ``engine``, as
    :func:`check_checkpoint_engine` says (the caller names the checkpoint); None when it can."""
    owner = state_owner(files)
    if (owner.own_checkpoint_file if owner is not None else None) == engine.own_checkpoint_file:
        return None  # neither holds state of its own, or it is this engine's
    refused = owner if owner is not None else type(engine)
    written, run = ("with", "does not use") if owner is not None else ("without", "uses")
    return (f"was written {written} {refused.label} and this run {run} it: a {refused.label} checkpoint resumes under "
            f"{refused.label} only ({refused.own_checkpoint_hint}). Resume with the engine that wrote it, or start "
            "from its model weights.")


def state_owner(checkpoint: str | os.PathLike | Collection[str]) -> type[Engine] | None:
    """The engine whose own state ``checkpoint`` holds, which no other engine reads (None: any engine reads it).
    ``checkpoint``: its folder, or the names of its files (relative to it) as listed already."""
    files = _names_in(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else checkpoint
    for cls in ENGINES:
        if cls.own_checkpoint_file is not None and cls.own_checkpoint_file in files:
            return cls
    return None


def _names_in(checkpoint: str | os.PathLike) -> set[str]:
    """The names of the regular files at the top of ``checkpoint`` (the marker files engines own are there)."""
    folder = Path(checkpoint)
    return {p.name for p in folder.iterdir() if p.is_file() and not p.is_symlink()} if folder.is_dir() else set()


def build_accelerator(args: Any, model: Any = None) -> Any:
    """The ``accelerate.Accelerator`` for ``args`` (creates the process group under torchrun).

    ``model``, when the Trainer was given one, tells whether it was tensor-parallelized when it was loaded
    (``from_pretrained(..., tp_plan="auto")``): Accelerate must then know its mesh (see :func:`_parallelism`).

    Accelerate keeps one process-wide state and ignores the precision and plugins of any later Accelerator
    (or refuses a different precision). Like the reference (which resets it when its arguments set up the
    device), each Trainer starts from a fresh state, so a second Trainer in a script or a notebook gets its own
    settings. The process group itself is kept.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DataLoaderConfiguration

    AcceleratorState._reset_state(reset_partial_state=True)
    _forget_earlier_engines(args)
    acc_cfg = _accelerator_config_dict(args)
    mixed_precision = getattr(args, "mixed_precision", None) or _precision_from_flags(args)
    note_cpu_fp16(mixed_precision, args.device)
    dl_config = DataLoaderConfiguration(
        split_batches=acc_cfg.get("split_batches", False),
        dispatch_batches=acc_cfg.get("dispatch_batches"),
        even_batches=acc_cfg.get("even_batches", True),
        # As the reference's Accelerator: a loader a subclass builds with a torch RandomSampler and prepares
        # through ``trainer.accelerator`` (sentence-transformers does) gets Accelerate's seedable sampler, which
        # the epoch loop's set_epoch reseeds with seed + epoch, so each epoch draws the reference's order and a
        # resume replays it. trainwell's own sampler is no RandomSampler: Accelerate leaves it as it is.
        use_seedable_sampler=acc_cfg.get("use_seedable_sampler", True),
        data_seed=args.data_seed,
        # From pinned memory a non-blocking copy changes no result, and a blocking one makes the host wait for
        # the previous step's kernels before it can queue the next step: a hidden sync per step.
        non_blocking=acc_cfg.get("non_blocking", False) or bool(args.dataloader_pin_memory),
    )
    with _clear_mesh_errors(args):
        accelerator = Accelerator(
            mixed_precision=mixed_precision,
            cpu=accelerate_cpu(args),  # several CPU processes are joined over gloo even with use_cpu=False
            kwargs_handlers=_kwargs_handlers(args),
            dataloader_config=dl_config,
            dynamo_plugin=_dynamo_plugin(args),
            **_engine_plugins(args),
            **_parallelism(args, model),
            # The trainer steps the scheduler itself, once per optimizer step.
            step_scheduler_with_optimizer=False,
            # No RNG broadcast at each epoch start: it would overwrite a rank's restored RNG on resume, and
            # trainwell's samplers draw from their own seeded generators anyway.
            rng_types=[],
        )
    _check_engine_active(args, accelerator)
    _check_processes_joined(args, accelerator)
    return accelerator


@contextlib.contextmanager
def _clear_mesh_errors(args: Any) -> Iterator[None]:
    """Accelerate's refusal of a device mesh over CPU processes, said in terms of the arguments."""
    try:
        yield
    except ValueError as err:
        if "ParallelismConfig is only compatible" not in str(err) or "MULTI_CPU" not in str(err):
            raise
        from trainwell.args.normalize import to_plain

        raise ValueError(
            f"A device mesh over several CPU processes (parallelism_config={to_plain(args.parallelism_config)}, "
            "or a model loaded tensor-parallel): Accelerate runs one only on GPUs, or under FSDP2 or DeepSpeed "
            f"(it said: {err}). Train on GPUs, or without the mesh to train with DDP on CPUs."
        ) from err


def _parallelism(args: Any, model: Any) -> dict[str, Any]:
    """``parallelism_config=`` for the Accelerator: the arguments' ``ParallelismConfig``, with the tensor-parallel
    size of a model sharded at load time filled in (as the reference does; its data-parallel size with it).

    Accelerate builds the device mesh from it, shards the data over its data-parallel dimensions only and checks
    that its sizes multiply to the number of processes.
    """
    from accelerate.utils import get_model_tp_size

    config = args.parallelism_config
    model_tp = (get_model_tp_size(model) if model is not None else None) or 1
    if model_tp > 1:
        from accelerate import ParallelismConfig

        distributed = getattr(getattr(model, "config", None), "distributed_config", None)
        model_dp = getattr(distributed, "dp_size", None) or 1
        if config is None:
            config = ParallelismConfig(tp_size=model_tp, dp_shard_size=model_dp)
        elif config.tp_size != model_tp:
            raise ValueError(
                f"parallelism_config.tp_size={config.tp_size} but the model was loaded tensor-parallel over "
                f"{model_tp} processes (its tp_size). Set tp_size={model_tp}, or load the model with tp_size="
                f"{config.tp_size}."
            )
    return {} if config is None else {"parallelism_config": config}


def _kwargs_handlers(args: Any) -> list[Any]:
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    from trainwell.utils.rendezvous import init_method as rendezvous_init_method

    handlers: list[Any] = []
    ddp_kwargs = {
        "find_unused_parameters": args.ddp_find_unused_parameters,
        "bucket_cap_mb": args.ddp_bucket_cap_mb,
        "broadcast_buffers": args.ddp_broadcast_buffers,
        "static_graph": args.ddp_static_graph,
    }
    ddp_kwargs = {k: v for k, v in ddp_kwargs.items() if v is not None}
    if ddp_kwargs:
        handlers.append(DistributedDataParallelKwargs(**ddp_kwargs))
    # The process group's settings, where one can be created: Accelerate reads them (at a cost: it builds a default
    # handler to compare with, clearing and restoring os.environ, ~0.1 ms) even in a lone process that has none.
    if args.ddp_backend is None and not (under_a_launcher() or args.deepspeed or args.fsdp):
        return handlers
    pg_kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=args.ddp_timeout)}
    if args.ddp_backend is not None:
        pg_kwargs["backend"] = args.ddp_backend
    if (method := rendezvous_init_method()) is not None:  # under torchrun: a key space per restart (see there)
        pg_kwargs["init_method"] = method
    handlers.append(InitProcessGroupKwargs(**pg_kwargs))
    return handlers


def _dynamo_plugin(args: Any) -> Any:
    """``torch_compile``: Accelerate compiles the model it prepares; None leaves Accelerate's environment default."""
    if not args.torch_compile:
        return None
    from accelerate.utils import TorchDynamoPlugin

    return TorchDynamoPlugin(backend=args.torch_compile_backend, mode=args.torch_compile_mode)


# What the launcher (accelerate launch) put in the environment, read before any Accelerator of this process ran:
# an Accelerator given an FSDP or DeepSpeed plugin writes ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED=true
# into os.environ for good, and Accelerate would then apply that engine to every later Accelerator.
_ENGINE_VARIABLES = tuple(cls.launch_variable for cls in ENGINES if cls.launch_variable is not None)
_LAUNCH_ENV: dict[str, str | None] | None = None


def _forget_earlier_engines(args: Any) -> None:
    """Keep an earlier Trainer's FSDP or DeepSpeed (recorded in os.environ by Accelerate) from this one."""
    global _LAUNCH_ENV
    if _LAUNCH_ENV is None:
        _LAUNCH_ENV = {name: os.environ.get(name) for name in _ENGINE_VARIABLES}
    for name, value in _LAUNCH_ENV.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _engine_plugins(args: Any) -> dict[str, Any]:
    """The plugins the engines need for ``args`` (``fsdp_plugin=``, ``deepspeed_plugin=``), as Accelerator kwargs."""
    plugins: dict[str, Any] = {}
    for cls in ENGINES:
        plugins.update(cls.plugin(args))
    return plugins


def _check_engine_active(args: Any, accelerator: Any) -> None:
    """An engine asked for but not running is an error: Accelerate would silently train without it."""
    for cls in ENGINES:
        if cls.asked(args) and not cls.runs(accelerator):
            raise RuntimeError(
                f"{cls.label} was asked for ({cls.argument} or accelerate launch) but Accelerate set up "
                f"{accelerator.distributed_type.value} instead: it runs {cls.label} only in processes started by a "
                "distributed launcher (torchrun --nproc_per_node N, or accelerate launch --num_processes N), never "
                "with use_cpu=True, and FSDP only on GPUs. Launch it that way, or drop the option."
            )


def _check_processes_joined(args: Any, accelerator: Any) -> None:
    """A launcher started several processes but Accelerate set this one up alone: refuse, naming the fix.

    Each process would train its own copy of the run, believe it is the main process and write the same
    ``output_dir`` (the reference does that silently). Left after ``accelerate_cpu``: an MPS machine (Accelerate
    joins processes on GPUs, or on CPUs with ``cpu=True``) and DeepSpeed on CPUs without the gloo backend.
    """
    launched = launched_processes()
    if launched <= 1 or accelerator.num_processes > 1:
        return
    device = accelerator.device.type
    if DeepSpeed.asked(args):
        fix = "DeepSpeed joins CPU processes over gloo only: pass ddp_backend='gloo'"
    elif device == "cpu":
        fix = "launch with torchrun or accelerate launch --multi_gpu, which set the process group up"
    else:
        fix = (f"Accelerate joins several processes on {device} only through the CPU: pass use_cpu=True to train "
               "them together on CPUs (gloo), or launch a single process")
    raise RuntimeError(
        f"The launcher started {launched} processes (WORLD_SIZE={launched}) but Accelerate set this one up to train "
        f"alone ({accelerator.distributed_type.value}, 1 process on {device}): each process would train its own "
        f"copy and write the same output_dir ({args.output_dir}). To train them as one job, {fix}."
    )


def _precision_from_flags(args: Any) -> str:
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return "no"


def _accelerator_config_dict(args: Any) -> dict[str, Any]:
    cfg = getattr(args, "accelerator_config", None)
    if cfg is None:
        return {}
    if hasattr(cfg, "to_dict"):
        cfg = cfg.to_dict()
    cfg = dict(cfg)
    if cfg.get("gradient_accumulation_kwargs"):
        raise NotImplementedError(
            "accelerator_config.gradient_accumulation_kwargs is not supported by trainwell: set "
            "gradient_accumulation_steps instead (trainwell accumulates gradients itself)."
        )
    if cfg.get("use_configured_state"):
        raise NotImplementedError(
            "accelerator_config.use_configured_state is not supported by trainwell yet: let the Trainer build "
            "its own Accelerator."
        )
    if cfg.get("use_seedable_sampler") is False:
        logger.warning(
            "accelerator_config.use_seedable_sampler=False applies only to a loader a subclass prepares through "
            "trainer.accelerator, as on the reference: trainwell's own sampler is always seeded from data_seed or "
            "seed, which is what makes resume exact."
        )
    return cfg
