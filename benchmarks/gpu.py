"""Throughput on one GPU: trainwell against a hand-written loop, for a GPT-2-small-sized model.

A decoder-only transformer the size of GPT-2 small (12 layers, width 768, 12 heads, vocabulary 50,257, 1,024
positions; 124M parameters) is built in plain PyTorch (no ``transformers`` needed), and trained on random token
ids generated in code, with AdamW. Each configuration runs in a fresh subprocess (FSDP and DeepSpeed under
``torchrun --nproc_per_node 1``) for ``--warmup`` steps, then is timed over ``--steps`` steps:

* ``loop bf16`` / ``loop bf16 compiled``: the hand-written baseline (a DataLoader with pinned memory, autocast
  bf16, fused AdamW, one ``optimizer.step()`` per batch; ``torch.compile`` on the model);
* ``trainwell bf16``, ``trainwell fp16`` (GradScaler), ``trainwell bf16 compiled`` (``torch_compile=True``);
* ``trainwell FSDP2 bf16`` (``fsdp=True``, one process) and ``trainwell ZeRO-3 bf16`` (``deepspeed=`` a ZeRO-3
  config with ``"auto"`` values);
* ``loop QLoRA bf16`` / ``trainwell QLoRA bf16``: the QLoRA recipe (needs ``transformers``, ``peft`` and
  ``bitsandbytes``): a Llama of the same size (``transformers``, built from a config) loaded 4-bit NF4 with bf16
  compute, ``prepare_model_for_kbit_training``, LoRA r=16 on the attention projections; the hand-written loop
  steps AdamW over the adapter's parameters. Its MFU counts 4 x parameters per token (no weight gradients for
  the frozen base) plus the attention's term.

Printed: tokens/s, the ratio to the matching hand-written loop (goal: trainwell bf16 >= 0.99x), MFU (model
FLOPs: 6 x parameters + the attention's 12 x layers x width x sequence, per token, over the GPU's dense bf16
peak; ``--peak-tflops`` overrides the table), the peak GPU memory, and the first and last loss (all runs
start from the same weights; the hand-written loop shuffles with its own sampler). Nothing is asserted.

    python benchmarks/gpu.py [--batch 8] [--steps 30] [--warmup 10] [--only NAME ...] [--peak-tflops 989]
    python benchmarks/gpu.py --smoke     # CPU, a tiny model, the plain bf16 pair: checks the script runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

SIZES = {"gpt2-small": dict(layers=12, width=768, heads=12, vocab=50257, seq=1024),
         "tiny": dict(layers=2, width=64, heads=4, vocab=512, seq=64)}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}  # dense
CONFIGS = {  # name -> (runner, options)
    "loop bf16": ("loop", {}),
    "trainwell bf16": ("trainwell", {"bf16": True}),
    "trainwell fp16": ("trainwell", {"fp16": True}),
    "loop bf16 compiled": ("loop", {"compile": True}),
    "trainwell bf16 compiled": ("trainwell", {"bf16": True, "torch_compile": True}),
    "trainwell FSDP2 bf16": ("trainwell", {"bf16": True, "fsdp": True,
                                           "fsdp_config": {"transformer_layer_cls_to_wrap": ["Block"]}}),
    "trainwell ZeRO-3 bf16": ("trainwell", {"bf16": True, "deepspeed": {
        "zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto", "gradient_clipping": "auto"}}),
    "loop QLoRA bf16": ("loop", {"qlora": True}),
    "trainwell QLoRA bf16": ("trainwell", {"bf16": True, "qlora": True}),
}
LAUNCHED = ("fsdp", "deepspeed")  # these run under torchrun
BASELINE = {"trainwell bf16": "loop bf16", "trainwell fp16": "loop bf16", "trainwell bf16 compiled":
            "loop bf16 compiled", "trainwell FSDP2 bf16": "loop bf16", "trainwell ZeRO-3 bf16": "loop bf16",
            "trainwell QLoRA bf16": "loop QLoRA bf16"}


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(att)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-2's shape: token and position embeddings, pre-norm blocks, an output head tied to the embedding."""

    def __init__(self, layers: int, width: int, heads: int, vocab: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        for module in self.modules():  # GPT-2's initialization: N(0, 0.02), zero biases
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        return out


class Tokens(Dataset):
    def __init__(self, n: int, vocab: int, seq: int) -> None:
        self.ids = torch.randint(vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model(size: dict) -> GPT:
    torch.manual_seed(0)
    return GPT(**size)


def _llama_config(size: dict) -> object:
    import transformers

    return transformers.LlamaConfig(hidden_size=size["width"], num_hidden_layers=size["layers"],
                                    num_attention_heads=size["heads"], num_key_value_heads=size["heads"],
                                    intermediate_size=4 * size["width"], vocab_size=size["vocab"],
                                    max_position_embeddings=size["seq"])


def _parameters(size: dict, qlora: bool) -> int:
    """The model's parameter count (the Llama's unquantized, for QLoRA; built on the meta device: no memory)."""
    if not qlora:
        return sum(p.numel() for p in _model(size).parameters())
    import transformers

    with torch.device("meta"):
        return sum(p.numel() for p in transformers.LlamaForCausalLM(_llama_config(size)).parameters())


def _qlora_model(size: dict, device: str) -> nn.Module:
    """The QLoRA recipe on a Llama of ``size`` (same seed every time): 4-bit NF4 base, bf16 compute, LoRA r=16."""
    import peft
    import transformers

    torch.manual_seed(0)
    config = _llama_config(size)
    quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                   bnb_4bit_compute_dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as folder:
        transformers.LlamaForCausalLM(config).save_pretrained(folder)
        base = transformers.LlamaForCausalLM.from_pretrained(
            folder, quantization_config=quantization, device_map={"": 0 if device == "cuda" else "cpu"})
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    lora = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                   "o_proj"])
    return peft.get_peft_model(base, lora)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_loop(size: dict, batch: int, warmup: int, steps: int, options: dict, device: str) -> dict:
    """The hand-written baseline: what a careful user writes for bf16 training on one GPU."""
    model = _qlora_model(size, device) if options.get("qlora") else _model(size).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=device == "cuda")
    forward = torch.compile(model) if options.get("compile") else model
    loader = DataLoader(Tokens(batch * (warmup + steps), size["vocab"], size["seq"]), batch_size=batch,
                        shuffle=True, pin_memory=device == "cuda", generator=torch.Generator().manual_seed(42))
    losses, start = [], None
    for step, inputs in enumerate(loader):
        if step == warmup:
            _sync()
            start = time.perf_counter()
        inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = forward(**inputs)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    _sync()
    return {"seconds": time.perf_counter() - start, "losses": [float(x) for x in losses]}


