"""step_timeout: a process that stops making progress stops the run within seconds, naming where it was.

Fault injection with two processes under torchrun (gloo, CPU; tests/distributed/stall_script.py): process 1 sleeps in
a callback, blocks in its data loader, or never enters the gradient all-reduce process 0 waits in. Every process
must print its Python stack and stop with one error naming process 1 and the frame it was in, within seconds of
the timeout. In one process, the error is raised in the main thread; "auto" derives the timeout from the step time.
The progress signal is an int per micro-batch (held by tests/test_speed_contracts.py with the watchdog on).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import threading
import time

import pytest

from tests.common.models import ClassificationDataset, DropoutMLP
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.backend import stall

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "stall_script.py")


def _launch(workdir, stall_kind: str) -> tuple[dict[int, dict], str, float]:
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", SCRIPT, "--workdir",
              str(workdir), "--stall", stall_kind]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    results = {}
    for rank in (0, 1):
        path = workdir / f"result-{rank}.json"
        if path.is_file():
            results[rank] = json.loads(path.read_text())
    return results, proc.stdout + proc.stderr, time.monotonic() - start


@pytest.mark.distributed
@pytest.mark.parametrize(("kind", "stuck_in", "waiting_in"), [
    ("callback", "stall_script.py:36 in on_step_end (a callback's on_step_end at step 3)", "process 0 in "),
    ("loader", "in __getitem__ (reading the training data of step 2)", "process 0 in "),
    ("collective", "in compute_loss (in training step 3)",
     "process 0 in precision.py:N in backward (the backward pass (its gradient all-reduce) in training step 3)"),
])
def test_a_stuck_process_stops_every_process_with_one_error_naming_it(tmp_path, kind, stuck_in, waiting_in):
    results, log, seconds = _launch(tmp_path, kind)
    printed = re.findall(r"^StepTimeout: (No progress .*)$", log, flags=re.MULTILINE)
    assert printed, log[-6000:]
    message = printed[0]
    assert message.startswith("No progress for 3 s (step_timeout=3.0): process 1 of 2 is stuck "), message
    waiting = re.sub(r"precision\.py:\d+ ", "precision.py:N ", message)  # trainwell's own line: any edit moves it
    assert stuck_in in message and "the other processes were waiting for it: " + waiting_in in waiting, message
    # every process printed its stack and the same error (their stderr may interleave: looked for whole)
    assert log.count("StepTimeout: No progress for 3 s") == 2 and set(printed) == {message}, log[-6000:]
    for rank in (0, 1):
        assert f"trainwell step_timeout: the Python stack of process {rank}:" in log, log[-6000:]
    assert "most recent call first" in log  # faulthandler's dump
    assert 1 not in results  # process 1, stuck in a sleep or a wait, was ended
    # Process 0 raises it from train() once process 1's exit breaks its collective, unless the launcher, seeing
    # process 1 gone, ends it first.
    survivor = results.get(0)
    if survivor is not None:
        assert survivor["error"] == "StepTimeout" and survivor["message"] == message, survivor
    assert seconds < 120, seconds
    record = [json.loads(line) for line in (tmp_path / "step_timeout.jsonl").read_text().splitlines()]
    assert len(record) == 1 and record[0]["processes"] == [1]


# ---------------------------------------------------------------------------------------------- one process
class BusyAt(TrainerCallback):
    """At ``step``'s end, keeps the main thread busy in Python (short sleeps) and never returns."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        while state.global_step == self.step:
            time.sleep(0.05)


def _train(out, **kwargs):
    settings = {"max_steps": 6, "per_device_train_batch_size": 4, "logging_steps": 1, "save_strategy": "no",
                "report_to": "none", "disable_tqdm": True, **kwargs}
    stall_at = settings.pop("stall_at")
    trainer = Trainer(DropoutMLP(), TrainingArguments(str(out), **settings), train_dataset=ClassificationDataset(),
                      callbacks=[BusyAt(stall_at)])
    trainer.train()


def test_one_stuck_process_raises_step_timeout_in_its_main_thread(tmp_path, capfd):
    start = time.monotonic()
    with pytest.raises(stall.StepTimeout, match=r"^No progress for 2 s \(step_timeout=2\.0\): the process was stuck "
                                                r"in test_step_timeout\.py:\d+ in on_step_end \(a callback's "
                                                r"on_step_end at step 3\)\. Every process printed its Python stack"):
        _train(tmp_path, step_timeout=2, stall_at=3)
    assert time.monotonic() - start < 30
    assert "trainwell step_timeout: the Python stack of process 0:" in capfd.readouterr().err
    assert [t for t in threading.enumerate() if t.name == "trainwell-step-watchdog"] == []
    line = json.loads((tmp_path / "step_timeout.jsonl").read_text())
    assert line["step"] == 3 and line["processes"] == [0] and "on_step_end" in line["frame"]


