"""The trackers beyond the first four: every ``report_to`` name of the reference, each exercised for real.

Comet, ClearML, Neptune, DVCLive, CodeCarbon and SwanLab run through their real packages in their offline or
local modes, and what they recorded is read back with their own readers (skipped, with the reason, when the
package is not installed: the test extra installs them). Azure ML, DagsHub and Flyte record only inside their
services: their callbacks are tested against stand-ins for the client objects they call. Kubeflow needs no
package: it posts to a server on the loopback address. Every test fails if anything tries to reach the network.
"""

from __future__ import annotations

import glob
import importlib.machinery
import json
import os
import socket
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.common.timing import hang_timeout
from tests.conftest import make_args
from tests.test_integrations import _tracker, _train
from trainwell.integrations import TRACKERS, get_reporting_integration_callbacks

# Comet reports its own errors to a crash service, set up when comet_ml is imported: off before any import.
# Its offline mode also looks up cloud metadata, git state and (for CO2) the machine's location: off too.
COMET_QUIET = {"COMET_ERROR_TRACKING_ENABLE": "false", "COMET_AUTO_LOG_ENV_DETAILS": "false",
               "COMET_AUTO_LOG_CO2": "false", "COMET_AUTO_LOG_GIT_METADATA": "false",
               "COMET_AUTO_LOG_GIT_PATCH": "false", "COMET_DISABLE_ANNOUNCEMENT": "true"}  # fmt: skip
for _name, _value in COMET_QUIET.items():
    os.environ.setdefault(_name, _value)

