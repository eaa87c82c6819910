"""The hot path's contracts, held on a CPU so that speed cannot regress while nobody has a GPU at hand.

- **No host read of a device tensor between logging steps**, and one batched read at a logging step. On a CPU
  a read is free, so trainwell takes the host path there; these tests switch ``reads_are_free`` off to run the
  accelerator path, and count every way a tensor reaches the host (``item``, ``__bool__``, ``__float__``,
  ``__int__``, ``__index__``, ``tolist``, ``numpy``, ``cpu``, ``to("cpu")``, synchronize).
- **No kernel a hand-written loop would not run**, beyond the loss bookkeeping: every aten op of an optimizer
  step is counted and compared with the same step written by hand.
- **Batches are copied non-blocking** wherever the loader pins memory; nothing pins memory without an
  accelerator to copy to.
"""

from __future__ import annotations

import collections
import math
import sys
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.common.models import ClassificationDataset
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.loop import progress

_READS = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu"}


def _in_data_pipeline() -> bool:
    """Whether the caller runs inside the data pipeline (samplers, loaders, collators): it works on host tensors
    before any batch is copied to the device, so its reads are no syncs (on a CPU, every tensor is a host one)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/utils/data/" in name or "/trainwell/data/" in name:
            return True
        frame = frame.f_back
    return False


class HostReads(TorchFunctionMode):
    """Counts the calls that bring a device tensor's value to the host (each one a sync on an accelerator)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _READS and not _in_data_pipeline():
            self.calls[name] += 1
        elif name == "to" and "cpu" in [*args[1:], kwargs.get("device")] and not _in_data_pipeline():
            self.calls["to('cpu')"] += 1
        return func(*args, **kwargs)


class Kernels(TorchDispatchMode):
    """Counts the aten ops that run (each a kernel launch on an accelerator), views and detach aside."""

    _FREE = {"aten.detach", "aten.t", "aten.view", "aten.select", "aten.alias", "aten._to_copy_noop"}

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name not in self._FREE and not name.startswith("profiler.") and not _in_data_pipeline():
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class PerStep(TrainerCallback):
    """Runs a counting mode over each optimizer step's whole turn: from one on_step_begin to the next (the data
    fetch, the step, on_step_end, and the log/save boundary); the first and the last turn are left out."""

    def __init__(self, make_mode: Any) -> None:
        self.make_mode, self.mode, self.steps = make_mode, None, []

    def _close(self, keep: bool = True) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            if keep:
                self.steps.append(dict(self.mode.calls))
            self.mode = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._close()
        if state.global_step >= 1:  # the first step builds lazily-created state; measure the steady ones
            self.mode = self.make_mode()
            self.mode.__enter__()

    def on_train_end(self, args, state, control, **kwargs):
        self._close(keep=False)  # the last turn holds the end of train(), not a step


def _count(tmp_path, make_mode, fp16: bool = False, **kwargs) -> list[dict]:
    counter = PerStep(make_mode)
    settings = {"max_steps": 9, "per_device_train_batch_size": 4, "logging_steps": 4, "save_strategy": "no",
                "report_to": "none", "disable_tqdm": True, **kwargs}
    torch.manual_seed(0)
    trainer = Trainer(MLP(), TrainingArguments(str(tmp_path), **settings), train_dataset=ClassificationDataset(),
                      callbacks=[counter])
    if fp16:
        _fp16_on_a_cpu(trainer)
    trainer.train()
    _LAST_LOGS[:] = [e for e in trainer.state.log_history if "loss" in e]
    return counter.steps


_LAST_LOGS: list[dict] = []