# A stuck callback in a C call (a long sleep) that no exception reaches: the process must end by os._exit.
_SLEEPER = """
import sys, time
from tests.common.models import ClassificationDataset, DropoutMLP
from trainwell import Trainer, TrainerCallback, TrainingArguments
class SleepAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            time.sleep(300)
args = TrainingArguments(sys.argv[1], max_steps=6, per_device_train_batch_size=4, logging_steps=1,
                         save_strategy="no", report_to="none", disable_tqdm=True, step_timeout=2)
Trainer(DropoutMLP(), args, train_dataset=ClassificationDataset(), callbacks=[SleepAt()]).train()
"""


@pytest.mark.parametrize("at_record", ["nothing", "fifo"])
def test_a_process_stuck_where_no_exception_reaches_ends_within_the_grace_whatever_sits_at_the_record(
        tmp_path, at_record):
    """issue 39: with a FIFO at step_timeout.jsonl the stop message printed and the process never ended (the record
    was opened, blocking, before the stop); without it, one process alone waited the 10 s meant for the processes
    waiting on another, not the 2 s of the stuck one."""
    out = tmp_path / "out"
    out.mkdir()
    if at_record == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("needs FIFOs")
        os.mkfifo(out / "step_timeout.jsonl")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _SLEEPER, str(out)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    seen = {}

    def read() -> None:
        for line in proc.stderr:  # the time of the stop message
            if line.startswith("StepTimeout: No progress for 2 s"):
                seen.setdefault("stopped", time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=120)  # before the fix: the callback's 300 s sleep, then train() went on
        ended = time.monotonic()
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not end after its step_timeout stop")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    stopped = seen.get("stopped")
    assert stopped is not None and proc.returncode == 1, proc.returncode
    assert ended - stopped < stall.GRACE_STUCK + 4, ended - stopped  # 2 s of grace, not 10 (nor for ever)
    if at_record == "fifo":
        assert stat.S_ISFIFO(os.lstat(out / "step_timeout.jsonl").st_mode)  # refused, never written nor replaced
    else:
        record = json.loads((out / "step_timeout.jsonl").read_text())
        assert record["step"] == 3 and record["processes"] == [0]


def test_train_in_another_thread_is_stopped_there_and_the_main_thread_left_alone(tmp_path, monkeypatch):
    """Ray Tune's trials and a threaded Optuna search (n_jobs > 1) call train() outside the main thread: the
    watchdog names that thread's frame and raises StepTimeout there, never in the main thread (busy with something
    else), and it is joined before train() returns."""
    exits = []
    monkeypatch.setattr(stall.os, "_exit", exits.append)  # a wrong thread would otherwise end pytest itself
    outcome = {}

    def target():
        try:
            _train(tmp_path, step_timeout=2, stall_at=3)
        except BaseException as err:  # noqa: BLE001 - the outcome is the test's to judge
            outcome["error"] = err

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while worker.is_alive() and time.monotonic() < deadline:
        worker.join(0.05)  # short waits: an exception raised in this thread would be delivered here
    assert isinstance(outcome.get("error"), stall.StepTimeout), outcome
    assert re.search(r"stuck in test_step_timeout\.py:\d+ in on_step_end", str(outcome["error"])), outcome
    assert exits == []
    assert [t for t in threading.enumerate() if t.name == "trainwell-step-watchdog"] == []


def test_auto_takes_the_timeout_from_the_step_time_with_a_floor(tmp_path, monkeypatch):
    monkeypatch.setattr(stall, "AUTO_FLOOR", 1.5)
    monkeypatch.setattr(stall, "AUTO_SAMPLES", 3)
    monkeypatch.setattr(stall, "AUTO_WARMUP", 2)
    monkeypatch.setattr(stall, "AUTO_POLL", 0.05)
    slow = type("Slow", (TrainerCallback,), {"on_step_begin": lambda *a, **k: time.sleep(0.03)})
    args = TrainingArguments(str(tmp_path), max_steps=200, per_device_train_batch_size=4, save_strategy="no",
                             report_to="none", disable_tqdm=True, step_timeout="auto")
    trainer = Trainer(DropoutMLP(), args, train_dataset=ClassificationDataset(), callbacks=[slow(), BusyAt(40)])
    with pytest.raises(stall.StepTimeout, match=r"^No progress for \d s \(step_timeout='auto' \(\d s\)\)"):
        trainer.train()
    assert stall.auto_timeout([0.01, 0.02, 5.0]) == 1.5  # the floor
    assert stall.auto_timeout([1.0, 2.0, 3.0]) == 40.0  # 20 x the median


