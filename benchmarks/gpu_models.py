"""The models and data of ``benchmarks/gpu.py``: a GPT-2-shaped model in plain PyTorch, the same shape as a
``transformers`` GPT2LMHeadModel, the QLoRA recipe's 4-bit Llama, and random token ids. Every builder seeds
itself, so all runs of one model start from the same weights."""

from __future__ import annotations

import tempfile

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

SIZES = {
    "gpt2-small": dict(layers=12, width=768, heads=12, vocab=50257, seq=1024),
    "tiny": dict(layers=2, width=64, heads=4, vocab=512, seq=64),
}


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


def build(size: dict, kind: str, device: str) -> nn.Module:
    """``kind``: ``gpt`` (plain PyTorch, on the CPU: the runner places it), ``hf`` (GPT2LMHeadModel) or ``qlora``."""
    if kind == "qlora":
        return _qlora_model(size, device)
    torch.manual_seed(0)
    return _gpt2(size) if kind == "hf" else GPT(**size)


def parameters(size: dict, kind: str) -> int:
    """The model's parameter count (a tied weight once; the Llama's unquantized, for QLoRA), built on the meta
    device: no memory, no time."""
    with torch.device("meta"):
        if kind == "qlora":
            import transformers

            model = transformers.LlamaForCausalLM(_llama_config(size))
        else:
            model = _gpt2(size) if kind == "hf" else GPT(**size)
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
        num_key_value_heads=size["heads"],
        intermediate_size=4 * size["width"],
        vocab_size=size["vocab"],
        max_position_embeddings=size["seq"],
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
        transformers.LlamaForCausalLM(config).save_pretrained(folder)
        base = transformers.LlamaForCausalLM.from_pretrained(
            folder, quantization_config=quantization, device_map={"": 0 if device == "cuda" else "cpu"}
        )
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    lora = peft.LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    return peft.get_peft_model(base, lora)
