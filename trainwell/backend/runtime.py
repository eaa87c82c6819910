"""The runtime: the one place that talks to ``accelerate``.

Owns the ``Accelerator`` of one Trainer (built from ``TrainingArguments`` by ``trainwell.backend.engines``),
the process topology, the engine that runs the model (``trainwell.backend.engine.Engine``, chosen once here),
the ``Precision`` of ``trainwell.backend.precision``, and the handful of operations the loops need from
Accelerate (prepare, gather, reduce, barrier). The loops read these objects, never ``args.fp16`` or
``args.use_cpu``: flags become objects here, once.

Multi-process training is whatever Accelerate sets up from ``torchrun`` / ``accelerate launch``; there is no
home-made distributed layer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from trainwell.backend.engines import build_accelerator, choose_engine
from trainwell.backend.precision import Precision

logger = logging.getLogger(__name__)


_EXIT_HOOK_REGISTERED = False


def _destroy_process_group_at_exit() -> None:
    """Tear the process group down at interpreter exit (registered once per process).

    A gloo worker thread drops its reference to a finished collective (and the tensors it holds) a moment
    after the collective completes, and that needs the GIL. A process that exits right after its last
    collective (a non-main rank with nothing left to write) can reach interpreter finalization first; the
    worker's GIL request then ends its thread, and the process dies with ``terminate called without an active
    exception`` (SIGABRT) after the script finished, so torchrun reports the whole job as failed (seen in
    about 1 of 25 two-process runs here; a core dump showed ``~AsyncBarrierWork`` on a gloo thread in
    ``take_gil``). So, before finalization: collect garbage (wrappers such as DDP that hold the group go,
    and the group's destructor, which releases the GIL, joins its threads), destroy the group if the script
    did not, and release the GIL for a moment so a worker still disposing of a collective can finish.
    """
    global _EXIT_HOOK_REGISTERED
    if _EXIT_HOOK_REGISTERED:
        return
    _EXIT_HOOK_REGISTERED = True
    import atexit

    def destroy() -> None:
        import gc
        import time

        import torch.distributed as dist

        gc.collect()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        time.sleep(0.05)  # the GIL is free meanwhile: pending gloo workers finish before finalization

    atexit.register(destroy)


class Runtime:
    """Device, precision and process topology for one ``Trainer``, backed by an ``accelerate.Accelerator``."""

    def __init__(self, args: Any, model: torch.nn.Module | None = None) -> None:
        self.args = args
        self.accelerator = build_accelerator(args, model)
        state = self.accelerator.state
        self.device: torch.device = self.accelerator.device
        self.num_processes: int = state.num_processes
        self.process_index: int = state.process_index
        self.local_process_index: int = state.local_process_index
        self.is_main_process: bool = self.accelerator.is_main_process
        self.is_local_main_process: bool = self.accelerator.is_local_main_process
        self.distributed: bool = self.num_processes > 1
        if self.distributed:
            _destroy_process_group_at_exit()
        self._read_mesh()
        #: the engine that runs the model (data parallel, FSDP2, tensor parallel, DeepSpeed): how it is prepared,
        #: stepped and checkpointed
        self.engine = choose_engine(self)
        #: the dtype floating-point inputs take (the engine's: DeepSpeed keeps a half-precision model), None: as is
        self.input_dtype: torch.dtype | None = self.engine.input_dtype
        self.mixed_precision: str = str(self.accelerator.mixed_precision)
        self.precision = Precision(self.accelerator, args, self.engine)
        dynamo = state.dynamo_plugin
        #: torch.compile's backend when models are compiled (``torch_compile`` or ``accelerate launch``), else None
        self.compile_backend: str | None = None if dynamo.backend.value == "NO" else dynamo.backend.value.lower()
        self._compile_kwargs = dynamo.to_kwargs() if self.compile_backend else {}
        self._compiled: dict[int, tuple[Any, Any]] = {}
        self._prepared: tuple[Any, Any] | None = None  # the model and optimizer prepare() returned last

    def _read_mesh(self) -> None:
        """The data-parallel share of the processes, from Accelerate's device mesh (``parallelism_config``).

        Processes of one tensor-parallel group hold parts of one model and read the same batches; data is sharded,
        samples counted and outputs gathered over the data-parallel dimensions only. Without a mesh every process
        is its own data-parallel rank.
        """
        config = self.accelerator.parallelism_config
        sizes = {"tp": 1, "cp": 1, "sp": 1}
        if config is not None and config.total_size == self.num_processes:
            sizes = {"tp": config.tp_size, "cp": config.cp_size, "sp": config.sp_size}
        #: the tensor-, context- and sequence-parallel degrees (``get_tp_size`` and friends)
        self.tp_size, self.cp_size, self.sp_size = sizes["tp"], sizes["cp"], sizes["sp"]
        #: processes that hold one copy of the data: each data-parallel rank's group (1 without a mesh)
        self.model_parallel_size: int = self.tp_size * self.cp_size * self.sp_size
        #: how many different batches one step reads, and which of them this process reads
        self.data_parallel_size: int = self.num_processes // self.model_parallel_size
        # init_device_mesh lays ranks out row-major with the data dimensions outermost: a data-parallel
        # rank's group is the consecutive processes [rank * model_parallel_size, (rank + 1) * model_parallel_size)
        self.data_parallel_rank: int = self.process_index // self.model_parallel_size
        #: the first process of each data-parallel rank's group: whose outputs an evaluation keeps
        self.data_parallel_leaders: list[int] = list(range(0, self.num_processes, self.model_parallel_size))
        if self.model_parallel_size > 1 and self.args.train_sampling_strategy == "batch_rebalance":
            raise ValueError(
                "train_sampling_strategy='batch_rebalance' with tensor parallelism (tp_size="
                f"{self.tp_size}): its sampler deals micro-batches to every process, and the processes of a "
                "tensor-parallel group must read the same ones. Use 'random' or 'group_by_length'."
            )

    # ----------------------------------------------------------------------------------------- preparation
    def prepare(
        self, model: torch.nn.Module, optimizer: Any, scheduler: Any, num_training_steps: int
    ) -> tuple[torch.nn.Module, Any, Any]:
        """The model, optimizer and scheduler for training, prepared by the engine (once per model and optimizer)."""
        if self._prepared is not None and optimizer is self._prepared[1]:
            return self._prepared[0], optimizer, scheduler  # a later train() call with the same model and optimizer
        model, optimizer, scheduler = self.engine.prepare(model, optimizer, scheduler, num_training_steps)
        self.precision.prepared(model)
        self._prepared = (model, optimizer)
        return model, optimizer, scheduler

    def prepare_dataloader(self, dataloader: Any, as_reference: bool = False) -> Any:
        """Shard across processes and place batches on the device.

        A single process on the CPU gets the loader back untouched: there is nothing to shard or move, and the
        wrapper costs a recursive device copy per batch that the per-step overhead budget cannot afford. With
        ``as_reference`` it is prepared by Accelerate there too, as the reference prepares every loader (for a
        sampler that is not trainwell's, whose order Accelerate's seedable sampler then decides).
        """
        if not self.distributed and self.device.type == "cpu" and not as_reference:
            if getattr(dataloader, "batch_size", None) is not None:
                # what Accelerate's loaders carry and scripts read: the batch over all processes
                dataloader.total_batch_size = dataloader.batch_size
            return dataloader
        from trainwell.data.rebalance import keep_rank_batches

        # a sampler that already yields this rank's micro-batches must not be sharded again (batch_rebalance)
        return keep_rank_batches(self.accelerator.prepare_data_loader(dataloader), dataloader.batch_sampler)

    @staticmethod
    def skip_first_batches(dataloader: Any, num_batches: int) -> Any | None:
        """A loader that starts ``num_batches`` batches into ``dataloader``'s pass, as the reference resumes one
        (Accelerate's ``skip_first_batches``: the batch sampler skips their indices, nothing is loaded), or None
        when ``dataloader`` reads iterable data (no indices to skip: its batches must be read to pass them)."""
        from torch.utils.data import DataLoader, IterableDataset

        if not isinstance(dataloader, DataLoader) or isinstance(dataloader.dataset, IterableDataset):
            return None
        from accelerate.data_loader import skip_first_batches

        return skip_first_batches(dataloader, num_batches)

    def compiled(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` compiled as training compiles it (one wrapper per model, kept), or ``model`` itself.

        For evaluating a model that training has not prepared (and so not compiled) yet.
        """
        if self.compile_backend is None or hasattr(model, "_orig_mod"):
            return model
        kept = self._compiled.get(id(model))
        if kept is None or kept[0] is not model:
            kept = self._compiled[id(model)] = (model, torch.compile(model, **self._compile_kwargs))
        return kept[1]

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model)

    # ----------------------------------------------------------------------------------------- collectives
    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over processes (identity in a single process)."""
        if not self.distributed:
            return tensor
        return self.accelerator.reduce(tensor.to(self.device), reduction="sum")

    def reduce_data_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a per-batch count over the data-parallel ranks (each group's processes read the same batches)."""
        total = self.reduce_sum(tensor)
        if self.model_parallel_size == 1:
            return total
        return total // self.model_parallel_size if not total.is_floating_point() else total / self.model_parallel_size

    def data_sum_of_number(self, value: float) -> float:
        """A per-process number summed over the data-parallel ranks, on the host: the number itself in one process
        (no tensor, no copy), else one collective and one read (callers do this at log and save steps only)."""
        if not self.distributed:
            return value
        return float(self.reduce_data_sum(torch.tensor(value, device=self.device)).item())

    def gather(self, data: Any) -> Any:
        if not self.distributed:
            return data
        return self.accelerator.gather(data)

    def gather_for_metrics(self, data: Any) -> Any:
        """Gather eval outputs, dropping the samples Accelerate duplicated to even out the last batch."""
        if not self.distributed:
            return data
        return self.accelerator.gather_for_metrics(data)

    def pad_across_processes(self, data: Any, dim: int = 1, pad_index: int = -100) -> Any:
        if not self.distributed:
            return data
        return self.accelerator.pad_across_processes(data, dim=dim, pad_index=pad_index)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (picklable plain data), in process order; ``[obj]`` in a single process."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.num_processes
        dist.all_gather_object(gathered, obj)
        return gathered

    def wait_for_everyone(self) -> None:
        if self.distributed:
            self.accelerator.wait_for_everyone()

    def end(self) -> None:
        self.accelerator.end_training()


def to_device(data: Any, device: torch.device, float_dtype: torch.dtype | None = None) -> Any:
    """``data`` (tensors, nested in dicts, lists and tuples) on ``device``, floating-point tensors in
    ``float_dtype`` when one is given; other values as they are."""
    if isinstance(data, torch.Tensor):
        dtype = float_dtype if float_dtype is not None and data.is_floating_point() else None
        return data.to(device, dtype=dtype, non_blocking=True)
    if isinstance(data, Mapping):
        return type(data)({k: to_device(v, device, float_dtype) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return type(data)(to_device(v, device, float_dtype) for v in data)
    return data


def gather_loss_sum(runtime: Any, value: Any) -> float:
    """The mean over processes of each process's loss sum (one collective, at log steps only), on the host."""
    return float(mean_loss_sum(runtime, value).item())


def mean_loss_sum(runtime: Any, value: Any) -> torch.Tensor:
    """The mean over processes of each process's loss sum, as a float32 tensor left on the device."""
    tensor = torch.as_tensor(value, dtype=torch.float32, device=runtime.device).reshape(1)
    if runtime.distributed:
        tensor = runtime.gather(tensor).mean()
    return tensor.sum()


#: the Trainer attributes attach_runtime fills: a process's own (Accelerate's process-wide state among them),
#: dropped before a Trainer is sent to another process
RUNTIME_ATTRIBUTES = ("runtime", "precision", "accelerator", "gather_function")


def attach_runtime(trainer: Any, model: Any = None) -> None:
    """Build the Trainer's runtime (devices, Accelerate, precision) from its arguments: in ``__init__``, and again
    in a process the Trainer was sent to without it (a Ray Tune worker). ``model``: the model given to the Trainer,
    whose load-time tensor parallelism the runtime's device mesh must match."""
    trainer.runtime = Runtime(trainer.args, model)
    trainer.precision, trainer.accelerator = trainer.runtime.precision, trainer.runtime.accelerator
    trainer.gather_function = trainer.accelerator.gather_for_metrics
