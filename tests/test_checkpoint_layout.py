"""Checkpoint contents and naming, save strategies, rotation, and resuming a reference checkpoint (in process).

* the files of ``checkpoint-N`` (reference layout, ``training_args.json`` instead of a pickle), and
  ``save_only_model``;
* tied weights survive a safetensors round trip through a checkpoint;
* a checkpoint written by the reference ``transformers`` Trainer resumes in trainwell to the reference's own
  final weights;
* ``save_strategy`` "steps" (int and ratio ``save_steps``), "epoch", "best";
* ``save_total_limit`` rotation: the best and the newest are always kept, so is the one just written; the one
  resumed from rotates out as on the reference;
* ``restore_callback_states_from_checkpoint`` with ``EarlyStoppingCallback``; ``ignore_data_skip``; a
  stateful ``IterableDataset`` is not replayed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.checkpointing.data import PlainIterable, StatefulIterable
from tests.common.models import ClassificationDataset, DropoutMLP, RegressionDataset, RegressionModel
from tests.conftest import make_args

FIXTURE = Path(__file__).parent / "fixtures" / "reference_checkpoint"


def _trainer(out_dir, model=None, train_len=16, eval_dataset=None, callbacks=None, compute_metrics=None, **kwargs):
    from trainwell import Trainer

    kwargs = {"per_device_train_batch_size": 4, "learning_rate": 0.1, "max_steps": 6, **kwargs}
    return Trainer(
        model=model if model is not None else RegressionModel(), args=make_args(out_dir, **kwargs),
        train_dataset=RegressionDataset(length=train_len), eval_dataset=eval_dataset, callbacks=callbacks,
        compute_metrics=compute_metrics,
    )


def _steps(out_dir) -> list[int]:
    root = Path(out_dir)
    if not root.is_dir():
        return []
    return sorted(int(p.name.split("-")[1]) for p in root.iterdir() if p.is_dir() and p.name.startswith("checkpoint-"))


class Scripted:
    """compute_metrics returning a scripted ``score`` per evaluation (to place the best step exactly)."""

    def __init__(self, values):
        self.values, self.calls = list(values), 0

    def __call__(self, prediction):
        value = self.values[self.calls]
        self.calls += 1
        return {"score": value}


def _snapshot_on_save(out_dir, record: list):
    from trainwell import TrainerCallback

    class Snapshot(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            record.append((state.global_step, _steps(out_dir)))

    return Snapshot()


# ------------------------------------------------------------------------------------------ layout
def test_checkpoint_files_match_the_reference_layout(out_dir):
    _trainer(out_dir, save_strategy="steps", save_steps=3, logging_steps=1).train()
    assert _steps(out_dir) == [3, 6]
    folder = Path(out_dir) / "checkpoint-3"
    names = sorted(os.listdir(folder))
    # the reference's files, and trainwell's manifest of them (which the reference ignores)
    assert names == sorted(["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                            "trainer_state.json", "training_args.json", "checkpoint_manifest.json"])
    assert not [n for n in os.listdir(out_dir) if n.startswith(".tmp")]
    saved_args = json.loads((folder / "training_args.json").read_text())  # JSON, never a pickle
    assert saved_args["save_steps"] == 3 and saved_args["output_dir"] == out_dir
    state = json.loads((folder / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and len([h for h in state["log_history"] if "loss" in h]) >= 1
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    assert sorted(weights) == ["a", "b"]
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        assert (folder / name).read_bytes()[:2] == b"PK"  # torch's zip format
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    assert optimizer["state"] and optimizer["param_groups"]


def test_save_only_model_writes_no_training_state(out_dir, caplog):
    _trainer(out_dir, save_strategy="steps", save_steps=3, save_only_model=True).train()
    folder = Path(out_dir) / "checkpoint-3"
    assert sorted(os.listdir(folder)) == ["checkpoint_manifest.json", "model.safetensors", "trainer_state.json",
                                          "training_args.json"]
    from trainwell import get_last_checkpoint

    # still a complete checkpoint of its kind: resume picks it, and warns that the optimizer starts over
    assert get_last_checkpoint(out_dir) == str(Path(out_dir) / "checkpoint-6")
    trainer = _trainer(out_dir, save_strategy="steps", save_steps=3, save_only_model=True, max_steps=8)
    with caplog.at_level("WARNING"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 8
    assert "optimizer.pt" in caplog.text


class TiedLM(nn.Module):
    """An embedding whose weight is also the output layer's (tied), as in most language models."""

    def __init__(self, vocab: int = 11, dim: int = 6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return out


class TokenData(torch.utils.data.Dataset):
    def __init__(self, n: int = 16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 11, (n, 5), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_tied_weights_round_trip_through_a_checkpoint(out_dir):
    from safetensors.torch import load_file

    from trainwell import Trainer

    torch.manual_seed(0)
    args = make_args(out_dir, per_device_train_batch_size=4, learning_rate=0.1, max_steps=2, save_strategy="steps",
                     save_steps=2)
    trainer = Trainer(model=TiedLM(), args=args, train_dataset=TokenData())
    trainer.train()
    trained = trainer.model.emb.weight.detach().clone()
    assert trainer.model.head.weight is trainer.model.emb.weight
    stored = load_file(str(Path(out_dir) / "checkpoint-2" / "model.safetensors"))
    assert len(stored) == 1  # one copy of the shared tensor
    assert torch.equal(next(iter(stored.values())), trained)

    torch.manual_seed(1)
    fresh = TiedLM()
    assert not torch.equal(fresh.emb.weight, trained)
    resumed = Trainer(model=fresh, args=args, train_dataset=TokenData())
    resumed.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-2"))  # max_steps reached: load only
    assert resumed.model.head.weight is resumed.model.emb.weight  # the tie is intact
    assert torch.equal(resumed.model.emb.weight, trained) and torch.equal(resumed.model.head.weight, trained)


def test_resuming_a_reference_trainer_checkpoint_ends_at_the_reference_weights(out_dir):
    """tests/fixtures/reference_checkpoint is checkpoint-6 of a transformers Trainer run of 16 steps."""
    from trainwell import Trainer

    expected = json.loads((FIXTURE / "expected.json").read_text())
    shutil.copytree(FIXTURE, Path(out_dir) / "checkpoint-6", ignore=shutil.ignore_patterns("expected.json"))
    a = expected["args"]  # the arguments of tests/checkpointing/make_reference_fixture.py
    args = make_args(out_dir, per_device_train_batch_size=a["per_device_train_batch_size"],
                     gradient_accumulation_steps=a["gradient_accumulation_steps"], learning_rate=a["learning_rate"],
                     optim=a["optim"], weight_decay=a["weight_decay"], num_train_epochs=a["num_train_epochs"],
                     seed=a["seed"], logging_steps=1, save_strategy="steps", save_steps=6)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=a["length"]))
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == expected["global_step"] == 16
    # Bit-exact with the torch of this venv (same data order, RNG, AdamW and schedule as the reference); a
    # tolerance of a few float32 ulps leaves room for another torch build's kernels.
    assert trainer.model.a.item() == pytest.approx(expected["a"], rel=1e-6, abs=1e-7)
    assert trainer.model.b.item() == pytest.approx(expected["b"], rel=1e-6, abs=1e-7)
    logged = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    assert sorted(logged) == list(range(1, 17))
    for step in range(7, 17):  # trainwell's own losses after the resume, at full precision like the reference's
        assert logged[step] == pytest.approx(expected["losses"][str(step)], rel=1e-6, abs=1e-7), step


