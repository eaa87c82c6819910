"""Trained by tests/test_deepspeed.py under ``torchrun --nproc_per_node N`` on the CPU: DeepSpeed ZeRO via trainwell.

DeepSpeed runs on CPU processes with gloo (``ddp_backend="gloo"``, and not ``use_cpu=True``, which makes
Accelerate drop DeepSpeed for DDP). TEST ONLY: DeepSpeed's first start on a CPU compiles its shared-memory
communication op with g++ (4-7 minutes cold); the tests use gloo's collectives only, so ``--skip-shm-build``
replaces that build with a no-op before DeepSpeed starts (see ../shared/reference/distributed_on_cpu.md,
recipe C). The optimizer is a torch one (DeepSpeed's own CPU Adam would compile for minutes too): trainwell's
AdamW, or the config's ``"optimizer"`` with ``"torch_adam": true``.

Writes the final full weights, the logged losses and a few facts about the run to ``--out`` (rank 0).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common import engine_flags  # noqa: E402
from tests.common.models import ClassificationDataset  # noqa: E402
from tests.distributed.fsdp_script import Net  # noqa: E402


def skip_shm_build() -> None:
    """TEST ONLY: no g++ build of DeepSpeed's CPU shared-memory op (gloo does the collectives)."""
    importlib.import_module("deepspeed.comm.torch")
    # `import deepspeed.comm.torch as m` would bind torch itself: deepspeed.comm re-exports it
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


def config(cli: argparse.Namespace) -> dict:
    ds: dict = {
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
        "gradient_clipping": "auto", "zero_optimization": {"stage": cli.stage},
    }
    if cli.bf16:
        ds["bf16"] = {"enabled": "auto"}
    if cli.ds_optimizer:
        ds["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": "auto",
                                                        "eps": "auto", "torch_adam": True}}
        ds["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                               "warmup_num_steps": "auto", "total_num_steps": "auto"}}
    return ds


def main() -> None:
    parser = argparse.ArgumentParser()
    engine_flags.add_flags(parser, ga=2)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--ds-optimizer", action="store_true", help="the config names the optimizer and scheduler")
    parser.add_argument("--plain", action="store_true", help="no DeepSpeed: the DDP run to compare with")
    parser.add_argument("--no-transformers", action="store_true",
                        help="run as if transformers were not installed (imports of it fail)")
    cli = parser.parse_args()
    if cli.no_transformers:
        sys.modules["transformers"] = None  # what an uninstalled package looks like to import and find_spec
    if not cli.plain:
        skip_shm_build()

    from trainwell import Trainer, TrainingArguments

    engine = {"use_cpu": True} if cli.plain else {"deepspeed": config(cli), "ddp_backend": "gloo"}
    args = TrainingArguments(bf16=cli.bf16, **engine, **engine_flags.arguments(cli))
    data = ClassificationDataset(n=96)
    trainer = Trainer(model=Net(), args=args, train_dataset=data, eval_dataset=data if cli.best else None,
                      callbacks=engine_flags.callbacks(cli))
    trainer.train(resume_from_checkpoint=engine_flags.resume(cli))
    final = os.path.join(cli.workdir, "final")
    trainer.save_model(final)  # every process: under ZeRO-3 the weights are gathered
    if trainer.is_world_process_zero():
        from safetensors.torch import load_file

        weights = load_file(os.path.join(final, "model.safetensors"))
        with open(cli.out, "w") as fh:
            json.dump({
                "params": {k: v.float().flatten().tolist() for k, v in weights.items()},
                "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                "lrs": [h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h],
                "world": trainer.runtime.num_processes,
                "deepspeed": trainer.runtime.engine.name == "deepspeed",
                "engine": type(trainer.model_wrapped).__name__,
                "deepspeed_attribute": trainer.deepspeed is trainer.model_wrapped and trainer.is_deepspeed_enabled,
                "precision": trainer.runtime.mixed_precision,
                "best_step": trainer.state.best_global_step,
                "last_step": trainer.state.global_step,
            }, fh)


if __name__ == "__main__":
    main()
