"""trainwell trains `transformers` models (built from a config in code: nothing is downloaded), and matches
the reference Trainer on the same run. Skipped when `transformers` is not installed."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")

from trainwell import Trainer, TrainingArguments  # noqa: E402


def tiny_gpt2():
    config = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


class Tokens(Dataset):
    """Variable-length counting sequences (next token = previous + 1), padded to 12 with labels -100."""

    def __init__(self, n=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(4, 13, (1,), generator=g))
            start = int(torch.randint(3, 30, (1,), generator=g))
            ids = torch.arange(start, start + 12)
            mask = (torch.arange(12) < length).long()
            labels = ids.masked_fill(mask == 0, -100)
            self.items.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def run(trainer_cls, args_cls, out_dir, model_fn=tiny_gpt2, **kwargs):
    kwargs = {"save_strategy": "no", **kwargs}
    args = args_cls(output_dir=out_dir, report_to="none", disable_tqdm=True, use_cpu=True, learning_rate=1e-2,
                    per_device_train_batch_size=4, logging_steps=1, **kwargs)
    trainer = trainer_cls(model=model_fn(), args=args, train_dataset=Tokens(), eval_dataset=Tokens(n=8, seed=1))
    result = trainer.train()
    metrics = trainer.evaluate()
    return trainer, result, metrics


def test_gpt2_trains_and_saves_pretrained(out_dir):
    trainer, result, metrics = run(Trainer, TrainingArguments, out_dir, num_train_epochs=3)
    assert trainer.model_accepts_loss_kwargs  # a transformers model normalizes by num_items_in_batch
    assert trainer.model_info.shifts_labels
    assert result.metrics["total_flos"] > 0  # transformers models report num_parameters()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < losses[0]
    trainer.save_model()
    assert {"config.json", "model.safetensors"} <= set(os.listdir(out_dir))
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(out_dir)
    for a, b in zip(reloaded.parameters(), trainer.model.parameters()):
        torch.testing.assert_close(a, b)
    assert json.load(open(os.path.join(out_dir, "config.json")))["n_layer"] == 2


def test_gpt2_num_items_counts_the_shifted_labels(out_dir):
    # GPT2LMHeadModel has no loss_type, so the reference counts unshifted labels (one item too many per row)
    # although the model's loss shifts them; trainwell counts what the loss averages over.
    seen = []

    class Spy(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen.append((int(num_items_in_batch), int((inputs["labels"][:, 1:] != -100).sum())))
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    args = TrainingArguments(output_dir=out_dir, report_to="none", disable_tqdm=True, use_cpu=True, max_steps=2,
                             per_device_train_batch_size=4, save_strategy="no")
    Spy(model=tiny_gpt2(), args=args, train_dataset=Tokens()).train()
    assert seen and all(window == shifted for window, shifted in seen)


@pytest.mark.parametrize("ga", [1, 2])
def test_same_losses_as_the_reference_trainer(tmp_path, ga):
    # A model whose loss_type the reference recognises, so both count the same items.
    ours, our_result, our_metrics = run(Trainer, TrainingArguments, str(tmp_path / "tw"), model_fn=tiny_llama,
                                        gradient_accumulation_steps=ga)
    ref, ref_result, ref_metrics = run(transformers.Trainer, transformers.TrainingArguments, str(tmp_path / "hf"),
                                       model_fn=tiny_llama, gradient_accumulation_steps=ga)
    ours_losses = [h["loss"] for h in ours.state.log_history if "loss" in h]
    ref_losses = [h["loss"] for h in ref.state.log_history if "loss" in h]
    assert ours_losses == pytest.approx(ref_losses, abs=2e-4)
    assert our_result.training_loss == pytest.approx(ref_result.training_loss, rel=1e-4)
    assert our_metrics["eval_loss"] == pytest.approx(ref_metrics["eval_loss"], rel=1e-4)
    for a, b in zip(ours.model.parameters(), ref.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("writer", ["trainwell", "reference"])
def test_a_checkpoint_of_either_trainer_resumes_on_the_other(tmp_path, writer):
    """weight_decay=0 (the default): both Trainers keep the two parameter groups, so optimizer.pt loads across."""
    impls = {"trainwell": (Trainer, TrainingArguments), "reference": (transformers.Trainer,
                                                                     transformers.TrainingArguments)}
    reader = "reference" if writer == "trainwell" else "trainwell"
    full, _, _ = run(*impls[reader], str(tmp_path / "full"), model_fn=tiny_llama, max_steps=6)
    first, _, _ = run(*impls[writer], str(tmp_path / "first"), model_fn=tiny_llama, max_steps=6,
                      save_strategy="steps", save_steps=3)
    trainer_cls, args_cls = impls[reader]
    args = args_cls(output_dir=str(tmp_path / "second"), report_to="none", disable_tqdm=True, use_cpu=True,
                    learning_rate=1e-2, per_device_train_batch_size=4, logging_steps=1, save_strategy="no",
                    max_steps=6)
    second = trainer_cls(model=tiny_llama(), args=args, train_dataset=Tokens())
    second.train(resume_from_checkpoint=str(tmp_path / "first" / "checkpoint-3"))
    assert second.state.global_step == 6
    assert len(second.optimizer.param_groups) == 2
    for a, b in zip(second.model.parameters(), full.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_eval_loss_is_the_references_to_the_last_bit(tmp_path):
    """The reference averages the per-sample float32 losses in float32 (numpy's pairwise sum); a float64 mean
    differs from it in the last place for some batches, so a comparison with the reference would need a tolerance."""
    from tests.common.models import RegressionDataset, RegressionModel

    def losses(lib):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                     disable_tqdm=True, per_device_eval_batch_size=3)
        trainer = lib.Trainer(model=RegressionModel(a=0.7, b=0.1), args=args)
        return [trainer.evaluate(RegressionDataset(length=n, seed=n))["eval_loss"] for n in range(5, 40, 3)]

    import trainwell

    assert losses(trainwell) == losses(transformers)


def test_a_plain_runs_folder_holds_what_the_references_holds(tmp_path):
    """Scripts list output_dir and the reference's own tests count its entries: with report_to="none" a run with
    evaluation, checkpoints, the best model, save_model and save_state leaves the same files, but the pickle the
    reference writes (training_args.bin; trainwell writes training_args.json) and trainwell's checkpoint manifest.
    Then, resumed from checkpoint-4 with save_total_limit=2, both keep checkpoint-6 and checkpoint-8."""
    from tests.common.models import RegressionDataset, RegressionModel

    def listing(lib, stop_at=None, resume=None, **extra):
        out = tmp_path / lib.__name__

        class Stop(lib.TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == stop_at:
                    control.should_training_stop = True

        args = lib.TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, disable_tqdm=True,
                                     per_device_train_batch_size=4, max_steps=8, save_steps=2, logging_steps=1,
                                     **extra)
        trainer = lib.Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64),
                              eval_dataset=RegressionDataset(length=8), callbacks=[Stop()])
        trainer.train(resume_from_checkpoint=resume and str(out / resume))
        trainer.save_model()
        trainer.save_state()
        names = {"training_args.bin": "training_args", "training_args.json": "training_args"}
        return {os.path.relpath(folder, out): sorted(names.get(f, f) for f in files if f != "checkpoint_manifest.json")
                for folder, _, files in os.walk(out)}

    import trainwell

    best = dict(eval_strategy="steps", eval_steps=2, load_best_model_at_end=True)
    assert listing(trainwell, **best) == listing(transformers, **best)
    for lib in (trainwell, transformers):
        shutil.rmtree(tmp_path / lib.__name__)
    rotation = dict(save_total_limit=2)
    assert listing(trainwell, stop_at=4, **rotation) == listing(transformers, stop_at=4, **rotation)
    resumed = listing(trainwell, resume="checkpoint-4", **rotation)
    assert resumed == listing(transformers, resume="checkpoint-4", **rotation)
    assert sorted(k for k in resumed if k.startswith("checkpoint")) == ["checkpoint-6", "checkpoint-8"], resumed
