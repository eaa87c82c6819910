"""What TRL's command-line scripts are pointed at in tests/test_libraries.py, built here in code (nothing downloaded):
a tiny Llama causal LM and a tiny Llama reward model (``num_labels=1``, its score head saved too, so loading it draws
no random numbers), each saved with its tokenizer, and three local datasets, each a folder of ``train.jsonl`` and
``test.jsonl`` that ``datasets.load_dataset(folder)`` reads as its two splits (``--dataset_name FOLDER``).
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch
import transformers

WORDS = [f"w{i}" for i in range(40)]
TRAIN, TEST = 32, 8


def build(root: Path) -> dict[str, str]:
    """Write the models and datasets under ``root``; their paths by name (lm, rm, text, prefs, pairs)."""
    vocab = {token: i for i, token in enumerate(["<pad>", "<unk>", "<eos>", *WORDS])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>",
                                               pad_token="<pad>")
    config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": len(tok), "max_position_embeddings": 64, "pad_token_id": 0,
              "eos_token_id": 2, "bos_token_id": 2}
    paths = {name: str(root / name) for name in ("lm", "rm", "text", "prefs", "pairs")}
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).save_pretrained(paths["lm"])
    torch.manual_seed(0)
    transformers.LlamaForSequenceClassification(transformers.LlamaConfig(**config, num_labels=1)).save_pretrained(
        paths["rm"])
    for folder in (paths["lm"], paths["rm"]):
        tok.save_pretrained(folder)
    generator = torch.Generator().manual_seed(0)

    def words(count: int) -> str:
        return " ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (count,), generator=generator).tolist())

    _write(paths["text"], [{"text": words(4 + i % 8)} for i in range(TRAIN + TEST)])
    _write(paths["prefs"], [{"prompt": words(5), "chosen": words(4), "rejected": words(4)}
                            for _ in range(TRAIN + TEST)])
    _write(paths["pairs"], [{"chosen": words(6), "rejected": words(6)} for _ in range(TRAIN + TEST)])
    return paths


def _write(folder: str, rows: list[dict]) -> None:
    Path(folder).mkdir(parents=True)
    for split, part in (("train", rows[:TRAIN]), ("test", rows[TRAIN:])):
        with open(Path(folder) / f"{split}.jsonl", "w") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in part)
