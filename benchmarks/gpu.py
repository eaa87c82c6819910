"""Throughput on one GPU: trainwell against hand-written loops doing the same work, and the reference Trainer beside
them, for a GPT-2-small-sized model (``--size gpt2-small``, the default) or a Llama of 1.2B parameters (``--size 1b``).

The models are built in plain PyTorch (``benchmarks/gpu_models.py``; no ``transformers`` needed): GPT-2 small (12
layers, width 768, 12 heads, vocabulary 50,257, 1,024 positions; 124M parameters) and the shape of Llama 3.2 1B
(16 layers, width 2,048, 32 heads sharing 8 key/value heads, SwiGLU 8,192, vocabulary 128,256, tied embeddings;
1.24B parameters, a size people fine-tune), trained on random token ids generated in code, with AdamW (fused on a
GPU, no weight decay, constant LR). Each configuration runs in a fresh subprocess (the FSDP2 and DeepSpeed ones
under ``torchrun --nproc_per_node 1``) for ``--warmup`` steps, then is timed over ``--steps`` steps
(``benchmarks/gpu_runners.py``). Every trainwell row has a hand-written baseline doing the same work:

* ``loop bf16`` / ``trainwell bf16``: a DataLoader with pinned memory, autocast bf16, one ``optimizer.step()``
  per batch, no clipping (``max_grad_norm=0``);
* ``loop fp16`` / ``trainwell fp16``: autocast fp16 with a ``GradScaler`` (scale, step, update);
* ``loop bf16 clip`` / ``trainwell bf16 clip``: the bf16 pair with the gradient norm clipped to 1.0;
* ``loop bf16 compiled`` / ``trainwell bf16 compiled``: ``torch.compile`` on the model (``torch_compile=True``);
* ``loop FSDP2 bf16`` / ``trainwell FSDP2 bf16`` / ``transformers FSDP2 bf16`` (``fsdp=True``), one process: the
  loop shards each block and the root with ``fully_shard`` and ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`` (torchtitan's recipe; no autocast), on a 1-rank process group (nccl; gloo on a CPU);
* ``... FSDP2 AC bf16``: the same with activation checkpointing (``fsdp_config={"activation_checkpointing":
  True}``; the loop wraps each block in ``checkpoint_wrapper`` before sharding it, as Accelerate does);
* ``loop ZeRO-2 bf16`` / ``trainwell ZeRO-2 bf16`` and ``loop ZeRO-3 bf16`` / ``trainwell ZeRO-3 bf16`` /
  ``transformers ZeRO-3 bf16`` (``deepspeed=`` a config with ``"auto"`` values): the loop calls
  ``deepspeed.initialize`` with the values they resolve to and the same torch AdamW, then ``engine.backward`` and
  ``engine.step`` (needs ``deepspeed``);
* ``loop GPT2LMHeadModel`` / ``trainwell GPT2LMHeadModel`` / ``transformers GPT2LMHeadModel``: the GPT-2 shape as
  a ``transformers`` model built from a config, bf16, clipping at 1.0 (the reference's default), trained by a
  loop, by trainwell and by the reference Trainer (needs ``transformers``);
* ``loop QLoRA bf16`` / ``trainwell QLoRA bf16`` / ``transformers QLoRA bf16``: the QLoRA recipe (needs
  ``transformers``, ``peft`` and ``bitsandbytes``): a Llama of the size's shape loaded 4-bit NF4 with bf16
  compute, LoRA r=16 on the attention projections. Its MFU counts 4 x parameters per token (no weight gradients
  for the frozen base).

The trainers log every ``--logging-steps`` steps; the loops read their mean loss as often (one host sync each).
Printed, one row per configuration as it finishes (a configuration that fails, times out or cannot run here
still gets its row, saying why): tokens/s, the ratio to its baseline, MFU (model FLOPs: 6 x parameters + the
attention's 12 x layers x width x sequence, per token, over the GPU's dense bf16 peak; ``--peak-tflops``
overrides the table), the peak GPU memory, and the first and last logged loss. Nothing is asserted.
``--markdown FILE`` appends the rows to a markdown table (``benchmarks/gpu_session.sh`` writes its header);
``--deadline T`` (a Unix time) leaves the rows that would start after it unrun, saying so.

    python benchmarks/gpu.py [--size gpt2-small|1b] [--batch 8] [--steps 30] [--warmup 10] [--only NAME[,NAME]]
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]  # the models beside this file; the trainwell of this checkout, as the children get
from gpu_models import SIZES, parameters  # noqa: E402
from gpu_runners import run_deepspeed_loop, run_loop, run_trainer  # noqa: E402

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}  # dense
GPU_ONLY = "a CUDA GPU"
SIZE_ALIASES = {"1b": "llama-1b"}


@dataclass(frozen=True)
class Config:
    runner: str  #: loop, trainwell or reference
    options: dict  #: precision, clip, compile, fsdp, checkpointing, zero (the ZeRO stage), model (gpt, hf, qlora)
    baseline: str | None = None  #: the row it is compared with
    goal: float | None = None  #: the issue's goal for its ratio to the baseline
    needs: tuple[str, ...] = ()  #: GPU_ONLY and the packages it needs

    @property
    def launched(self) -> bool:  # FSDP2 and DeepSpeed run under torchrun, as users run them
        return "fsdp" in self.options or "zero" in self.options


HF, QLORA, DS = ("transformers",), ("transformers", "peft", "bitsandbytes"), ("deepspeed",)
BF16 = {"precision": "bf16"}
FSDP, FSDP_AC = {**BF16, "fsdp": True}, {**BF16, "fsdp": True, "checkpointing": True}
ZERO2, ZERO3 = {"precision": "bf16", "zero": 2}, {"precision": "bf16", "zero": 3}
HF_GPT2, QLORA_BF16 = {"precision": "bf16", "clip": 1.0, "model": "hf"}, {"precision": "bf16", "model": "qlora"}
CONFIGS = {  # baselines first: each row can print its ratio as soon as it finishes
    "loop bf16": Config("loop", BF16),
    "trainwell bf16": Config("trainwell", BF16, "loop bf16", 0.99),
    "loop fp16": Config("loop", {"precision": "fp16"}, needs=(GPU_ONLY,)),
    "trainwell fp16": Config("trainwell", {"precision": "fp16"}, "loop fp16", 0.99, needs=(GPU_ONLY,)),
    "loop bf16 clip": Config("loop", {**BF16, "clip": 1.0}),
    "trainwell bf16 clip": Config("trainwell", {**BF16, "clip": 1.0}, "loop bf16 clip", 0.99),
    "loop bf16 compiled": Config("loop", {**BF16, "compile": True}),
    "trainwell bf16 compiled": Config("trainwell", {**BF16, "compile": True}, "loop bf16 compiled", 0.98),
    # Accelerate runs FSDP only on GPUs: the Trainers' FSDP2 rows need one
    "loop FSDP2 bf16": Config("loop", FSDP),
    "trainwell FSDP2 bf16": Config("trainwell", FSDP, "loop FSDP2 bf16", 0.98, needs=(GPU_ONLY,)),
    "transformers FSDP2 bf16": Config("reference", FSDP, "loop FSDP2 bf16", needs=(GPU_ONLY, *HF)),
    "loop FSDP2 AC bf16": Config("loop", FSDP_AC),
    "trainwell FSDP2 AC bf16": Config("trainwell", FSDP_AC, "loop FSDP2 AC bf16", 0.98, needs=(GPU_ONLY,)),
    "transformers FSDP2 AC bf16": Config("reference", FSDP_AC, "loop FSDP2 AC bf16", needs=(GPU_ONLY, *HF)),
    "loop ZeRO-2 bf16": Config("loop", ZERO2, needs=DS),
    "trainwell ZeRO-2 bf16": Config("trainwell", ZERO2, "loop ZeRO-2 bf16", 0.97, needs=DS),
    "loop ZeRO-3 bf16": Config("loop", ZERO3, needs=DS),
    "trainwell ZeRO-3 bf16": Config("trainwell", ZERO3, "loop ZeRO-3 bf16", 0.97, needs=DS),
    # the reference refuses bf16 on a CPU unless use_cpu=True, which turns DeepSpeed off
    "transformers ZeRO-3 bf16": Config("reference", ZERO3, "loop ZeRO-3 bf16", needs=(GPU_ONLY, *DS, *HF)),
    "loop GPT2LMHeadModel": Config("loop", HF_GPT2, needs=HF),
    "trainwell GPT2LMHeadModel": Config("trainwell", HF_GPT2, "loop GPT2LMHeadModel", 0.99, needs=HF),
    "transformers GPT2LMHeadModel": Config("reference", HF_GPT2, "loop GPT2LMHeadModel", needs=HF),
    "loop QLoRA bf16": Config("loop", QLORA_BF16, needs=QLORA),
    "trainwell QLoRA bf16": Config("trainwell", QLORA_BF16, "loop QLoRA bf16", 1.0, needs=QLORA),
    "transformers QLoRA bf16": Config("reference", QLORA_BF16, "loop QLoRA bf16", needs=QLORA),
}


# ------------------------------------------------------------------------------------------------- a child
def child(name: str, cli: argparse.Namespace) -> dict:
    """Run configuration ``name`` in this process; its timing and facts as a dict. With ``cli.profile_out``, the
    timed steps run under ``torch.profiler`` and its summary is written there (``benchmarks/gpu_profile.py``)."""
    import gpu_runners

    size, config = SIZES[cli.size], CONFIGS[name]
    if getattr(cli, "profile_out", None):
        from gpu_profile import ProfileWindow

        gpu_runners.WINDOW = ProfileWindow(cli.device, cli.profile_out, cli.steps)
    if cli.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    options = config.options
    if config.runner != "loop":
        result = run_trainer(size, cli.batch, cli.warmup, cli.steps, config.runner, options, cli, config.launched)
    else:
        result = (run_deepspeed_loop if "zero" in options else run_loop)(
            size, cli.batch, cli.warmup, cli.steps, options, cli
        )
    gpu_runners.WINDOW = gpu_runners.Window()
    kind = options.get("model", "gpt")
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


def launch(name: str, flags: list[str], cli: argparse.Namespace, left: float | None = None) -> dict | str:
    """Run one configuration (within ``left`` seconds too, when given); its result, or a string that says why there
    is none (never raises)."""
    config = CONFIGS[name]
    timeout = cli.timeout if left is None else max(1.0, min(cli.timeout, left))
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
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
            if proc.returncode != 0 or not os.path.exists(out):
                return f"failed (exit {proc.returncode}): {_error_line(proc.stdout + proc.stderr)}"
            with open(out) as fh:
                return json.load(fh)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    except Exception as err:  # one configuration's failure must not cost the other rows
        return f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:180] if str(err).strip() else ''}"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rate(result: dict) -> float:
    return result["tokens"] / result["seconds"]


def _cells(name: str, results: dict, size: dict, peak: float | None) -> dict | str:
    """A finished row's figures as text (tokens/s, ratio to the baseline, MFU, peak GiB, losses), or why none."""
    r = results[name]
    if isinstance(r, str):
        return r
    flops = r["flops_per_param"] * r["params"] + 12 * size["layers"] * size["width"] * size["seq"]
    base = results.get(CONFIGS[name].baseline or "")
    return {
        "rate": f"{_rate(r):,.0f}",
        "ratio": f"{_rate(r) / _rate(base):.3f}x" if isinstance(base, dict) else "",
        "mfu": f"{_rate(r) * flops / (peak * 1e12):.1%}" if peak else "-",
        "peak": f"{r['peak_bytes'] / 2**30:.2f}",
        "losses": f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}" if r["losses"] else "-",
    }