# The reference's report_to names and their callback classes (transformers.integrations.INTEGRATION_TO_CALLBACK).
REFERENCE = {
    "azure_ml": "AzureMLCallback", "comet_ml": "CometCallback", "mlflow": "MLflowCallback",
    "neptune": "NeptuneCallback", "tensorboard": "TensorBoardCallback", "trackio": "TrackioCallback",
    "wandb": "WandbCallback", "codecarbon": "CodeCarbonCallback", "clearml": "ClearMLCallback",
    "dagshub": "DagsHubCallback", "flyte": "FlyteCallback", "dvclive": "DVCLiveCallback",
    "swanlab": "SwanLabCallback", "kubeflow": "KubeflowCallback",
}  # fmt: skip


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Refuse, and record, any connection or name lookup beyond the loopback address."""
    attempts = []
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def local(host):
        return str(host) in ("localhost", "::1") or str(host).startswith("127.")

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not local(address[0]):
            attempts.append(address)
            raise OSError(f"test: no network ({address})")
        return real_connect(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if host is not None and not local(host):
            attempts.append(host)
            raise socket.gaierror(f"test: no network ({host})")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield
    assert not attempts, f"a tracker tried to reach the network: {attempts}"


# --- names -----------------------------------------------------------------------------------------------------


def test_every_reference_name_is_accepted_with_the_reference_class_name():
    assert set(REFERENCE) <= set(TRACKERS)
    for name, cls in REFERENCE.items():
        assert TRACKERS[name].cls == cls
        assert make_args("o", report_to=name).report_to == [name]


def test_all_follows_the_reference_rules(monkeypatch):
    installed = {"azureml.core", "comet_ml", "flytekit", "clearml", "dagshub", "dvclive"}
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object() if name in installed else None)
    for var in ("COMET_API_KEY", "COMET_MODE", "COMET_START_ONLINE", "COMET_CONFIG", "KUBEFLOW_TRAINER_SERVER_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.comet.config
    # Azure ML (no MLflow installed), not Comet (no API key), not DagsHub (needs MLflow too), never Flyte
    assert make_args("o", report_to="all").report_to == ["azure_ml", "dvclive", "clearml"]
    monkeypatch.setenv("COMET_API_KEY", "k")
    installed.add("mlflow")  # with MLflow, Azure ML runs are logged through it; DagsHub now has what it needs
    assert make_args("o", report_to="all").report_to == ["comet_ml", "dagshub", "dvclive", "mlflow", "clearml"]
    monkeypatch.setenv("DISABLE_MLFLOW_INTEGRATION", "TRUE")
    assert "mlflow" not in make_args("o", report_to="all").report_to


def test_comet_config_file_counts_as_configured(monkeypatch, tmp_path):
    from trainwell.args.trackers import comet_configured

    for var in ("COMET_API_KEY", "COMET_MODE", "COMET_START_ONLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COMET_CONFIG", str(tmp_path / "conf"))
    assert not comet_configured()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / ".comet.config").write_text("[comet]\napi_key = abc\n")
    assert comet_configured()
    monkeypatch.delenv("COMET_CONFIG")
    assert not comet_configured()
    monkeypatch.setenv("COMET_START_ONLINE", "0")  # an offline run needs no key
    assert comet_configured()


def test_kubeflow_is_added_inside_a_trainjob(monkeypatch):
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "http://127.0.0.1:9/status")
    assert make_args("o", report_to="none").report_to == ["kubeflow"]
    assert make_args("o", report_to=["jsonl"]).report_to == ["jsonl", "kubeflow"]
    monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "true")
    assert make_args("o", report_to="none").report_to == []


def test_missing_client_package_names_the_pip_install():
    if TRACKERS["flyte"].installed():
        pytest.skip("flytekit is installed here")
    with pytest.raises(ImportError, match="pip install flytekit"):
        get_reporting_integration_callbacks(["flyte"])


# --- trackers with a local mode, read back with their own readers -----------------------------------------------


def test_comet_offline_experiment_reads_back(out_dir, tmp_path, monkeypatch):
    pytest.importorskip("comet_ml", reason="comet_ml is not installed (pip install comet_ml)")
    import zipfile

    from comet_ml.messages import MetricMessage, ParameterMessage

    from trainwell.integrations.comet import CometCallback

    monkeypatch.setenv("COMET_MODE", "offline")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("COMET_PROJECT_NAME", "trainwell-tests")
    trainer = _train(out_dir, report_to="comet_ml")
    experiment = _tracker(trainer, CometCallback).experiment
    assert experiment.alive  # left open, as the reference leaves it, for a following evaluate()
    trainer.evaluate()
    experiment.end()  # writes the offline archive
    (archive,) = glob.glob(str(tmp_path / "comet" / "*.zip"))
    with zipfile.ZipFile(archive) as z:
        messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines()]
        meta = json.loads(z.read("experiment.json"))
    assert meta["project_name"] == "trainwell-tests"
    metrics = [MetricMessage.from_message_dict(m["payload"]).metric for m in messages if m["type"] == "metric_msg"]
    assert [m["step"] for m in metrics if m["metricName"] == "train/loss"] == [2, 4, 6]
    assert [m["step"] for m in metrics if m["metricName"] == "eval/loss"] == [3, 6, 6]
    params = {}
    for m in messages:
        if m["type"] == "parameter_msg":
            message = ParameterMessage.from_message_dict(m["payload"])
            for param in (message.param, message.params):
                if param:
                    params[param["paramName"]] = param["paramValue"]
    assert params["args|learning_rate"] == 0.1 and params["args|max_steps"] == 6
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert others["Name"] == "unit-run"


def test_comet_mode_is_checked_before_training(out_dir, monkeypatch):
    pytest.importorskip("comet_ml", reason="comet_ml is not installed (pip install comet_ml)")
    monkeypatch.setenv("COMET_MODE", "ofline")
    with pytest.raises(ValueError, match="COMET_MODE='ofline' is not a Comet mode"):
        _train(out_dir, report_to="comet_ml")


_CLEARML_CHILD = """
import json, socket, sys
attempts = []
real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo
local = lambda host: str(host) in ("localhost", "::1") or str(host).startswith("127.")
def connect(sock, address):
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not local(address[0]):
        attempts.append(str(address)); raise OSError("no network")
    return real_connect(sock, address)
def getaddrinfo(host, *args, **kwargs):
    if host is not None and not local(host):
        attempts.append(str(host)); raise socket.gaierror("no network")
    return real_getaddrinfo(host, *args, **kwargs)
socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
from clearml import Task
from clearml.utilities.check_updates import CheckPackageUpdates
CheckPackageUpdates._package_version_checked = True  # its online check for a newer release
from tests.test_integrations import _train, _tracker
from trainwell.integrations.clearml import ClearMLCallback
Task.set_offline(True)
trainer = _train(sys.argv[1], report_to="clearml", save_strategy="steps", save_steps=3)
print(json.dumps({"attempts": attempts, "closed": _tracker(trainer, ClearMLCallback)._task is None}))
"""


def test_clearml_offline_session_reads_back(out_dir, tmp_path, monkeypatch):
    """Run in a child process: ClearML's Task patches process-wide hooks (fork, streams) that outlive it."""
    pytest.importorskip("clearml", reason="clearml is not installed (pip install clearml)")
    import subprocess

    conf = tmp_path / "clearml.conf"
    # The reporter's subprocess makes Task.close() wait seconds for it; in-process reporting records the same.
    conf.write_text(
        "sdk { development { report_use_subprocess: false }\n"
        f'      storage {{ cache {{ default_base_dir: "{tmp_path / "cache"}" }} }} }}\n'
    )
    env = {**os.environ, "CLEARML_CONFIG_FILE": str(conf), "CLEARML_PROJECT": "trainwell-tests",
           "CLEARML_TASK": "unit-run", "CLEARML_LOG_MODEL": "true", "HOME": str(tmp_path)}  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    child = subprocess.run([sys.executable, "-c", _CLEARML_CHILD, out_dir], env=env, cwd=root, capture_output=True,
                           text=True, timeout=hang_timeout(300))  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result == {"attempts": [], "closed": True}  # no network; the task it created is closed at the end
    (session,) = [p for p in glob.glob(str(tmp_path / "cache" / "offline" / "*")) if os.path.isdir(p)]
    with open(os.path.join(session, "metrics.jsonl")) as f:
        events = [e for line in f for e in json.loads(line)]
    scalars = [(e["metric"], e["variant"], e["iter"]) for e in events if e["type"] == "training_stats_scalar"]
    assert [it for title, series, it in scalars if (title, series) == ("train", "loss")] == [2, 4, 6]
    assert [it for title, series, it in scalars if (title, series) == ("eval", "loss")] == [3, 6]
    assert ("Summary", "train_runtime") in {(title, series) for title, series, _ in scalars}
    with open(os.path.join(session, "task.json")) as f:
        task = json.load(f)
    assert task["name"] == "unit-run"
    hparams = task["hyperparams"]["Transformers"]
    assert hparams["learning_rate"]["value"] == "0.1" and "hub_token" not in hparams


def test_clearml_uploads_checkpoints_as_models_within_save_total_limit(out_dir, monkeypatch):
    """ClearML cannot store models offline, so its model objects are stood in for here."""
    pytest.importorskip("clearml", reason="clearml is not installed (pip install clearml)")
    from trainwell.integrations.clearml import ClearMLCallback

    uploads, removed, scalars = [], [], []

    class OutputModel:
        def __init__(self, task, name):
            self.name = name

        def connect(self, task, name):
            pass

        def update_weights_package(self, weights_path, target_filename, iteration, auto_delete_file):
            uploads.append((self.name, weights_path, iteration, auto_delete_file))

    report = types.SimpleNamespace(report_scalar=lambda **kw: scalars.append(kw), report_single_value=lambda **kw: 0)
    task = types.SimpleNamespace(
        get_logger=lambda: report,
        update_parameters=lambda params: None,
        set_configuration_object=lambda **kw: None,
        close=lambda: None,
    )
    task_cls = types.SimpleNamespace(
        current_task=lambda: None, init=lambda **kw: task, running_locally=lambda: True, is_offline=lambda: False
    )
    model_cls = types.SimpleNamespace(remove=lambda model, **kw: removed.append(model.name))
    callback = ClearMLCallback()
    callback._clearml = types.SimpleNamespace(Task=task_cls, OutputModel=OutputModel, Model=model_cls)
    monkeypatch.delenv("CLEARML_LOG_MODEL", raising=False)  # default: on for a task the callback created
    _train(out_dir, callbacks=[callback], save_strategy="steps", save_steps=2, save_total_limit=2)
    assert [(name, it) for name, _, it, _ in uploads] == [("checkpoint-2", 2), ("checkpoint-4", 4), ("checkpoint-6", 6)]
    assert uploads[0][1] == os.path.join(out_dir, "checkpoint-2") and removed == ["checkpoint-2"]
    assert {(s["title"], s["series"]) for s in scalars} >= {("train", "loss"), ("eval", "loss")}


def _neptune_operations(folder):
    """The operations Neptune queued for a run, read with its own disk queue (what ``neptune sync`` uploads)."""
    from pathlib import Path

    from neptune.core.components.queue.disk_queue import DiskQueue
    from neptune.internal.operation import Operation

    queue = DiskQueue(Path(folder), lambda op: op.to_dict(), Operation.from_dict, threading.RLock())
    operations = []
    while (element := queue.get()) is not None:
        operations.append(element.obj)
    return operations