def _fp16_on_a_cpu(trainer: Trainer) -> None:
    """Give a CPU trainer what Accelerate builds for fp16 on a GPU (and on a CPU never): fp16 autocast around the
    prepared forward, a grad scaler, and the optimizer stepped through it."""
    from trainwell.backend.precision import Precision

    accelerator = trainer.accelerator
    accelerator.scaler, accelerator.native_amp = torch.amp.GradScaler("cpu"), True
    accelerator.state._mixed_precision = "fp16"
    trainer.runtime.precision = trainer.precision = Precision(accelerator, trainer.args, trainer.runtime.engine)
    assert trainer.precision.mode == "fp16" and trainer.precision.can_skip_steps


@pytest.fixture
def accelerator_path(monkeypatch):
    """Take the path trainwell takes on an accelerator, where a host read is a sync."""
    monkeypatch.setattr(progress, "reads_are_free", lambda device: False)
    syncs = []
    for module in (torch.cuda, torch.accelerator):
        monkeypatch.setattr(module, "synchronize", lambda *a, **k: syncs.append(1))
    return syncs


# trainwell's resilience arguments all on (docs/resilience.md): the non-finite guard (on by default), the spike
# watch at each log (it needs checkpoints: none falls in the counted steps) and the step watchdog's thread.
RESILIENCE = {"skip_nonfinite_steps": True, "rollback_on_spike": 5.0, "step_timeout": 60.0,
              "save_strategy": "steps", "save_steps": 100}


@pytest.mark.parametrize("settings", [{}, {"bf16": True}, {"gradient_accumulation_steps": 4},
                                      {"max_grad_norm": 0.0}, {"logging_nan_inf_filter": False},
                                      {"skip_nonfinite_steps": False}, RESILIENCE,
                                      {**RESILIENCE, "optim": "sgd"}, {"report_to": "live"}],
                         ids=["defaults", "bf16", "accumulation-4", "no-clipping", "no-nan-filter", "no-guard",
                              "resilience-on", "resilience-copy-guard", "live-log-and-system-metrics"])
def test_no_host_read_between_logging_steps_and_one_at_a_log(tmp_path, accelerator_path, settings):
    steps = _count(tmp_path, HostReads, **settings)
    # turn i begins at global step i + 1 and ends at global step i + 2: the logs at steps 4 and 8 are turns 2 and 6
    assert len(steps) == 7
    logging_turns = {2, 6}
    for i, reads in enumerate(steps):
        if i in logging_turns:
            assert reads == {"tolist": 1}, (i, reads)  # the loss, the gradient norm and the window's counts
        else:
            assert reads == {}, (i, reads)
    assert accelerator_path == []


def _hand_step_kernels(clip: bool, bf16: bool = False, fp16: bool = False) -> dict:
    """One optimizer step of the loop a user writes: forward (under bf16 or fp16 autocast), backward (fp16: of the
    scaled loss), (clip: fp16 unscales first), step (fp16: through the scaler, then its update), schedule, zero."""
    torch.manual_seed(0)
    model = MLP()
    # The reference's two groups (weights, then biases and norms), which trainwell keeps so that an optimizer.pt
    # loads in either Trainer; with weight_decay=0 the second costs one fused launch more than a single group.
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    others = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    optimizer = torch.optim.AdamW([{"params": weights}, {"params": others}], lr=5e-5, weight_decay=0.0, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / 9)
    scaler = torch.amp.GradScaler("cpu")
    data = ClassificationDataset()
    batches = [{"x": torch.stack([data[i]["x"] for i in range(j, j + 4)]),
                "labels": torch.stack([torch.as_tensor(data[i]["labels"]) for i in range(j, j + 4)])}
               for j in range(0, 12, 4)]
    counts = []
    for batch in batches:
        with Kernels() as mode:
            with torch.autocast("cpu", dtype=torch.float16 if fp16 else torch.bfloat16, enabled=bf16 or fp16):
                loss = model(**batch)["loss"]
            (scaler.scale(loss) if fp16 else loss).backward()
            if clip:
                if fp16:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if fp16:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        counts.append(dict(mode.calls))
    return counts[-1]


