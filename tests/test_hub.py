"""push_to_hub and hub_strategy through the real huggingface_hub client, against a Hub the test starts locally.

No test reaches a network: ``huggingface_hub``'s endpoint is pointed at :class:`FakeHub`, which records every
commit, so the assertions are on what was actually uploaded.
"""

from __future__ import annotations

import logging
import sys
import time
import types
from concurrent.futures import Future

import pytest

from tests.common.fake_hub import FakeHub
from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from tests.conftest import make_args
from trainwell import Trainer, TrainerCallback

hub_constants = pytest.importorskip("huggingface_hub.constants")


@pytest.fixture
def fake_hub(monkeypatch):
    with FakeHub() as hub:
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        yield hub


class StepTimes(TrainerCallback):
    def __init__(self):
        self.pushes, self.step_ends = 0, []

    def on_push_begin(self, args, state, control, **kwargs):
        self.pushes += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())


def _trainer(out_dir, callbacks=(), **kwargs):
    settings = dict(push_to_hub=True, max_steps=6, save_strategy="steps", save_steps=2, per_device_train_batch_size=4)
    args = make_args(str(out_dir), **{**settings, **kwargs})
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32),
                   callbacks=list(callbacks))


def _paths(commit):
    return sorted(commit.files)


def test_every_save_uploads_the_model_after_each_checkpoint(fake_hub, tmp_path):
    times = StepTimes()
    trainer = _trainer(tmp_path / "my-run", callbacks=[times], hub_always_push=True)  # none skipped while busy
    assert trainer.hub_model_id == "tester/my-run"  # the repository is created at construction
    assert fake_hub.repos["tester/my-run"]["name"] == "my-run"
    trainer.train()
    assert [c.message for c in fake_hub.commits] == [f"Training in progress, step {s}" for s in (2, 4, 6)]
    for commit in fake_hub.commits:
        assert _paths(commit) == ["model.safetensors", "training_args.json"]  # no checkpoint-*, no _*
    weights = (tmp_path / "my-run" / "checkpoint-6" / "model.safetensors").read_bytes()
    assert fake_hub.files("tester/my-run")["model.safetensors"] == weights
    assert (tmp_path / "my-run" / "model.safetensors").read_bytes() == weights  # copied to output_dir, as the reference
    assert times.pushes == 3
    assert not (tmp_path / "my-run" / "_hub_staging").exists()


@pytest.mark.parametrize(("strategy", "folders"), [
    ("checkpoint", {"last-checkpoint"}),
    ("all_checkpoints", {"checkpoint-2", "checkpoint-4", "checkpoint-6"}),
])
def test_checkpoint_strategies_upload_the_checkpoint_folder(fake_hub, tmp_path, strategy, folders):
    trainer = _trainer(tmp_path / "run", hub_strategy=strategy, hub_model_id="org/named", hub_always_push=True)
    trainer.train()
    assert trainer.hub_model_id == "org/named"
    uploaded = fake_hub.files("org/named")
    assert {path.split("/")[0] for path in uploaded if "/" in path} == folders
    checkpoint = tmp_path / "run" / "checkpoint-6"
    prefix = "last-checkpoint" if strategy == "checkpoint" else "checkpoint-6"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth"):
        assert uploaded[f"{prefix}/{name}"] == (checkpoint / name).read_bytes()
    assert any(c.message == "Training in progress, step 6, checkpoint" for c in fake_hub.commits)


def test_end_strategy_pushes_only_when_asked(fake_hub, tmp_path):
    trainer = _trainer(tmp_path / "run", hub_strategy="end", hub_revision="dev")
    trainer.train()
    assert fake_hub.commits == []
    info = trainer.push_to_hub(dataset="toy")
    assert info.commit_url.startswith(fake_hub.url)
    (commit,) = fake_hub.commits
    assert commit.message == "End of training" and commit.revision == "dev"
    assert {"README.md", "model.safetensors", "training_args.json"} <= set(commit.files)
    assert not any(path.startswith("checkpoint-") for path in commit.files)
    assert b"toy" in commit.files["README.md"]


def test_save_model_pushes_and_non_blocking_push_returns_a_future(fake_hub, tmp_path):
    trainer = _trainer(tmp_path / "run", hub_strategy="end")
    trainer.train()
    trainer.save_model()
    assert [c.message for c in fake_hub.commits] == ["Model save"]
    future = trainer.push_to_hub("later", blocking=False)
    assert isinstance(future, Future)
    assert future.result(timeout=hang_timeout(30)).commit_url.startswith(fake_hub.url)
    assert fake_hub.commits[-1].message == "later"


