"""Trains a library's trainer (TRL's SFTTrainer or DPOTrainer, sentence-transformers' trainer, the Trainer on a PEFT
model) on a tiny model built here, on the reference or on trainwell: ``--backend trainwell`` calls
``trainwell.patch_transformers()`` before the library is imported, which is the documented switch. Run by
tests/test_libraries.py, one process per run.

Writes the logged losses, evaluation losses, the order of the batches the loss was computed on, a digest of the final
weights, the trainer's base classes and the first checkpoint's files to --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--library", choices=("sft", "sft-peft", "dpo", "sentence-transformers", "peft"), required=True)
parser.add_argument("--backend", choices=("trainwell", "transformers"), required=True)
parser.add_argument("--workdir", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--resume", default=None)
cli = parser.parse_args()
if cli.backend == "trainwell":
    import trainwell

    trainwell.patch_transformers()  # before the library is imported

import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from datasets import Dataset  # noqa: E402

WORDS = [f"w{i}" for i in range(40)]
COMMON = {"output_dir": cli.workdir, "max_steps": 6, "per_device_train_batch_size": 4, "logging_steps": 1,
          "report_to": "none", "save_steps": 3, "eval_strategy": "steps", "eval_steps": 3, "learning_rate": 1e-3,
          "use_cpu": True, "seed": 0, "disable_tqdm": True}
# TRL's configs default to bf16 (4x slower on a CPU, and not what is compared) and gradient checkpointing
TRL = {"bf16": False, "gradient_checkpointing": False}


def tokenizer(special: list[str], **tokens: str) -> transformers.PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate([*special, *WORDS])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=tokens["unk_token"]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **tokens)


def sentences(generator: torch.Generator, count: int, length: int) -> list[str]:
    return [" ".join(WORDS[j] for j in torch.randint(0, 40, (length,), generator=generator).tolist())
            for _ in range(count)]


def causal_lm(folder: str) -> tuple[str, transformers.PreTrainedTokenizerFast]:
    """A tiny Llama and its tokenizer saved in ``folder`` (DPO builds its reference model from the path)."""
    tok = tokenizer(["<pad>", "<unk>", "<eos>"], unk_token="<unk>", eos_token="<eos>", pad_token="<pad>")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, vocab_size=len(tok), max_position_embeddings=64,
                                      pad_token_id=0, eos_token_id=2, bos_token_id=2)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, tok


def sft() -> object:
    from trl import SFTConfig, SFTTrainer

    folder, tok = causal_lm(cli.workdir + "-model")
    generator = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({"text": [sentences(generator, 1, 4 + i % 8)[0] for i in range(40)]})
    return SFTTrainer(model=transformers.LlamaForCausalLM.from_pretrained(folder), processing_class=tok,
                      args=SFTConfig(**COMMON, **TRL), train_dataset=data, eval_dataset=data.select(range(8)))


def sft_peft() -> object:
    """SFTTrainer(peft_config=...): TRL wraps the model in a LoRA PeftModel itself; the best adapter reloads at the end
    (the first evaluation's: "order" falls with every evaluation)."""
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    folder, tok = causal_lm(cli.workdir + "-model")
    generator = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({"text": [sentences(generator, 1, 4 + i % 8)[0] for i in range(40)]})
    evaluations = []

    def order(prediction: object) -> dict:
        evaluations.append(1)
        return {"order": -len(evaluations)}

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, task_type="CAUSAL_LM")
    args = SFTConfig(**{**COMMON, "learning_rate": 1e-2}, **TRL, load_best_model_at_end=True,
                     metric_for_best_model="order")
    return SFTTrainer(model=transformers.LlamaForCausalLM.from_pretrained(folder), processing_class=tok, args=args,
                      train_dataset=data, eval_dataset=data.select(range(8)), peft_config=lora, compute_metrics=order)


def dpo() -> object:
    from trl import DPOConfig, DPOTrainer

    folder, tok = causal_lm(cli.workdir + "-model")
    generator = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({"prompt": sentences(generator, 24, 5), "chosen": sentences(generator, 24, 4),
                              "rejected": sentences(generator, 24, 4)})
    return DPOTrainer(model=folder, processing_class=tok, args=DPOConfig(**COMMON, **TRL), train_dataset=data,
                      eval_dataset=data.select(range(8)))


