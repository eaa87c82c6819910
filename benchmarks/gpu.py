"""Throughput on one GPU: trainwell against hand-written loops doing the same work, for a GPT-2-small-sized model.

A decoder-only transformer the size of GPT-2 small (12 layers, width 768, 12 heads, vocabulary 50,257, 1,024
positions; 124M parameters) is built in plain PyTorch (``benchmarks/gpu_models.py``; no ``transformers`` needed),
and trained on random token ids generated in code, with AdamW (fused on a GPU, no weight decay, constant LR).
Each configuration runs in a fresh subprocess (the FSDP2 and DeepSpeed ones under ``torchrun --nproc_per_node 1``)
for ``--warmup`` steps, then is timed over ``--steps`` steps. Every trainwell row has a hand-written baseline
doing the same work:

* ``loop bf16`` / ``trainwell bf16``: a DataLoader with pinned memory, autocast bf16, one ``optimizer.step()``
  per batch, no clipping (``max_grad_norm=0``);
* ``loop fp16`` / ``trainwell fp16``: autocast fp16 with a ``GradScaler`` (scale, step, update);
* ``loop bf16 clip`` / ``trainwell bf16 clip``: the bf16 pair with the gradient norm clipped to 1.0;
* ``loop bf16 compiled`` / ``trainwell bf16 compiled``: ``torch.compile`` on the model (``torch_compile=True``);
* ``loop FSDP2 bf16`` / ``trainwell FSDP2 bf16`` (``fsdp=True``), one process: the loop shards each block and
  the root with ``fully_shard`` and ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (torchtitan's
  recipe; no autocast), on a 1-rank process group (nccl; gloo on a CPU);
* ``trainwell ZeRO-3 bf16`` (``deepspeed=`` a ZeRO-3 config with ``"auto"`` values), against ``loop bf16``;
* ``loop GPT2LMHeadModel`` / ``trainwell GPT2LMHeadModel`` / ``transformers GPT2LMHeadModel``: the same shape as
  a ``transformers`` model built from a config, bf16, clipping at 1.0 (the reference's default), trained by a
  loop, by trainwell and by the reference Trainer (needs ``transformers``);
* ``loop QLoRA bf16`` / ``trainwell QLoRA bf16``: the QLoRA recipe (needs ``transformers``, ``peft`` and
  ``bitsandbytes``): a Llama of the same size loaded 4-bit NF4 with bf16 compute, LoRA r=16 on the attention
  projections. Its MFU counts 4 x parameters per token (no weight gradients for the frozen base).

The trainers log every ``--logging-steps`` steps; the loops read their mean loss as often (one host sync each).
Printed, one row per configuration as it finishes (a configuration that fails, times out or cannot run here
still gets its row, saying why): tokens/s, the ratio to its baseline, MFU (model FLOPs: 6 x parameters + the
attention's 12 x layers x width x sequence, per token, over the GPU's dense bf16 peak; ``--peak-tflops``
overrides the table), the peak GPU memory, and the first and last logged loss. Nothing is asserted.

    python benchmarks/gpu.py [--batch 8] [--steps 30] [--warmup 10] [--only NAME[,NAME]] [--logging-steps 10]
    python benchmarks/gpu.py --dry-run   # what would run here, and what would be skipped
    python benchmarks/gpu.py --smoke     # CPU, a tiny model, 2+3 steps of every configuration a CPU can run
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]  # the models beside this file; the trainwell of this checkout, as the children get
from gpu_models import SIZES, Tokens, build, parameters  # noqa: E402

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}  # dense
GPU_ONLY = "a CUDA GPU"


@dataclass(frozen=True)
class Config:
    runner: str  #: loop, trainwell or reference
    options: dict  #: precision, clip, compile, fsdp, deepspeed, model (gpt, hf, qlora)
    baseline: str | None = None  #: the row it is compared with
    goal: float | None = None  #: the issue's goal for its ratio to the baseline
    needs: tuple[str, ...] = ()  #: GPU_ONLY and the packages it needs

    @property
    def launched(self) -> bool:  # FSDP2 and DeepSpeed run under torchrun, as users run them
        return "fsdp" in self.options or "deepspeed" in self.options


HF, QLORA = ("transformers",), ("transformers", "peft", "bitsandbytes")
FSDP_CONFIG = {"transformer_layer_cls_to_wrap": ["Block"]}
ZERO3 = {
    "zero_optimization": {"stage": 3},
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
}
CONFIGS = {  # baselines first: each row can print its ratio as soon as it finishes
    "loop bf16": Config("loop", {"precision": "bf16"}),
    "trainwell bf16": Config("trainwell", {"precision": "bf16"}, "loop bf16", 0.99),
    "loop fp16": Config("loop", {"precision": "fp16"}, needs=(GPU_ONLY,)),
    "trainwell fp16": Config("trainwell", {"precision": "fp16"}, "loop fp16", 0.97, needs=(GPU_ONLY,)),
    "loop bf16 clip": Config("loop", {"precision": "bf16", "clip": 1.0}),
    "trainwell bf16 clip": Config("trainwell", {"precision": "bf16", "clip": 1.0}, "loop bf16 clip", 0.99),
    "loop bf16 compiled": Config("loop", {"precision": "bf16", "compile": True}),
    "trainwell bf16 compiled": Config("trainwell", {"precision": "bf16", "compile": True}, "loop bf16 compiled", 0.98),
    "loop FSDP2 bf16": Config("loop", {"precision": "bf16", "fsdp": True}),
    "trainwell FSDP2 bf16": Config(
        "trainwell", {"precision": "bf16", "fsdp": True}, "loop FSDP2 bf16", 0.97, needs=(GPU_ONLY,)
    ),  # Accelerate runs FSDP only on GPUs
    "trainwell ZeRO-3 bf16": Config(
        "trainwell", {"precision": "bf16", "deepspeed": ZERO3}, "loop bf16", needs=(GPU_ONLY, "deepspeed")
    ),
    "loop GPT2LMHeadModel": Config("loop", {"precision": "bf16", "clip": 1.0, "model": "hf"}, needs=HF),
    "trainwell GPT2LMHeadModel": Config(
        "trainwell", {"precision": "bf16", "clip": 1.0, "model": "hf"}, "loop GPT2LMHeadModel", 0.99, needs=HF
    ),
    "transformers GPT2LMHeadModel": Config(
        "reference", {"precision": "bf16", "clip": 1.0, "model": "hf"}, "loop GPT2LMHeadModel", needs=HF
    ),
    "loop QLoRA bf16": Config("loop", {"precision": "bf16", "model": "qlora"}, needs=QLORA),
    "trainwell QLoRA bf16": Config(
        "trainwell", {"precision": "bf16", "model": "qlora"}, "loop QLoRA bf16", needs=QLORA
    ),
}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------- runners
def _fully_shard(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """The hand-written FSDP2 set-up: a process group of torchrun's ranks, each block and the root sharded."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model.to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def run_loop(size: dict, batch: int, warmup: int, steps: int, options: dict, cli: argparse.Namespace) -> dict:
    """The hand-written baseline: what a careful user writes for this configuration on one GPU."""
    device, precision, clip = cli.device, options["precision"], options.get("clip")
    model = build(size, options.get("model", "gpt"), device)
    if options.get("fsdp"):
        model = _fully_shard(model, device)  # parameters in bf16 for compute by FSDP2's policy: no autocast
    elif options.get("model") != "qlora":
        model = model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0, fused=device == "cuda")
    scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
    forward = torch.compile(model, backend=cli.compile_backend) if options.get("compile") else model
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    autocast = contextlib.nullcontext() if options.get("fsdp") else torch.autocast(device, dtype=dtype)
    loader = DataLoader(
        Tokens(batch * (warmup + steps), size["vocab"], size["seq"]),
        batch_size=batch,
        shuffle=True,
        pin_memory=device == "cuda",
        generator=torch.Generator().manual_seed(42),
    )
    window, logged, start = [], [], None
    for step, inputs in enumerate(loader):
        if step == warmup:
            _sync(device)
            start = time.perf_counter()
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
        window.append(loss.detach())
        if (step + 1) % cli.logging_steps == 0:  # a logging step: one host read, as the trainers' logs
            logged.append(float(torch.stack(window).float().mean()))
            window = []
    _sync(device)
    seconds = time.perf_counter() - start
    if options.get("fsdp"):
        torch.distributed.destroy_process_group()
    return {"seconds": seconds, "losses": logged}


