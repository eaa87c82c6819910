"""output_dir as an object-store URL: checkpoints staged locally, uploaded with the manifest last, rotated, resumed
from the store bit for bit, and a store that fails says so with the staged copy kept.

Against a real S3-API server on 127.0.0.1 (moto's standalone server), spoken to through s3fs as AWS would be
(``AWS_ENDPOINT_URL`` and fake credentials in the environment); ``file://`` through fsspec's local file system.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from tests.common import s3server  # noqa: E402
from tests.common.models import RegressionDataset, RegressionModel  # noqa: E402
from tests.common.timing import hang_timeout  # noqa: E402
from tests.conftest import make_args  # noqa: E402
from trainwell import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from trainwell.checkpoint import store  # noqa: E402
from trainwell.checkpoint.resume import get_last_checkpoint  # noqa: E402
from trainwell.checkpoint.store import StoreError  # noqa: E402

SCRIPT = Path(__file__).parent / "checkpointing" / "store_script.py"
MANIFEST = "checkpoint_manifest.json"


@pytest.fixture(scope="module")
def server():
    srv = s3server.S3Server().start()
    try:
        with s3server.environment(srv.env()):
            yield srv
    finally:
        srv.stop()


@pytest.fixture
def bucket(server, request):
    """A fresh bucket for each test (named after it), clients opened afresh."""
    name = "t-" + request.node.name.lower().replace("_", "-")[:50].strip("-").replace("[", "-").replace("]", "")
    server.client().create_bucket(Bucket=name)
    s3server.forget_clients()
    yield name
    s3server.forget_clients()


def _trainer(out, staging, max_steps=6, **kwargs):
    torch.manual_seed(0)
    args = make_args(str(out), max_steps=max_steps, per_device_train_batch_size=8, logging_steps=1,
                     save_strategy="steps", save_steps=2, output_staging_dir=str(staging) if staging else None,
                     **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())


def _losses(trainer):
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def _same_weights(a, b):
    return torch.equal(a.model.a, b.model.a) and torch.equal(a.model.b, b.model.b)


def _checkpoints(server, bucket, prefix="run/"):
    """checkpoint name -> the file names the store holds of it."""
    found: dict[str, list[str]] = {}
    for key in server.keys(bucket, prefix):
        name, _, file = key[len(prefix):].partition("/")
        found.setdefault(name, []).append(file)
    return found


class _UploadSpy:
    """Records each file put into the store, in order, and the thread that put it."""

    def __init__(self, monkeypatch):
        self.puts: list[tuple[str, str]] = []
        original = store.FsspecStore.upload
        spy = self

        def upload(self, folder, name):
            put, put_file = self.fs.put, self.fs.put_file
            self.fs.put = lambda lpaths, rpaths, **kw: (spy._note(rpaths), put(lpaths, rpaths, **kw))[1]
            self.fs.put_file = lambda lpath, rpath, **kw: (spy._note([rpath]), put_file(lpath, rpath, **kw))[1]
            try:
                return original(self, folder, name)
            finally:
                del self.fs.put, self.fs.put_file

        monkeypatch.setattr(store.FsspecStore, "upload", upload)

    def _note(self, paths):
        self.puts += [(p, threading.current_thread().name) for p in paths]


# ------------------------------------------------------------------------------------------------ saving
def test_a_run_saves_to_s3_manifest_last_rotated_and_no_local_s3_folder(server, bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spy = _UploadSpy(monkeypatch)
    url = f"s3://{bucket}/run"
    trainer = _trainer(url, None, save_total_limit=2)
    assert trainer.args.output_dir == url and trainer.args.to_dict()["output_dir"] == url
    trainer.train()
    assert not os.path.exists(tmp_path / "s3:")  # the old behaviour: a local folder named after the scheme
    staging = tmp_path / "trainwell_staging" / "s3" / bucket / "run"  # the documented default
    held = _checkpoints(server, bucket)
    assert sorted(held) == ["checkpoint-4", "checkpoint-6"]  # save_total_limit=2 in the store
    assert sorted(os.listdir(staging / "checkpoint-6")) == sorted(held["checkpoint-6"])
    assert sorted(p.name for p in staging.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    for name in ("checkpoint-2", "checkpoint-4", "checkpoint-6"):
        mine = list(dict.fromkeys(path for path, _ in spy.puts if f"/{name}/" in path))  # put may call put_file
        assert mine[-1].endswith(f"{name}/{MANIFEST}") and len(mine) == 7, mine  # the manifest goes up last
    saved = server.client().get_object(Bucket=bucket, Key="run/checkpoint-6/training_args.json")["Body"].read()
    assert f'"output_dir": "{url}"'.encode() in saved
    assert {thread for _, thread in spy.puts} == {"MainThread"}


def test_save_async_uploads_off_the_training_thread(server, bucket, tmp_path, monkeypatch):
    spy = _UploadSpy(monkeypatch)
    trainer = _trainer(f"s3://{bucket}/run", tmp_path / "stage", save_async=True)
    trainer.train()
    assert sorted(_checkpoints(server, bucket)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    threads = {thread for _, thread in spy.puts}
    assert threads and all(t.startswith("trainwell-save-") for t in threads), threads


# ------------------------------------------------------------------------------------------------ resuming
def test_resume_true_from_the_store_is_bitwise_and_skips_a_folder_without_manifest(server, bucket, tmp_path):
    full = _trainer(tmp_path / "local", None)
    full.train()
    _trainer(f"s3://{bucket}/run", tmp_path / "stage-a").train()
    # checkpoint-6 loses its manifest (an upload cut short): never resumed, removed when the next run begins
    server.client().delete_object(Bucket=bucket, Key=f"run/checkpoint-6/{MANIFEST}")
    assert get_last_checkpoint(f"s3://{bucket}/run") == f"s3://{bucket}/run/checkpoint-4"  # the reference's idiom
    resumed = _trainer(f"s3://{bucket}/run", tmp_path / "stage-b")  # another machine: nothing staged
    resumed.train(resume_from_checkpoint=True)
    assert resumed.checkpointer.resume.path == str(tmp_path / "stage-b" / "checkpoint-4")
    assert _same_weights(resumed, full)
    assert {s: v for s, v in _losses(resumed).items() if s > 4} == {s: v for s, v in _losses(full).items() if s > 4}
    held = _checkpoints(server, bucket)
    assert sorted(held) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"] and MANIFEST in held["checkpoint-6"]
    assert not (tmp_path / "stage-b" / "checkpoint-2").exists()  # only what was resumed was downloaded


def test_a_folder_without_manifest_is_cleaned_and_a_checkpoint_url_resumes(server, bucket, tmp_path):
    with pytest.raises(ValueError, match=rf"s3://{bucket}/run holds no complete checkpoint"):
        _trainer(f"s3://{bucket}/run", tmp_path / "stage-0").train(resume_from_checkpoint=True)
    _trainer(f"s3://{bucket}/run", tmp_path / "stage-a", max_steps=4).train()
    server.client().put_object(Bucket=bucket, Key="run/checkpoint-8/model.safetensors", Body=b"partial")
    trainer = _trainer(f"s3://{bucket}/run", tmp_path / "stage-b")
    trainer.train(resume_from_checkpoint=f"s3://{bucket}/run/checkpoint-2")
    assert trainer.checkpointer.resume.path == str(tmp_path / "stage-b" / "checkpoint-2")
    assert "checkpoint-8" not in _checkpoints(server, bucket)
    with pytest.raises(ValueError, match="not a complete checkpoint of the store"):
        _trainer(f"s3://{bucket}/run", tmp_path / "stage-c").train(
            resume_from_checkpoint=f"s3://{bucket}/run/checkpoint-99")


def test_best_checkpoint_and_save_total_limit_1_in_the_store(server, bucket, tmp_path):
    kwargs = dict(eval_strategy="steps", eval_steps=2, load_best_model_at_end=True, metric_for_best_model="loss",
                  save_total_limit=1)
    torch.manual_seed(0)
    args = make_args(f"s3://{bucket}/run", max_steps=6, per_device_train_batch_size=8, save_strategy="steps",
                     save_steps=2, output_staging_dir=str(tmp_path / "stage"), **kwargs)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=16))
    trainer.train()
    best = Path(trainer.state.best_model_checkpoint).name
    assert sorted(_checkpoints(server, bucket)) == [best]  # only the best is kept, in the store as on disk


def test_the_best_checkpoint_is_fetched_when_a_resume_on_another_machine_loads_it(server, bucket, tmp_path):
    def trainer(staging):
        torch.manual_seed(0)
        args = make_args(f"s3://{bucket}/run", max_steps=6, per_device_train_batch_size=8, save_strategy="steps",
                         save_steps=2, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
                         metric_for_best_model="loss", greater_is_better=True,  # the first: the highest loss
                         output_staging_dir=str(tmp_path / staging))
        return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                       eval_dataset=RegressionDataset(length=16))

    full = trainer("stage-a")
    full.train()
    assert Path(full.state.best_model_checkpoint).name == "checkpoint-2"
    server.client().delete_object(Bucket=bucket, Key=f"run/checkpoint-6/{MANIFEST}")
    resumed = trainer("stage-b")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.best_model_checkpoint == str(tmp_path / "stage-b" / "checkpoint-2")
    assert (tmp_path / "stage-b" / "checkpoint-2" / MANIFEST).is_file()  # fetched when the best was loaded
    assert _same_weights(resumed, full)


def test_file_url(tmp_path):
    full = _trainer(tmp_path / "local", None)
    full.train()
    url = f"file://{tmp_path}/store/run"
    _trainer(url, tmp_path / "stage-a").train()
    assert (tmp_path / "store" / "run" / "checkpoint-6" / MANIFEST).is_file()
    (tmp_path / "store" / "run" / "checkpoint-6" / MANIFEST).unlink()
    resumed = _trainer(url, tmp_path / "stage-b")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.checkpointer.resume.path.endswith("checkpoint-4") and _same_weights(resumed, full)


# ------------------------------------------------------------------------------------------------ failures
def test_a_kill_during_an_upload_then_a_bitwise_resume(server, bucket, tmp_path):
    full = _trainer(tmp_path / "local", None)
    full.train()
    url, staging = f"s3://{bucket}/run", tmp_path / "stage"
    staging.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), url, str(staging), str(tmp_path / "result.pt"),
                             "--stall-upload", "checkpoint-4"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        while not (staging / "stalled").exists():  # waits on progress: the run reached the upload
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    held = _checkpoints(server, bucket)
    assert MANIFEST not in held["checkpoint-4"] and len(held["checkpoint-4"]) == 6  # every file up but the manifest
    s3server.forget_clients()
    resumed = _trainer(url, staging)  # the same machine: its staged checkpoint-4 is complete, but not in the store
    resumed.train(resume_from_checkpoint=True)
    assert resumed.checkpointer.resume.path == str(staging / "checkpoint-2")
    assert _same_weights(resumed, full)
    assert {s: v for s, v in _losses(resumed).items() if s > 2} == {s: v for s, v in _losses(full).items() if s > 2}
    assert MANIFEST in _checkpoints(server, bucket)["checkpoint-4"]


@pytest.mark.parametrize("save_async", [False, True])
def test_the_network_gone_mid_upload_keeps_the_staged_copy_and_the_store(server, bucket, tmp_path, monkeypatch,
                                                                         save_async):
    proxy = s3server.CuttableProxy(server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    s3server.forget_clients()
    original = store.FsspecStore.upload

    def upload(self, folder, name):
        if name == "checkpoint-4":
            put = self.fs.put

            def cut_then_put(lpaths, rpaths, **kw):
                put(lpaths[:2], rpaths[:2], **kw)
                proxy.cut()  # the network goes after two files
                return put(lpaths[2:], rpaths[2:], **kw)

            self.fs.put = cut_then_put
        return original(self, folder, name)

    monkeypatch.setattr(store.FsspecStore, "upload", upload)
    staging = tmp_path / "stage"
    trainer = _trainer(f"s3://{bucket}/run", staging, save_async=save_async)
    with pytest.raises(StoreError if not save_async else RuntimeError) as caught:  # async: from the next save
        trainer.train()
    message = str(caught.value)
    assert f"s3://{bucket}/run/checkpoint-4" in message and "could not be reached" in message
    assert f"kept locally at {staging / 'checkpoint-4'}" in message
    assert (staging / "checkpoint-4" / MANIFEST).is_file()  # the staged copy is complete and kept
    held = _checkpoints(server, bucket)
    assert MANIFEST in held["checkpoint-2"] and MANIFEST not in held.get("checkpoint-4", [])
    assert trainer.state.global_step == (6 if save_async else 4)


def test_a_missing_bucket_or_credentials_are_said_before_any_step(server, bucket, tmp_path):
    s3server.forget_clients()
    steps = []

    class Count(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(state.global_step)

    options = {"key": "testing-key-id", "secret": "SHHH-42"}  # explicit credentials: never printed
    trainer = _trainer("s3://no-such-bucket/run", tmp_path / "stage", storage_options=options)
    trainer.add_callback(Count())
    with pytest.raises(StoreError, match=r"s3://no-such-bucket/run.*does not exist.*create the bucket") as caught:
        trainer.train()
    assert steps == [] and "SHHH-42" not in str(caught.value)
    assert "SHHH-42" not in str(trainer.args) and "SHHH-42" not in trainer.args.to_json_string()
    assert TrainingArguments.from_dict(trainer.args.to_dict()).storage_options is None  # "<HIDDEN>" is no secret
    s3server.forget_clients()
    half = _trainer(f"s3://{bucket}/run", tmp_path / "stage-b", storage_options={"secret": "SHHH-42"})
    with pytest.raises(StoreError, match=r"credentials were refused or missing.*storage_options") as caught:
        half.train()
    assert "SHHH-42" not in str(caught.value)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"output_dir": "hdfs://cluster/run"}, ValueError, r"hdfs://.*s3://, gs://, az://"),
    ({"output_dir": "gs://bucket/run"}, ImportError, r"'gcsfs'.*pip install 'trainwell\[gcs\]'"),
    ({"output_dir": "s3://"}, ValueError, "names no bucket"),
    ({"output_dir": "s3://bucket/run", "save_on_each_node": True}, ValueError, "save_on_each_node=True with"),
    ({"output_dir": "run", "output_staging_dir": "stage"}, ValueError, "output_staging_dir='stage' is for a run"),
    ({"output_dir": "run", "storage_options": {"key": "SECRET"}}, ValueError, r"storage_options \(keys \['key'\]\)"),
    ({"output_dir": "s3://bucket/run", "storage_options": "{not json"}, ValueError, "storage_options: pass a dict"),
])
def test_bad_inputs_are_refused_at_construction(kwargs, error, match, monkeypatch):
    real = __import__("importlib").util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "gcsfs" else real(name, *a))
    with pytest.raises(error, match=match):
        TrainingArguments(report_to="none", **kwargs)


def test_the_logs_stay_in_the_staging_folder_and_report_follows_the_url(server, bucket, tmp_path, monkeypatch,
                                                                        capsys):
    from tests.common.cli import run_cli

    monkeypatch.chdir(tmp_path)
    url = f"s3://{bucket}/run"
    code, _, err = run_cli(capsys, "report", url)
    assert code != 0 and "staging folder" in err and f"trainwell_staging/s3/{bucket}/run" in err
    trainer = _trainer(url, None, max_steps=2, report_to="tensorboard")
    trainer.train()
    trainer.save_state()
    trainer.save_model(url)  # the script's usual save_model(args.output_dir): staged, then uploaded
    assert not os.path.exists(tmp_path / "s3:")
    assert {"run/model.safetensors", "run/training_args.json", "run/trainer_state.json"} <= set(
        server.keys(bucket, "run/"))
    staging = tmp_path / "trainwell_staging" / "s3" / bucket / "run"
    assert (staging / "trainer_state.json").is_file() and list((staging / "runs").glob("*/events.out.*"))
    code, out, _ = run_cli(capsys, "report", url)
    assert code == 0 and f"trainwell_staging/s3/{bucket}/run/report" in out


def _torchrun(*argv: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(s3server.free_port()), str(SCRIPT), *argv],
                          env=env, capture_output=True, text=True, timeout=hang_timeout(600))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


def test_two_nodes_without_a_shared_disk_resume_from_the_store(server, bucket, tmp_path):
    """Two processes, each staging on its own disk (a node each): process 0 uploads; after a restart on fresh disks
    every process downloads what it reads of the newest complete checkpoint, and the run ends bit for bit as the
    uninterrupted one."""
    url = f"s3://{bucket}/run"
    _torchrun(url, str(tmp_path / "disks-a"), str(tmp_path / "full.pt"), "--per-rank-staging")  # uninterrupted
    assert not (tmp_path / "disks-a" / "rank1" / "checkpoint-2").exists()  # only process 0 writes and uploads
    server.client().delete_object(Bucket=bucket, Key=f"run/checkpoint-6/{MANIFEST}")
    _torchrun(url, str(tmp_path / "disks-b"), str(tmp_path / "resumed.pt"), "--per-rank-staging", "--resume")
    full, resumed = torch.load(tmp_path / "full.pt"), torch.load(tmp_path / "resumed.pt")
    assert resumed["resumed"] == str(tmp_path / "disks-b" / "rank0" / "checkpoint-4")
    assert torch.equal(full["a"], resumed["a"]) and torch.equal(full["b"], resumed["b"])
    assert {s: v for s, v in resumed["losses"].items() if s > 4} == {s: v for s, v in full["losses"].items() if s > 4}
    rank1 = tmp_path / "disks-b" / "rank1" / "checkpoint-4"
    assert (rank1 / "rng_state_1.pth").is_file() and not (rank1 / "rng_state_0.pth").exists()  # what it reads
