"""NEFTune, the underflow/overflow debugger, memory metrics and Liger kernels, switched on through TrainingArguments."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n=32, length=8, vocab=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class TinyLM(nn.Module):
    def __init__(self, vocab=64, hidden=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()) if labels is not None else None
        return {"loss": loss, "logits": logits}


def _lm_trainer(out_dir, **kwargs):
    torch.manual_seed(0)
    args = make_args(str(out_dir), max_steps=4, per_device_train_batch_size=8, logging_steps=1, **kwargs)
    return Trainer(model=TinyLM(), args=args, train_dataset=TokenDataset(), eval_dataset=TokenDataset(n=16, seed=1))


def _losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


# ------------------------------------------------------------------------------------------------ NEFTune
def test_neftune_noises_training_only_and_is_removed_after(tmp_path):
    plain, noisy = _lm_trainer(tmp_path / "plain"), _lm_trainer(tmp_path / "noisy", neftune_noise_alpha=5.0)
    before = noisy.evaluate()["eval_loss"]
    plain.train()
    noisy.train()
    assert _losses(plain)[0] != _losses(noisy)[0]  # the first step already saw noisy embeddings
    embed = noisy.model.get_input_embeddings()
    assert not embed._forward_hooks and not hasattr(embed, "neftune_noise_alpha")  # gone after train()
    ids = TokenDataset(n=4)[0]["input_ids"][None]
    noisy.model.train()
    assert torch.equal(embed(ids), embed(ids))  # no noise any more, even in train mode
    fresh = _lm_trainer(tmp_path / "fresh", neftune_noise_alpha=5.0)
    assert fresh.evaluate()["eval_loss"] == before  # evaluation never has noise


def test_neftune_is_removed_when_training_fails(tmp_path):
    trainer = _lm_trainer(tmp_path, neftune_noise_alpha=5.0)

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    trainer.training_step = boom
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert not trainer.model.get_input_embeddings()._forward_hooks


def test_neftune_needs_input_embeddings(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=make_args(str(tmp_path), neftune_noise_alpha=5.0, max_steps=2),
                      train_dataset=RegressionDataset())
    with pytest.raises(ValueError, match="neftune_noise_alpha.*RegressionModel"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_neftune_gives_the_references_losses(tmp_path):
    transformers = pytest.importorskip("transformers")
    import trainwell

    def run(lib):
        lib.set_seed(0)
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
        model = transformers.LlamaForCausalLM(config)
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), max_steps=4, per_device_train_batch_size=8,
                                     logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
                                     save_strategy="no", neftune_noise_alpha=5.0)
        trainer = lib.Trainer(model=model, args=args, train_dataset=TokenDataset())
        trainer.train()
        return _losses(trainer)

    mine, theirs = run(trainwell), run(transformers)
    # the same noise draws from the same RNG state (both count the tokens Llama predicts: the same normalization)
    assert mine == pytest.approx(theirs, rel=1e-6)


# ------------------------------------------------------------------------------------------------ overflow debugger
class Overflowing(nn.Module):
    def __init__(self):
        super().__init__()
        self.small = nn.Linear(1, 1)
        self.huge = nn.Linear(1, 1)
        with torch.no_grad():
            self.huge.weight.fill_(3e38)

    def forward(self, input_x, labels=None):
        y = self.huge(self.small(input_x[:, None]) + 10).squeeze(-1)
        return {"loss": ((y - labels) ** 2).mean(), "logits": y}


def test_underflow_overflow_names_the_module_and_stops(tmp_path, capsys):
    args = make_args(str(tmp_path), debug="underflow_overflow", max_steps=3, per_device_train_batch_size=4)
    trainer = Trainer(model=Overflowing(), args=args, train_dataset=RegressionDataset())
    with pytest.raises(ValueError, match="inf/nan"):
        trainer.train()
    report = capsys.readouterr().out
    assert "Detected inf/nan during batch_number=0" in report and "huge" in report
    assert "abs min" in report and "abs max" in report
    assert all(not m._forward_hooks for m in trainer.model.modules())  # the debugger's hooks are gone


def test_underflow_overflow_is_silent_on_a_healthy_model(tmp_path, capsys):
    args = make_args(str(tmp_path), debug="underflow_overflow", max_steps=3)
    Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset()).train()
    assert "inf/nan" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ memory metrics
def _memory_run(lib, out_dir):
    args = lib.TrainingArguments(str(out_dir), max_steps=4, per_device_train_batch_size=8, report_to="none",
                                 use_cpu=True, disable_tqdm=True, save_strategy="no", skip_memory_metrics=False,
                                 eval_strategy="steps", eval_steps=2)
    trainer = lib.Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                          eval_dataset=RegressionDataset(length=16))
    train = trainer.train().metrics
    return train, trainer.evaluate(), trainer.predict(RegressionDataset(length=16)).metrics


def _mem(metrics):
    return sorted(k for k in metrics if "_mem_" in k or k.startswith("before_init"))


def test_memory_metrics_per_stage(tmp_path):
    train, evaluate, predict = _memory_run(__import__("trainwell"), tmp_path)
    assert _mem(train) == ["before_init_mem_cpu", "init_mem_cpu_alloc_delta", "init_mem_cpu_peaked_delta",
                           "train_mem_cpu_alloc_delta", "train_mem_cpu_peaked_delta"]
    assert _mem(evaluate) == ["eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"]
    assert _mem(predict) == ["test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"]
    assert train["before_init_mem_cpu"] > 10 * 2**20 and all(isinstance(train[k], int) for k in _mem(train))


def test_memory_metric_names_are_the_references(tmp_path):
    transformers = pytest.importorskip("transformers")
    mine = _memory_run(__import__("trainwell"), tmp_path / "mine")
    theirs = _memory_run(transformers, tmp_path / "theirs")
    assert [_mem(m) for m in mine] == [_mem(m) for m in theirs]


# ------------------------------------------------------------------------------------------------ Liger kernels
def test_liger_kernel_names_what_is_missing(tmp_path, monkeypatch):
    args = make_args(str(tmp_path), use_liger_kernel=True, max_steps=1)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    with pytest.raises(ImportError, match="pip install liger-kernel"):
        trainer.train()
    fake = types.ModuleType("liger_kernel")
    fake.__spec__ = types.SimpleNamespace(name="liger_kernel")
    monkeypatch.setitem(sys.modules, "liger_kernel", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        trainer.train()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(TypeError, match="RegressionModel is not one"):
        trainer.train()
    assert trainer.state.global_step == 0