def run_trainwell(size: dict, batch: int, warmup: int, steps: int, options: dict, device: str) -> dict:
    from trainwell import Trainer, TrainerCallback, TrainingArguments

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.start = self.end = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, warmup + steps):
                _sync()
                if state.global_step == warmup:
                    self.start = time.perf_counter()
                else:
                    self.end = time.perf_counter()

    clock = Clock()
    options = dict(options)
    model = _qlora_model(size, device) if options.pop("qlora", False) else _model(size)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=batch, learning_rate=1e-4, weight_decay=0.0,
            optim="adamw_torch_fused" if device == "cuda" else "adamw_torch", lr_scheduler_type="constant",
            max_grad_norm=0.0, max_steps=warmup + steps, logging_steps=1, save_strategy="no", report_to="none",
            disable_tqdm=True, seed=42, use_cpu=device == "cpu" and not set(options) & set(LAUNCHED),
            ddp_backend="gloo" if device == "cpu" and set(options) & set(LAUNCHED) else None, **options,
        )
        trainer = Trainer(model=model, args=args,
                          train_dataset=Tokens(batch * (warmup + steps), size["vocab"], size["seq"]),
                          callbacks=[clock])
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"seconds": clock.end - clock.start, "losses": losses}


def child(name: str, size_name: str, batch: int, warmup: int, steps: int, device: str) -> dict:
    size = SIZES[size_name]
    runner, options = CONFIGS[name]
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if runner == "loop":
        result = run_loop(size, batch, warmup, steps, options, device)
    else:
        result = run_trainwell(size, batch, warmup, steps, options, device)
    params = _parameters(size, options.get("qlora", False))
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    per_param = 4 if options.get("qlora") else 6  # a frozen base computes no weight gradients
    return {**result, "params": params, "peak_bytes": peak, "tokens": batch * size["seq"] * steps,
            "flops_per_param": per_param}


