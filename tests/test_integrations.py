"""Experiment trackers: the registry, each tracker writing locally and read back, and failure isolation.

Each third-party tracker is exercised against its real package writing to a temporary folder (no network);
its test is skipped, with the reason, when the package is not installed (scripts/test.sh installs them).
"""

from __future__ import annotations

import csv
import glob
import json
import logging
import os
import struct
import time

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.integrations import TRACKERS, Tracker, reporting_callbacks, tracker_class
from trainwell.integrations.base import TrackerCallback, resolve_logging_dir, rewrite_logs


def _train(out_dir, callbacks=None, **kwargs):
    defaults = dict(max_steps=6, logging_steps=2, per_device_train_batch_size=8, eval_strategy="steps",
                    eval_steps=3, learning_rate=0.1, run_name="unit-run")
    args = make_args(out_dir, **{**defaults, **kwargs})
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=48),
                      eval_dataset=RegressionDataset(length=16, seed=1), callbacks=callbacks)
    trainer.train()
    return trainer


def _tracker(trainer, cls):
    return next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, cls))


# --- registry and names -------------------------------------------------------------------------------------------


def test_unknown_tracker_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        make_args("o", report_to="tensorbord")
    assert "Did you mean 'tensorboard'?" in str(err.value)
    assert all(repr(name) in str(err.value) for name in TRACKERS)
    with pytest.raises(ValueError, match="jsonl"):
        tracker_class("comet")


def test_missing_package_names_what_to_install(monkeypatch, out_dir):
    monkeypatch.setattr(Tracker, "installed", lambda self: "wandb" not in self.packages)
    with pytest.raises(ImportError, match="pip install wandb"):
        _train(out_dir, report_to="wandb")


def test_all_means_the_installed_third_party_trackers(monkeypatch):
    installed = {"mlflow", "trackio"}
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name in installed else None)
    assert make_args("o", report_to="all").report_to == ["mlflow", "trackio"]
    assert make_args("o", report_to="none").report_to == []
    assert reporting_callbacks([]) == []


def test_rewrite_logs_and_logging_dir(monkeypatch, tmp_path):
    assert rewrite_logs({"loss": 1, "eval_loss": 2, "test_acc": 3}) == {"train/loss": 1, "eval/loss": 2,
                                                                         "test/acc": 3}
    args = make_args(str(tmp_path), run_name="exp/1")
    assert resolve_logging_dir(args) == os.path.join(str(tmp_path), "runs", "exp_1")
    args.logging_dir = str(tmp_path / "here")  # what the 4.x logging_dir= argument sets
    assert resolve_logging_dir(args) == str(tmp_path / "here")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "env"))
    assert resolve_logging_dir(args, "TENSORBOARD_LOGGING_DIR") == str(tmp_path / "env")
    unnamed = make_args(str(tmp_path))
    assert os.path.dirname(resolve_logging_dir(unnamed)) == os.path.join(str(tmp_path), "runs")


