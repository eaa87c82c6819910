"""Sessions of a resumed run in the report: how a resume is found in log_history, overlaps, totals, throughput."""

from __future__ import annotations

import json

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.report import load_run, summary
from trainwell.report.history import sessions_summary, summary_text
from trainwell.report.sessions import merged_entries, split_sessions
from trainwell.report.tables import session_rows


def _write(tmp_path, history, **state):
    tmp_path.mkdir(parents=True, exist_ok=True)
    body = {"global_step": max((e.get("step", 0) for e in history), default=0), "max_steps": 0,
            "log_history": history, **state}
    (tmp_path / "trainer_state.json").write_text(json.dumps(body))
    return load_run(tmp_path)


def _losses(steps, start=10.0, runtime=None):
    """Training logs at ``steps`` (loss falling), with a per-log clock when ``runtime`` gives seconds per step."""
    entries = []
    for i, step in enumerate(steps):
        entry = {"loss": start - i, "learning_rate": 0.1, "epoch": step / 10, "step": step}
        if runtime is not None:
            entry["train_runtime"] = runtime * (i + 1)
        entries.append(entry)
    return entries


def _summary(step, runtime, steps, samples_per_step=8, loss=5.0):
    return {"train_runtime": runtime, "train_samples_per_second": steps * samples_per_step / runtime,
            "train_steps_per_second": steps / runtime, "train_loss": loss, "total_flos": 0.0, "step": step}


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """A real trainwell run in three train() calls: 8 steps; resumed to 12 from the last checkpoint; then
    resumed to 16 from checkpoint-4, an earlier checkpoint than the last logged step. No token counting, so the
    log entries carry no clock: the resume must be found from the summary."""
    out = str(tmp_path_factory.mktemp("resumed") / "out")

    def train(max_steps, resume=None):
        args = make_args(out, max_steps=max_steps, logging_steps=2, eval_strategy="steps", eval_steps=4,
                         save_strategy="steps", save_steps=4, per_device_train_batch_size=8, learning_rate=0.1)
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64),
                          eval_dataset=RegressionDataset(length=16, seed=1))
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_state()

    train(8)
    train(12, resume=True)
    train(16, resume=f"{out}/checkpoint-4")
    return out


def test_a_real_resumed_run_shows_its_resume_point(resumed_run):
    run = load_run(resumed_run)
    # The checkpoint's history replaced what the earlier calls logged after step 4, their summaries included:
    # the last summary covering 12 steps of a 16-step history is what shows the resume.
    assert [(s.start_step, s.end_step, s.summary is not None) for s in run.sessions] == [(0, 4, False),
                                                                                         (4, 16, True)]
    rows = summary(run)
    assert rows["sessions"] == "2 (resumed at step 4)"
    assert rows["runtime"].startswith("at least ") and rows["runtime not logged"] == "session 1 (steps 0-4)"
    # throughput over the session whose time is known, and said so
    assert rows["train steps per second"].endswith("(session 2 only)")
    assert [p[0] for p in run.series["loss"]] == [2, 4, 6, 8, 10, 12, 14, 16]
    table = session_rows(run)
    assert [r["steps"] for r in table] == ["0-4", "4-16"] and table[1]["ended"] == "train() returned"
    assert "sessions:" in summary_text(run)


def test_a_summary_followed_by_more_training_is_a_new_session_and_evaluate_stays(tmp_path):
    history = [*_losses([2, 4]), _summary(4, 2.0, 4), {"eval_loss": 3.0, "step": 4},  # trainer.evaluate()
               *_losses([6, 8], start=4.0), _summary(8, 6.0, 4)]
    sessions = split_sessions(history)
    assert [(s.start_step, s.end_step, len(s.entries)) for s in sessions] == [(0, 4, 3), (4, 8, 2)]
    run = _write(tmp_path, history)
    totals = sessions_summary(run)
    assert totals["runtime"] == "0:00:08 (8.0 s) over 2 sessions"  # summed, not the last call's 6 s
    assert totals["train steps per second"] == "1"  # 8 steps in 8 s; the last summary alone says 0.667


def test_throughput_is_work_over_time_not_an_average_or_the_last_rate(tmp_path):
    # 10 steps in 10 s, then 20 steps in 5 s: 30 / 15 = 2 steps/s (mean of rates 2.5, last rate 4)
    history = [*_losses([5, 10]), _summary(10, 10.0, 10, samples_per_step=8),
               *_losses([20, 30], start=6.0), _summary(30, 5.0, 20, samples_per_step=8)]
    totals = sessions_summary(_write(tmp_path, history))
    assert totals["train steps per second"] == "2" and totals["train samples per second"] == "16"
    assert totals["runtime"] == "0:00:15 (15.0 s) over 2 sessions"


def test_steps_going_back_resolve_overlaps_in_favour_of_the_later_session(tmp_path):
    first = _losses([2, 4, 6, 8], start=10.0)
    second = _losses([6, 8, 10], start=2.0)  # resumed from checkpoint-4 and appended
    sessions = split_sessions(first + second)
    assert [(s.start_step, s.end_step) for s in sessions] == [(0, 8), (4, 10)]
    merged = [(index, e["step"], e["loss"]) for index, e in merged_entries(sessions)]
    assert merged == [(1, 2, 10.0), (1, 4, 9.0), (2, 6, 2.0), (2, 8, 1.0), (2, 10, 0.0)]
    rows = summary(_write(tmp_path, first + second))
    assert rows["sessions"] == "2 (resumed at step 4); 4 steps trained more than once"
    # the mean over the run weights each logged loss by its steps, the later session winning where they overlap
    assert rows["mean train loss"].startswith(f"{(10 * 2 + 9 * 2 + 2 * 2 + 1 * 2 + 0 * 2) / 10:.4g} ")