def test_a_run_that_makes_progress_is_never_stopped(tmp_path):
    trainer = Trainer(DropoutMLP(), TrainingArguments(str(tmp_path), max_steps=6, per_device_train_batch_size=4,
                                                     save_strategy="steps", save_steps=2, report_to="none",
                                                     disable_tqdm=True, step_timeout=1),
                      train_dataset=ClassificationDataset(), eval_dataset=ClassificationDataset(n=16))
    trainer.train()
    assert trainer.state.global_step == 6 and not (tmp_path / "step_timeout.jsonl").exists()


class SlowData(ClassificationDataset):
    def __getitem__(self, i):
        time.sleep(0.04)  # 0.16 s per batch of 4
        return super().__getitem__(i)


class SkipRecord(TrainerCallback):
    """A rollback_on_spike record in the state: steps 3-12 are passed over (their batches read, not trained)."""

    def on_train_begin(self, args, state, control, **kwargs):
        state.log_history.append({"rollback": 1, "rollback_to_step": 2, "skipped_steps_from": 3,
                                  "skipped_steps_to": 12, "step": 12})


def test_steps_passed_over_after_a_rollback_are_progress(tmp_path):
    """A rerun passes over the steps a rollback recorded by reading their batches (1.6 s here, minutes for the
    few hundred batches of a real skip): that is progress, not a stuck process."""
    args = TrainingArguments(str(tmp_path), max_steps=14, per_device_train_batch_size=4, save_strategy="no",
                             report_to="none", disable_tqdm=True, step_timeout=1)
    trainer = Trainer(DropoutMLP(), args, train_dataset=SlowData(), callbacks=[SkipRecord()])
    trainer.train()
    assert trainer.state.global_step == 14 and not (tmp_path / "step_timeout.jsonl").exists()


# ---------------------------------------------------------------------------------------------- no processes
def test_the_stuck_process_is_the_one_outside_a_collective_or_silent():
    report = lambda beats, collective: {"beats": beats, "collective": collective}  # noqa: E731
    assert stall.verdict({0: report(9, True), 1: report(8, False)}, 2) == [1]
    assert stall.verdict({0: report(9, False), 1: report(9, True)}, 2) == [0]
    assert stall.verdict({0: report(9, True)}, 2) == [1]  # no report: frozen
    assert stall.verdict({0: report(9, True), 1: report(7, True)}, 2) == [1]  # all waiting: the fewest beats
    assert stall.verdict({0: report(5, False), 1: report(5, False)}, 2) == [0, 1]


def test_what_a_stuck_main_thread_was_doing():
    assert stall.doing(["run", "_run_epoch", "_fire", "on_step_end", "call_event"], 3) == (
        "a callback's on_step_end at step 3")
    assert stall.doing(["run", "_run_epoch", "_windows", "__next__"], 4) == "reading the training data of step 5"
    assert stall.doing(["run", "_run_epoch", "run_window", "backward"], 4) == (
        "the backward pass (its gradient all-reduce) in training step 5")


class StopWhen(TrainerCallback):
    """Slow steps (0.05 s) until ``event`` is set, then stops training (or ``max_steps`` ends it)."""

    def __init__(self, event):
        self.event = event

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)
        if self.event.is_set():  # (never cleared: the flow callback sets it at max_steps)
            control.should_training_stop = True


def test_two_trainings_in_two_threads_each_have_their_own_heartbeat(tmp_path, monkeypatch):
    """Threaded Optuna or Ray Tune trials train in one process: one stuck while the other makes progress must stop
    within its step_timeout (a heartbeat shared by the process would hide its stall until the other ends)."""
    monkeypatch.setattr(stall.os, "_exit", lambda code: None)  # never end pytest
    stuck_done, outcome = threading.Event(), {}

    def stuck():
        try:
            _train(tmp_path / "stuck", step_timeout=2, stall_at=3)
        except BaseException as err:  # noqa: BLE001 - the outcome is the test's to judge
            outcome["error"] = err
        finally:
            stuck_done.set()

    def healthy():
        args = TrainingArguments(str(tmp_path / "healthy"), max_steps=2000, per_device_train_batch_size=4,
                                 save_strategy="no", report_to="none", disable_tqdm=True, step_timeout=60)
        trainer = Trainer(DropoutMLP(), args, train_dataset=ClassificationDataset(), callbacks=[StopWhen(stuck_done)])
        outcome["healthy_steps"] = trainer.train().global_step

    threads = [threading.Thread(target=healthy, daemon=True), threading.Thread(target=stuck, daemon=True)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 240
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        for thread in threads:
            thread.join(0.05)
    assert isinstance(outcome.get("error"), stall.StepTimeout), outcome
    # the healthy run was still going when the stuck one stopped: it stopped on that, not at max_steps
    assert outcome.get("healthy_steps", 2000) < 2000, outcome