def test_trainwells_own_files_are_never_pushed(fake_hub, tmp_path):
    """The live log and a step_timeout record are trainwell's bookkeeping (the reference writes neither): the
    model repository gets what the reference's would."""
    trainer = _trainer(tmp_path / "run", hub_strategy="end", report_to="live")
    trainer.train()
    (tmp_path / "run" / "step_timeout.jsonl").write_text("{}\n")
    assert (tmp_path / "run" / "live_log.jsonl").is_file()
    trainer.push_to_hub()
    uploaded = fake_hub.files("tester/run")
    assert "model.safetensors" in uploaded
    assert not {"live_log.jsonl", "step_timeout.jsonl", ".trainwell.lock"} & set(uploaded)


def test_push_to_hub_without_push_to_hub_argument_creates_the_repo(fake_hub, tmp_path):
    args = make_args(str(tmp_path / "plain"), max_steps=2)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    trainer.train()
    assert fake_hub.commits == [] and trainer.hub_model_id is None
    trainer.push_to_hub()
    assert trainer.hub_model_id == "tester/plain" and fake_hub.commits[0].message == "End of training"


def test_a_failed_push_logs_and_training_goes_on(monkeypatch, tmp_path, caplog):
    # huggingface_hub retries an HTTP 500 five times, sleeping 1+2+4+8+8 s between tries: the retries stay, the
    # waits go (a namespace for its module's `time`, so no one else's sleep changes)
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    with FakeHub(fail_commits=True) as hub:
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        trainer = _trainer(tmp_path / "run")
        with caplog.at_level(logging.WARNING, logger="trainwell"):
            out = trainer.train()
    assert out.global_step == 6 and hub.commits == []
    assert "push of" in caplog.text and "training goes on" in caplog.text
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_pushes_never_block_a_step_and_skip_while_busy(monkeypatch, tmp_path):
    with FakeHub(commit_delay=1.5) as hub:
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        times = StepTimes()
        trainer = _trainer(tmp_path / "run", callbacks=[times], max_steps=8)
        trainer.train()  # returns after the last push lands
        gaps = [b - a for a, b in zip(times.step_ends, times.step_ends[1:])]
        assert max(gaps) < 1.0, gaps  # an upload takes 1.5 s: no step waited for one
        # the first push is still running at steps 4, 6 and 8: those are skipped (hub_always_push is False)
        assert len(hub.commits) < 4 and times.pushes == len(hub.commits)


def test_hub_always_push_uploads_every_checkpoint_even_when_rotated(monkeypatch, tmp_path):
    with FakeHub(commit_delay=0.5) as hub:
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        trainer = _trainer(tmp_path / "run", hub_always_push=True, hub_strategy="all_checkpoints",
                           save_total_limit=1)
        trainer.train()
        uploaded = hub.files("tester/run")
    # checkpoint-2 and -4 were deleted by save_total_limit while their uploads waited: the snapshots kept them
    for step in (2, 4, 6):
        assert f"checkpoint-{step}/model.safetensors" in uploaded and f"checkpoint-{step}/optimizer.pt" in uploaded
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-6"]


def test_async_saves_are_pushed_once_published(fake_hub, tmp_path):
    trainer = _trainer(tmp_path / "run", save_async=True, hub_strategy="checkpoint", hub_always_push=True)
    trainer.train()
    uploaded = fake_hub.files("tester/run")
    assert uploaded["last-checkpoint/model.safetensors"] == (
        tmp_path / "run" / "checkpoint-6" / "model.safetensors").read_bytes()


def test_missing_huggingface_hub_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match="pip install huggingface_hub"):
        _trainer(tmp_path / "run")


def test_the_token_never_lands_in_the_uploaded_arguments(fake_hub, tmp_path):
    trainer = _trainer(tmp_path / "run", hub_token="hf_secret_value", max_steps=2)
    trainer.train()
    assert b"hf_secret_value" not in fake_hub.files("tester/run")["training_args.json"]


def test_the_same_commits_as_the_reference(fake_hub, tmp_path):
    transformers = pytest.importorskip("transformers")
    import trainwell

    def pushed(lib):
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), push_to_hub=True, hub_strategy="checkpoint",
                                     hub_always_push=True, max_steps=4, save_strategy="steps", save_steps=2,
                                     report_to="none", use_cpu=True, per_device_train_batch_size=4, disable_tqdm=True)
        lib.Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32)).train()
        # training_args.bin (a pickle) is training_args.json in trainwell, and trainwell's checkpoints carry their
        # manifest: the deliberate differences
        return [(c.message, [p.replace("training_args.bin", "training_args.json") for p in _paths(c)
                             if not p.endswith("checkpoint_manifest.json")])
                for c in fake_hub.commits if c.repo_id == f"tester/{lib.__name__}"]

    assert pushed(trainwell) == pushed(transformers)