# ------------------------------------------------------------------------------------------ strategies
@pytest.mark.parametrize("save_steps,expected", [(2, [2, 4, 6, 8]), (0.25, [2, 4, 6, 8]), (0.3, [3, 6, 8])])
def test_save_steps_int_or_ratio_and_the_final_step(out_dir, save_steps, expected):
    """A ratio is a fraction of max_steps, rounded up (8 × 0.3 → every 3); the last step is always saved."""
    _trainer(out_dir, max_steps=8, save_strategy="steps", save_steps=save_steps).train()
    assert _steps(out_dir) == expected


def test_save_strategy_epoch(out_dir):
    _trainer(out_dir, max_steps=-1, num_train_epochs=3, save_strategy="epoch").train()  # 4 steps per epoch
    assert _steps(out_dir) == [4, 8, 12]


def test_save_strategy_best_saves_only_improvements(out_dir):
    scores = [0.1, 0.5, 0.3, 0.6, 0.2, 0.4]  # improvements at steps 1, 2 and 4
    trainer = _trainer(out_dir, save_strategy="best", eval_strategy="steps", eval_steps=1,
                       metric_for_best_model="score", greater_is_better=True,
                       eval_dataset=RegressionDataset(length=8), compute_metrics=Scripted(scores))
    trainer.train()
    assert _steps(out_dir) == [1, 2, 4]
    assert trainer.state.best_global_step == 4
    assert trainer.state.best_model_checkpoint == str(Path(out_dir) / "checkpoint-4")


