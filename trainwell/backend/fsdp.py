"""The FSDP2 engine: ``fsdp``/``fsdp_config`` (or ``accelerate launch --use_fsdp``) through Accelerate's plugin.

Owns Accelerate's ``FullyShardedDataParallelPlugin`` built from the normalized arguments
(``args.fsdp_plugin_args``), the refusal of a size-based wrapping policy that would pick a module container, and
the checkpoint state: the optimizer as DCP shards (``optimizer_0/``) and, with
``fsdp_config["state_dict_type"]="SHARDED_STATE_DICT"``, the model as shards too (``pytorch_model_fsdp_0/``)
instead of full weights (``trainwell.backend.sharded``). docs/distributed.md has the runs.
"""

from __future__ import annotations

from typing import Any

import torch

from trainwell.backend import sharded
from trainwell.backend.engine import DTensorEngine
from trainwell.utils.model import unwrap


class FSDP2(DTensorEngine):
    name = "fsdp"
    label = "FSDP"
    launch_variable = "ACCELERATE_USE_FSDP"
    argument = "fsdp=True"
    is_fsdp_enabled = True
    syncs_forward = True

    def __init__(self, runtime: Any) -> None:
        plugin = runtime.accelerator.state.fsdp_plugin
        #: checkpoints keep the model sharded (``fsdp_config["state_dict_type"]="SHARDED_STATE_DICT"``)
        self.sharded_checkpoints: bool = "SHARDED" in str(plugin.state_dict_type)
        if self.sharded_checkpoints and runtime.args.save_only_model:
            raise ValueError(
                "save_only_model=True with fsdp_config['state_dict_type']='SHARDED_STATE_DICT': a sharded checkpoint "
                "keeps the model's shards with the optimizer's. Use state_dict_type='FULL_STATE_DICT' to save only "
                "full model weights, or save_only_model=False."
            )
        super().__init__(runtime)

    @classmethod
    def runs(cls, accelerator: Any) -> bool:
        from accelerate.utils import DistributedType

        return accelerator.distributed_type == DistributedType.FSDP

    @classmethod
    def plugin(cls, args: Any) -> dict[str, Any]:
        """Accelerate's FSDP plugin (FSDP2) for ``fsdp``/``fsdp_config``; none leaves ``accelerate launch
        --use_fsdp``'s."""
        if not args.fsdp:
            return {}
        from accelerate.utils import FullyShardedDataParallelPlugin

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)}

    @classmethod
    def asked(cls, args: Any) -> bool:
        return bool(args.fsdp) or super().asked(args)

    def prepare(self, model: torch.nn.Module, optimizer: Any, scheduler: Any,
                num_training_steps: int) -> tuple[torch.nn.Module, Any, Any]:
        check_size_based_wrap(self.accelerator.state.fsdp_plugin, model)
        return super().prepare(model, optimizer, scheduler, num_training_steps)

    def checkpoint_keeps_model(self, model: torch.nn.Module, save_only_model: bool) -> bool:
        return self.sharded_checkpoints

    def save_state(self, model: torch.nn.Module, optimizer: Any, directory: str) -> bool:
        if self.sharded_checkpoints:
            sharded.save_model_shards(unwrap(model), directory)
        return super().save_state(model, optimizer, directory)


def check_size_based_wrap(plugin: Any, model: Any) -> None:
    """FSDP2 with ``SIZE_BASED_WRAP``: refuse, before anything is sharded, a policy that would pick a module container.

    Accelerate shards every module above ``min_num_params``; an ``nn.ModuleList``/``nn.ModuleDict`` holding the
    layers always qualifies when a layer does, and ``fully_shard`` cannot wrap a container (it has no
    ``forward``), so the run would crash inside ``prepare`` (with the reference too).
    """
    from torch import nn

    policy = getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy)
    if getattr(policy, "__name__", "") != "size_based_auto_wrap_policy":
        return
    limit = plugin.min_num_params
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            size = sum(p.numel() for p in module.parameters())
            if size > limit:
                items = sorted({type(m).__name__ for m in module.children()})
                raise ValueError(
                    f"fsdp_config auto_wrap_policy='SIZE_BASED_WRAP' with min_num_params={limit} would shard "
                    f"'{name}' ({type(module).__name__}, {size:,} parameters) on its own, and FSDP2 cannot wrap a "
                    "container (it has no forward). Use fsdp_config={'auto_wrap_policy': 'TRANSFORMER_BASED_WRAP', "
                    f"'transformer_layer_cls_to_wrap': {items}}} (its items' classes), or min_num_params >= {size}."
                )
