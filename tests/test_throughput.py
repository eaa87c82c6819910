"""log_throughput: tokens per second over each log window and MFU where the device's peak is known."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.common.models import TinyTokenLM
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.utils.throughput import ThroughputWindow, non_embedding_parameters, peak_flops


class FixedTokens(torch.utils.data.Dataset):
    """16 sequences of 8 tokens: every batch holds batch_size x 8 tokens."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        ids = torch.arange(8) % 17
        return {"input_ids": ids, "labels": ids}


def _trainer(tmp_path, callbacks=(), eval_dataset=None, **kwargs) -> Trainer:
    settings = {"max_steps": 4, "per_device_train_batch_size": 2, "logging_steps": 2, "save_strategy": "no",
                "report_to": "none", "disable_tqdm": True, "log_throughput": True, **kwargs}
    return Trainer(TinyTokenLM(), TrainingArguments(str(tmp_path), **settings), train_dataset=FixedTokens(),
                   eval_dataset=eval_dataset, callbacks=list(callbacks))


class FakeClock:
    """The window's clock, moved only by the test's callbacks: rates come out exact, whatever the machine's load."""

    def __init__(self, monkeypatch) -> None:
        self.now = 0.0
        monkeypatch.setattr(ThroughputWindow, "clock", staticmethod(lambda: self.now))


class Advance(TrainerCallback):
    """Each step takes ``step`` seconds of training on the fake clock, each evaluation and each save ``other``."""

    def __init__(self, clock: FakeClock, step: float, other: float = 0.0) -> None:
        self.clock, self.step, self.other = clock, step, other

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.now += self.step

    def on_evaluate(self, args, state, control, **kwargs):
        self.clock.now += self.other

    def on_save(self, args, state, control, **kwargs):
        self.clock.now += self.other


def test_each_training_log_has_the_window_throughput(tmp_path, monkeypatch):
    clock = FakeClock(monkeypatch)
    trainer = _trainer(tmp_path, [Advance(clock, step=0.05)], max_steps=6)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["tokens_per_second"] for e in logs] == [320.0] * 3  # 2 steps x 16 tokens per 0.1 s window
    assert all("mfu" not in e for e in logs)  # a CPU has no known peak
    assert trainer.state.num_input_tokens_seen == 0  # its own count: include_num_input_tokens_seen is untouched


def test_evaluating_and_saving_are_left_out_of_the_window(tmp_path, monkeypatch):
    clock = FakeClock(monkeypatch)
    trainer = _trainer(tmp_path, [Advance(clock, step=0.05, other=1.0)], save_strategy="steps", save_steps=1,
                       eval_strategy="steps", eval_steps=1, eval_dataset=FixedTokens())
    trainer.train()
    # counted, the two seconds of evaluating and saving per step would make it 32 tokens / 4.1 s
    assert [e["tokens_per_second"] for e in trainer.state.log_history if "loss" in e] == [320.0] * 2


def test_off_by_default_and_off_the_log(tmp_path):
    trainer = _trainer(tmp_path, log_throughput=False)
    trainer.train()
    assert all("tokens_per_second" not in e and "mfu" not in e for e in trainer.state.log_history)
    assert "log_throughput" not in trainer.args.to_dict()


def test_mfu_is_six_times_parameters_times_tokens_over_the_peak(monkeypatch):
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(ThroughputWindow, "clock", staticmethod(lambda: next(clock)))
    window = ThroughputWindow(parameters=1_000, peak=1e6, data_parallel=2, model_parallel=1)
    window.add(100)
    logs = window.take()  # 100 tokens in 2 s on this process
    assert logs == {"tokens_per_second": 100.0, "mfu": pytest.approx(6 * 1_000 * 50 / 1e6)}


def test_the_peak_table(monkeypatch):
    assert peak_flops(torch.device("cpu"), "bf16") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(torch.device("cuda", 0), "bf16") == 989e12
    assert peak_flops(torch.device("cuda", 0), "no") is None  # full precision: no tensor-core peak claimed
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops(torch.device("cuda", 0), "fp16") == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert peak_flops(torch.device("cuda", 0), "bf16") is None


def test_embeddings_are_left_out_of_the_parameters():
    model = nn.Sequential(nn.Embedding(100, 8), nn.Linear(8, 8))
    assert non_embedding_parameters(model) == 8 * 8 + 8