# ------------------------------------------------------------------------------------------ rotation
def _expected_rotation(limit: int, bests: dict[int, int | None], last: int) -> list[tuple[int, list[int]]]:
    """The rule, step by step: after saving step s keep s, the best so far, and the newest others up to limit."""
    kept: list[int] = []
    history = []
    for step in range(1, last + 1):
        kept.append(step)
        protected = {step} | ({bests[step]} if bests[step] else set())
        others = [s for s in kept if s not in protected]
        budget = max(limit - len(protected), 0)
        kept = sorted(protected | set(others[len(others) - budget:] if budget else []))
        history.append((step, list(kept)))
    return history


@pytest.mark.parametrize("limit", [1, 2, 3])
@pytest.mark.parametrize("load_best", [False, True], ids=["plain", "load_best"])
def test_save_total_limit_keeps_best_and_newest(out_dir, limit, load_best):
    scores = [0.1, 0.5, 0.3, 0.6, 0.2, 0.4]  # the best is step 2, then step 4 (never the newest at the end)
    record: list = []
    extra = {}
    if load_best:
        extra = dict(eval_strategy="steps", eval_steps=1, load_best_model_at_end=True, metric_for_best_model="score",
                     greater_is_better=True)
    trainer = _trainer(out_dir, save_strategy="steps", save_steps=1, save_total_limit=limit,
                       eval_dataset=RegressionDataset(length=8) if load_best else None,
                       compute_metrics=Scripted(scores) if load_best else None,
                       callbacks=[_snapshot_on_save(out_dir, record)], **extra)
    trainer.train()
    bests = {s: (4 if s >= 4 else 2 if s >= 2 else 1) if load_best else None for s in range(1, 7)}
    assert record == _expected_rotation(limit, bests, 6)
    final = {(False, 1): [6], (False, 2): [5, 6], (False, 3): [4, 5, 6],
             (True, 1): [4], (True, 2): [4, 6], (True, 3): [4, 5, 6]}[(load_best, limit)]
    # after training ends, save_total_limit=1 keeps only the best (as the reference); otherwise nothing changes
    assert _steps(out_dir) == final
    if load_best:
        from safetensors.torch import load_file

        best = load_file(str(Path(out_dir) / "checkpoint-4" / "model.safetensors"))
        assert trainer.state.best_model_checkpoint == str(Path(out_dir) / "checkpoint-4")
        assert torch.equal(trainer.model.a.detach(), best["a"]) and torch.equal(trainer.model.b.detach(), best["b"])


def test_rotation_never_deletes_the_one_just_saved_even_below_a_higher_step_left_by_an_earlier_run(out_dir):
    _trainer(out_dir, save_strategy="steps", save_steps=1).train()
    assert _steps(out_dir) == [1, 2, 3, 4, 5, 6]
    record: list = []
    resumed = _trainer(out_dir, save_strategy="steps", save_steps=1, save_total_limit=1,
                       callbacks=[_snapshot_on_save(out_dir, record)])
    resumed.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-3"))
    # the one just written survives, even though an older run left a higher step around
    assert record == [(4, [4, 6]), (5, [5, 6]), (6, [6])]


