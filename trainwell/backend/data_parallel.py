"""The data-parallel engine: one process, or DDP over several (any device Accelerate runs without FSDP, DeepSpeed
or a tensor-parallel mesh).

Each process holds the whole model; a checkpoint holds full weights and the optimizer's full ``state_dict``
(``optimizer.pt``), written by the writer process alone, which ``save_async`` can stage on the host. Preparing wraps
the model (DDP, autocast) and the optimizer only when Accelerate has work to do in its ``step``. This is the
engine of every run that asks for no other, and the last row of ``trainwell.backend.engines.ENGINES``.
"""

from __future__ import annotations

from typing import Any

import torch

from trainwell.backend.engine import Engine


class DataParallel(Engine):
    """One process, or DDP: the base engine's defaults, with torch's own backward and clipping where they suffice."""

    name = "data_parallel"
    label = "DDP"

    def __init__(self, runtime: Any) -> None:
        super().__init__(runtime)
        from accelerate.utils import DistributedType

        # DDP all-reduces inside torch's backward (its hooks): nothing of Accelerate's backward is needed there,
        # nor on one process; other devices (XLA, ...) go through Accelerate's
        self.direct_gradients = self.accelerator.distributed_type in (
            DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU
        )

    @classmethod
    def runs(cls, accelerator: Any) -> bool:
        return True  # the last row: whatever no other engine runs

    def prepare(self, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                num_training_steps: int) -> tuple[torch.nn.Module, Any, Any]:
        """Place and wrap the model (DDP, autocast) as Accelerate decides; wrap the optimizer only when needed.

        Compiled in mixed precision on one process, the model is compiled first: Accelerate then wraps the
        compiled module's ``forward`` in autocast and its float32 output cast, so they run around the compiled
        graphs as a hand-written ``with torch.autocast(...)`` does. Compiled together with the model (Accelerate's
        order), each graph break of the model splits the wrappers' frames into more graphs and breaks.

        The optimizer is wrapped only when Accelerate has work to do in its ``step`` (a grad scaler, XLA): the
        wrapper's ``step`` re-checks optional packages on the file system at every call, which costs more than a
        tiny model's whole optimizer step.
        """
        runtime = self.runtime
        if runtime.compile_backend is not None and not self.distributed and runtime.precision.mode in ("bf16", "fp16"):
            model = runtime.compiled(model)
        model = self.accelerator.prepare_model(model)
        if not (runtime.precision.direct or type(optimizer).__name__ == "AcceleratedOptimizer"):
            optimizer = self.accelerator.prepare_optimizer(optimizer)
        return model, optimizer, scheduler