def format_row(name: str, results: dict, size: dict, peak: float | None) -> str:
    c = _cells(name, results, size, peak)
    if isinstance(c, str):
        return f"{name:<31}{c}"
    return f"{name:<31}{c['rate']:>12}{c['ratio']:>9}{c['mfu']:>7}{c['peak']:>10}{c['losses']:>22}"


MARKDOWN_HEADER = (
    "| size | configuration | tokens/s | vs its baseline (goal) | MFU | peak GiB | loss first -> last | note |\n"
    "|---|---|---:|---:|---:|---:|---|---|\n"
)


def markdown_row(name: str, results: dict, cli: argparse.Namespace, peak: float | None) -> str:
    """The row of ``--markdown``: the columns of MARKDOWN_HEADER."""
    config, c = CONFIGS[name], _cells(name, results, SIZES[cli.size], peak)
    if isinstance(c, str):
        return f"| {cli.size} | {name} | | | | | | {c.replace('|', '/')} |\n"
    ratio = f"{c['ratio']} vs {config.baseline}" if c["ratio"] else ""
    if ratio and config.goal is not None:
        met = _rate(results[name]) / _rate(results[config.baseline]) >= config.goal
        ratio += f" (>= {config.goal}: {'met' if met else 'MISSED'})"
    return f"| {cli.size} | {name} | {c['rate']} | {ratio} | {c['mfu']} | {c['peak']} | {c['losses']} | |\n"


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
    parser.add_argument("--size", choices=[*SIZES, *SIZE_ALIASES], default="gpt2-small",
                        help="the model: gpt2-small (124M), 1b (= llama-1b, 1.24B), tiny or llama-tiny (CPU checks)")
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
        help="CPU, tiny model (the --size's tiny twin), batch 4, 2+3 steps, the eager compile backend, in process",
    )
    parser.add_argument("--markdown", metavar="FILE", help="append each row to this markdown table")
    parser.add_argument("--deadline", type=float, default=None, metavar="UNIX_TIME",
                        help="leave the rows that would start after this time unrun (and cap each row's timeout)")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    cli = parser.parse_args(argv)
    cli.size = SIZE_ALIASES.get(cli.size, cli.size)
    if cli.smoke:
        cli.size = "llama-tiny" if SIZES[cli.size].get("arch") == "llama" else "tiny"
        cli.device, cli.batch, cli.steps, cli.warmup = "cpu", 4, 3, 2
        cli.compile_backend, cli.in_process, cli.logging_steps = "eager", True, 1
    if min(cli.steps, cli.warmup, cli.batch, cli.logging_steps) < 1:
        parser.error("--steps, --warmup, --batch and --logging-steps must be positive integers")
    return cli, _names(cli.only, parser)


