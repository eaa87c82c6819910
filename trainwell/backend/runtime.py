"""The runtime: the one place that talks to ``accelerate``.

Owns building the ``Accelerator`` from ``TrainingArguments`` (device, DDP settings, process group, and the
``Precision`` of ``trainwell.backend.precision``) and the handful of operations the loops need from it
(prepare, no_sync, gather, reduce, barrier). The loops read these objects, never ``args.fp16`` or
``args.use_cpu``: flags become objects here, once.

Multi-process training is whatever Accelerate sets up from ``torchrun`` / ``accelerate launch``; there is no
home-made distributed layer.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from typing import Any

import torch

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

    def __init__(self, args: Any) -> None:
        from accelerate import Accelerator
        from accelerate.utils import (
            DataLoaderConfiguration,
            DistributedDataParallelKwargs,
            InitProcessGroupKwargs,
        )

        acc_cfg = _accelerator_config_dict(args)
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
        pg_kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=args.ddp_timeout)}
        if args.ddp_backend is not None:
            pg_kwargs["backend"] = args.ddp_backend
        handlers.append(InitProcessGroupKwargs(**pg_kwargs))

        dl_config = DataLoaderConfiguration(
            split_batches=acc_cfg.get("split_batches", False),
            dispatch_batches=acc_cfg.get("dispatch_batches"),
            even_batches=acc_cfg.get("even_batches", True),
            # trainwell's own samplers are seeded and resumable; Accelerate must not swap them.
            use_seedable_sampler=False,
            non_blocking=acc_cfg.get("non_blocking", False),
        )
        self.accelerator = Accelerator(
            mixed_precision=getattr(args, "mixed_precision", None) or _precision_from_flags(args),
            cpu=bool(args.use_cpu),
            kwargs_handlers=handlers,
            dataloader_config=dl_config,
            # The trainer steps the scheduler itself, once per optimizer step.
            step_scheduler_with_optimizer=False,
            # No RNG broadcast at each epoch start: it would overwrite a rank's restored RNG on resume, and
            # trainwell's samplers draw from their own seeded generators anyway.
            rng_types=[],
        )
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
        self.mixed_precision: str = str(self.accelerator.mixed_precision)
        self.precision = Precision(self.accelerator, args)

    # ----------------------------------------------------------------------------------------- preparation
    def prepare_model(self, model: torch.nn.Module, evaluation_mode: bool = False) -> torch.nn.Module:
        """Place the model and wrap it (DDP, autocast) as Accelerate decides."""
        return self.accelerator.prepare_model(model, evaluation_mode=evaluation_mode)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Wrap the optimizer when Accelerate has work to do in ``step`` (a grad scaler, DeepSpeed, XLA).

        Otherwise the optimizer is returned as is: the wrapper's ``step`` re-checks optional packages on the
        file system at every call, which costs more than a tiny model's whole optimizer step.
        """
        if self.precision.direct or type(optimizer).__name__ == "AcceleratedOptimizer":
            return optimizer
        return self.accelerator.prepare_optimizer(optimizer)

    def prepare_dataloader(self, dataloader: Any) -> Any:
        """Shard across processes and place batches on the device.

        A single process on the CPU gets the loader back untouched: there is nothing to shard or move, and the
        wrapper costs a recursive device copy per batch that the per-step overhead budget cannot afford.
        """
        if not self.distributed and self.device.type == "cpu":
            return dataloader
        return self.accelerator.prepare_data_loader(dataloader)

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.unwrap_model(model)

    # ----------------------------------------------------------------------------------------- the step
    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce for a micro-batch that is not the last of its window."""
        if not self.distributed:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    # ----------------------------------------------------------------------------------------- collectives
    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over processes (identity in a single process)."""
        if not self.distributed:
            return tensor
        return self.accelerator.reduce(tensor.to(self.device), reduction="sum")

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

    def wait_for_everyone(self) -> None:
        if self.distributed:
            self.accelerator.wait_for_everyone()

    def end(self) -> None:
        self.accelerator.end_training()


def to_device(data: Any, device: torch.device) -> Any:
    """``data`` (tensors, nested in dicts, lists and tuples) on ``device``; other values as they are."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return type(data)({k: to_device(v, device) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return type(data)(to_device(v, device) for v in data)
    return data


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
            "accelerator_config.use_seedable_sampler=False is ignored: trainwell samplers are always seeded from "
            "data_seed or seed, which is what makes resume exact."
        )
    return cfg