def test_importing_trainwell_imports_no_tracker():
    import subprocess
    import sys

    code = ("import sys, trainwell\nfrom trainwell import Trainer, TrainingArguments\n"
            "TrainingArguments(output_dir='o', report_to='all')\n"
            "bad = [m for m in ('tensorboard', 'mlflow', 'wandb', 'trackio', 'matplotlib', 'tensorboardX', 'comet_ml', "
            "'clearml', 'neptune', 'dvclive', 'codecarbon', 'swanlab', 'azureml', 'dagshub', 'flytekit') "
            "if m in sys.modules]\nassert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- built-in file loggers -----------------------------------------------------------------------------------------


def test_jsonl_and_csv_follow_logging_steps(out_dir):
    trainer = _train(out_dir, report_to=["jsonl", "csv"])
    folder = os.path.join(out_dir, "runs", "unit-run")
    records = [json.loads(line) for line in open(os.path.join(folder, "logs.jsonl"))]
    train_steps = [r["step"] for r in records if "loss" in r]
    assert train_steps == [2, 4, 6]
    assert [r["step"] for r in records if "eval_loss" in r] == [3, 6]
    assert records[-1]["train_runtime"] > 0 and all("time" in r for r in records)
    with open(os.path.join(folder, "logs.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(records)
    assert {"step", "loss", "eval_loss", "train_runtime"} <= set(rows[0])  # widened header, every row
    assert [float(r["loss"]) for r in rows if r["loss"]] == [r["loss"] for r in records if "loss" in r]
    assert trainer.state.global_step == 6


def test_logging_strategy_no_sends_only_evaluations(out_dir):
    _train(out_dir, report_to="jsonl", logging_strategy="no")
    records = [json.loads(line) for line in open(os.path.join(out_dir, "runs", "unit-run", "logs.jsonl"))]
    assert not any("loss" in r for r in records) and [r["step"] for r in records if "eval_loss" in r] == [3, 6]


# --- failure isolation ---------------------------------------------------------------------------------------------


class _Exploding(TrackerCallback):
    name = "exploding"

    def __init__(self):
        super().__init__()
        self.calls = 0

    def log_metrics(self, logs, step, args, state):
        self.calls += 1
        raise OSError(28, "No space left on device")


def test_a_failing_tracker_is_reported_once_and_training_goes_on(out_dir, caplog):
    boom = _Exploding()
    with caplog.at_level(logging.ERROR, logger="trainwell.integrations"):
        trainer = _train(out_dir, callbacks=[boom])
    assert trainer.state.global_step == 6 and boom.failed and boom.calls == 1
    reports = [r for r in caplog.records if "exploding tracker failed" in r.getMessage()]
    assert len(reports) == 1 and "No space left on device" in reports[0].getMessage()


def test_a_file_logger_on_a_full_disk_does_not_stop_training(out_dir, monkeypatch, caplog):
    real_open = os.open  # the log is appended through trainwell.utils.safe_files (os.open, in its folder)

    def full_disk(path, *args, **kwargs):
        if str(path).endswith("logs.jsonl"):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_disk)
    with caplog.at_level(logging.ERROR, logger="trainwell.integrations"):
        trainer = _train(out_dir, report_to="jsonl")
    assert trainer.state.global_step == 6
    assert sum("jsonl tracker failed" in r.getMessage() for r in caplog.records) == 1


# --- third-party trackers, each writing locally and read back ------------------------------------------------------


def test_tensorboard_event_files_read_back(out_dir):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainwell.integrations.tensorboard import TensorBoardCallback

    trainer = _train(out_dir, report_to="tensorboard")
    tb = _tracker(trainer, TensorBoardCallback)
    assert tb.logging_dir == os.path.join(out_dir, "runs", "unit-run") and tb.tb_writer is None
    events = EventAccumulator(tb.logging_dir)
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/learning_rate", "eval/loss"} <= set(scalars)
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6]
    assert [e.step for e in events.Scalars("eval/loss")] == [3, 6]
    assert "args/text_summary" in events.Tags()["tensors"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # sqlalchemy deprecations inside mlflow's store
def test_mlflow_params_metrics_and_artifacts(out_dir, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "trainwell-tests")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "1")
    monkeypatch.chdir(tmp_path)  # the default artifact store is ./mlruns
    from trainwell.integrations.mlflow import MLflowCallback

    trainer = _train(out_dir, report_to="mlflow", save_strategy="steps", save_steps=6)
    run_id = _tracker(trainer, MLflowCallback).run_id
    client = mlflow.tracking.MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "unit-run" and run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.1" and run.data.params["max_steps"] == "6"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [2, 4, 6]
    assert [m.step for m in client.get_metric_history(run_id, "eval_loss")] == [3, 6]
    artifacts = [a.path for a in client.list_artifacts(run_id, "checkpoint-6")]
    assert any(p.endswith("trainer_state.json") for p in artifacts)
    assert mlflow.active_run() is None


def _wandb_records(path):
    """Records of an offline ``.wandb`` file (a LevelDB-style log of protobuf records after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    pos, block, chunks, records = 7, 32768, b"", []
    while pos + 7 <= len(data):
        space = block - pos % block
        if space < 7:  # block trailer padding
            pos += space
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last fragment of one
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
        elif kind == 0:
            break
    return records


def test_wandb_offline_run_reads_back(out_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "trainwell-tests")
    import wandb

    trainer = _train(out_dir, report_to="wandb")
    trainer.evaluate()  # after train(): logged to the same, still open, run
    wandb.finish()
    files = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    # wandb's service process may still be writing the file when finish() returns (seen on a loaded machine)
    deadline = time.monotonic() + hang_timeout(30)
    records = _wandb_records(files[0])
    while not any(r.WhichOneof("record_type") == "run" for r in records) and time.monotonic() < deadline:
        time.sleep(0.5)
        records = _wandb_records(files[0])
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "unit-run" and run.project == "trainwell-tests"
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    losses = [(h["train/global_step"], h["train/loss"]) for h in history if "train/loss" in h]
    assert [step for step, _ in losses] == [2, 4, 6]
    assert [h["train/global_step"] for h in history if "eval/loss" in h] == [3, 6, 6]


def test_trackio_local_project_reads_back(out_dir, tmp_path, monkeypatch):
    trackio = pytest.importorskip("trackio", reason="trackio is not installed (pip install trackio)")
    import trackio.sqlite_storage as storage

    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path))
    monkeypatch.setattr(storage, "TRACKIO_DIR", tmp_path)  # read at import time; point this test at tmp_path
    _train(out_dir, report_to="trackio", project="trainwell-tests")
    assert os.path.exists(tmp_path / "trainwell-tests.db")
    assert trackio.SQLiteStorage.get_runs("trainwell-tests") == ["unit-run"]
    logs = trackio.SQLiteStorage.get_logs("trainwell-tests", "unit-run")
    assert [row["step"] for row in logs if "train/loss" in row] == [2, 4, 6]
    assert [row["step"] for row in logs if "eval/loss" in row] == [3, 6]
    config = trackio.SQLiteStorage.get_run_config("trainwell-tests", "unit-run")
    assert config["learning_rate"] == 0.1
