"""Crashes and signals: a run killed at any instant resumes exactly, and never from a broken checkpoint.

* One chained run (saving every step) is SIGKILLed 20 times: at seeded random moments during training, and
  deliberately inside a save right after each of its files is written. Every restart uses
  ``resume_from_checkpoint=True``; after each kill every published ``checkpoint-N`` must be whole and the
  half-written one must only exist as a temporary folder. The chain then finishes, equal bit for bit to the
  uninterrupted run.
* ``enable_jit_checkpoint``: SIGTERM saves the step that completes after the signal and exits cleanly;
  SIGINT saves too, then raises KeyboardInterrupt. Both resume exactly.
"""

from __future__ import annotations

import random
import signal
import subprocess

import pytest

from tests.checkpointing import harness as h
from tests.common.timing import hang_timeout

MAP = [*h.MAP_EPOCHS, "--save-steps", "4"]  # the same uninterrupted run as tests/test_checkpoint_resume.py
SAVE_FILES = (
    "model.safetensors", "training_args.json", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
)


@pytest.fixture(scope="module")
def full_map(tmp_path_factory):
    return h.baseline(tmp_path_factory, MAP)


def _check_after_crash(workdir, kill_note: str) -> None:
    """Every published checkpoint is whole, and the library picks the newest one."""
    from trainwell.checkpoint.resume import get_last_checkpoint

    steps = h.checkpoint_steps(workdir)
    for step in steps:
        h.assert_checkpoint_loadable(workdir / f"checkpoint-{step}")
    if steps:
        assert get_last_checkpoint(workdir) == str(workdir / f"checkpoint-{steps[-1]}"), kill_note


def _kill_plans(rng: random.Random) -> list[tuple[str, object]]:
    """20 kills: one inside a save after each file, the rest at random moments (seeded), shuffled together."""
    plans: list[tuple[str, object]] = [("in-save", name) for name in SAVE_FILES]
    plans += [("timed", rng.uniform(0.0, 0.09)) for _ in range(14)]
    rng.shuffle(plans)
    return plans


def test_twenty_kills_then_exact_finish(tmp_path, full_map):
    rng = random.Random(20240611)
    workdir, ready, out = tmp_path / "run", tmp_path / "ready", tmp_path / "result.pt"
    base = [*h.MAP_EPOCHS, "--save-steps", "1", "--sleep", "0.02", "--ready-file", str(ready)]
    kills, in_save = 0, 0
    plans = _kill_plans(rng)
    for index, (kind, detail) in enumerate(plans):
        newest = (h.checkpoint_steps(workdir) or [0])[-1]
        if kind == "timed" and newest + (len(plans) - index) >= h.MAP_STEPS - 6:
            # A fast machine got far (a timed kill lets up to ~4 steps through): from here kill as soon as a
            # step is announced (at most one more checkpoint per kill), so the run cannot end before the last kill.
            detail = 0.0
        args = base + (["--resume", "true"] if newest else [])
        ready.unlink(missing_ok=True)
        note = f"kill #{kills + 1} ({kind} {detail}), newest checkpoint before it: {newest}"
        if kind == "in-save" and newest < h.MAP_STEPS - 2:
            step = newest + 1 + rng.randrange(2)
            proc = h.run([*args, "--die-in-save", f"{step}:{detail}"], workdir, out,
                         script=h.DIE_IN_SAVE_SCRIPT, expect_rc=None)
            assert proc.returncode == -signal.SIGKILL, note + "\n" + h.describe(proc)
            # the crash hit the save of `step`: its files are only in the temporary folder
            assert (workdir / f".tmp-checkpoint-{step}" / str(detail)).is_file(), note
            assert step not in h.checkpoint_steps(workdir), note
            in_save += 1
        else:
            proc = h.start(args, workdir, out)
            announced = h.wait_for_step(ready, proc, at_least=newest + 1)
            assert announced is not None, note + " (the run ended before it was killed)\n" + h.describe_popen(proc)
            if kind == "timed":
                _sleep(float(detail))
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=hang_timeout(60))
            assert proc.returncode == -signal.SIGKILL, note
        kills += 1
        _check_after_crash(workdir, note)
        print(note, "->", h.checkpoint_steps(workdir)[-1:], h.temporary_folders(workdir))
        assert (h.checkpoint_steps(workdir) or [0])[-1] < h.MAP_STEPS, "the chain ended before all kills were made"

    assert kills == 20 and in_save == len(SAVE_FILES)
    ready.unlink(missing_ok=True)
    h.run([*base, "--resume", "true"], workdir, out)
    resumed_from = min(step for step, _ in h.load_result(out)["losses"]) - 1
    h.assert_same_training(h.load_result(out), full_map, resumed_from=resumed_from)
    assert h.temporary_folders(workdir) == [], "a temporary checkpoint folder was left behind"
    assert h.checkpoint_steps(workdir) == list(range(1, h.MAP_STEPS + 1))


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


# ------------------------------------------------------------------------------------------ signals
def _signal_mid_run(tmp_path, sig: int) -> tuple[subprocess.Popen, int, str, str]:
    """Start a slow run with enable_jit_checkpoint, send ``sig`` while step r's end is being handled."""
    workdir, ready = tmp_path / "run", tmp_path / "ready"
    proc = h.start([*h.MAP_EPOCHS, "--jit", "--sleep", "0.3", "--ready-file", str(ready)], workdir,
                   tmp_path / "first.pt")
    announced = h.wait_for_step(ready, proc, at_least=3)
    assert announced is not None, h.describe_popen(proc)
    _sleep(0.05)  # inside the 0.3 s sleep that follows step `announced` (its on_step_end)
    current = int(ready.read_text())
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=hang_timeout(120))
    return proc, current, stdout, stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_jit_checkpoint_on_signal_saves_then_resumes_exactly(tmp_path, full_map, sig):
    proc, current, stdout, stderr = _signal_mid_run(tmp_path, sig)
    workdir = tmp_path / "run"
    steps = h.checkpoint_steps(workdir)
    # one checkpoint (no save strategy otherwise), at the first step boundary after the signal: the signal
    # arrived during step `current`'s end, whose callbacks (the JIT one among them) were still running
    assert len(steps) == 1, steps
    saved = steps[0]
    assert saved in (current, current + 1) and saved < h.MAP_STEPS
    h.assert_checkpoint_loadable(workdir / f"checkpoint-{saved}")
    if sig == signal.SIGTERM:
        assert proc.returncode == 0, f"exit code {proc.returncode}\n{stderr[-3000:]}"
        first = h.load_result(tmp_path / "first.pt")
        assert first["global_step"] == saved  # training stopped right after the save
    else:
        assert proc.returncode != 0 and "KeyboardInterrupt" in stderr, stderr[-3000:]
        assert not (tmp_path / "first.pt").exists()  # train() raised: the script never got to write its result

    h.run([*h.MAP_EPOCHS, "--resume", "true"], workdir, tmp_path / "second.pt")
    h.assert_same_training(h.load_result(tmp_path / "second.pt"), full_map, resumed_from=saved)
    assert h.temporary_folders(workdir) == []
