"""The tensor-parallel engine: a device mesh with ``tp_size`` above 1 (``parallelism_config``, or a model loaded
tensor-parallel), without FSDP2 or DeepSpeed.

Accelerate's ``prepare`` makes the parameters the tensor-parallel plan leaves whole DTensors too, so the model and
optimizer are handled as FSDP2's are (:class:`trainwell.backend.engine.DTensorEngine`): prepared together, full
weights gathered for ``save_model``, the optimizer checkpointed as DCP shards. The model itself is checkpointed
as full weights (``model.safetensors``). docs/parallelism.md has the runs.
"""

from __future__ import annotations

from typing import Any

from trainwell.backend.engine import DTensorEngine


class TensorParallel(DTensorEngine):
    name = "tensor_parallel"
    label = "tensor parallelism"

    @classmethod
    def runs(cls, accelerator: Any) -> bool:
        # asked after FSDP2 and DeepSpeed, which run a tensor-parallel mesh themselves
        mesh = accelerator.parallelism_config
        return mesh is not None and mesh.tp_enabled
