"""Trained by tests/test_parallelism.py: ``parallelism_config`` (Accelerate's device mesh) through trainwell.

Run under ``torchrun --nproc_per_node N`` on the CPU, or as one plain process for a baseline. ``--model net`` is a
small classifier (tests/distributed/fsdp_script.py's); ``--model llama`` is the tiny Llama saved in ``--model-dir``
by the test, loaded tensor-parallel over ``--load-tp`` processes (``DistributedConfig(tp_size=...)``) when asked.

Accelerate accepts a ``ParallelismConfig`` over several processes only on GPUs (or under FSDP2 or DeepSpeed): on
CPU processes (``MULTI_CPU``) its check refuses every mesh with more than one process, although gloo runs the
DTensor collectives the mesh needs. ``--mesh-on-cpu`` installs a TEST-ONLY patch before the Trainer is built:
that one check accepts ``MULTI_CPU`` (the sizes must still multiply to the number of processes), which is what
it does for ``MULTI_GPU``. trainwell's own code has no such switch. ``--fsdp-on-cpu`` adds fsdp_script's patch.

Writes the final full weights, the logged losses, evaluation metrics and facts about the run to ``--out`` (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common import engine_flags  # noqa: E402
from tests.distributed.fsdp_script import Net, install_fsdp_on_cpu_patch  # noqa: E402


def install_mesh_on_cpu_patch() -> None:
    """TEST ONLY: let a ParallelismConfig over several CPU processes pass Accelerate's check (module docstring)."""
    from accelerate import ParallelismConfig
    from accelerate.utils import DistributedType

    original = ParallelismConfig._validate_accelerator

    def validate(self, accelerator):
        if accelerator.distributed_type != DistributedType.MULTI_CPU:
            return original(self, accelerator)
        if self.total_size != accelerator.num_processes:
            raise ValueError(f"ParallelismConfig total_size ({self.total_size}) does not match num_processes "
                             f"({accelerator.num_processes})")

    ParallelismConfig._validate_accelerator = validate


class TokenData(torch.utils.data.Dataset):
    """Random token sequences, each its own label (a causal language-modelling task)."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 128, (n, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build(cli: argparse.Namespace) -> tuple[torch.nn.Module, torch.utils.data.Dataset, torch.utils.data.Dataset]:
    if cli.model == "net":
        from tests.common.models import ClassificationDataset

        return Net(), ClassificationDataset(n=96), ClassificationDataset(n=37, seed=5)
    from transformers import LlamaForCausalLM

    extra = {}
    if cli.load_tp:
        from transformers.distributed.configuration_utils import DistributedConfig

        extra["distributed_config"] = DistributedConfig(tp_size=cli.load_tp)
    return LlamaForCausalLM.from_pretrained(cli.model_dir, **extra), TokenData(48, 1), TokenData(13, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    engine_flags.add_flags(parser)
    parser.add_argument("--model", choices=("net", "llama"), default="net")
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--load-tp", type=int, default=0, help="load the Llama tensor-parallel over N processes")
    parser.add_argument("--mesh", default=None, help="parallelism_config as JSON, e.g. '{\"tp_size\": 2}'")
    parser.add_argument("--mesh-on-cpu", action="store_true", help="install the test-only patch (see above)")
    parser.add_argument("--fsdp", default=None, help="the layer class FSDP2 wraps (with --fsdp-on-cpu)")
    parser.add_argument("--evaluate", action="store_true")
    cli = parser.parse_args()
    if cli.mesh_on_cpu:
        install_mesh_on_cpu_patch()
    if cli.fsdp:
        install_fsdp_on_cpu_patch()

    from trainwell import Trainer, TrainingArguments

    fsdp = {"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": [cli.fsdp]}} if cli.fsdp else {}
    args = TrainingArguments(use_cpu=True, parallelism_config=cli.mesh, include_num_input_tokens_seen=True, **fsdp,
                             **engine_flags.arguments(cli))
    model, train, evaluation = build(cli)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation)
    trainer.train(resume_from_checkpoint=engine_flags.resume(cli))
    metrics = trainer.evaluate() if cli.evaluate else {}
    prediction = trainer.predict(evaluation) if cli.evaluate else None
    from torch.distributed.tensor import DTensor

    dtensors = sum(isinstance(p, DTensor) for p in trainer.model.parameters())
    final = os.path.join(cli.workdir, "final")
    trainer.save_model(final)  # every process: sharded parameters are gathered
    if trainer.is_world_process_zero():
        from safetensors.torch import load_file

        weights = load_file(os.path.join(final, "model.safetensors"))
        checkpoints = sorted(p for p in os.listdir(cli.workdir) if p.startswith("checkpoint-"))
        runtime = trainer.runtime
        with open(cli.out, "w") as fh:
            json.dump({
                "params": {k: v.flatten().tolist() for k, v in weights.items()},
                "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                "metrics": metrics,
                "predictions": None if prediction is None else list(prediction.predictions.shape),
                "world": runtime.num_processes,
                "sizes": [trainer.get_tp_size(), trainer.get_cp_size(), trainer.get_sp_size()],
                "data_parallel": runtime.data_parallel_size,
                "total_batch": trainer.get_total_train_batch_size(args),
                "tokens": trainer.state.num_input_tokens_seen,
                "dtensor_params": dtensors,
                "is_fsdp_enabled": trainer.is_fsdp_enabled,
                "checkpoint": sorted(os.listdir(os.path.join(cli.workdir, checkpoints[0]))) if checkpoints else [],
            }, fh)


if __name__ == "__main__":
    main()
