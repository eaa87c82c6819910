"""Ray Train as the cluster engine: a local Ray cluster, ``ray.train.torch.TorchTrainer`` over 2 CPU workers.

The run of tests/distributed/ray_script.py trains under Ray exactly as under torchrun; with trainwell's
``RayTrainReportCallback`` every checkpoint reaches Ray complete and from one process; a worker killed mid-run
is restarted by Ray (``FailureConfig(max_failures=1)``), resumes Ray's last checkpoint and ends bit-equal to the
uninterrupted run, with trainwell's callback and with what the reference's users write (Ray's own
``RayTrainReportCallback`` and ``prepare_trainer``). Three Ray runs and one torchrun run in all, on one Ray
instance for the module; the errors (outside a Ray worker, without Ray) and ``latest_checkpoint``'s reading of
either callback's layout need no cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.launch import ScriptRuns
from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from tests.conftest import make_args

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).resolve().parent / "distributed" / "ray_script.py"
CHECKPOINT_FILES = ["checkpoint_manifest.json", "model.safetensors", "optimizer.pt", "rng_state_0.pth",
                    "rng_state_1.pth", "scheduler.pt", "trainer_state.json", "training_args.json"]


# ------------------------------------------------------------------------------------ without a Ray cluster
@pytest.fixture
def ray_train():
    return pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install 'ray[train]')")


def _trainer(out_dir, **kwargs):
    from trainwell import Trainer
    from trainwell.integrations.ray import RayTrainReportCallback

    args = make_args(out_dir, max_steps=2, save_strategy="steps", save_steps=1, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=8),
                   callbacks=[RayTrainReportCallback()])


def test_outside_a_ray_train_worker_the_callback_and_the_resume_name_the_fix(ray_train, out_dir):
    from trainwell.integrations.ray import latest_checkpoint

    with pytest.raises(RuntimeError, match=r"runs inside a Ray Train worker.*TorchTrainer\(train_func"):
        _trainer(out_dir).train()
    with pytest.raises(RuntimeError, match=r"latest_checkpoint\(\) runs inside a Ray Train worker"):
        latest_checkpoint()
    with pytest.raises(RuntimeError, match="set save_async=False when training on Ray Train"):
        _trainer(out_dir, save_async=True).train()


def test_without_ray_the_callback_says_what_to_install(monkeypatch):
    from trainwell.integrations.ray import RayTrainReportCallback, latest_checkpoint

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as when it is not installed
    with pytest.raises(ImportError, match=r"pip install 'ray\[train\]'"):
        RayTrainReportCallback()
    with pytest.raises(ImportError, match=r"pip install 'ray\[train\]'"):
        latest_checkpoint()


def test_latest_checkpoint_reads_either_callbacks_layout(ray_train, monkeypatch, tmp_path):
    """Ray's latest checkpoint, as a worker sees it: None, the callbacks' ``checkpoint/`` inside, a trainwell
    checkpoint itself, or something else (an error naming the fix)."""
    from trainwell.integrations.ray import latest_checkpoint

    held = []
    monkeypatch.setattr(ray_train, "get_context", lambda: object())  # as in a worker
    monkeypatch.setattr(ray_train, "get_checkpoint", lambda: held[-1] if held else None)
    assert latest_checkpoint() is None
    for folder, expected in (("nested", "nested/checkpoint"), ("flat", "flat")):
        (tmp_path / expected).mkdir(parents=True)
        (tmp_path / expected / "trainer_state.json").write_text("{}")
        held.append(ray_train.Checkpoint.from_directory(str(tmp_path / folder)))
        assert latest_checkpoint() == str(tmp_path / expected)
    (tmp_path / "other").mkdir()
    held.append(ray_train.Checkpoint.from_directory(str(tmp_path / "other")))
    with pytest.raises(ValueError, match=r"holds no trainwell checkpoint.*RayTrainReportCallback"):
        latest_checkpoint()


# ------------------------------------------------------------------------------------ the example
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ray_train.py"


def test_docs_scaling_shows_the_ray_example_file():
    blocks = re.findall(r"^```python\n(.*?)^```$", (ROOT / "docs" / "scaling.md").read_text("utf-8"), re.S | re.M)
    assert EXAMPLE.read_text("utf-8") in blocks, (
        "docs/scaling.md's Ray Train example differs from examples/ray_train.py: paste the file into it unchanged")


def test_the_ray_example_trains_on_its_own_local_ray_and_prints_each_line_once(tmp_path):
    """What a newcomer runs: the example starts its own Ray (no dashboard), trains 2 workers, Ray keeps the
    checkpoints; the driver shows each of rank 0's progress lines once (Ray Train's print made them twice).
    Runs before this module's Ray instance is started (pytest keeps the file's order), so one Ray runs at a time."""
    pytest.importorskip("ray.train.torch", reason="Ray Train is not installed (pip install 'ray[train]')")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}  # see ray_cluster below
    run = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "40"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=hang_timeout(600))  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert re.search(r"^step 40 loss \d", run.stdout, re.M), run.stdout[-2000:]
    (checkpoint,) = re.findall(r"^checkpoint: (.+)$", run.stdout, re.M)
    assert Path(checkpoint).parent.parent == tmp_path / "ray-results" / "ray-train-example"
    assert json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"] == 40
    progress = re.findall(r"\[(\d+)/40 \d+% \| eta [^]]*\] \{'loss'", out)
    assert progress == ["10", "20", "30", "40"], out[-6000:]  # rank 0 logs every 10 steps: each line once


# ------------------------------------------------------------------------------------ on a local Ray cluster
@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance with room for the 2 workers, nothing reaching out (no dashboard, no usage stats)."""
    pytest.importorskip("ray.train.torch", reason="Ray Train is not installed (pip install 'ray[train]')")
    import ray

    # Ray's controller polls the workers for their reports every 2 s by default: each report of a run waits for the
    # poll of the one before, and the run's end for one more poll. 0.2 s saves about 7 s per run here.
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _fit(root: Path, engine: str, output_dir: str, **kill: int):
    """One ``TorchTrainer.fit()``; returns Ray's result and each process's report (its last attempt's)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from tests.distributed.ray_script import train_func

    report_dir = root / "report"
    report_dir.mkdir(parents=True)
    datasets = {"train": _ray_dataset()} if engine == "reference" else None
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"engine": engine, "report_dir": str(report_dir), "output_dir": output_dir, **kill},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False), datasets=datasets,
        run_config=RunConfig(name=engine, storage_path=str(root / "storage"),
                             failure_config=FailureConfig(max_failures=1 if kill else 0)),
    )
    result = trainer.fit()
    reports = {rank: json.loads((report_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    return result, reports


def _ray_dataset():
    """The training samples as a Ray Dataset (each worker gets a shard, as prepare_trainer's users have it)."""
    import ray.data

    from tests.common.models import ClassificationDataset

    samples = ClassificationDataset(n=32)
    return ray.data.from_items([{k: v.numpy() for k, v in samples[i].items()} for i in range(len(samples))])


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory):
    """The run under torchrun, without Ray: what every Ray run must end equal to."""
    runs = ScriptRuns(str(SCRIPT), tmp_path_factory.mktemp("torchrun"))
    return runs("torchrun", 2)


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    return root, *_fit(root, "trainwell", str(root / "out"))