def run_trainer(size: dict, batch: int, warmup: int, steps: int, config: Config, cli: argparse.Namespace) -> dict:
    """trainwell's Trainer (or the reference's, for ``runner="reference"``) with the configuration's arguments."""
    if config.runner == "reference":
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from trainwell import Trainer, TrainerCallback, TrainingArguments
    device, options = cli.device, config.options

    class Clock(TrainerCallback):
        start = end = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, warmup + steps):
                _sync(device)
                if state.global_step == warmup:
                    self.start = time.perf_counter()
                else:
                    self.end = time.perf_counter()

    clock = Clock()
    model = build(size, options.get("model", "gpt"), device)
    extra: dict = {"bf16": options["precision"] == "bf16", "fp16": options["precision"] == "fp16"}
    if options.get("compile"):
        extra["torch_compile_backend"] = cli.compile_backend
    if options.get("fsdp"):
        extra.update(fsdp=True, fsdp_config=FSDP_CONFIG)
    if options.get("deepspeed"):
        extra["deepspeed"] = options["deepspeed"]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch,
            learning_rate=1e-4,
            weight_decay=0.0,
            optim="adamw_torch_fused" if device == "cuda" else "adamw_torch",
            lr_scheduler_type="constant",
            max_grad_norm=options.get("clip", 0.0),
            max_steps=warmup + steps,
            logging_steps=cli.logging_steps,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=42,
            use_cpu=device == "cpu" and not config.launched,
            ddp_backend="gloo" if device == "cpu" and config.launched else None,
            **extra,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Tokens(batch * (warmup + steps), size["vocab"], size["seq"]),
            callbacks=[clock],
        )
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"seconds": clock.end - clock.start, "losses": losses}