def test_neptune_offline_run_reads_back(out_dir, tmp_path, monkeypatch):
    pytest.importorskip("neptune", reason="neptune is not installed (pip install neptune)")
    monkeypatch.chdir(tmp_path)  # offline runs go to ./.neptune
    monkeypatch.setenv("NEPTUNE_MODE", "offline")
    monkeypatch.setenv("NEPTUNE_PROJECT", "trainwell/tests")
    from trainwell.integrations.neptune import NeptuneCallback

    callback = NeptuneCallback(name="unit-run", capture_hardware_metrics=False, capture_stdout=False,
                               capture_stderr=False, capture_traceback=False)  # fmt: skip
    trainer = _train(out_dir, callbacks=[callback])
    assert NeptuneCallback.get_run(trainer) is None  # stopped at the end of training
    (folder,) = glob.glob(str(tmp_path / ".neptune" / "offline" / "run__*"))
    operations = _neptune_operations(folder)
    series = {}
    assigned = {}
    for op in operations:
        path = "/".join(op.path)
        if type(op).__name__ == "LogFloats":
            series.setdefault(path, []).extend((v.step, v.value) for v in op.values)
        elif hasattr(op, "value"):
            assigned[path] = op.value
    assert [step for step, _ in series["finetuning/train/loss"]] == [2, 4, 6]
    assert [step for step, _ in series["finetuning/eval/loss"]] == [3, 6]
    assert assigned["sys/name"] == "unit-run" and assigned["finetuning/train/epoch"] > 0
    assert float(assigned["finetuning/trainer_parameters/learning_rate"]) == 0.1


def test_neptune_best_checkpoints_need_load_best_model_at_end():
    pytest.importorskip("neptune", reason="neptune is not installed (pip install neptune)")
    from trainwell.integrations.neptune import NeptuneCallback

    with pytest.raises(ValueError, match="log_checkpoints='lats'"):
        NeptuneCallback(log_checkpoints="lats")
    callback = NeptuneCallback(log_checkpoints="best", mode="debug")
    from trainwell.state import TrainerState

    with pytest.raises(ValueError, match="load_best_model_at_end=True"):
        callback.start(make_args("o"), TrainerState(), None)


def test_dvclive_files_read_back(out_dir, tmp_path, monkeypatch):
    pytest.importorskip("dvclive", reason="dvclive is not installed (pip install dvclive)")
    from dvc.repo import Repo
    from dvclive.serialize import load_yaml
    from dvclive.utils import parse_json, parse_tsv

    from trainwell.integrations.dvclive import DVCLiveCallback

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    Repo.init(str(tmp_path), no_scm=True)  # a DVC repository (without git): DVCLive records artifacts there
    callback = DVCLiveCallback(dir=str(tmp_path / "live"), log_model=True, save_dvc_exp=False)
    _train(out_dir, callbacks=[callback])
    live = tmp_path / "live"
    loss = parse_tsv(live / "plots" / "metrics" / "loss.tsv")
    assert [int(row["step"]) for row in loss] == [2, 4, 6]
    assert [int(row["step"]) for row in parse_tsv(live / "plots" / "metrics" / "eval" / "loss.tsv")] == [3, 6]
    params = load_yaml(live / "params.yaml")
    assert params["learning_rate"] == 0.1 and params["max_steps"] == 6
    assert parse_json(live / "metrics.json")["train"]["runtime"] > 0
    assert os.path.exists(os.path.join(out_dir, "last", "model.safetensors"))  # log_model=True: the final model
    artifacts = load_yaml(tmp_path / "dvc.yaml")["artifacts"]  # ...logged as a model artifact
    assert artifacts["last"]["type"] == "model"


def test_codecarbon_offline_tracker_writes_emissions(out_dir, monkeypatch):
    pytest.importorskip("codecarbon", reason="codecarbon is not installed (pip install codecarbon)")
    import csv

    from trainwell.integrations.codecarbon import CodeCarbonCallback

    monkeypatch.setenv("CODECARBON_COUNTRY_ISO_CODE", "FRA")  # the offline tracker: no location lookup
    monkeypatch.setenv("CODECARBON_LOG_LEVEL", "error")
    trainer = _train(out_dir, report_to="codecarbon")
    tracker = _tracker(trainer, CodeCarbonCallback).tracker
    assert type(tracker).__name__ == "OfflineEmissionsTracker"
    with open(os.path.join(out_dir, "emissions.csv"), newline="") as f:
        (row,) = list(csv.DictReader(f))
    measured = tracker.final_emissions_data
    assert row["country_iso_code"] == "FRA" and float(row["duration"]) > 0
    assert float(row["emissions"]) == pytest.approx(measured.emissions) and measured.energy_consumed > 0


