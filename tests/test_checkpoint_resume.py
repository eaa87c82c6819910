"""Bitwise resume: an interrupted run resumed in a *fresh process* ends exactly like the uninterrupted run.

Each case trains ``DropoutMLP`` (dropout, AdamW, linear warmup/decay, clipping, gradient accumulation 3, a
shuffled sampler) with ``tests/checkpointing/train_script.py``. The uninterrupted run of each configuration
is made once per session and also saves checkpoints along the way; a case copies one of them into an empty
folder (or cuts a run short with ``--stop-at``) and resumes there with ``resume_from_checkpoint=True``.
Final weights, optimizer state, every micro-batch loss after the resume point and the logged losses must be
equal with ``torch.equal`` / ``==``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tests.checkpointing import harness as h

MAP = [*h.MAP_EPOCHS, "--save-steps", "4"]  # uninterrupted, saving checkpoint-4, -8, ..., -40
ITERABLE = ["--max-steps", "20", "--save-steps", "5"]  # 8 steps per pass over the data: 3 passes


@pytest.fixture(scope="module")
def full_map(tmp_path_factory):
    return h.baseline(tmp_path_factory, MAP)


def _resume_copy(tmp_path, source: dict, step: int, args: list[str]) -> dict:
    """Resume ``args`` in a fresh process from a copy of ``checkpoint-{step}`` of the run ``source``."""
    workdir = tmp_path / "resumed"
    h.copy_checkpoint(source["workdir"], step, workdir)
    h.run([*args, "--resume", "true"], workdir, tmp_path / "resumed.pt")
    return h.load_result(tmp_path / "resumed.pt")


def test_uninterrupted_run_is_what_the_tests_expect(full_map):
    """Guards the comparisons below: the baseline trains 40 steps of 3 micro-batches and saves every 4 steps."""
    assert full_map["global_step"] == h.MAP_STEPS and full_map["world"] == 1
    assert len(full_map["losses"]) == h.MAP_STEPS * h.GA
    assert h.checkpoint_steps(full_map["workdir"]) == list(range(4, 41, 4))
    # dropout and data order make consecutive losses differ: equal losses below cannot be a coincidence
    assert len({loss for _, loss in full_map["losses"]}) > 0.9 * len(full_map["losses"])


def test_job_cut_short_mid_epoch_resumes_exactly(tmp_path, full_map):
    """The job stops after step 5 (mid-epoch; only checkpoint-5 is written); a new process finishes it."""
    workdir = tmp_path / "run"
    h.run([*h.MAP_EPOCHS, "--stop-at", "5"], workdir, tmp_path / "first.pt")
    first = h.load_result(tmp_path / "first.pt")
    assert first["global_step"] == 5 and h.checkpoint_steps(workdir) == [5]
    assert first["losses"] == [(s, v) for s, v in full_map["losses"] if s <= 5]
    h.assert_checkpoint_loadable(workdir / "checkpoint-5")

    h.run([*h.MAP_EPOCHS, "--resume", "true"], workdir, tmp_path / "second.pt")
    h.assert_same_training(h.load_result(tmp_path / "second.pt"), full_map, resumed_from=5)


def test_resume_at_an_epoch_boundary(tmp_path, full_map):
    """checkpoint-8 is the last step of epoch 0: the resumed run starts epoch 1 with its own shuffle."""
    resumed = _resume_copy(tmp_path, full_map, 8, MAP)
    h.assert_same_training(resumed, full_map, resumed_from=8)


def test_resume_mid_epoch_with_dataloader_workers(tmp_path, tmp_path_factory):
    """Two loader worker processes; checkpoint-12 is mid-way through epoch 1."""
    args = [*MAP, "--workers", "2"]
    full = h.baseline(tmp_path_factory, args)
    resumed = _resume_copy(tmp_path, full, 12, args)
    h.assert_same_training(resumed, full, resumed_from=12)


@pytest.mark.parametrize("step", [5, 10], ids=["first-pass", "second-pass"])
def test_plain_iterable_dataset_resumes_by_replay(tmp_path, tmp_path_factory, step):
    """An IterableDataset without state_dict is replayed up to the checkpoint, also in a later pass.

    ``PlainIterable`` draws a new order at each ``__iter__``, so resuming in pass 1 must read pass 0 again.
    """
    args = [*ITERABLE, "--data", "iterable"]
    full = h.baseline(tmp_path_factory, args)
    assert full["global_step"] == 20
    resumed = _resume_copy(tmp_path, full, step, args)
    h.assert_same_training(resumed, full, resumed_from=step)
    # the resumed run's epoch counter follows the passes over the data as the uninterrupted one's did
    state = json.loads((tmp_path / "resumed" / "checkpoint-20" / "trainer_state.json").read_text())
    assert state["epoch"] == json.loads((full["workdir"] / "checkpoint-20" / "trainer_state.json").read_text())["epoch"]


def test_stateful_iterable_dataset_resumes_from_its_state(tmp_path, tmp_path_factory):
    """An IterableDataset with state_dict/load_state_dict restores its position (checkpoint in pass 1)."""
    args = [*ITERABLE, "--data", "stateful"]
    full = h.baseline(tmp_path_factory, args)
    assert (full["workdir"] / "checkpoint-10" / "data_state.pth").is_file()
    resumed = _resume_copy(tmp_path, full, 10, args)
    h.assert_same_training(resumed, full, resumed_from=10)
    state = json.loads((tmp_path / "resumed" / "checkpoint-20" / "trainer_state.json").read_text())
    assert state["epoch"] == json.loads((full["workdir"] / "checkpoint-20" / "trainer_state.json").read_text())["epoch"]


# ------------------------------------------------------------------------------------------ two ranks
def _two_rank_launcher() -> list[str]:
    import torch

    if torch.cuda.is_available():
        pytest.skip("these launch commands start CPU processes on a machine without GPUs")
    exe = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    if exe is None:
        pytest.skip("the accelerate launcher is not installed")
    # On a machine without GPUs, --multi_gpu starts 2 CPU processes with gloo.
    return [exe, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no"]


@pytest.mark.distributed
def test_two_ranks_resume_exactly(tmp_path, tmp_path_factory):
    """2 gloo CPU processes: 12 steps (4 per epoch); resuming from checkpoint-5 (mid-epoch 1) is exact."""
    launcher = _two_rank_launcher()
    args = ["--save-steps", "5"]
    full = h.baseline(tmp_path_factory, args, launcher=launcher)
    assert full["world"] == 2 and full["global_step"] == 12
    names = sorted(p.name for p in (full["workdir"] / "checkpoint-5").iterdir())
    assert "rng_state_0.pth" in names and "rng_state_1.pth" in names and "rng_state.pth" not in names

    workdir = tmp_path / "resumed"
    h.copy_checkpoint(full["workdir"], 5, workdir)
    h.run([*args, "--resume", "true"], workdir, tmp_path / "resumed.pt", launcher=launcher)
    h.assert_same_training(h.load_result(tmp_path / "resumed.pt"), full, resumed_from=5)