def child(name: str, cli: argparse.Namespace) -> dict:
    """Run configuration ``name`` in this process; its timing and facts as a dict."""
    size, config = SIZES[cli.size], CONFIGS[name]
    if cli.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if config.runner == "loop":
        result = run_loop(size, cli.batch, cli.warmup, cli.steps, config.options, cli)
    else:
        result = run_trainer(size, cli.batch, cli.warmup, cli.steps, config, cli)
    kind = config.options.get("model", "gpt")
    peak = torch.cuda.max_memory_allocated() if cli.device == "cuda" else 0
    per_param = 4 if kind == "qlora" else 6  # a frozen base computes no weight gradients
    tokens = cli.batch * size["seq"] * cli.steps
    return {
        **result,
        "params": parameters(size, kind),
        "peak_bytes": peak,
        "tokens": tokens,
        "flops_per_param": per_param,
    }


# ------------------------------------------------------------------------------------------------- driver
def skip_reason(config: Config, device: str) -> str | None:
    """Why ``config`` cannot run here (a GPU or a package missing), or None."""
    if device == "cuda" and not torch.cuda.is_available():
        return "skipped: --device cuda, and no CUDA GPU here"
    if GPU_ONLY in config.needs and device != "cuda":
        return f"skipped: needs {GPU_ONLY}"
    missing = [p for p in config.needs if p != GPU_ONLY and importlib.util.find_spec(p) is None]
    return f"skipped: {', '.join(missing)} not installed" if missing else None


def _error_line(output: str) -> str:
    """The most telling line of a failed child's output: its last exception line (not torchrun's own
    ChildFailedError, which only says that a rank failed), else its last line."""
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", line.strip()) for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(Error|Exception)\b.*:", line) and "ChildFailedError" not in line]
    return ((errors or lines or ["no output"])[-1])[:200]


def launch(name: str, flags: list[str], cli: argparse.Namespace) -> dict | str:
    """Run one configuration; its result, or a string that says why there is none (never raises)."""
    config = CONFIGS[name]
    try:
        if cli.in_process and not config.launched:
            with contextlib.redirect_stdout(sys.stderr):
                return child(name, cli)
        launcher = [sys.executable]
        if config.launched:
            launcher += ["-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(_free_port())]
        env = {**os.environ, "PYTHONPATH": ROOT}
        with tempfile.TemporaryDirectory() as folder:
            out = os.path.join(folder, "result.json")
            cmd = [*launcher, os.path.abspath(__file__), "--child", name, "--out", out, *flags]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=cli.timeout, check=False)
            if proc.returncode != 0 or not os.path.exists(out):
                return f"failed (exit {proc.returncode}): {_error_line(proc.stdout + proc.stderr)}"
            with open(out) as fh:
                return json.load(fh)
    except subprocess.TimeoutExpired:
        return f"timed out after {cli.timeout:.0f} s"
    except Exception as err:  # one configuration's failure must not cost the other rows
        return f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:180] if str(err).strip() else ''}"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rate(result: dict) -> float:
    return result["tokens"] / result["seconds"]


def format_row(name: str, results: dict, size: dict, peak: float | None) -> str:
    r = results[name]
    if isinstance(r, str):
        return f"{name:<31}{r}"
    flops = r["flops_per_param"] * r["params"] + 12 * size["layers"] * size["width"] * size["seq"]
    base = results.get(CONFIGS[name].baseline or "")
    ratio = f"{_rate(r) / _rate(base):.3f}x" if isinstance(base, dict) else ""
    mfu = f"{_rate(r) * flops / (peak * 1e12):.1%}" if peak else "-"
    losses = f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}" if r["losses"] else "-"
    return f"{name:<31}{_rate(r):>12,.0f}{ratio:>9}{mfu:>7}{r['peak_bytes'] / 2**30:>10.2f}{losses:>22}"


