"""The runners of ``benchmarks/gpu.py``: the hand-written loops (plain, FSDP2, DeepSpeed) and the Trainers
(trainwell's and the reference's), each training a configuration for ``warmup`` + ``steps`` steps and timing the
last ``steps``.

:data:`WINDOW` is told when the timed steps begin and end (``benchmarks/gpu_profile.py`` puts a profiler there);
by default it does nothing. :func:`trainer_arguments` is the whole translation of a configuration into the Trainer's
arguments, so a CPU test can check the plumbing of the rows only a GPU runs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Any

import torch
from gpu_models import BLOCKS, SIZES, Tokens, arch, build
from torch.utils.data import DataLoader


class Window:
    """The timed steps' begin and end; a subclass does something there (a profiler)."""

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass


WINDOW = Window()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def zero_config(stage: int, batch: int, world: int, clip: float, auto: bool) -> dict:
    """The DeepSpeed config of a ZeRO row: what a user hands the Trainer (``auto`` values, filled from the
    arguments), or what those values resolve to for the same run (the hand-written DeepSpeed loop's)."""
    def value(resolved: Any) -> Any:
        return "auto" if auto else resolved

    return {
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": value(True)},
        "train_micro_batch_size_per_gpu": value(batch),
        "gradient_accumulation_steps": value(1),
        "train_batch_size": value(batch * world),
        "gradient_clipping": value(clip),
        # what Accelerate adds for the Trainers: no progress report every 10 steps, a torch optimizer under ZeRO
        "steps_per_print": float("inf"),
        "zero_allow_untested_optimizer": True,
    }


def deepspeed_on_cpu() -> None:
    """On a CPU, keep DeepSpeed from compiling its shared-memory collectives with g++ at its first init (minutes):
    gloo's collectives are used instead (see the project's notes on distributed engines on CPU). Smoke runs only."""
    import importlib
    import sys

    importlib.import_module("deepspeed.comm.torch")
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # deepspeed.comm re-exports torch: by sys.modules


def _loader(size: dict, batch: int, n: int, device: str) -> DataLoader:
    return DataLoader(
        Tokens(batch * n, size["vocab"], size["seq"]),
        batch_size=batch,
        shuffle=True,
        pin_memory=device == "cuda",
        generator=torch.Generator().manual_seed(42),
    )


def _fully_shard(model: torch.nn.Module, device: str, checkpoint: bool) -> torch.nn.Module:
    """The hand-written FSDP2 set-up: a process group of torchrun's ranks, each block (wrapped for activation
    checkpointing first, as Accelerate wraps it) and the root sharded, torchtitan's mixed-precision policy."""
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model.to(device)
    for i, block in enumerate(model.blocks):
        if checkpoint:
            model.blocks[i] = block = checkpoint_wrapper(block, preserve_rng_state=False)
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def _timed(loader: DataLoader, warmup: int, device: str, step, logging_steps: int) -> dict:
    """Run ``step(inputs)`` (returning the loss) over ``loader``; time the steps after ``warmup``. The mean loss is
    read every ``logging_steps`` steps (one host sync each), as the trainers log it."""
    window, logged, start = [], [], None
    for i, inputs in enumerate(loader):
        if i == warmup:
            sync(device)
            start = time.perf_counter()
            WINDOW.begin()
        window.append(step(inputs).detach())
        if (i + 1) % logging_steps == 0:
            logged.append(float(torch.stack(window).float().mean()))
            window = []
    sync(device)
    seconds = time.perf_counter() - start
    WINDOW.end()
    return {"seconds": seconds, "losses": logged}


def run_loop(size: dict, batch: int, warmup: int, steps: int, options: dict, cli: Any) -> dict:
    """The hand-written baseline: what a careful user writes for this configuration on one GPU."""
    device, precision, clip = cli.device, options["precision"], options.get("clip")
    model = build(size, options.get("model", "gpt"), device)
    if options.get("fsdp"):
        model = _fully_shard(model, device, bool(options.get("checkpointing")))  # bf16 by FSDP2's policy
    elif options.get("model") != "qlora":
        model = model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0, fused=device == "cuda")
    scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
    forward = torch.compile(model, backend=cli.compile_backend) if options.get("compile") else model
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    autocast = contextlib.nullcontext() if options.get("fsdp") else torch.autocast(device, dtype=dtype)

    def step(inputs: dict) -> torch.Tensor:
        inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
        with autocast:
            loss = forward(**inputs)["loss"]
        (scaler.scale(loss) if scaler else loss).backward()
        if clip:
            if scaler:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trainable, clip)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    result = _timed(_loader(size, batch, warmup + steps, device), warmup, device, step, cli.logging_steps)
    if options.get("fsdp"):
        torch.distributed.destroy_process_group()
    return result


