"""The reference's ``transformers.trainer_pt_utils`` helpers that user code imports, under the same path.

Re-exported from their owners; trainwell's own evaluation does not use the ``nested_*`` helpers (it accumulates
predictions in one buffer), they are offered for subclasses and scripts that call them.
"""

from __future__ import annotations

from trainwell.utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["nested_concat", "nested_numpify", "nested_detach", "nested_truncate"], "trainwell.loop.gather"),
    "find_batch_size": "trainwell.loop.accumulation",
    "LabelSmoother": "trainwell.loop.losses",
    **dict.fromkeys(["LengthGroupedSampler", "DistributedLengthGroupedSampler"], "trainwell.data.length_grouped"),
    "BatchRebalanceSampler": "trainwell.data.rebalance",
    "get_parameter_names": "trainwell.optim.param_groups",
    "AcceleratorConfig": "trainwell.training_args",
    "LayerWiseDummyOptimizer": "trainwell.optim.layerwise",
    "LayerWiseDummyScheduler": "trainwell.optim.layerwise",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
