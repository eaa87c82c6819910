"""Seq2SeqTrainer and Seq2SeqTrainingArguments: evaluation and prediction that generate, compared with the
reference on the same tiny T5 built from a config (nothing is downloaded)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from trainwell import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainingArguments


class Copy(Dataset):
    """Copy task: the target is the source followed by EOS (id 1); ids 3..29, pad 0."""

    def __init__(self, n: int = 24, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.sources = torch.randint(3, 30, (n, 5), generator=g)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        source = self.sources[i]
        return {"input_ids": source, "attention_mask": torch.ones_like(source),
                "labels": torch.cat([source, torch.tensor([1])])}


def exact_match(prediction) -> dict[str, float]:
    preds, labels = prediction.predictions, prediction.label_ids
    preds = preds[:, 1:] if preds.shape[1] > labels.shape[1] else preds  # generated ids start with the start id
    width = min(preds.shape[1], labels.shape[1])
    mask = labels[:, :width] != -100
    return {"token_accuracy": float(((preds[:, :width] == labels[:, :width]) | ~mask).all(axis=1).mean())}


def _run(impl: str, out_dir: str, **extra):
    transformers = pytest.importorskip("transformers")
    trainer_cls, args_cls = ((Seq2SeqTrainer, Seq2SeqTrainingArguments) if impl == "trainwell"
                             else (transformers.Seq2SeqTrainer, transformers.Seq2SeqTrainingArguments))
    config = transformers.T5Config(vocab_size=32, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    args = args_cls(output_dir=out_dir, report_to="none", disable_tqdm=True, use_cpu=True, learning_rate=3e-3,
                    per_device_train_batch_size=8, per_device_eval_batch_size=4, max_steps=6, save_strategy="no",
                    predict_with_generate=True, generation_max_length=9, **extra)
    trainer = trainer_cls(model=model, args=args, train_dataset=Copy(), eval_dataset=Copy(n=12, seed=1),
                          compute_metrics=exact_match)
    before = trainer.evaluate()
    trainer.train()
    return trainer, before, trainer.predict(Copy(n=12, seed=1), num_beams=2)


def test_generated_predictions_and_metrics_match_the_reference(tmp_path):
    # eval batches of 4 over 12 samples: no short last batch, whose loss the reference overweights
    # (docs/evaluation.md), so eval_loss is comparable
    ours, our_before, our_pred = _run("trainwell", str(tmp_path / "tw"))
    ref, ref_before, ref_pred = _run("reference", str(tmp_path / "hf"))
    assert our_before["eval_loss"] == pytest.approx(ref_before["eval_loss"], rel=1e-5)
    assert our_before["eval_token_accuracy"] == ref_before["eval_token_accuracy"]
    assert our_pred.predictions.shape == ref_pred.predictions.shape  # padded to generation_max_length (9)
    np.testing.assert_array_equal(our_pred.predictions, ref_pred.predictions)
    np.testing.assert_array_equal(our_pred.label_ids, ref_pred.label_ids)
    assert our_pred.metrics["test_loss"] == pytest.approx(ref_pred.metrics["test_loss"], rel=1e-4)
    assert our_pred.metrics["test_token_accuracy"] == ref_pred.metrics["test_token_accuracy"]


def test_the_arguments_are_the_references(tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = [(f.name, f.default) for f in dataclasses.fields(Seq2SeqTrainingArguments)][-5:]
    theirs = [(f.name, f.default) for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)][-5:]
    assert ours == theirs
    assert issubclass(Seq2SeqTrainingArguments, TrainingArguments)


def test_without_a_pad_token_the_error_says_what_to_set(tmp_path):
    trainer = Seq2SeqTrainer.__new__(Seq2SeqTrainer)
    trainer.processing_class, trainer.model = None, torch.nn.Linear(1, 1)
    with pytest.raises(ValueError, match="needs a pad token"):
        trainer._pad_tensors_to_max_len(torch.ones(2, 3, dtype=torch.long), 5)