def sentence_transformers() -> object:
    """Three epochs of 3 steps (dropout on): a new sample order each epoch, as the reference's seedable sampler draws
    it through the trainer's own prepared loader; checkpoint-4 lies in the second epoch. The loss's own classifier
    trains too (sentence-transformers' get_optimizer_cls_and_kwargs)."""
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
        models,
    )

    folder = cli.workdir + "-bert"
    tok = tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], unk_token="[UNK]", pad_token="[PAD]",
                    cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(folder)
    generator = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({"sentence1": sentences(generator, 24, 5), "sentence2": sentences(generator, 24, 5),
                              "label": torch.randint(0, 3, (24,), generator=generator).tolist()})
    torch.manual_seed(0)
    model = SentenceTransformer(modules=[models.Transformer(folder), models.Pooling(16)], device="cpu")
    settings = {**COMMON, "max_steps": -1, "num_train_epochs": 3, "per_device_train_batch_size": 8, "save_steps": 4}
    # SoftmaxLoss (its NLI examples' loss) trains a classifier of its own: the trainer's get_optimizer_cls_and_kwargs
    # override hands those weights to the optimizer
    return SentenceTransformerTrainer(model=model, args=SentenceTransformerTrainingArguments(**settings),
                                      train_dataset=data, eval_dataset=data.select(range(8)),
                                      loss=losses.SoftmaxLoss(model, sentence_embedding_dimension=16, num_labels=3))


def peft() -> object:
    """The Trainer on a LoRA model from ``peft.get_peft_model`` (what PEFT's own examples do), keeping the best
    of three evaluations: the second ("score" peaks there), so the best checkpoint (4) is neither the first nor
    the last."""
    from peft import LoraConfig, get_peft_model

    folder, tok = causal_lm(cli.workdir + "-model")
    generator = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({"text": [sentences(generator, 1, 6)[0] for _ in range(40)]})
    data = data.map(lambda row: {**tok(row["text"]), "labels": tok(row["text"])["input_ids"]}, remove_columns=["text"])
    scores = iter([1.0, 3.0, 2.0])
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, task_type="CAUSAL_LM")
    model = get_peft_model(transformers.LlamaForCausalLM.from_pretrained(folder), lora)
    args = transformers.TrainingArguments(**{**COMMON, "learning_rate": 1e-2, "save_steps": 2, "eval_steps": 2},
                                          load_best_model_at_end=True, metric_for_best_model="score")
    return transformers.Trainer(model=model, args=args, train_dataset=data, eval_dataset=data.select(range(8)),
                                compute_metrics=lambda prediction: {"score": next(scores)})


trainer = {"sft": sft, "sft-peft": sft_peft, "dpo": dpo, "sentence-transformers": sentence_transformers,
           "peft": peft}[cli.library]()
order = []  # a digest of each batch the loss is computed on, in the order trained
compute_loss = trainer.compute_loss


def recording_compute_loss(model: object, inputs: dict, *args: object, **kwargs: object) -> object:
    if model.training:
        order.append(digest(v for _, v in sorted(inputs.items()) if isinstance(v, torch.Tensor)))
    return compute_loss(model, inputs, *args, **kwargs)


def digest(tensors: object) -> str:
    return hashlib.sha256(b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in tensors)).hexdigest()[:16]


trainer.compute_loss = recording_compute_loss


def adapter_sums(model: object) -> dict:
    if not hasattr(model, "peft_config"):
        return {}
    from peft import get_peft_model_state_dict

    return {k: float(v.double().sum()) for k, v in get_peft_model_state_dict(model).items()}


trainer.train(resume_from_checkpoint=cli.resume)
history = trainer.state.log_history
checkpoint = os.path.join(cli.workdir, "checkpoint-3")
with open(cli.out, "w") as fh:
    json.dump({
        "losses": {h["step"]: h["loss"] for h in history if "loss" in h},
        "eval_losses": {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h},
        "margins": {h["step"]: h["rewards/margins"] for h in history if "rewards/margins" in h},
        "bases": [f"{c.__module__}.{c.__qualname__}" for c in type(trainer).__mro__],
        "args_bases": [f"{c.__module__}.{c.__qualname__}" for c in type(trainer.args).__mro__],
        "checkpoint": sorted(os.listdir(checkpoint)) if os.path.isdir(checkpoint) else [],
        "global_step": trainer.state.global_step,
        "best": trainer.state.best_model_checkpoint and os.path.basename(trainer.state.best_model_checkpoint),
        # the adapter the model ends with (after load_best_model_at_end), as sums of its tensors
        "adapter": adapter_sums(trainer.model),
        "order": order,
        "weights": digest(v for _, v in sorted(trainer.model.state_dict().items())),
        "modules": sorted(m for m in ("trainwell", "transformers.trainer") if m in sys.modules),
    }, fh)
