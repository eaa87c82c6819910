"""Two CPU processes (gloo) with batch b train like one process with batch 2b."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.common.timing import hang_timeout

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "train_script.py")
pytestmark = pytest.mark.distributed


def _accelerate() -> list[str]:
    exe = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    if exe is None:
        pytest.skip("the accelerate launcher is not installed")
    return [exe]


def _cpu_only() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("these launch commands are for CPU-only machines")


def _run(cmd: list[str], tmp_path, name: str) -> dict:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd + ["--out", str(out), "--workdir", str(tmp_path / name)], env=env,
                          capture_output=True, text=True, timeout=hang_timeout(300))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("model,ga", [("regression", 1), ("regression", 2), ("tokens", 2)])
def test_two_ranks_equal_one_rank_with_double_batch(tmp_path, model, ga):
    _cpu_only()
    # On a machine without GPUs, `--multi_gpu` makes Accelerate start 2 CPU processes with gloo (torchrun);
    # `--cpu` alone starts a single process in accelerate 1.x.
    launch = _accelerate() + ["launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                              "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT]
    two = _run(launch + ["--batch", "4", "--ga", str(ga), "--model", model], tmp_path, "two")
    one = _run([sys.executable, SCRIPT, "--batch", "8", "--ga", str(ga), "--model", model], tmp_path, "one")
    assert two["world"] == 2 and one["world"] == 1
    assert two["steps"] == one["steps"]
    for name, values in one["params"].items():
        assert two["params"][name] == pytest.approx(values, rel=1e-4, abs=1e-6), name
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4, abs=1e-6)
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-5)
    # predictions cover exactly the dataset, in order: the samples Accelerate duplicated to even out the
    # last batch (13 or 23 samples on 2 ranks) are dropped
    np.testing.assert_allclose(np.asarray(two["predictions"]), np.asarray(one["predictions"]), rtol=1e-5, atol=1e-6)


def test_two_ranks_resume_a_stateful_iterable_where_they_stopped(tmp_path):
    """Rank 0 reads one batch per rank ahead of the step (Accelerate dispatches an IterableDataset): the
    checkpoint holds the position of the batches trained on, and the resumed run ends at the same weights."""
    _cpu_only()
    import torch

    launch = _accelerate() + ["launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                              "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT, "--batch", "4",
                              "--ga", "2", "--stateful-iterable"]
    full = _run(launch, tmp_path, "full")
    checkpoint = tmp_path / "full" / "checkpoint-5"
    state = torch.load(next(checkpoint.glob("data_state*0.pth")), weights_only=True)
    assert state == {"passes": 0, "position": 5 * 2 * 2 * 4}  # steps x GA x ranks x batch
    resumed = _run(launch + ["--resume", str(checkpoint)], tmp_path, "resumed")
    assert resumed["params"] == full["params"]
    assert resumed["losses"] == full["losses"]  # the first 5 come from the checkpoint's log history


def test_ranks_that_exit_right_after_a_collective_exit_cleanly(tmp_path):
    """gloo's worker threads release a finished collective a moment after it completes; a rank that exits
    first used to abort in interpreter finalization (SIGABRT), failing the job after its work was done."""
    _cpu_only()
    launch = _accelerate() + ["launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                              "--mixed_precision", "no", "--dynamo_backend", "no",
                              os.path.join(os.path.dirname(__file__), "distributed", "exit_script.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # Without the exit hook 4 of 15 runs of this script failed (and 8 of 20 of a bare torch repro), so six clean
    # runs in a row happen by chance about 15% of the time: this catches a regression most times, not always.
    for attempt in range(6):
        proc = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=hang_timeout(300), cwd=tmp_path)
        assert proc.returncode == 0, f"run {attempt + 1}:\n{proc.stderr[-3000:]}"
