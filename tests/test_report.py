"""Run reports: from a trainwell run and from a reference-written trainer_state.json, plots, page, comparison."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.report import load_run, summary, write_comparison, write_report
from trainwell.report.history import find_state_file, series_from_log_history
from trainwell.report.plots import plot_groups

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "reference_trainer_state.json")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def trainwell_run(tmp_path_factory):
    """A finished trainwell run with evaluations, checkpoints and a saved state."""
    out = str(tmp_path_factory.mktemp("run") / "out")
    args = make_args(out, max_steps=12, logging_steps=2, eval_strategy="steps", eval_steps=4, save_strategy="steps",
                     save_steps=4, load_best_model_at_end=True, metric_for_best_model="loss",
                     per_device_train_batch_size=8, learning_rate=0.1, include_num_input_tokens_seen="all")
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64),
                      eval_dataset=RegressionDataset(length=16, seed=1))
    trainer.train()
    trainer.save_state()
    return out


def test_series_split_curves_from_end_of_training_values():
    series, final = series_from_log_history([
        {"loss": 2.0, "learning_rate": 0.1, "epoch": 0.5, "step": 2},
        {"eval_loss": 1.5, "eval_runtime": 0.1, "epoch": 0.5, "step": 2},
        {"train_runtime": 3.0, "train_loss": 1.8, "total_flos": 0.0, "step": 4, "note": "text", "flag": True},
    ])
    assert series == {"loss": [(2, 2.0)], "learning_rate": [(2, 0.1)], "eval_loss": [(2, 1.5)],
                      "eval_runtime": [(2, 0.1)]}
    assert final == {"train_runtime": 3.0, "train_loss": 1.8, "total_flos": 0.0}
    assert list(plot_groups(series)) == ["loss", "learning_rate"]


def test_report_of_a_trainwell_run(trainwell_run):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    report = write_report(trainwell_run)
    assert str(report.out_dir) == os.path.join(trainwell_run, "report")
    names = sorted(p.name for p in report.images)
    assert names == ["grad_norm.png", "learning_rate.png", "loss.png", "throughput.png"]
    for image in report.images:
        assert image.read_bytes()[:8] == PNG_MAGIC and image.stat().st_size > 5000
    page = report.html.read_text()
    assert page.count("data:image/png;base64,") == 4 and "src=\"http" not in page and "<script" not in page
    assert "validation loss" in report.text and "best checkpoint" in report.text and "runtime" in report.text
    assert "perplexity" not in report.text  # a regression loss: no perplexity invented for it
    assert (report.out_dir / "summary.txt").read_text().strip() == report.text


def test_perplexity_is_shown_only_when_the_run_logged_it(tmp_path):
    from trainwell.report.history import RunHistory

    series, _ = series_from_log_history([
        {"eval_loss": 2.0, "eval_perplexity": 7.389, "step": 4},
        {"eval_loss": 1.0, "eval_perplexity": 2.718, "step": 8},
    ])
    assert summary(RunHistory("lm", "x", {}, series, {}))["lowest validation loss"] == "1 at step 8 (perplexity 2.718)"
    del series["eval_perplexity"]
    assert summary(RunHistory("reg", "x", {}, series, {}))["lowest validation loss"] == "1 at step 8"


def test_report_of_a_reference_trainer_state(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    run_dir = tmp_path / "reference-run"
    run_dir.mkdir()
    shutil.copy(FIXTURE, run_dir / "trainer_state.json")
    report = write_report(run_dir)
    assert sorted(p.name for p in report.images) == ["grad_norm.png", "learning_rate.png", "loss.png",
                                                    "throughput.png"]
    rows = summary(load_run(run_dir))
    state = json.loads(open(FIXTURE).read())
    assert rows["steps"] == f"{state['global_step']} / {state['max_steps']}"
    assert rows["best checkpoint"] == state["best_model_checkpoint"]
    assert rows["validation loss"].startswith(f"{state['log_history'][2]['eval_loss']:.4g}")


def test_a_running_run_is_read_from_its_newest_checkpoint(trainwell_run, tmp_path):
    running = tmp_path / "running"
    for name in ("checkpoint-4", "checkpoint-8"):
        shutil.copytree(os.path.join(trainwell_run, name), running / name)
    assert find_state_file(running) == running / "checkpoint-8" / "trainer_state.json"
    run = load_run(running)
    assert run.name == "running" and run.run_dir == str(running) and run.state["global_step"] == 8
    with pytest.raises(FileNotFoundError, match="no trainer_state.json"):
        find_state_file(tmp_path / "empty")


def test_a_newer_checkpoint_wins_over_an_older_saved_state(trainwell_run, tmp_path):
    # save_state() wrote the output folder's file at step 4; the run was resumed and is now at checkpoint-8
    run = tmp_path / "resumed"
    for name in ("checkpoint-4", "checkpoint-8"):
        shutil.copytree(os.path.join(trainwell_run, name), run / name)
    shutil.copy(run / "checkpoint-4" / "trainer_state.json", run / "trainer_state.json")
    assert find_state_file(run) == run / "checkpoint-8" / "trainer_state.json"
    shutil.copy(run / "checkpoint-8" / "trainer_state.json", run / "trainer_state.json")  # a tie: the run's own
    assert find_state_file(run) == run / "trainer_state.json"


def test_comparison_of_several_runs(trainwell_run, tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copy(FIXTURE, reference / "trainer_state.json")
    report = write_comparison([trainwell_run, reference], tmp_path / "cmp")
    assert [p.name for p in report.images] == ["comparison.png"]
    assert report.images[0].read_bytes()[:8] == PNG_MAGIC
    assert "out" in report.text and "reference" in report.text


def test_without_matplotlib_the_page_and_summary_are_still_written(trainwell_run, tmp_path, monkeypatch):
    monkeypatch.setattr("trainwell.report.matplotlib_available", lambda: False)
    report = write_report(trainwell_run, out_dir=tmp_path / "plain")
    assert report.images == [] and "pip install 'trainwell[report]'" in report.note
    assert "pip install" in report.html.read_text() and (tmp_path / "plain" / "summary.txt").exists()


def test_not_a_trainer_state_is_a_clear_error(tmp_path):
    bad = tmp_path / "trainer_state.json"
    bad.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="no log_history"):
        load_run(tmp_path)
    bad.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_run(bad)


def test_a_search_folder_compares_its_trials(tmp_path, capsys):
    from trainwell.cli import main

    for trial, lr, losses in (("run-0", 0.1, [3.0, 1.0]), ("run-1", 1e-5, [3.0, 2.9])):
        checkpoint = tmp_path / trial / "checkpoint-2"
        checkpoint.mkdir(parents=True)
        history = [{"step": i + 1, "epoch": 0.5 * (i + 1), "eval_loss": v} for i, v in enumerate(losses)]
        state = {"global_step": 2, "max_steps": 2, "log_history": history, "trial_params": {"learning_rate": lr},
                 "is_hyper_param_search": True}
        (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "trial                   learning_rate=0.1" in out and "learning_rate=1e-05" in out
    assert (tmp_path / "report" / "index.html").is_file()  # the comparison is written inside the search folder
    assert main(["report", str(tmp_path)]) == 0  # its own report folder is not taken for a trial
    with pytest.raises(FileNotFoundError):
        from trainwell.report.history import expand_search_folders

        expand_search_folders([str(tmp_path / "run-0" / "checkpoint-2" / "nothing")])


def test_log_throughput_gets_a_throughput_and_an_mfu_plot():
    series = {"loss": [(2, 2.0)], "tokens_per_second": [(2, 900.0)], "mfu": [(2, 0.41)],
              "eval_samples_per_second": [(2, 50.0)]}
    groups = plot_groups(series)
    assert groups["throughput"] == ["tokens_per_second"]  # the evaluation speed is on another scale
    assert groups["mfu"] == ["mfu"]
