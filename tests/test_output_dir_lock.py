"""One writer per output_dir: a second run stops with the holder named, a dead run's lock is taken over."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.checkpoint import lock
from trainwell.checkpoint.lock import LOCK_NAME, OutputDirInUseError

ROOT = Path(__file__).resolve().parents[1]

# A second process that trains into argv[1] and, at its first step, says so and waits for argv[2] to appear.
_HOLDER = """
import os, sys, time
from tests.common.models import RegressionDataset, RegressionModel
from trainwell import Trainer, TrainerCallback, TrainingArguments

out, release = sys.argv[1], sys.argv[2]

class Wait(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            open(os.path.join(os.path.dirname(out), "started"), "w").close()
            while not os.path.exists(release):
                time.sleep(0.05)

args = TrainingArguments(out, max_steps=2, save_steps=1, report_to="none", disable_tqdm=True)
Trainer(RegressionModel(), args, train_dataset=RegressionDataset(), callbacks=[Wait()]).train()
"""


def _args(out, **kwargs) -> TrainingArguments:
    return TrainingArguments(str(out), max_steps=2, save_steps=1, report_to="none", disable_tqdm=True, **kwargs)


def _trainer(out, callbacks=(), **kwargs) -> Trainer:
    return Trainer(RegressionModel(), _args(out, **kwargs), train_dataset=RegressionDataset(),
                   callbacks=list(callbacks))


def _start_holder(tmp_path: Path, out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), str(tmp_path / "release")], cwd=ROOT, env=env)
    deadline = time.monotonic() + hang_timeout(120)
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, "the holder ended before training"
        assert time.monotonic() < deadline, "the holder never started training"
        time.sleep(0.05)
    return proc


def test_a_second_run_stops_at_construction_naming_the_first(tmp_path):
    out = tmp_path / "out"
    early = _trainer(out)  # built before the other run started: stopped when it starts training
    holder = _start_holder(tmp_path, out)
    try:
        with pytest.raises(OutputDirInUseError) as err:
            _trainer(out)
        message = str(err.value)
        assert f"output_dir {str(out)!r} is in use by another training run (pid {holder.pid} on host " \
               f"{socket.gethostname()}, started " in message
        assert "Wait for that run to end or stop it, or pass another output_dir" in message
        with pytest.raises(OutputDirInUseError, match=f"pid {holder.pid} "):
            early.train()
        assert not (out / "checkpoint-1").exists()  # neither run wrote into the other's folder
    finally:
        (tmp_path / "release").touch()
        assert holder.wait(timeout=hang_timeout(120)) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-1",
                                                                                        "checkpoint-2"]
    assert not (out / LOCK_NAME).exists()  # released at the end of train()
    _trainer(out).train(resume_from_checkpoint=True)  # the folder is free again


def test_the_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path, caplog):
    out = tmp_path / "out"
    holder = _start_holder(tmp_path, out)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=hang_timeout(60))
    left = json.loads((out / LOCK_NAME).read_text())
    assert left["pid"] == holder.pid and left["host"] == socket.gethostname()
    trainer = _trainer(out)  # the kernel dropped the dead run's lock: no error
    trainer.train()
    assert trainer.state.global_step == 2
    assert f"Taking over the lock of {out} left by a run that ended without releasing it (pid {holder.pid} on " \
           f"host {socket.gethostname()}" in caplog.text
    assert not (out / LOCK_NAME).exists()


def test_trainers_of_one_process_share_their_folder(tmp_path):
    """A script that resumes with a second trainer, or a callback that trains another one, is one writer."""
    out = tmp_path / "out"
    inner: list[Trainer] = []

    class TrainAnother(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if not inner:
                inner.append(_trainer(out, save_strategy="no"))
                inner[0].train()
                assert (out / LOCK_NAME).exists()  # still held: the outer run goes on

    _trainer(out, callbacks=[TrainAnother()]).train()
    assert inner[0].state.global_step == 2
    assert not (out / LOCK_NAME).exists()
    _trainer(out).train(resume_from_checkpoint=True)


def test_the_lock_is_released_when_training_fails(tmp_path):
    out = tmp_path / "out"

    class Fail(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _trainer(out, callbacks=[Fail()]).train()
    assert not (out / LOCK_NAME).exists()
    assert lock._held == {}


def test_the_lock_is_held_while_training(tmp_path):
    out = tmp_path / "out"
    seen: list[dict] = []

    class Look(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(json.loads((out / LOCK_NAME).read_text()))

    _trainer(out, callbacks=[Look()]).train()
    assert seen[0]["pid"] == os.getpid() and seen[0]["host"] == socket.gethostname()
    assert sys.argv[0][:100] in seen[0]["command"]


def test_a_folder_that_cannot_be_written_is_named_before_any_step(tmp_path, monkeypatch):
    out = tmp_path / "out"
    trainer = _trainer(out)
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if str(path).endswith(LOCK_NAME):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(PermissionError, match=rf"output_dir {str(out)!r} cannot be written \(Permission denied\): "
                                              r"the run could save nothing there. Pass an output_dir you can "
                                              r"write to"):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_dir_is_named_and_its_checkpoints_stay(tmp_path):
    out = tmp_path / "out"
    _trainer(out).train()
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    out.chmod(0o555)
    try:
        with pytest.raises(PermissionError, match="cannot be written"):
            _trainer(out, max_steps=4).train(resume_from_checkpoint=True)
    finally:
        out.chmod(0o755)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_file_system_without_locks_warns_and_trains(tmp_path, monkeypatch, caplog):
    out = tmp_path / "out"

    def no_locks(fd, mode):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)
    trainer = _trainer(out)
    trainer.train()
    assert trainer.state.global_step == 2
    assert f"Cannot lock {out} on this file system" in caplog.text


def test_a_search_trial_locks_its_own_folder(tmp_path):
    """Trials of a search run in their own folders under output_dir, so parallel trials never share a lock."""
    pytest.importorskip("optuna")
    out = tmp_path / "out"
    seen: list[tuple[bool, bool]] = []

    class Look(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(((out / "run-0" / LOCK_NAME).exists(), (out / LOCK_NAME).exists()))

    trainer = Trainer(model_init=lambda: RegressionModel(), args=_args(out), train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=8),
                      callbacks=[Look()])
    trainer.hyperparameter_search(hp_space=lambda trial: {"learning_rate": trial.suggest_float("lr", 1e-3, 1e-2)},
                                  backend="optuna", n_trials=1, compute_objective=lambda metrics: 0.0)
    assert seen and set(seen) == {(True, False)}
    assert not (out / "run-0" / LOCK_NAME).exists()


def test_the_hub_upload_leaves_the_lock_out():
    from trainwell.integrations.hub import _ignored

    assert _ignored(LOCK_NAME)


# ------------------------------------------------------------------------------------------------ a hostile lock file
@pytest.mark.parametrize("kind", ["link", "dangling", "fifo", "folder"])
def test_a_lock_name_holding_something_else_is_named_never_written_through_nor_hung_on(tmp_path, kind):
    """``.trainwell.lock`` as a link (to a file outside output_dir: it was truncated and overwritten), a FIFO (the
    open blocked), or a folder: an error naming it, at construction, before any step; the link's target intact."""
    out, target = tmp_path / "out", tmp_path / "precious.txt"
    out.mkdir()
    target.write_text("keep me")
    path = out / LOCK_NAME
    if kind == "link":
        path.symlink_to(target)
    elif kind == "dangling":
        path.symlink_to(tmp_path / "nothing")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    previous = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("the lock open hung")))
    signal.alarm(60)
    try:
        with pytest.raises(lock.UnusableLockError, match=rf"{path} is a (symbolic link|FIFO|folder), where trainwell "
                                                         r"keeps the lock .* Remove it and train again"):
            _trainer(out)
        trainer = _trainer(out, save_strategy="no")  # a run that writes nothing takes no lock
        trainer.train()
        if kind in ("link", "dangling"):  # the lock itself (taken at train()) refuses it too
            with pytest.raises(lock.UnusableLockError):
                lock.holding(str(out)).__enter__()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert target.read_text() == "keep me" and not (tmp_path / "nothing").exists()


def test_a_run_that_saves_nothing_trains_where_it_cannot_write(tmp_path, monkeypatch):
    """save_strategy='no' writes nothing into output_dir while it trains: it takes no lock, so a folder it cannot
    write to is no reason to refuse it (the reference trains there)."""
    out = tmp_path / "out"
    out.mkdir()
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(out)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    trainer = _trainer(out, save_strategy="no")
    trainer.train()
    assert trainer.state.global_step == 2 and not (out / LOCK_NAME).exists()
    assert not lock.writes(_args(out, save_strategy="no")) and lock.writes(_args(out))
    assert lock.writes(_args(out, save_strategy="no", enable_jit_checkpoint=True))