def child_flags(cli: argparse.Namespace) -> list[str]:
    """The command-line flags that make a child process run a configuration as ``cli`` says."""
    return [
        "--size", cli.size, "--device", cli.device, "--batch", str(cli.batch), "--steps", str(cli.steps),
        "--warmup", str(cli.warmup), "--logging-steps", str(cli.logging_steps), "--compile-backend",
        cli.compile_backend,
    ]  # fmt: skip


def _dry_run(names: list[str], cli: argparse.Namespace) -> None:
    for name in names:
        config = CONFIGS[name]
        how = "torchrun --nproc_per_node 1" if config.launched else "this process" if cli.in_process else "a subprocess"
        print(f"{name:<31}{skip_reason(config, cli.device) or 'would run in ' + how}")


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
    if cli.dry_run:
        return _dry_run(names, cli)
    peak = _peak_tflops(cli)
    print(
        f"{'configuration':<31}{'tokens/s':>12}{'vs base':>9}{'MFU':>7}{'peak GiB':>10}{'loss first -> last':>22}",
        flush=True,
    )
    results: dict[str, dict | str] = {}
    for name in names:
        left = None if cli.deadline is None else cli.deadline - time.time()
        if left is not None and left < 5:
            results[name] = "not run: the session's time budget was spent"
        else:
            results[name] = skip_reason(CONFIGS[name], cli.device) or launch(name, child_flags(cli), cli, left)
        print(format_row(name, results, size, peak), flush=True)
        if cli.markdown:
            with open(cli.markdown, "a") as fh:
                fh.write(markdown_row(name, results, cli, peak))
    for line in summary(results):
        print(line)


if __name__ == "__main__":
    main()