# What trainwell adds to a step, and why: the running loss sum for the logs (an add), the count of finite losses
# for the NaN/inf warning (sub and eq test finiteness, an add counts), and with the NaN/inf filter the running
# mean in a non-finite loss's place (div, where); with clipping off, the gradient norm the logs report (the
# reference logs it too): one norm per gradient, stacked, reduced. The data pipeline runs on the host: not counted.
_LOSS_BOOKKEEPING = {"aten.sub": 1, "aten.eq": 1, "aten.add": 2, "aten.div": 1, "aten.where": 1}
_NORM_FOR_THE_LOGS = {"aten._foreach_norm": 1, "aten.stack": 1, "aten.linalg_vector_norm": 1}
# skip_nonfinite_steps (on by default; trainwell/loop/guard.py): the decision from the norm the step has anyway and
# the loss (add them, x * 0, != 0 into the optimizer's found_inf), the count of skipped steps (add_), and, inside the
# fused AdamW, its own step-count correction for found_inf (one _foreach_sub_ per parameter group, as under fp16's
# GradScaler). Scalar kernels all: no pass over the gradients, no host read.
_NONFINITE_GUARD = {"aten.add": 1, "aten.mul": 1, "aten.ne": 1, "aten.add_": 1, "aten._foreach_sub_": 2}


@pytest.mark.parametrize("clip", [True, False], ids=["clipping", "no-clipping"])
@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_a_step_runs_the_kernels_of_a_hand_written_step_and_the_loss_bookkeeping(tmp_path, accelerator_path, clip,
                                                                                 guard):
    ours = _count(tmp_path, Kernels, max_grad_norm=1.0 if clip else 0.0, logging_steps=100,
                  skip_nonfinite_steps=guard)[-1]
    expected = collections.Counter(_hand_step_kernels(clip))
    expected.update(_LOSS_BOOKKEEPING)
    if not clip:
        expected.update(_NORM_FOR_THE_LOGS)
    if guard:
        expected.update(_NONFINITE_GUARD)
    assert ours == dict(expected)
    if not clip:  # the norm is taken, never applied: no gradient is multiplied by 1.0
        assert "aten._foreach_mul_" not in ours


def test_a_bf16_step_runs_the_kernels_of_a_hand_written_autocast_step(tmp_path, accelerator_path):
    """No float32 copy of the outputs that nobody sees: Accelerate's prepared forward casts every bf16 output (the
    logits) to float32, one more ``_to_copy`` per step than a loop under ``torch.autocast`` makes."""
    ours = _count(tmp_path, Kernels, bf16=True, logging_steps=100)[-1]
    expected = collections.Counter(_hand_step_kernels(clip=True, bf16=True))
    expected.update(_LOSS_BOOKKEEPING)
    expected.update(_NONFINITE_GUARD)  # on by default with the fused AdamW: bf16 is where it matters most
    assert ours == dict(expected)


@pytest.mark.parametrize("clip", [True, False], ids=["clipping", "no-clipping"])
def test_an_fp16_step_runs_the_kernels_of_a_hand_written_grad_scaler_step(tmp_path, accelerator_path, clip):
    """The grad scaler is called as a loop calls it: no division of the loss by Accelerate's accumulation steps
    (always 1 here), no multiplication of every gradient by 1.0 with clipping off, no float32 copy of the logits.
    With clipping off the gradients are unscaled before the norm the logs report: the same one pass a loop's
    ``scaler.step`` makes to look for infinities, so only the norm is extra."""
    ours = _count(tmp_path, Kernels, fp16=True, max_grad_norm=1.0 if clip else 0.0, logging_steps=100)[-1]
    expected = collections.Counter(_hand_step_kernels(clip, fp16=True))
    expected.update(_LOSS_BOOKKEEPING)
    if not clip:
        expected.update(_NORM_FOR_THE_LOGS)
        # the scaler's inverse scale is a scalar of the explicit unscale_ (a reciprocal, two casts) instead of the
        # step's (a full, a mul): scalar kernels, no pass over the gradients
        expected.update({"aten.reciprocal": 1, "aten._to_copy": 2, "aten.full": -1, "aten.mul": -1})
    assert ours == dict(+expected)