def summary(results: dict) -> list[str]:
    """One line per configuration with a goal: its ratio to its baseline, met or missed."""
    lines = []
    for name, result in results.items():
        config = CONFIGS[name]
        base = results.get(config.baseline or "")
        if config.goal is None or not isinstance(result, dict) or not isinstance(base, dict):
            continue
        ratio = _rate(result) / _rate(base)
        verdict = "met" if ratio >= config.goal else "MISSED"
        lines.append(f"{name} / {config.baseline}: {ratio:.3f}x (goal >= {config.goal}) -> {verdict}")
    return lines


def _peak_tflops(cli: argparse.Namespace) -> float | None:
    if cli.peak_tflops:
        return cli.peak_tflops
    if cli.device != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _names(values: list[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    """``--only`` values (comma-separated, repeatable), checked against the configurations."""
    if not values:
        return list(CONFIGS)
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--only: unknown configuration(s) {unknown}; choose from: {', '.join(CONFIGS)}")
    return names


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the timing starts")
    parser.add_argument("--only", action="append", metavar="NAME[,NAME]", help="configurations to run (default all)")
    parser.add_argument("--logging-steps", type=int, default=10, help="log (the loops: read the loss) every N steps")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration (subprocesses)")
    parser.add_argument("--size", choices=list(SIZES), default="gpt2-small")
    parser.add_argument("--tiny", action="store_const", const="tiny", dest="size", help="--size tiny")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the compiled pair")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the configurations that need no launcher in this process (a quick check)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would run and what would be skipped")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU, tiny model, batch 4, 2+3 steps, the eager compile backend, in process",
    )
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    if cli.smoke:
        cli.size, cli.device, cli.batch, cli.steps, cli.warmup = "tiny", "cpu", 4, 3, 2
        cli.compile_backend, cli.in_process, cli.logging_steps = "eager", True, 1
    if min(cli.steps, cli.warmup, cli.batch, cli.logging_steps) < 1:
        parser.error("--steps, --warmup, --batch and --logging-steps must be positive integers")
    return cli, _names(cli.only, parser)


def main(argv: list[str] | None = None) -> None:
    cli, names = parse(argv)
    if cli.child:
        with contextlib.redirect_stdout(sys.stderr):
            result = child(cli.child, cli)
        with open(cli.out, "w") as fh:
            json.dump(result, fh)
        return
    if cli.device == "cuda" and not torch.cuda.is_available() and not cli.dry_run:
        sys.exit(
            "benchmarks/gpu.py: no CUDA GPU here. Use --smoke (or --device cpu --tiny) for a CPU check of the "
            "script, or --dry-run to list the configurations."
        )
    where = torch.cuda.get_device_name() if cli.device == "cuda" and torch.cuda.is_available() else "CPU"
    size = SIZES[cli.size]
    print(
        f"{where}, torch {torch.__version__}, {cli.size}, batch {cli.batch} x {size['seq']} tokens, {cli.warmup} "
        f"warm-up + {cli.steps} timed steps, logging every {cli.logging_steps}",
        flush=True,
    )
    flags = [
        "--size",
        cli.size,
        "--device",
        cli.device,
        "--batch",
        str(cli.batch),
        "--steps",
        str(cli.steps),
        "--warmup",
        str(cli.warmup),
        "--logging-steps",
        str(cli.logging_steps),
        "--compile-backend",
        cli.compile_backend,
    ]
    if cli.dry_run:
        for name in names:
            config = CONFIGS[name]
            how = (
                "torchrun --nproc_per_node 1"
                if config.launched
                else "this process"
                if cli.in_process
                else "a subprocess"
            )
            print(f"{name:<31}{skip_reason(config, cli.device) or 'would run in ' + how}")
        return
    peak = _peak_tflops(cli)
    print(
        f"{'configuration':<31}{'tokens/s':>12}{'vs base':>9}{'MFU':>7}{'peak GiB':>10}{'loss first -> last':>22}",
        flush=True,
    )
    results: dict[str, dict | str] = {}
    for name in names:
        results[name] = skip_reason(CONFIGS[name], cli.device) or launch(name, flags, cli)
        print(format_row(name, results, size, peak), flush=True)
    for line in summary(results):
        print(line)


if __name__ == "__main__":
    main()