def run_deepspeed_loop(size: dict, batch: int, warmup: int, steps: int, options: dict, cli: Any) -> dict:
    """The hand-written DeepSpeed loop: ``deepspeed.initialize`` with the ZeRO config trainwell resolves for the same
    run and the same torch AdamW, then ``engine(...)``, ``engine.backward``, ``engine.step`` per batch."""
    import deepspeed
    import torch.distributed as dist

    device = cli.device
    if device == "cpu":
        deepspeed_on_cpu()
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    model = build(size, options.get("model", "gpt"), device)
    config = zero_config(options["zero"], batch, dist.get_world_size(), options.get("clip", 0.0), auto=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=device == "cuda")
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def step(inputs: dict) -> torch.Tensor:
        inputs = {k: v.to(engine.device, non_blocking=True) for k, v in inputs.items()}
        loss = engine(**inputs)["loss"]
        engine.backward(loss)
        engine.step()
        return loss

    result = _timed(_loader(size, batch, warmup + steps, device), warmup, device, step, cli.logging_steps)
    dist.destroy_process_group()
    return result


def trainer_arguments(runner: str, options: dict, cli: Any, output_dir: str, launched: bool) -> dict:
    """The keyword arguments of ``TrainingArguments`` for a configuration (trainwell's and the reference's alike)."""
    size = SIZES[cli.size]
    extra: dict = {"bf16": options["precision"] == "bf16", "fp16": options["precision"] == "fp16"}
    if options.get("compile"):
        extra.update(torch_compile=True, torch_compile_backend=cli.compile_backend)
    if options.get("fsdp"):
        layer = BLOCKS["llama" if options.get("model") == "qlora" else arch(size)]
        fsdp_config = {"transformer_layer_cls_to_wrap": [layer]}
        if options.get("checkpointing"):
            fsdp_config["activation_checkpointing"] = True
        extra.update(fsdp=True, fsdp_config=fsdp_config)
    if options.get("zero"):
        extra["deepspeed"] = zero_config(options["zero"], cli.batch, 1, options.get("clip", 0.0), auto=True)
    cpu = cli.device == "cpu"
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=cli.batch,
        learning_rate=1e-4,
        weight_decay=0.0,
        optim="adamw_torch" if cpu else "adamw_torch_fused",
        lr_scheduler_type="constant",
        max_grad_norm=options.get("clip", 0.0),
        max_steps=cli.warmup + cli.steps,
        logging_steps=cli.logging_steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=42,
        use_cpu=cpu and not launched,
        ddp_backend="gloo" if cpu and launched else None,
        **extra,
    )


def run_trainer(size: dict, batch: int, warmup: int, steps: int, runner: str, options: dict, cli: Any,
                launched: bool) -> dict:
    """trainwell's Trainer (or the reference's, for ``runner="reference"``) with the configuration's arguments."""
    if runner == "reference":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from trainwell import Trainer, TrainerCallback, TrainingArguments
    device = cli.device
    if options.get("zero") and device == "cpu":
        deepspeed_on_cpu()

    class Clock(TrainerCallback):
        start = end = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, warmup + steps):
                sync(device)
                if state.global_step == warmup:
                    self.start = time.perf_counter()
                    WINDOW.begin()
                else:
                    self.end = time.perf_counter()
                    WINDOW.end()

    clock = Clock()
    model = build(size, options.get("model", "gpt"), device)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(**trainer_arguments(runner, options, cli, out, launched))
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Tokens(batch * (warmup + steps), size["vocab"], size["seq"]),
            callbacks=[clock],
        )
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"seconds": clock.end - clock.start, "losses": losses}
