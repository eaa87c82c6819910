"""Helpers for the checkpoint tests that run ``train_script.py`` in fresh processes.

* :func:`run` / :func:`start` launch the script (one process, or two under ``accelerate launch``);
* :func:`baseline` runs an uninterrupted training once per test session and caches its result;
* :func:`assert_same_training` compares a resumed run's end with the uninterrupted one *exactly*
  (``torch.equal`` and ``==``, never a tolerance);
* :func:`assert_checkpoint_loadable` is an independent, strict check that a published ``checkpoint-N``
  folder is whole (every file is read back completely), used after every crash.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tests.common.timing import hang_timeout

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCRIPT = str(HERE / "train_script.py")
DIE_IN_SAVE_SCRIPT = str(HERE / "die_in_save.py")

CHECKPOINT_FILES = (
    "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.json",
)

# Every map-style run of these tests trains 5 epochs of 8 optimizer steps (96 samples, batch 4, GA 3).
MAP_EPOCHS = ["--epochs", "5"]
MAP_STEPS = 40
STEPS_PER_EPOCH = 8
GA = 3


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}


def command(args: list[str], script: str = SCRIPT, launcher: list[str] | None = None) -> list[str]:
    return (launcher + [script] if launcher else [sys.executable, script]) + list(args)


def run(args: list[str], workdir: Path, out: Path, script: str = SCRIPT, launcher: list[str] | None = None,
        expect_rc: int | None = 0, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run the script to its end (``timeout``: a hang guard, default 240 s scaled by the machine's slowdown)."""
    proc = subprocess.run(
        command([*args, "--workdir", str(workdir), "--out", str(out)], script, launcher),
        env=env(), cwd=str(ROOT), capture_output=True, text=True,
        timeout=timeout if timeout is not None else hang_timeout(240),
    )
    if expect_rc is not None:
        assert proc.returncode == expect_rc, describe(proc)
    return proc


def start(args: list[str], workdir: Path, out: Path, script: str = SCRIPT) -> subprocess.Popen:
    return subprocess.Popen(
        command([*args, "--workdir", str(workdir), "--out", str(out)], script),
        env=env(), cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def describe(proc: Any) -> str:
    stdout, stderr = proc.stdout or "", proc.stderr or ""
    return f"exit code {proc.returncode}\n--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-5000:]}"


def load_result(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=False)


_BASELINES: dict[tuple, dict[str, Any]] = {}


def baseline(tmp_path_factory: Any, args: list[str], launcher: list[str] | None = None) -> dict[str, Any]:
    """An uninterrupted run with ``args`` (once per session): its result, and its workdir as ``"workdir"``."""
    key = (tuple(args), tuple(launcher or ()))
    if key not in _BASELINES:
        folder = tmp_path_factory.mktemp("baseline")
        run(args, folder / "run", folder / "result.pt", launcher=launcher)
        result = load_result(folder / "result.pt")
        result["workdir"] = folder / "run"
        _BASELINES[key] = result
    return _BASELINES[key]


def copy_checkpoint(source_workdir: Path, step: int, workdir: Path) -> Path:
    """A fresh output folder holding only ``checkpoint-{step}`` of another run (nothing else to resume from)."""
    workdir.mkdir(parents=True)
    target = workdir / f"checkpoint-{step}"
    shutil.copytree(source_workdir / f"checkpoint-{step}", target)
    return target


def assert_tensors_equal(a: Any, b: Any, where: str = "") -> None:
    """Nested dicts/lists of tensors and numbers are equal exactly (bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: max abs diff {(a.double() - b.double()).abs().max().item()}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_tensors_equal(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_tensors_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_training(resumed: dict[str, Any], full: dict[str, Any], resumed_from: int) -> None:
    """The resumed run ends exactly as the uninterrupted one: weights, optimizer, and every loss after the resume."""
    assert resumed["global_step"] == full["global_step"]
    assert_tensors_equal(resumed["params"], full["params"], "params")
    assert_tensors_equal(resumed["optimizer"], full["optimizer"], "optimizer")
    # every micro-batch loss (step, value) after the resume, bit for bit, and none before it
    expected = [(step, loss) for step, loss in full["losses"] if step > resumed_from]
    assert resumed["losses"] == expected
    assert len(expected) == (full["global_step"] - resumed_from) * GA
    # the log history: restored up to the checkpoint, then the resumed run's own logs, equal to the full run's
    assert resumed["logged"] == full["logged"]


def checkpoint_steps(workdir: Path) -> list[int]:
    if not workdir.is_dir():
        return []
    steps = []
    for path in workdir.iterdir():
        if path.is_dir() and path.name.startswith("checkpoint-") and path.name[len("checkpoint-"):].isdigit():
            steps.append(int(path.name[len("checkpoint-"):]))
    return sorted(steps)


def temporary_folders(workdir: Path) -> list[str]:
    return sorted(p.name for p in workdir.iterdir() if p.name.startswith(".tmp")) if workdir.is_dir() else []


def assert_checkpoint_loadable(path: Path) -> None:
    """Every file of a published checkpoint is present and reads back whole (not the library's own check)."""
    from safetensors.torch import load_file

    from trainwell.checkpoint.io import load_rng_file

    names = sorted(p.name for p in path.iterdir())
    for name in CHECKPOINT_FILES:
        assert name in names, f"{path.name} has no {name}: {names}"
    assert not [n for n in names if n.endswith(".tmp")], names
    weights = load_file(str(path / "model.safetensors"))
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    for name in ("optimizer.pt", "scheduler.pt"):
        assert isinstance(torch.load(path / name, weights_only=True), dict), name
    assert "cpu" in load_rng_file(path / "rng_state.pth")
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["global_step"] == int(path.name.split("-")[1])
    assert json.loads((path / "training_args.json").read_text())["output_dir"]


def wait_for_step(ready_file: Path, proc: subprocess.Popen, at_least: int,
                  timeout: float | None = None) -> int | None:
    """Wait until the script announces a step >= ``at_least``; None when it exited first (``timeout``: a hang
    guard, default 60 s scaled by the machine's slowdown)."""
    timeout = timeout if timeout is not None else hang_timeout(60)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        try:
            text = ready_file.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text.isdigit() and int(text) >= at_least:
            return int(text)
        time.sleep(0.005)
    proc.kill()
    raise AssertionError(f"no step >= {at_least} announced in {timeout}s:\n{describe_popen(proc)}")


def describe_popen(proc: subprocess.Popen) -> str:
    try:
        stdout, stderr = proc.communicate(timeout=hang_timeout(30))
    except (subprocess.TimeoutExpired, ValueError):
        stdout, stderr = "", ""
    stdout, stderr = stdout or "", stderr or ""
    return f"exit code {proc.returncode}\n--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-5000:]}"