def _launch(name: str, flags: list[str]) -> dict | str:
    launcher = [sys.executable]
    if set(CONFIGS[name][1]) & set(LAUNCHED):
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", "1"]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [*launcher, os.path.abspath(__file__), "--child", name, "--out", out.name, *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
        if proc.returncode != 0:
            return (proc.stdout + proc.stderr).strip().splitlines()[-1][:160] if proc.stdout + proc.stderr else "?"
        return json.load(open(out.name))


def _peak_tflops(cli_value: float | None) -> float | None:
    if cli_value:
        return cli_value
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def report(results: dict[str, dict | str], size: dict, peak: float | None) -> None:
    head = f"{'configuration':<26}{'tokens/s':>12}{'vs loop':>9}{'MFU':>7}{'peak GiB':>10}{'loss first -> last':>22}"
    print(head)
    for name, r in results.items():
        if isinstance(r, str):
            print(f"{name:<26}failed: {r}")
            continue
        rate = r["tokens"] / r["seconds"]
        flops = r.get("flops_per_param", 6) * r["params"] + 12 * size["layers"] * size["width"] * size["seq"]
        base = results.get(BASELINE.get(name, ""))
        ratio = f"{rate / (base['tokens'] / base['seconds']):.3f}x" if isinstance(base, dict) else ""
        mfu = f"{rate * flops / (peak * 1e12):.1%}" if peak else "-"
        losses = f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}"
        print(f"{name:<26}{rate:>12,.0f}{ratio:>9}{mfu:>7}{r['peak_bytes'] / 2**30:>10.2f}{losses:>22}")
    ours, loop = results.get("trainwell bf16"), results.get("loop bf16")
    if isinstance(ours, dict) and isinstance(loop, dict):
        ratio = (ours["tokens"] / ours["seconds"]) / (loop["tokens"] / loop["seconds"])
        print(f"trainwell bf16 / hand-written bf16 loop: {ratio:.3f}x (goal >= 0.99x) -> "
              f"{'met' if ratio >= 0.99 else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), default=None)
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, tiny model, 2+3 steps; the plain bf16 pair unless --only")
    parser.add_argument("--child", choices=list(CONFIGS))
    parser.add_argument("--out")
    parser.add_argument("--size", choices=list(SIZES), default="gpt2-small")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    cli = parser.parse_args()
    if cli.child:
        with contextlib.redirect_stdout(sys.stderr):
            result = child(cli.child, cli.size, cli.batch, cli.warmup, cli.steps, cli.device)
        with open(cli.out, "w") as fh:
            json.dump(result, fh)
        return
    if cli.smoke:
        cli.size, cli.device, cli.batch, cli.steps, cli.warmup = "tiny", "cpu", 4, 3, 2
        # fp16 and FSDP need a GPU; ZeRO-3 and compile would build kernels for minutes on a CPU
        names = cli.only or ["loop bf16", "trainwell bf16"]
    elif not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA GPU (or --smoke for a CPU check of the script)")
    else:
        names = cli.only or list(CONFIGS)
    where = torch.cuda.get_device_name() if cli.device == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}, {cli.size}, batch {cli.batch} x {SIZES[cli.size]['seq']} tokens, "
          f"{cli.warmup} warm-up + {cli.steps} timed steps")
    flags = ["--size", cli.size, "--device", cli.device, "--batch", str(cli.batch), "--steps", str(cli.steps),
             "--warmup", str(cli.warmup)]
    results = {name: _launch(name, flags) for name in names}
    report(results, SIZES[cli.size], _peak_tflops(cli.peak_tflops))


if __name__ == "__main__":
    main()