def _assert_equal_to(reports: dict, expected: dict) -> None:
    for rank, report in reports.items():
        assert report["step"] == 6, rank
        assert report["params"] == expected["params"], f"process {rank}: the weights differ"
        assert report["losses"] == expected["losses"], f"process {rank}: the logged losses differ"


def test_training_on_ray_equals_the_same_run_under_torchrun(uninterrupted, torchrun):
    root, result, reports = uninterrupted
    assert all(r["trainwell"] == torchrun["trainwell"] for r in reports.values())  # this checkout on the workers
    assert all(r["attempt"] == 1 and r["resumed"] is None for r in reports.values())
    _assert_equal_to(reports, torchrun)


def test_each_checkpoint_reaches_ray_complete_from_process_zero_only(uninterrupted):
    root, result, reports = uninterrupted
    # every process reports at every save (Ray's barrier); only process 0 hands over files, so none is uploaded twice
    assert [c["step"] for c in reports[0]["reports"]] == [c["step"] for c in reports[1]["reports"]] == [2, 4, 6]
    assert all(c["files"] is None for c in reports[1]["reports"])
    assert [c["files"] for c in reports[0]["reports"]] == [[f"checkpoint/{f}" for f in CHECKPOINT_FILES]] * 3
    # Ray's result: the last checkpoint, with the metrics logged by then
    assert result.error is None
    assert sorted(os.listdir(Path(result.checkpoint.path) / "checkpoint")) == CHECKPOINT_FILES
    assert result.metrics["step"] == 6 and result.metrics["epoch"] == 0.75
    assert result.metrics["loss"] == reports[0]["losses"][-1]
    assert len(result.best_checkpoints) == 3
    # the staging folders are gone; output_dir keeps the Trainer's own checkpoints (and process 0's live log)
    assert sorted(os.listdir(root / "out")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_a_killed_worker_is_restarted_by_ray_and_resumes_exactly(ray_cluster, uninterrupted, tmp_path):
    """Process 1 dies at step 5; Ray restarts both from checkpoint-4 of its storage. Each process has a disk of its
    own (``output_dir`` differs), so the restarted processes find the checkpoint in Ray's storage only."""
    result, reports = _fit(tmp_path, "trainwell", str(tmp_path / "disk{rank}" / "out"), kill_rank=1, kill_step=5)
    assert result.error is None
    for report in reports.values():
        assert report["attempt"] == 2
        assert Path(report["resumed"]).parent.parent == Path(result.path)
        assert json.loads((Path(report["resumed"]) / "trainer_state.json").read_text())["global_step"] == 4
    _assert_equal_to(reports, uninterrupted[2][0])
    assert result.metrics["step"] == 6


def test_the_reference_users_ray_code_trains_trainwell_and_resumes_exactly(ray_cluster, uninterrupted, tmp_path):
    """Ray's ``RayTrainReportCallback`` and ``prepare_trainer`` (written for the reference's Trainer) with
    trainwell's, and Ray's documented resume; a worker killed at step 5 again."""
    result, reports = _fit(tmp_path, "reference", str(tmp_path / "out"), kill_rank=1, kill_step=5)
    assert result.error is None
    for report in reports.values():
        assert report["attempt"] == 2 and report["prepared_class"] == "RayTransformersTrainer"
        assert json.loads((Path(report["resumed"]) / "trainer_state.json").read_text())["global_step"] == 4
    _assert_equal_to(reports, uninterrupted[2][0])
    assert sorted(os.listdir(Path(result.checkpoint.path) / "checkpoint")) == CHECKPOINT_FILES
    # Ray's callback has every process upload a copy of the checkpoint (trainwell's has process 0 alone)
    assert all(report["reports"][-1]["files"] is not None for report in reports.values())
    # prepare_trainer's Ray Data loader: each worker trains on its shard of the run's dataset, as one DDP job
    shards = [report["ray_data"] for report in reports.values()]
    assert all(s["dataset"] == "RayTorchIterableDataset" and s["step"] == 2 and len(s["losses"]) == 2 for s in shards)
    assert shards[0]["params"] == shards[1]["params"]
