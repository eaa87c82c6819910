"""``trainwell report --watch`` (issue 41): the run's state from its heartbeat, system metrics in the live log only,
and a run named before its folder exists. Without a browser (``test_report_watch_page.py`` drives the page)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.loop.live_log import LIVE_LOG_NAME
from trainwell.loop.system_sampler import SystemSampler
from trainwell.report.live_reader import parse_lines, rebuild
from trainwell.report.watch import WatchedRun, Watcher, watch_runs
from trainwell.report.watch_state import run_state

# A run that trains slowly (a sleep per step) with report_to="live", saving at step 4, until it is killed.
CHILD = """
import sys, time
from tests.common.models import RegressionDataset, RegressionModel
from trainwell import Trainer, TrainerCallback, TrainingArguments

class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05 if state.global_step < 6 else 0.5)

args = TrainingArguments(output_dir=sys.argv[1], max_steps=10000, logging_steps=2, save_steps=4, report_to="live",
                         disable_tqdm=True, use_cpu=True)
Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64),
                      callbacks=[Slow()]).train()
"""


def start_child(out) -> subprocess.Popen:
    """The run of ``CHILD`` in a new process, training into ``out``."""
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(out)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(out, proc: subprocess.Popen, name: str = "checkpoint-4") -> None:
    """Until the child saved ``name`` (its state file written) and logged past it."""
    deadline = time.monotonic() + hang_timeout(120)
    while not (out / name / "trainer_state.json").exists() or _logged_step(out) < 6:
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}): {proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {name} within the hang guard")
        time.sleep(0.1)


def _logged_step(out) -> int:
    try:
        records, _, _ = parse_lines((out / LIVE_LOG_NAME).read_bytes())
    except OSError:
        return -1
    return max([r["log"].get("step", -1) for r in records if "log" in r] or [-1])


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=hang_timeout(30))  # reaped: a zombie would still answer to its pid


def _run(watcher: Watcher) -> dict:
    watcher.refresh()
    return json.loads(watcher.payload(None))["runs"][0]


def test_a_killed_run_reads_stopped_unexpectedly_with_its_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = start_child(out)
    try:
        wait_for_checkpoint(out, proc)
        watcher = Watcher([WatchedRun(out, "run")])
        run = _run(watcher)
        assert run["state"] == "training" and run["state_text"] == "training", run
        assert run["system"]["cpu_percent"] and run["system"]["rss_bytes"][0][1] > 10 << 20  # the first sample
    finally:
        kill(proc)
    run = _run(watcher)
    assert run["state"] == "stopped", run
    assert run["state_text"].startswith(f"stopped unexpectedly at step {run['step']} (process {proc.pid} is gone)")
    assert run["checkpoint"] == max((n for n in os.listdir(out) if n.startswith("checkpoint-")),
                                    key=lambda n: int(n.split("-")[1]))
    assert run["state_text"].endswith(f"resume from {run['checkpoint']}")


def test_system_metrics_go_to_the_live_log_only_on_a_timer(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINWELL_SYSTEM_INTERVAL", "0.05")

    class Slow(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(0.03)

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=12, logging_steps=4, save_steps=100,
                             report_to="live", disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64),
                      callbacks=[Slow()])
    trainer.train()
    assert not any(k in e for e in trainer.state.log_history for k in ("cpu_percent", "rss_bytes", "pid"))
    records, _, skipped = parse_lines((tmp_path / LIVE_LOG_NAME).read_bytes())
    system = [r["system"] for r in records if "system" in r]
    assert skipped == 0 and len(system) >= 3 and system[-1] == {"pid": os.getpid(), "host": system[0]["host"],
                                                                 "ended": True}
    assert all(s["pid"] == os.getpid() and s["cpu_percent"] >= 0 and s["rss_bytes"] > 0 for s in system[:-1])
    history = rebuild(records)
    assert history.process["ended"] and [e for e in history.entries if "loss" in e] == [
        e for e in trainer.state.log_history if "loss" in e]  # the log entries as log_history holds them
    assert not any(t.name == "trainwell-system-metrics" for t in threading.enumerate())  # stopped with train()
    state = run_state(tmp_path, history, 12, finished=False, now=time.time())  # as if no summary had been logged
    assert state["text"] == "train() ended at step 12 without finishing; resume from checkpoint-12"


def test_a_heartbeat_from_another_machine_goes_stale(tmp_path):
    history = rebuild([{"session": {"start_step": 0, "resumed_from": None, "max_steps": 9}, "time": 100.0},
                       {"system": {"pid": 1, "host": "elsewhere", "cpu_percent": 5.0}, "time": 100.0},
                       {"log": {"loss": 1.0, "step": 3}, "time": 110.0}])
    assert run_state(tmp_path, history, 3, False, now=200.0)["state"] == "training"
    stopped = run_state(tmp_path, history, 3, False, now=300.0)
    assert stopped["text"] == "stopped unexpectedly at step 3 (no heartbeat for 190 s); no checkpoint to resume from"
    assert run_state(tmp_path, history, 3, True, now=300.0)["state"] == "finished"


def test_a_sampler_that_cannot_write_stops_and_training_goes_on(tmp_path):
    sampler = SystemSampler.begin(str(tmp_path / "missing" / LIVE_LOG_NAME), interval=0.01)
    sampler._thread.join(timeout=hang_timeout(10))
    assert not sampler._thread.is_alive()
    sampler.stop()


def test_a_run_named_before_its_folder_exists_is_waited_for(tmp_path):
    out = tmp_path / "later"
    server = watch_runs([str(out)], ["later"], interval=0.05)
    try:
        run = json.loads(server.watcher.payload(None))["runs"][0]
        assert run["error"] == f"waiting for {out} to be created (the run has not started yet)"
        out.mkdir()
        (out / LIVE_LOG_NAME).write_text(
            json.dumps({"session": {"start_step": 0, "resumed_from": None, "max_steps": 9}}) + "\n"
            + json.dumps({"log": {"loss": 2.0, "step": 1}}) + "\n")
        deadline = time.monotonic() + hang_timeout(20)
        while json.loads(server.watcher.payload(None))["runs"][0].get("step") != 1:
            assert time.monotonic() < deadline, server.watcher.payload(None)
            time.sleep(0.05)
    finally:
        server.watcher.stop()
        server.server_close()


def test_the_cli_waits_for_a_folder_not_there_yet(tmp_path, monkeypatch, capsys):
    from trainwell.cli import main
    from trainwell.report.watch_server import WatchServer

    served = []

    def serve(self, poll_interval=0.5):
        served.append(json.loads(self.watcher.payload(None)))
        raise KeyboardInterrupt

    monkeypatch.setattr(WatchServer, "serve_forever", serve)
    assert main(["report", "--watch", str(tmp_path / "not-yet"), "--x", "epoch"]) == 0
    assert "no such folder yet" in capsys.readouterr().out
    assert served[0]["x"] == "epoch" and "waiting for" in served[0]["runs"][0]["error"]



def test_gpu_metrics_come_from_the_allocator_and_nvml_without_a_gpu_here(tmp_path, monkeypatch):
    """No GPU on the test machine: torch.cuda's counters and NVML are stood in for, to check what is read (the
    allocator's host-side counters, NVML's device renumbered by CUDA_VISIBLE_DEVICES) and that a failing NVML
    drops the utilisation, never the sample."""
    import types

    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 1000 + d)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 2000 + d)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    rates = types.SimpleNamespace(gpu=42)
    nvml = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: calls.append(i) or i,
                                 nvmlDeviceGetUtilizationRates=lambda h: rates)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = SystemSampler(str(tmp_path / LIVE_LOG_NAME))
    sample = sampler.sample()
    assert {k: sample[k] for k in sample if k.startswith("gpu")} == {
        "gpu_memory_bytes": 1001, "gpu_reserved_bytes": 2001, "gpu_util_percent": 42.0}
    assert calls == [5]  # NVML's index of torch's device 1 under CUDA_VISIBLE_DEVICES=3,5; no synchronize

    def broken(handle):
        raise RuntimeError("NVML gone")

    nvml.nvmlDeviceGetUtilizationRates = broken
    sample = sampler.sample()
    assert "gpu_util_percent" not in sample and sample["gpu_memory_bytes"] == 1001 and sample["rss_bytes"] > 0


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan"])
def test_a_bad_sampling_interval_is_an_error_before_training(tmp_path, monkeypatch, value):
    monkeypatch.setenv("TRAINWELL_SYSTEM_INTERVAL", value)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to="live", disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=8))
    with pytest.raises(ValueError, match=f"TRAINWELL_SYSTEM_INTERVAL='{value}': pass the seconds"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_throughput_is_charted_per_unit(tmp_path):
    """A new run that has logged only its step-0 evaluation: its speeds (samples/s, steps/s) on two charts, not
    one log axis; a training speed (tokens/s) on its own."""
    from trainwell.report.watch import figures

    history = [{"eval_loss": 2.0, "eval_runtime": 1.0, "eval_samples_per_second": 64.0, "eval_steps_per_second": 8.0,
                "step": 0}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 0, "max_steps": 9,
                                                             "log_history": history}))
    watched = WatchedRun(tmp_path, "run")
    watched.refresh()
    shown = {f["key"]: (f["title"], [s["key"] for s in f["series"]]) for f in figures([watched])}
    assert {k: v for k, v in shown.items() if k.startswith("throughput")} == {
        "throughput_samples": ("throughput (samples/s)", ["eval_samples_per_second"]),
        "throughput_steps": ("throughput (steps/s)", ["eval_steps_per_second"])}
    history.append({"loss": 1.0, "tokens_per_second": 5000.0, "step": 1})
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1, "max_steps": 9,
                                                             "log_history": history}))
    watched = WatchedRun(tmp_path, "run")
    watched.refresh()
    shown = {f["key"]: (f["title"], [s["key"] for s in f["series"]]) for f in figures([watched])}
    assert {k: v for k, v in shown.items() if k.startswith("throughput")} == {
        "throughput_tokens": ("throughput (tokens/s)", ["tokens_per_second"])}
