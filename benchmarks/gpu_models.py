"""The models and data of ``benchmarks/gpu.py``: a GPT-2-shaped model and a Llama-shaped one in plain PyTorch, the
GPT-2 shape as a ``transformers`` GPT2LMHeadModel, the QLoRA recipe's 4-bit Llama, and random token ids. Every
builder seeds itself, so all runs of one model start from the same weights.

Sizes (``SIZES``): ``gpt2-small`` (124M parameters), ``llama-1b`` (the shape of Llama 3.2 1B: 16 layers, width
2,048, 32 heads sharing 8 key/value heads, SwiGLU 8,192, vocabulary 128,256, tied embeddings; 1.24B parameters; a
size people fine-tune, which fits one 80 GB GPU under FSDP2 with activation checkpointing, ZeRO-3 and QLoRA), and
``tiny`` / ``llama-tiny``, the same code at a size a CPU runs in seconds."""

from __future__ import annotations

import tempfile

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

SIZES = {
    "gpt2-small": dict(layers=12, width=768, heads=12, vocab=50257, seq=1024),
    "tiny": dict(layers=2, width=64, heads=4, vocab=512, seq=64),
    "llama-1b": dict(arch="llama", layers=16, width=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, seq=1024),
    "llama-tiny": dict(arch="llama", layers=2, width=64, heads=4, kv_heads=2, ffn=128, vocab=512, seq=64),
}
#: the class of a model's repeated block, per architecture: what FSDP2 shards (and checkpoints) one by one
BLOCKS = {"gpt": "Block", "llama": "LlamaBlock"}


def arch(size: dict) -> str:
    return size.get("arch", "gpt")


def _shape(size: dict) -> dict:
    """The keyword arguments of the size's plain-PyTorch model."""
    return {k: v for k, v in size.items() if k != "arch"}


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


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaBlock(nn.Module):
    """Pre-norm (RMSNorm) attention with rotary positions and grouped key/values, then a SwiGLU MLP; no biases."""

    def __init__(self, width: int, heads: int, kv_heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, width // heads
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.head, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        self.gate_up = nn.Linear(width, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head).permute(2, 0, 3, 1, 4)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # q is bf16 under autocast and under FSDP2's bf16 parameters
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, c))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    """Llama's shape: token embeddings, rotary positions, RMSNorm/SwiGLU blocks, an output head tied to the
    embedding (as Llama 3.2 1B)."""

    def __init__(self, layers: int, width: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(LlamaBlock(width, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight
        head = width // heads
        inv = 1.0 / (500000.0 ** (torch.arange(0, head, 2).float() / head))
        angles = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        t = input_ids.shape[1]
        x = self.tok(input_ids)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        logits = self.head(self.norm(x))
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


def build(size: dict, kind: str, device: str) -> nn.Module:
    """``kind``: ``gpt`` (the size's plain-PyTorch model, GPT-2's or Llama's shape, on the CPU: the runner places
    it; a model of a billion parameters is built on ``device`` directly, where its initialization takes a fraction
    of the time), ``hf`` (GPT2LMHeadModel) or ``qlora``."""
    if kind == "qlora":
        return _qlora_model(size, device)
    torch.manual_seed(0)
    if kind == "hf":
        return _gpt2(size)
    where = device if arch(size) == "llama" and size["width"] >= 1024 else "cpu"
    with torch.device(where):
        return (Llama if arch(size) == "llama" else GPT)(**_shape(size))


def parameters(size: dict, kind: str) -> int:
    """The model's parameter count (a tied weight once; the Llama's unquantized, for QLoRA), built on the meta
    device: no memory, no time."""
    with torch.device("meta"):
        if kind == "qlora":
            import transformers

            model = transformers.LlamaForCausalLM(_llama_config(size))
        elif kind == "hf":
            model = _gpt2(size)
        else:
            model = (Llama if arch(size) == "llama" else GPT)(**_shape(size))
    return sum(p.numel() for p in model.parameters())


def _gpt2(size: dict) -> nn.Module:
    import transformers

    config = transformers.GPT2Config(
        n_layer=size["layers"],
        n_embd=size["width"],
        n_head=size["heads"],
        vocab_size=size["vocab"],
        n_positions=size["seq"],
    )
    return transformers.GPT2LMHeadModel(config)


def _llama_config(size: dict) -> object:
    import transformers

    return transformers.LlamaConfig(
        hidden_size=size["width"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size.get("kv_heads", size["heads"]),
        intermediate_size=size.get("ffn", 4 * size["width"]),
        vocab_size=size["vocab"],
        max_position_embeddings=size["seq"],
        tie_word_embeddings=arch(size) == "llama",
        rope_theta=500000.0,
    )


def _qlora_model(size: dict, device: str) -> nn.Module:
    """The QLoRA recipe on a Llama of ``size`` (same seed every time): 4-bit NF4 base, bf16 compute, LoRA r=16."""
    import peft
    import transformers

    torch.manual_seed(0)
    config = _llama_config(size)
    quantization = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
    )
    with tempfile.TemporaryDirectory() as folder:
        # built on the GPU (a billion parameters initialize in a fraction of the CPU's time) and saved in bf16 (the
        # compute dtype): half the bytes to write and read back
        with torch.device(device):
            full = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        full.save_pretrained(folder)
        del full
        base = transformers.LlamaForCausalLM.from_pretrained(
            folder, quantization_config=quantization, device_map={"": 0 if device == "cuda" else "cpu"}
        )
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    lora = peft.LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    return peft.get_peft_model(base, lora)