def test_no_host_read_in_an_fp16_step(tmp_path, accelerator_path):
    steps = _count(tmp_path, HostReads, fp16=True, logging_steps=100)
    assert steps and all(reads == {} for reads in steps), steps


def test_the_loss_bookkeeping_is_one_add_without_the_nan_filter(tmp_path, accelerator_path):
    ours = _count(tmp_path, Kernels, logging_nan_inf_filter=False, logging_steps=100, skip_nonfinite_steps=False)[-1]
    expected = collections.Counter(_hand_step_kernels(clip=True))
    expected.update({"aten.sub": 1, "aten.eq": 1, "aten.add": 2})
    assert ours == dict(expected)


def test_batches_are_copied_non_blocking_from_pinned_memory(tmp_path, monkeypatch):
    """On an accelerator, Accelerate's loader copies each batch: non_blocking whenever memory is pinned."""
    import accelerate.data_loader as accelerate_loaders

    copies: list[bool] = []
    real = accelerate_loaders.send_to_device

    def recording(tensor, device, non_blocking=False, skip_keys=None):
        copies.append(non_blocking)
        return real(tensor, device, non_blocking=non_blocking, skip_keys=skip_keys)

    monkeypatch.setattr(accelerate_loaders, "send_to_device", recording)
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, report_to="none")
    assert args.dataloader_pin_memory and not args.accelerator_config.non_blocking  # the defaults
    trainer = Trainer(MLP(), args, train_dataset=ClassificationDataset())
    assert trainer.accelerator.dataloader_config.non_blocking
    loader = trainer.accelerator.prepare_data_loader(trainer.get_train_dataloader())  # what a GPU run gets
    for _ in zip(range(3), loader, strict=False):
        pass
    assert copies and all(copies)


def test_nothing_pins_memory_without_an_accelerator(tmp_path, monkeypatch):
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, report_to="none")
    trainer = Trainer(MLP(), args, train_dataset=ClassificationDataset(), eval_dataset=ClassificationDataset())
    assert not torch.accelerator.is_available()
    assert not trainer.get_train_dataloader().pin_memory and not trainer.get_eval_dataloader().pin_memory
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert trainer.get_train_dataloader().pin_memory  # where there is one, the argument decides


def test_the_accelerator_path_logs_what_the_host_path_logs(tmp_path, monkeypatch):
    on_host = _count(tmp_path / "host", HostReads, max_steps=8)
    host = [dict(e) for e in _LAST_LOGS]
    monkeypatch.setattr(progress, "reads_are_free", lambda device: False)
    _count(tmp_path / "device", HostReads, max_steps=8)
    assert on_host and [e.keys() for e in _LAST_LOGS] == [e.keys() for e in host]
    for ours, theirs in zip(_LAST_LOGS, host, strict=True):
        for key, value in theirs.items():
            assert ours[key] == pytest.approx(value, rel=1e-6), key


class NaNLoss(MLP):
    def forward(self, x, labels=None):
        out = super().forward(x, labels)
        return {**out, "loss": out["loss"] * float("nan")}


def test_the_accelerator_path_warns_of_a_window_of_nan_losses(tmp_path, accelerator_path):
    args = TrainingArguments(str(tmp_path), max_steps=4, per_device_train_batch_size=4, logging_steps=2,
                             save_strategy="no", report_to="none", disable_tqdm=True)
    trainer = Trainer(NaNLoss(), args, train_dataset=ClassificationDataset())
    with pytest.warns(RuntimeWarning, match="NaN or infinite on every one of the 2 micro-batches since step 0"):
        trainer.train()
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(logged) == 2 and all(math.isnan(v) for v in logged)  # not 0.0 (issue 39), as on the host path
