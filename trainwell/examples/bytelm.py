"""A byte-level causal transformer: the model ``trainwell demo`` trains.

Owns the model (``ByteLM``), its named sizes (``SIZES``) and sampling (``generate``). Bytes are tokens, so
the vocabulary is 256 and any text works without a tokenizer. The forward follows the contract trainwell's
Trainer expects of any module: ``forward(input_ids, labels=None) -> {"loss", "logits"}``, where ``labels``
are the input ids themselves and the model shifts them (position i predicts byte i+1), as causal LMs in
``transformers`` do. ``vocab_size`` (default 256, the bytes) lets the same model train on a tokenizer's ids:
``trainwell train`` builds it that way for ``task: causal-lm`` (``trainwell.cli.models``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from trainwell.utils.errors import choice_error

VOCAB_SIZE = 256


@dataclass(frozen=True)
class ByteLMConfig:
    """Shape of a ``ByteLM``. ``block_size`` is the longest context the position table covers; ``vocab_size``
    is 256 for bytes, or a tokenizer's vocabulary size."""

    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    block_size: int = 128
    dropout: float = 0.0
    vocab_size: int = VOCAB_SIZE

    def to_dict(self) -> dict:
        return asdict(self)


# Named sizes for `trainwell demo --size`; "small" is tuned to learn visibly in ~2 minutes on 2 CPU cores.
SIZES: dict[str, ByteLMConfig] = {
    "tiny": ByteLMConfig(n_layer=1, n_head=2, d_model=32, block_size=32),
    "small": ByteLMConfig(n_layer=4, n_head=4, d_model=128, block_size=128),
    "medium": ByteLMConfig(n_layer=6, n_head=6, d_model=384, block_size=256),
}


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, each with a residual."""

    def __init__(self, cfg: ByteLMConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Module):
    """A GPT-style language model over bytes (vocabulary 256, or ``config.vocab_size`` token ids), for training
    demos and tests."""

    main_input_name = "input_ids"

    def __init__(self, config: ByteLMConfig | None = None) -> None:
        super().__init__()
        cfg = config or ByteLMConfig()
        if cfg.d_model % cfg.n_head:
            raise ValueError(f"d_model={cfg.d_model} must be a multiple of n_head={cfg.n_head}.")
        self.config = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance flat with depth.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Logits ``(batch, time, vocab_size)``; with ``labels``, also the mean next-token cross-entropy ``loss``
        (labels equal to -100 are ignored)."""
        t = input_ids.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size={self.config.block_size}.")
        positions = torch.arange(t, device=input_ids.device)
        x = self.tok(input_ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(
                logits[:, :-1].reshape(-1, self.config.vocab_size), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return out

    @torch.no_grad()
    def generate(self, prompt: bytes, max_new_bytes: int = 200, temperature: float = 0.8, top_k: int = 40,
                 seed: int = 0) -> bytes:
        """Sample ``max_new_bytes`` after ``prompt`` (deterministic for a given ``seed``); returns only new bytes."""
        was_training = self.training
        self.eval()
        device = self.head.weight.device
        gen = torch.Generator(device="cpu").manual_seed(seed)
        ids = torch.tensor([list(prompt or b"\n")], dtype=torch.long, device=device)
        new: list[int] = []
        for _ in range(max_new_bytes):
            logits = self(ids[:, -self.config.block_size:])["logits"][0, -1].float().cpu() / max(temperature, 1e-5)
            if top_k:
                kth = torch.topk(logits, min(top_k, self.config.vocab_size)).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
        self.train(was_training)
        return bytes(new)


def build_model(size: str = "small", **overrides: int | float) -> ByteLM:
    """A ``ByteLM`` of a named size (``tiny``, ``small``, ``medium``), with fields overridden by keyword.

    Usable as a ``trainwell train`` model factory: ``model: {factory: trainwell.examples.bytelm:build_model}``.
    """
    if size not in SIZES:
        raise choice_error("size", size, SIZES)
    return ByteLM(ByteLMConfig(**{**SIZES[size].to_dict(), **overrides}))
