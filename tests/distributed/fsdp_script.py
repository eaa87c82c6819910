"""Trained by tests/test_fsdp.py under ``torchrun --nproc_per_node N`` on the CPU: FSDP2 (or DDP) through trainwell.

Accelerate runs FSDP only in processes it started on GPUs: on a CPU-only machine every supported switch gives
DDP (``MULTI_CPU``) and drops the FSDP plugin (see ../shared/reference/distributed_on_cpu.md). So that CI can
exercise trainwell's real FSDP path (Accelerate's ``fully_shard`` preparation, DTensor parameters, sharded
checkpoints), ``--fsdp-on-cpu`` installs a TEST-ONLY patch before the Trainer is built: right after an
``Accelerator`` that was given an FSDP plugin comes up as ``MULTI_CPU``, its shared state is switched to FSDP
(``distributed_type``, ``fsdp_plugin``), which is what Accelerate itself does on GPUs. trainwell's own code has no
such switch. Verified with accelerate 1.15; the test asserts that the parameters really are sharded (DTensor).

Writes the final full weights, the logged losses and a few facts about the run to ``--out`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common import engine_flags  # noqa: E402
from tests.common.models import ClassificationDataset  # noqa: E402


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Net(nn.Module):
    """Two Blocks (each its own FSDP unit) between an input and an output layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Block(16), Block(16)])
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        logits = self.out(h)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def install_fsdp_on_cpu_patch() -> None:
    """TEST ONLY: let an Accelerator given an FSDP plugin run FSDP on CPU processes (see the module docstring)."""
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    original = Accelerator.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.state.distributed_type == DistributedType.MULTI_CPU:
            if self.state.mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self.state.mixed_precision)  # what the state does on GPUs
            self.state.distributed_type = DistributedType.FSDP
            self.state.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    Accelerator.__init__ = init


def die_in_save(step: int, rank: int, when: str) -> None:
    """SIGKILL process ``rank`` in the sharded save of ``checkpoint-{step}``: ``before`` its optimizer shards are
    written (the other process is then inside the DCP collective), or ``after`` them (every shard and the
    metadata are written, the folder is not yet published)."""
    import signal

    from trainwell.backend import sharded

    original = sharded.save_optimizer_shards

    def dying(model, optimizer, directory):
        dies = f"checkpoint-{step}" in str(directory) and int(os.environ.get("RANK", "0")) == rank
        if dies and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        original(model, optimizer, directory)
        if dies:
            os.kill(os.getpid(), signal.SIGKILL)

    sharded.save_optimizer_shards = dying


def _mixed_precision_policy(model) -> dict | None:
    """The dtypes of the root FSDP2 module's MixedPrecisionPolicy (None outside FSDP2)."""
    state = getattr(model, "_get_fsdp_state", None)
    if state is None:
        return None
    policy = state()._mp_policy
    return {name: str(getattr(policy, name)) for name in ("param_dtype", "reduce_dtype", "output_dtype")}


def main() -> None:
    parser = argparse.ArgumentParser()
    engine_flags.add_flags(parser)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--fsdp-on-cpu", action="store_true", help="install the test-only patch (see above)")
    parser.add_argument("--state-dict-type", default="SHARDED_STATE_DICT")
    parser.add_argument("--compile", action="store_true", help="torch_compile with the eager backend")
    parser.add_argument("--fsdp-config", default="{}", help="JSON merged into the fsdp_config")
    parser.add_argument("--die-in-save", default=None, help="STEP:RANK:before|after (see die_in_save)")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--ema", action="store_true", help="EMA(decay=0.75); each process writes its final average")
    cli = parser.parse_args()
    if cli.fsdp_on_cpu:
        install_fsdp_on_cpu_patch()
    if cli.die_in_save:
        step, rank, when = cli.die_in_save.split(":")
        die_in_save(int(step), int(rank), when)

    from trainwell import Trainer, TrainingArguments

    fsdp_config = {"transformer_layer_cls_to_wrap": ["Block"], "state_dict_type": cli.state_dict_type,
                   **json.loads(cli.fsdp_config)}
    fsdp = {"fsdp": True, "fsdp_config": fsdp_config} if cli.fsdp else {}
    args = TrainingArguments(use_cpu=True, torch_compile_backend="eager" if cli.compile else None, **fsdp,
                             bf16=cli.bf16, **engine_flags.arguments(cli))
    data = ClassificationDataset(n=96)
    ema = []
    if cli.ema:
        from trainwell.techniques import EMA

        ema = [EMA(decay=0.75)]
    trainer = Trainer(model=Net(), args=args, train_dataset=data, eval_dataset=data if cli.best else None,
                      callbacks=engine_flags.callbacks(cli) + ema)
    trainer.train(resume_from_checkpoint=engine_flags.resume(cli))
    if ema:  # this process's average (its local shards under FSDP2)
        from safetensors.torch import save_file

        rank = trainer.runtime.process_index
        save_file({k: v.contiguous() for k, v in ema[0].state_dict().items()},
                  os.path.join(cli.workdir, f"ema-final-{rank}.safetensors"))
    from torch.distributed.tensor import DTensor

    sharded = all(isinstance(p, DTensor) for p in trainer.model.parameters())
    final = os.path.join(cli.workdir, "final")
    trainer.save_model(final)  # every process: under FSDP the full weights are gathered
    if trainer.is_world_process_zero():
        from safetensors.torch import load_file

        weights = load_file(os.path.join(final, "model.safetensors"))
        with open(cli.out, "w") as fh:
            json.dump({
                "params": {k: v.flatten().tolist() for k, v in weights.items()},
                "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                "world": trainer.runtime.num_processes,
                "engine": trainer.runtime.engine.name,
                "sharded_params": sharded,
                "is_fsdp_enabled": trainer.is_fsdp_enabled,
                "compiled": hasattr(trainer.model_wrapped, "_orig_mod"),
                "best_step": trainer.state.best_global_step,
                "last_step": trainer.state.global_step,
                "mp_policy": _mixed_precision_policy(trainer.model),
                "autocast_forward": hasattr(trainer.model, "_original_forward"),
                "checkpointed_layers": sum(hasattr(m, "_checkpoint_wrapped_module") for m in trainer.model.modules()),
            }, fh)


if __name__ == "__main__":
    main()
