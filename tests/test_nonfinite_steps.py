"""skip_nonfinite_steps: a step whose loss or gradient norm is NaN/inf is not applied, decided on the device (on
the CPU: on the host, where reading a number costs nothing; the ``path`` fixture runs both).

Fault injection: the loss of chosen steps is multiplied by NaN (or made infinite). The run must end bit-equal to a
run whose optimizer and scheduler did not step at those steps (what the reference's fp16 GradScaler skip does),
with the step's RNG draws taken, for the fused optimizers (``found_inf``) and the copy guard of the others. That no
step reads the device is held by tests/test_speed_contracts.py (``resilience-on``, ``resilience-copy-guard``). And
whatever the setting, a checkpoint of non-finite weights is refused while the previous one stays the newest.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.common.models import ClassificationDataset, DropoutMLP
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.checkpoint.finite import NonFiniteWeightsError, nonfinite_tensor
from trainwell.loop import progress

BAD_STEPS = (3, 4)


class Poisoned(Trainer):
    """The loss of the steps in ``bad`` is NaN (``kind="nan"``) or infinite (``"inf"``)."""

    def __init__(self, *args, bad=BAD_STEPS, kind="nan", **kwargs):
        super().__init__(*args, **kwargs)
        self.bad, self.kind = bad, kind

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step + 1 in self.bad:
            loss = loss * float("nan") if self.kind == "nan" else loss + float("inf")
        return loss


class SkipByHand(TrainerCallback):
    """What the reference's fp16 skip does at the steps in ``steps``: the optimizer and the scheduler do not step
    (the forward and backward run, so the step's random draws are taken)."""

    def __init__(self, steps):
        self.steps = steps

    def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        noop = lambda *a, **k: None  # noqa: E731
        for part in (optimizer, lr_scheduler):
            if state.global_step + 1 in self.steps:
                part.step = noop
            elif "step" in vars(part):
                del part.step


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step == self.step


@pytest.fixture(params=["host", "device"])
def path(request, monkeypatch):
    """The guard's two paths: the CPU's (decided on the host: a non-finite step is not taken) and an accelerator's
    (decided on the device: the fused optimizer's found_inf, or the copy guard), which the CPU takes when its reads
    are treated as syncs."""
    if request.param == "device":
        monkeypatch.setattr(progress, "reads_are_free", lambda device: False)
    return request.param


def _args(out, **kwargs) -> TrainingArguments:
    settings = {"max_steps": 8, "per_device_train_batch_size": 4, "logging_steps": 1, "save_strategy": "no",
                "report_to": "none", "disable_tqdm": True, "learning_rate": 1e-2, **kwargs}
    return TrainingArguments(str(out), **settings)


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _run(out, cls=Poisoned, callbacks=(), **kwargs):
    fault = {k: kwargs.pop(k) for k in ("bad", "kind") if k in kwargs}
    torch.manual_seed(0)
    trainer = cls(DropoutMLP(), _args(out, **kwargs), train_dataset=ClassificationDataset(), callbacks=list(callbacks),
                  **fault)
    trainer.train()
    return trainer


@pytest.mark.parametrize("bad", [BAD_STEPS, (1,)], ids=["steps-3-4", "first-step"])
@pytest.mark.parametrize("optim", ["adamw_torch_fused", "adamw_torch", "sgd"],
                         ids=["fused-found_inf", "foreach-copy-guard", "sgd-copy-guard"])
def test_a_nonfinite_step_is_skipped_as_the_reference_fp16_skip_does(tmp_path, path, optim, bad):
    # the first step creates the optimizer's state: skipped, it must leave none of the NaN gradient in it
    extra = {"optim_args": "momentum=0.9"} if optim == "sgd" else {}  # SGD with state to guard
    # True: the copy guard too (the default guards only the optimizers that skip a step themselves)
    guarded = _run(tmp_path / "guarded", optim=optim, bad=bad, skip_nonfinite_steps=True, **extra)
    by_hand = _run(tmp_path / "by_hand", cls=Trainer, callbacks=[SkipByHand(bad)], skip_nonfinite_steps=False,
                   optim=optim, **extra)
    ours, theirs = _weights(guarded), _weights(by_hand)
    assert all(torch.isfinite(v).all() for v in ours.values())
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name
    assert guarded.lr_scheduler.get_last_lr() == by_hand.lr_scheduler.get_last_lr()
    logged = {e["step"]: e.get("skipped_nonfinite_steps") for e in guarded.state.log_history if "loss" in e}
    assert logged == {step: 1 if step in bad else None for step in range(1, 9)}
    assert guarded.state.log_history[-1]["skipped_nonfinite_steps"] == len(bad)  # the summary: the call's total
    # the optimizer takes no attribute of the guard home with it
    assert not hasattr(getattr(guarded.optimizer, "optimizer", guarded.optimizer), "found_inf")
    guard = guarded.training_run.guard
    fused = optim == "adamw_torch_fused"
    expected = (True, False, False) if path == "host" else (False, fused, not fused)
    assert (guard.on_host, guard.fused, guard.copies) == expected


def test_an_infinite_loss_is_skipped_too_and_counted_at_the_next_log(tmp_path, path):
    trainer = _run(tmp_path, kind="inf", bad=(2,), logging_steps=4)
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert [e.get("skipped_nonfinite_steps") for e in logs] == [1, None]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_without_the_guard_the_weights_turn_nan_as_in_the_reference(tmp_path):
    trainer = _run(tmp_path, skip_nonfinite_steps=False)
    assert not all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_a_resume_after_a_skipped_step_equals_the_uninterrupted_run(tmp_path, path):
    # The skip at step 4 is counted on the device and read at the save of step 4 (the schedule moves back there),
    # then logged at step 6: the checkpoint carries both, so the resumed run logs and trains what the whole one did.
    settings = {"logging_steps": 3, "save_strategy": "steps", "save_steps": 4, "bad": (4,)}
    whole = _run(tmp_path / "whole", **settings)
    resumed_dir = tmp_path / "resumed"
    _run(resumed_dir, callbacks=[StopAt(4)], **settings)  # interrupted right after checkpoint-4
    torch.manual_seed(0)
    resumed = Poisoned(DropoutMLP(), _args(resumed_dir, logging_steps=3, save_strategy="steps", save_steps=4),
                       train_dataset=ClassificationDataset(), bad=(4,))
    resumed.train(resume_from_checkpoint=str(resumed_dir / "checkpoint-4"))
    ours, theirs = _weights(resumed), _weights(whole)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    logs = lambda t: [(e["step"], e["loss"], e.get("skipped_nonfinite_steps")) for e in t.state.log_history  # noqa: E731
                      if "loss" in e]
    assert logs(resumed) == logs(whole)
    assert [s for _, _, s in logs(whole)] == [None, 1]
    from trainwell.report import load_run
    from trainwell.report.tables import session_rows

    assert session_rows(load_run(tmp_path / "whole"))[0]["skipped steps"] == "1"  # the report counts it


@pytest.mark.parametrize("layout", ["own_row", "in_log_window"])
def test_the_pending_count_is_its_own_checkpoint_row_and_an_older_log_window_still_restores_it(tmp_path, layout):
    """Skips read at a save and not logged yet are the checkpoint's "skipped_steps" entry (the guard's own row), not
    part of the log window; a checkpoint written before the row (the count inside its log window) resumes alike."""
    settings = {"logging_steps": 3, "save_strategy": "steps", "save_steps": 4, "bad": (4,)}
    whole = _run(tmp_path / "whole", **settings)
    resumed_dir = tmp_path / "resumed"
    _run(resumed_dir, callbacks=[StopAt(4)], **settings)
    rng_file = resumed_dir / "checkpoint-4" / "rng_state.pth"
    saved = torch.load(rng_file, weights_only=False)
    assert saved["skipped_steps"] == 1 and "skipped_nonfinite_steps" not in saved["log_window"]
    if layout == "in_log_window":  # as trainwell wrote it before the row
        saved["log_window"]["skipped_nonfinite_steps"] = saved.pop("skipped_steps")
        torch.save(saved, rng_file)
        (resumed_dir / "checkpoint-4" / "checkpoint_manifest.json").unlink()  # the file is changed on purpose
    torch.manual_seed(0)
    unchecked = {"verify_checkpoint_checksums": layout == "own_row"}
    resumed = Poisoned(DropoutMLP(), _args(resumed_dir, logging_steps=3, save_strategy="steps", save_steps=4,
                                           **unchecked), train_dataset=ClassificationDataset(), bad=(4,))
    resumed.train(resume_from_checkpoint=str(resumed_dir / "checkpoint-4"))
    logs = lambda t: [(e["step"], e.get("skipped_nonfinite_steps")) for e in t.state.log_history  # noqa: E731
                      if "loss" in e]
    assert logs(resumed) == logs(whole) == [(3, None), (6, 1)]


def test_a_checkpoint_of_nonfinite_weights_is_refused_and_the_previous_one_stays(tmp_path):
    with pytest.raises(NonFiniteWeightsError, match=r"checkpoint-4 was not saved: the model's weights are not "
                                                    r"finite \(NaN or inf in 'net\.0\.weight'\)"):
        _run(tmp_path, skip_nonfinite_steps=False, save_strategy="steps", save_steps=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]  # no checkpoint-4, no staging folder
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    resumed = Trainer(DropoutMLP(), _args(tmp_path, max_steps=2), train_dataset=ClassificationDataset())
    resumed.train(resume_from_checkpoint=True)  # the newest checkpoint is the good one
    assert all(torch.isfinite(p).all() for p in resumed.model.parameters())


def test_the_finite_check_passes_over_float8_weights():
    """A LoRA over an fp8 base model holds frozen float8 weights, which have no aminmax kernel: every save failed."""
    model = torch.nn.Linear(4, 4)
    model.register_buffer("fp8_base", torch.randn(4, 4).to(torch.float8_e4m3fn))
    assert nonfinite_tensor(model) is None
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    assert nonfinite_tensor(model) == "weight"


@pytest.mark.parametrize("optim", ["adamw_torch_fused", "sgd"], ids=["fused", "copy-guard"])
def test_a_run_without_nonfinite_steps_trains_bit_for_bit_as_without_the_guard(tmp_path, path, optim):
    guarded = _run(tmp_path / "on", cls=Trainer, optim=optim, optim_args="momentum=0.9" if optim == "sgd" else None,
                   skip_nonfinite_steps=True)
    plain = _run(tmp_path / "off", cls=Trainer, optim=optim, optim_args="momentum=0.9" if optim == "sgd" else None,
                 skip_nonfinite_steps=False)
    ours, theirs = _weights(guarded), _weights(plain)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert [e.get("loss") for e in guarded.state.log_history] == [e.get("loss") for e in plain.state.log_history]


@pytest.mark.parametrize("optim", ["adamw_torch_fused", "adamw_torch"], ids=["fused", "foreach"])
def test_by_default_only_an_optimizer_that_skips_itself_is_guarded(tmp_path, path, optim, caplog):
    """skip_nonfinite_steps=None (the default): the fused optimizers skip through found_inf at no copy; another
    optimizer is not copied each step (its non-finite step is applied, as on the reference), and the log says how
    to guard it."""
    with caplog.at_level("INFO", logger="trainwell.loop.guard"):
        trainer = _run(tmp_path, optim=optim, bad=BAD_STEPS)
    finite = all(torch.isfinite(v).all() for v in _weights(trainer).values())
    assert finite is (optim == "adamw_torch_fused")
    assert ("Set skip_nonfinite_steps=True" in caplog.text) is (optim == "adamw_torch")


@pytest.mark.parametrize("path", ["device"], indirect=True)  # the host path never sets found_inf
def test_a_train_that_fails_before_its_first_step_takes_the_guard_off_the_optimizer(tmp_path, path):
    """The fused optimizer carries the guard's found_inf from the moment the step is built; a callback that raises
    in on_train_begin must not leave it there (a later optimizer.step() by hand would read a stale flag)."""

    class Fails(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            raise RuntimeError("callback failed")

    trainer = Trainer(DropoutMLP(), _args(tmp_path), train_dataset=ClassificationDataset(), callbacks=[Fails()])
    with pytest.raises(RuntimeError, match="callback failed"):
        trainer.train()
    assert not hasattr(getattr(trainer.optimizer, "optimizer", trainer.optimizer), "found_inf")


class NanLossOnly(Trainer):
    """The loss of the first micro-batch of step 3 is NaN through a constant (no gradient path): the gradients and
    their norm stay finite, so only the window's loss can tell the step is bad."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 5:  # two micro-batches a step: the fifth call is step 3's first
            loss = loss + torch.tensor(float("nan"))
        return loss


def test_a_nan_loss_in_an_early_micro_batch_skips_the_step_though_the_gradients_are_finite(tmp_path, path):
    guarded = _run(tmp_path / "guarded", cls=NanLossOnly, gradient_accumulation_steps=2, skip_nonfinite_steps=True)
    by_hand = _run(tmp_path / "by_hand", cls=Trainer, callbacks=[SkipByHand((3,))], gradient_accumulation_steps=2,
                   skip_nonfinite_steps=False)
    ours, theirs = _weights(guarded), _weights(by_hand)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    logged = {e["step"]: e.get("skipped_nonfinite_steps") for e in guarded.state.log_history if "loss" in e}
    assert logged == {step: 1 if step == 3 else None for step in range(1, 9)}