def _swanlab_scalars(run_file):
    """``({key: [(step, value)]}, start record)`` of a SwanLab run file, read with SwanLab's own record reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader = DataStoreReader()
    reader.open(run_file)
    out, start = {}, None
    for data in reader:
        record = Record()
        record.ParseFromString(data)
        if record.HasField("scalar"):
            out.setdefault(record.scalar.key, []).append((record.scalar.step, record.scalar.value.number))
        elif record.HasField("start"):
            start = record.start
    return out, start


def test_swanlab_offline_run_reads_back(out_dir, tmp_path, monkeypatch):
    swanlab = pytest.importorskip("swanlab", reason="swanlab is not installed (pip install swanlab)")
    pytest.importorskip("swanlab.sdk.internal.core_python.store", reason="needs swanlab >= 0.7's run files")
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.setenv("SWANLAB_LOG_DIR", str(tmp_path / "swanlog"))
    monkeypatch.setenv("SWANLAB_PROJECT", "trainwell-tests")
    _train(out_dir, report_to="swanlab")
    swanlab.finish()  # the run stays open after train(), as with the reference
    (run_file,) = glob.glob(str(tmp_path / "swanlog" / "run-*" / "*.swanlab"))
    scalars, start = _swanlab_scalars(run_file)
    assert start.project == "trainwell-tests" and start.name == "unit-run"
    assert [step for step, _ in scalars["train/loss"]] == [2, 4, 6]
    assert [step for step, _ in scalars["eval/loss"]] == [3, 6]
    assert [step for step, _ in scalars["single_value/train_runtime"]] == [6]
    config = glob.glob(str(tmp_path / "swanlog" / "run-*" / "files" / "config.yaml"))[0]
    assert "learning_rate" in open(config).read()


# --- trackers that record only inside their service: stand-ins for their clients ---------------------------------


def _fake_modules(monkeypatch, **modules):
    """Install stand-in modules (with a spec, so the registry sees them as installed)."""
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)


def test_azure_ml_logs_numbers_to_the_run_context(out_dir, monkeypatch):
    logged = []

    class Run:
        @staticmethod
        def get_context():
            return types.SimpleNamespace(log=lambda name, value, description: logged.append((name, value)))

    _fake_modules(monkeypatch, **{"azureml": {}, "azureml.core": {}, "azureml.core.run": {"Run": Run}})
    _train(out_dir, report_to="azure_ml")
    assert [value for name, value in logged if name == "loss"] and len([n for n, _ in logged if n == "loss"]) == 3
    assert len([n for n, _ in logged if n == "eval_loss"]) == 2 and ("train_runtime" in dict(logged))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # sqlalchemy deprecations inside mlflow's store
def test_dagshub_logs_through_mlflow_and_uploads_the_output(out_dir, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow)")
    uploads = []

    class Repo:
        def __init__(self, owner, name, branch):
            self.where = (owner, name, branch)

        def directory(self, path):
            return types.SimpleNamespace(add_dir=lambda folder: uploads.append((self.where, path, folder)))

    _fake_modules(monkeypatch, **{"dagshub": {}, "dagshub.upload": {"Repo": Repo}})
    monkeypatch.setenv("HF_DAGSHUB_LOG_ARTIFACTS", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(RuntimeError, match="dagshub.init"):
        _train(out_dir, report_to="dagshub")
    # The URI DagsHub's would be: an MLflow store can only be local here, so point the callback at one and
    # check it parses the real form separately.
    from trainwell.integrations.dagshub import DagsHubCallback, dagshub_repo

    assert dagshub_repo("https://dagshub.com/alice/my-model.mlflow") == ("alice", "my-model")
    uri = f"file://{tmp_path}/alice/my-model"  # a local file store: no database to create
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "dagshub-tests")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    trainer = _train(out_dir, report_to="dagshub")
    assert uploads == [(("alice", "my-model", "main"), "artifacts", out_dir)]
    run_id = _tracker(trainer, DagsHubCallback).run_id
    history = mlflow.tracking.MlflowClient(uri).get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [2, 4, 6]


def test_flyte_syncs_checkpoints_and_renders_the_log_history(out_dir, monkeypatch):
    pytest.importorskip("pandas", reason="the log history deck needs pandas")
    saved, decks = [], []
    checkpoint = types.SimpleNamespace(save=saved.append)

    class TableRenderer:
        def to_html(self, frame):
            return frame.to_html()

    _fake_modules(monkeypatch, **{
        "flytekit": {"current_context": lambda: types.SimpleNamespace(checkpoint=checkpoint),
                     "Deck": lambda name, html: decks.append((name, html))},
        "flytekitplugins": {}, "flytekitplugins.deck": {},
        "flytekitplugins.deck.renderer": {"TableRenderer": TableRenderer},
    })  # fmt: skip
    _train(out_dir, report_to="flyte", save_strategy="steps", save_steps=3)
    assert saved == [os.path.join(out_dir, "checkpoint-3"), os.path.join(out_dir, "checkpoint-6")]
    ((name, html),) = decks
    assert name == "Log History" and "eval_loss" in html and "train_runtime" in html


# --- Kubeflow: a status server on the loopback address -------------------------------------------------------------


class _StatusServer:
    def __init__(self):
        self.posts = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.posts.append((self.headers["Authorization"], json.loads(body)["trainerStatus"]))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/status"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_kubeflow_posts_progress_to_the_controller(out_dir, tmp_path, monkeypatch):
    from trainwell.integrations.kubeflow import KubeflowCallback

    server = _StatusServer()
    token = tmp_path / "token"
    token.write_text("secret\n")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", server.url)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    monkeypatch.setattr(KubeflowCallback, "min_interval_s", 0.0)  # every step posts (5 s apart in real runs)
    try:
        _train(out_dir)  # report_to="none": added by itself inside a TrainJob
    finally:
        server.close()
    assert {auth for auth, _ in server.posts} == {"Bearer secret"}
    progress = [status["progressPercentage"] for _, status in server.posts]
    assert progress == [0, 16, 33, 50, 66, 83, 99, 100]
    first, last = server.posts[0][1], server.posts[-1][1]
    assert first["metrics"] == [{"name": "total_steps", "value": "6"}]
    assert last["estimatedRemainingSeconds"] == 0 and "loss" in {m["name"] for m in last["metrics"]}


def test_kubeflow_keeps_training_when_the_controller_is_away(out_dir, tmp_path, monkeypatch):
    from trainwell.integrations.kubeflow import KubeflowCallback

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("secret")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", f"http://127.0.0.1:{port}/status")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    trainer = _train(out_dir, report_to="kubeflow")
    callback = _tracker(trainer, KubeflowCallback)
    assert trainer.state.global_step == 6 and callback.posts_failed >= 2 and not callback.failed
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL")
    with pytest.raises(RuntimeError, match="KUBEFLOW_TRAINER_SERVER_URL"):
        KubeflowCallback()


def test_neptune_last_checkpoint_replaces_the_previous_upload(out_dir, tmp_path, monkeypatch):
    pytest.importorskip("neptune", reason="neptune is not installed (pip install neptune)")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NEPTUNE_MODE", "offline")
    monkeypatch.setenv("NEPTUNE_PROJECT", "trainwell/tests")
    from trainwell.integrations.neptune import NeptuneCallback

    callback = NeptuneCallback(log_checkpoints="last", capture_hardware_metrics=False, capture_stdout=False,
                               capture_stderr=False, capture_traceback=False)  # fmt: skip
    _train(out_dir, callbacks=[callback], save_strategy="steps", save_steps=3, save_total_limit=1)
    (folder,) = glob.glob(str(tmp_path / ".neptune" / "offline" / "run__*"))
    ops = [op for op in _neptune_operations(folder) if op.path == ["finetuning", "checkpoints", "last"]]
    kinds = [type(op).__name__ for op in ops]
    assert kinds == ["UploadFileSet", "UploadFileSet", "DeleteFiles"]
    uploaded = [os.path.basename(op.file_globs[0]) for op in ops[:2]]
    assert uploaded == ["checkpoint-3", "checkpoint-6"]  # copies: rotation deleted checkpoint-3 meanwhile
    assert [os.path.basename(p) for p in ops[2].file_paths] == ["checkpoint-3"]
    assert not os.path.exists(os.path.dirname(ops[0].file_globs[0]))  # the copies are removed after the run