def test_rotation_after_a_resume_keeps_what_the_reference_keeps(out_dir):
    # Resumed from checkpoint-4 with a limit of 2, the reference keeps checkpoint-6 and -8: the checkpoint resumed
    # from is not protected (trainwell kept -4 and -8).
    from trainwell import TrainerCallback

    class StopAt4(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 4

    options = dict(max_steps=8, save_strategy="steps", save_steps=2, save_total_limit=2, train_len=32,
                   per_device_train_batch_size=2)
    _trainer(out_dir, callbacks=[StopAt4()], **options).train()
    assert _steps(out_dir) == [2, 4]
    _trainer(out_dir, **options).train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-4"))
    assert _steps(out_dir) == [6, 8]


# ------------------------------------------------------------------------------------------ resume details
def test_early_stopping_state_is_restored_when_asked(out_dir):
    from trainwell import EarlyStoppingCallback

    scores = [0.9, 0.5, 0.4, 0.3, 0.2, 0.1]  # only the first evaluation is an improvement
    common = dict(save_strategy="steps", save_steps=1, eval_strategy="steps", eval_steps=1,
                  metric_for_best_model="score", greater_is_better=True, eval_dataset=RegressionDataset(length=8))
    first = _trainer(out_dir, max_steps=3, compute_metrics=Scripted(scores),
                     callbacks=[EarlyStoppingCallback(early_stopping_patience=4)], **common)
    first.train()
    stored = json.loads((Path(out_dir) / "checkpoint-3" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert stored["EarlyStoppingCallback"]["attributes"]["early_stopping_patience_counter"] == 2

    def resume(restore: bool):
        trainer = _trainer(out_dir, compute_metrics=Scripted(scores[3:]),
                           restore_callback_states_from_checkpoint=restore,
                           callbacks=[EarlyStoppingCallback(early_stopping_patience=4)], **common)
        trainer.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-3"))
        return trainer

    restored = resume(True)  # counter 2 → 3 (step 4) → 4 (step 5): stops at the patience
    assert restored.state.global_step == 5
    callback = next(cb for cb in restored.callback_handler.callbacks if isinstance(cb, EarlyStoppingCallback))
    assert callback.early_stopping_patience_counter == 4
    assert resume(False).state.global_step == 6  # a fresh counter only reaches 3


def _recording_trainer(out_dir, dataset, **kwargs):
    from trainwell import Trainer

    class Recording(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            self.seen.append((self.state.global_step + 1, inputs["x"].clone()))
            return super().training_step(model, inputs, num_items_in_batch)

    torch.manual_seed(0)
    args = make_args(out_dir, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.01,
                     seed=3, **kwargs)
    trainer = Recording(model=DropoutMLP(), args=args, train_dataset=dataset)
    trainer.seen = []
    return trainer


def test_ignore_data_skip_restarts_the_epoch_like_the_reference(out_dir):
    """96 samples, batch 4, GA 2: 12 steps per epoch. Resumed at step 5 with ignore_data_skip, epoch 0's data
    is read again from its first batch (nothing skipped), and training still ends at max_steps."""
    full = _recording_trainer(out_dir, ClassificationDataset(n=96), num_train_epochs=2, save_strategy="steps",
                              save_steps=5)
    full.train()
    assert full.state.global_step == 24
    resumed = _recording_trainer(out_dir, ClassificationDataset(n=96), num_train_epochs=2, ignore_data_skip=True)
    resumed.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-5"))
    assert resumed.state.global_step == 24
    assert len(resumed.seen) == (24 - 5) * 2
    assert [s for s, _ in resumed.seen][:2] == [6, 6]
    # the first micro-batches after the resume are epoch 0's first ones, not the ones after step 5
    for (_, got), (_, want) in zip(resumed.seen[:4], full.seen[:4]):
        assert torch.equal(got, want)
    # then the epoch goes on in its own order: the resumed epoch 0 has all 12 windows, epoch 1 is cut short
    assert all(torch.equal(g, w) for (_, g), (_, w) in zip(resumed.seen[:24], full.seen[:24]))

    skipped = _recording_trainer(out_dir, ClassificationDataset(n=96), num_train_epochs=2)
    skipped.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-5"))
    assert torch.equal(skipped.seen[0][1], full.seen[10][1])  # without the flag: micro-batch 11 of epoch 0


def test_stateful_iterable_resumes_without_reading_consumed_samples(out_dir):
    full = _recording_trainer(out_dir, StatefulIterable(ClassificationDataset(n=96), seed=3), max_steps=16,
                              save_strategy="steps", save_steps=7)
    full.train()
    dataset = StatefulIterable(ClassificationDataset(n=96), seed=3)
    resumed = _recording_trainer(out_dir, dataset, max_steps=16)
    resumed.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-7"))
    # 9 more steps of 2 micro-batches of 4 samples: nothing before the checkpoint position was read
    assert dataset.loads == 9 * 2 * 4
    assert all(torch.equal(g, w) for (_, g), (_, w) in zip(resumed.seen, full.seen[7 * 2:]))
    assert len(resumed.seen) == len(full.seen) - 7 * 2


def _read_ahead_like_accelerate(trainer):
    """Hand the trainer Accelerate's prepared loader, which reads one batch ahead (as on a GPU)."""
    from accelerate.data_loader import DataLoaderShard

    build = trainer.runtime.prepare_dataloader

    def prepare(dataloader):
        build(dataloader)
        shard = DataLoaderShard(dataloader.dataset, batch_size=dataloader.batch_size,
                                collate_fn=dataloader.collate_fn, device=torch.device("cpu"))
        return shard

    trainer.runtime.prepare_dataloader = prepare
    return trainer


def test_stateful_iterable_saves_the_position_trained_on_when_the_loader_reads_ahead(out_dir):
    """The saved position is the one of the last batch trained on, not of the batch the loader fetched ahead."""
    full = _read_ahead_like_accelerate(_recording_trainer(
        out_dir, StatefulIterable(ClassificationDataset(n=96), seed=3), max_steps=16, save_strategy="steps",
        save_steps=7))
    full.train()
    saved = torch.load(Path(out_dir) / "checkpoint-7" / "data_state.pth", weights_only=True)
    assert saved == {"passes": 0, "position": 7 * 2 * 4}
    resumed = _read_ahead_like_accelerate(_recording_trainer(
        out_dir, StatefulIterable(ClassificationDataset(n=96), seed=3), max_steps=16))
    resumed.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-7"))
    assert len(resumed.seen) == len(full.seen) - 7 * 2
    assert all(torch.equal(g, w) for (_, g), (_, w) in zip(resumed.seen, full.seen[7 * 2:]))


class CountingDataset(ClassificationDataset):
    """Counts the samples read (``__getitem__`` calls)."""

    loads = 0

    def __getitem__(self, i):
        self.loads += 1
        return super().__getitem__(i)


def test_map_style_resume_skips_at_the_sampler_without_loading(out_dir):
    full = _recording_trainer(out_dir, ClassificationDataset(n=96), num_train_epochs=2, save_strategy="steps",
                              save_steps=5)
    full.train()
    dataset = CountingDataset(n=96)
    resumed = _recording_trainer(out_dir, dataset, num_train_epochs=2)
    resumed.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-5"))
    assert dataset.loads == (24 - 5) * 2 * 4  # only what the remaining 19 steps trained on
    assert all(torch.equal(g, w) for (_, g), (_, w) in zip(resumed.seen, full.seen[5 * 2:]))
    assert len(resumed.seen) == len(full.seen) - 5 * 2


def test_plain_iterable_resumed_with_a_longer_max_steps_reads_the_right_data(out_dir):
    """12 steps per pass (96 samples, batch 4, GA 2). A run of 14 steps stops in pass 1; resumed with
    max_steps=20, it goes on with pass 1's third window, as a 20-step run does (the position comes from the
    checkpoint's own scale, not the new max_steps)."""
    full = _recording_trainer(out_dir + "-full", PlainIterable(ClassificationDataset(n=96), seed=3), max_steps=20)
    full.train()
    _recording_trainer(out_dir, PlainIterable(ClassificationDataset(n=96), seed=3), max_steps=14,
                       save_strategy="steps", save_steps=14).train()
    resumed = _recording_trainer(out_dir, PlainIterable(ClassificationDataset(n=96), seed=3), max_steps=20)
    resumed.train(resume_from_checkpoint=str(Path(out_dir) / "checkpoint-14"))
    assert [s for s, _ in resumed.seen] == [s for s, _ in full.seen[14 * 2:]]
    assert all(torch.equal(g, w) for (_, g), (_, w) in zip(resumed.seen, full.seen[14 * 2:]))
    assert int(resumed.state.epoch) == 1


def test_resuming_a_finished_run_trains_no_further_step(out_dir, caplog):
    """max_steps=6 ends mid-epoch (4 steps per epoch). The reference resumes checkpoint-6 and takes step 7."""
    first = _trainer(out_dir, save_strategy="steps", save_steps=3)
    first.train()
    weights = {k: v.clone() for k, v in first.model.state_dict().items()}
    again = _trainer(out_dir, save_strategy="steps", save_steps=3)
    with caplog.at_level("WARNING", logger="trainwell"):
        result = again.train(resume_from_checkpoint=True)
    assert result.global_step == 6 and again.state.global_step == 6
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in weights.items())
    assert "nothing is left to train" in caplog.text
    assert _steps(out_dir) == [3, 6]


def test_a_resume_with_changed_intervals_or_batch_size_names_each_difference(out_dir, caplog):
    _trainer(out_dir, save_strategy="steps", save_steps=2).train()
    caplog.set_level(logging.WARNING, logger="trainwell")
    _trainer(out_dir, save_strategy="steps", save_steps=2).train(
        resume_from_checkpoint=str(Path(out_dir) / "checkpoint-2"))
    assert "differ from its run" not in caplog.text
    _trainer(out_dir, save_strategy="steps", save_steps=3, logging_steps=2, per_device_train_batch_size=2).train(
        resume_from_checkpoint=str(Path(out_dir) / "checkpoint-2"))
    message = next(r.getMessage() for r in caplog.records if "differ from its run" in r.getMessage())
    assert "save_steps: 2 -> 3" in message and "logging_steps: 500 -> 2" in message
    assert "per_device_train_batch_size: 4 -> 2" in message