def test_a_restarting_clock_marks_a_resume(tmp_path):
    history = [*_losses([10, 20, 30], runtime=1.0), *_losses([40, 50], runtime=0.5), _summary(50, 2.0, 20)]
    sessions = split_sessions(history)
    assert [(s.start_step, s.end_step) for s in sessions] == [(0, 30), (30, 50)]
    assert sessions[0].runtime == 3.0 and not sessions[0].runtime_is_complete
    totals = sessions_summary(_write(tmp_path, history))
    assert totals["runtime"] == "at least 0:00:05 (5.0 s) over 2 sessions"
    assert "runtime not logged" not in totals
    assert session_rows(load_run(tmp_path))[0]["runtime"] == "≥ 3.0 s"  # timed to its last log only


def test_the_summary_step_count_finds_a_resume_despite_rounding(tmp_path):
    # 100 steps at 0.333 steps/s (rounded to 3 decimals, as logged): 0.333 * 301.2 = 100.3 -> resumed at 100
    history = [*_losses(range(10, 201, 10)), {"train_runtime": 301.2, "train_samples_per_second": 2.664,
                                              "train_steps_per_second": 0.333, "train_loss": 3.0, "step": 200}]
    assert [(s.start_step, s.end_step) for s in split_sessions(history)] == [(0, 100), (100, 200)]
    # a summary whose rates count every step of the run (older versions of the reference) splits nothing
    history[-1]["train_steps_per_second"] = 200 / 301.2
    assert len(split_sessions(history)) == 1


def test_a_run_trained_in_one_go_is_one_session(tmp_path):
    history = [{"eval_loss": 5.0, "step": 0}, *_losses([2, 4, 6]), {"eval_loss": 2.0, "step": 6}, _summary(6, 3.0, 6)]
    run = _write(tmp_path, history)
    assert len(run.sessions) == 1 and "sessions" not in summary(run)
    assert summary(run)["runtime"] == "0:00:03 (3.0 s)" and "sessions:" not in summary_text(run)


def test_the_mean_train_loss_weights_each_log_by_its_steps_and_skips_nan():
    from trainwell.report.sessions import weighted_mean_loss

    entries = [{"loss": 4.0, "step": 10}, {"loss": float("nan"), "step": 20}, {"loss": 1.0, "step": 40}]
    assert weighted_mean_loss(entries) == pytest.approx((4.0 * 10 + 1.0 * 20) / 30)
    assert weighted_mean_loss(entries, start_step=5) == pytest.approx((4.0 * 5 + 1.0 * 20) / 25)
    assert weighted_mean_loss([{"eval_loss": 1.0, "step": 3}]) is None


def test_rounding_of_a_slow_run_is_not_taken_for_a_resume():
    # 81 s per step for 10,000 steps: 0.0123 steps/s is logged as 0.012, which alone would put a resume at 244
    history = [*_losses(range(10, 10001, 10)), {"train_runtime": 813008.0, "train_samples_per_second": 0.098,
                                                "train_steps_per_second": 0.012, "train_loss": 3.0, "step": 10000}]
    assert len(split_sessions(history)) == 1


def test_the_sessions_table_gives_the_steps_each_session_trained_not_its_logged_range(tmp_path):
    # Logged every 10 steps; the first call saved checkpoint-38 and died, the second resumed there and saved step 73
    # (its last log at 70). The table said "0-30, 38-70": the logged ranges, not what each session trained.
    first, second = _losses([10, 20, 30], runtime=1.0), _losses([40, 50, 60, 70], start=6.0, runtime=0.5)
    sessions = [{"start_step": 0, "resumed_from": None, "max_steps": 73, "num_input_tokens_seen": 0},
                {"start_step": 38, "resumed_from": "checkpoint-38", "max_steps": 73, "num_input_tokens_seen": 0}]
    lines = [{"session": sessions[0], "time": 1.0}, *({"log": e, "time": 2.0} for e in first),
             {"session": sessions[1], "time": 3.0}, *({"log": e, "time": 4.0} for e in second)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "live_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = _write(tmp_path, first + second, global_step=73, max_steps=73)
    assert [(s.start_step, s.end_step) for s in run.sessions] == [(0, 30), (38, 70)]
    assert [r["steps"] for r in session_rows(run)] == ["0-38", "38-73"]


def test_hyperparameters_changed_on_resume_read_per_session(tmp_path):
    # Resumed with another learning rate and length: the block showed only the last session's values.
    out = str(tmp_path / "out")

    def train(max_steps, learning_rate, resume=None):
        args = make_args(out, max_steps=max_steps, logging_steps=2, save_strategy="steps", save_steps=4,
                         per_device_train_batch_size=8, learning_rate=learning_rate, report_to="live")
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64))
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_state()

    train(8, 0.1)
    train(12, 0.05, resume=f"{out}/checkpoint-8")
    run = load_run(out)
    assert [s.start_step for s in run.sessions] == [0, 8]
    assert run.info["learning rate"] == "0.1 (session 1), 0.05 (session 2)"
    assert run.info["length"] == "max_steps=8 (session 1), max_steps=12 (session 2)"
    assert run.info["batch size per device"] == "8"  # unchanged: one value
    lines = [" ".join(line.split()) for line in summary_text(run).splitlines()]
    assert "learning rate 0.1 (session 1), 0.05 (session 2)" in lines
