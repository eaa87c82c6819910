"""The report's curves: x axes (step, epoch, tokens, time), train-loss smoothing, log-scale y, resume marks."""

from __future__ import annotations

import json
import math

import pytest

from trainwell.report import AxisError, load_run
from trainwell.report.curves import auto_weight, axis_series, build_axis, shared_axes, smooth, spans_decade


def _run(tmp_path, history, name="run"):
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 0, "max_steps": 0,
                                                           "log_history": history}))
    return load_run(folder)


def _history(steps=60, start=1000.0, tokens=True, clock=True, resume_at=None):
    """A language-model-like history: the loss falls from ``start`` (a perplexity-sized number) to ~2, a log
    every step, an evaluation every 10; a second train() call from ``resume_at`` when given (its clock restarts)."""
    history, t0 = [], 0
    for step in range(1, steps + 1):
        if resume_at is not None and step == resume_at + 1:
            t0 = step - 1
        entry = {"loss": 2 + start * math.exp(-step / 3) + 0.3 * (step % 2), "grad_norm": 1.0,
                 "learning_rate": 1e-3 * (1 - step / steps), "epoch": step / 20, "step": step}
        if tokens:
            entry["num_input_tokens_seen"] = 128 * step
        if clock:
            entry["train_runtime"] = 0.5 * (step - t0)
        history.append(entry)
        if step % 10 == 0:
            history.append({"eval_loss": 2 + 50 * math.exp(-step / 5), "epoch": step / 20, "step": step})
    history.append({"train_runtime": 0.5 * (steps - t0), "train_samples_per_second": 16.0,
                    "train_steps_per_second": 2.0, "train_loss": 3.0, "epoch": steps / 20, "step": steps})
    return history


# --- pure functions ------------------------------------------------------------------------------------------------


def test_smoothing_is_a_debiased_exponential_average():
    assert smooth([4.0, 4.0, 4.0], 0.9) == pytest.approx([4.0, 4.0, 4.0])  # no pull towards 0 at the start
    assert smooth([1.0, 3.0], 0.0) == [1.0, 3.0]
    assert smooth([0.0, 10.0], 0.5) == pytest.approx([0.0, 10.0 * 0.5 / 0.75])
    assert smooth([1.0, math.nan, 1.0], 0.5) == pytest.approx([1.0, 1.0, 1.0])  # a NaN loss does not poison it
    noisy = [5 + (-1) ** i for i in range(200)]
    assert max(smooth(noisy, auto_weight(200))[50:]) - min(smooth(noisy, auto_weight(200))[50:]) < 0.2
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        smooth([1.0], 1.0)


def test_auto_weight_follows_the_number_of_points():
    assert auto_weight(10) == 0.0 and auto_weight(39) == 0.0  # few points: every one is shown as logged
    assert auto_weight(200) == pytest.approx(0.9) and auto_weight(1000) == pytest.approx(0.98)


def test_log_scale_only_for_positive_values_spanning_more_than_a_decade():
    assert spans_decade([250.0, 30.0, 5.4]) and spans_decade([1.0], [20.0])
    assert not spans_decade([5.0, 0.6]) and not spans_decade([10.0, 1.0])  # exactly a decade: linear
    assert not spans_decade([100.0, -1.0]) and not spans_decade([0.0, 100.0]) and not spans_decade([])
    assert spans_decade([100.0, math.inf, 1.0, math.nan])  # non-finite values are ignored


# --- x axes --------------------------------------------------------------------------------------------------------


def test_each_axis_gives_the_x_of_every_point(tmp_path):
    run = _run(tmp_path, _history(steps=20))
    for name, first_x in (("step", 1.0), ("epoch", 0.05), ("tokens", 128.0), ("time", 0.5)):
        axis = build_axis(run, name)
        series = axis_series(run, axis)
        assert series["loss"][0][0] == pytest.approx(first_x), name
        assert len(series["loss"]) == 20 and len(series["eval_loss"]) == 2
        assert "train_runtime" not in series  # the clock is an index, not a metric
    assert build_axis(run, "tokens").label == "input tokens seen"
    assert build_axis(run, "time").label == "training time (s)"


def test_an_axis_the_history_cannot_give_names_what_is_missing(tmp_path):
    run = _run(tmp_path, _history(steps=20, tokens=False, clock=False))
    with pytest.raises(AxisError, match="no num_input_tokens_seen.*include_num_input_tokens_seen=True"):
        build_axis(run, "tokens")
    zeros = _run(tmp_path, [{**e, "num_input_tokens_seen": 0} for e in _history(steps=20)], name="zeros")
    with pytest.raises(AxisError, match="is 0 in every log entry"):
        build_axis(zeros, "tokens")
    no_epoch = _run(tmp_path, [{k: v for k, v in e.items() if k != "epoch"} for e in _history(20)], name="e")
    with pytest.raises(AxisError, match="no log entry of e has an 'epoch'"):
        build_axis(no_epoch, "epoch")
    with pytest.raises(AxisError, match="pass one of step, epoch, tokens, time"):
        build_axis(run, "wall")
    # without a per-log clock the time comes from the session's runtime, spread over its steps, and says so
    axis = build_axis(run, "time")
    assert "estimated" in axis.label and axis.values[-1] == pytest.approx(10.0)
    unsummarized = _run(tmp_path, _history(steps=20, clock=False)[:-1], name="unsummarized")
    with pytest.raises(AxisError, match=r"session 1 of unsummarized \(steps 0-20\) logged no time"):
        build_axis(unsummarized, "time")


def test_time_lays_sessions_end_to_end_and_marks_resumes(tmp_path):
    run = _run(tmp_path, _history(steps=40, resume_at=20))
    assert [(s.start_step, s.end_step) for s in run.sessions] == [(0, 20), (20, 40)]
    axis = build_axis(run, "time")
    loss = axis_series(run, axis)["loss"]
    # session 1 ran 10 s by its last log; session 2's clock restarts, so its first log (0.5 s) lands at 10.5 s
    assert loss[19][0] == pytest.approx(10.0) and loss[20][0] == pytest.approx(10.5)
    assert axis.marks == [(pytest.approx(10.0), "resumed at step 20")]
    assert build_axis(run, "step").marks == [(20.0, "resumed at step 20")]
    assert build_axis(run, "epoch").marks == [(pytest.approx(1.0), "resumed at step 20")]


def test_compared_time_axes_share_one_unit(tmp_path):
    short = _run(tmp_path, _history(steps=20), name="short")
    long = _run(tmp_path, [{**e, **({"train_runtime": e["train_runtime"] * 100} if "train_runtime" in e else {})}
                           for e in _history(steps=20)], name="long")  # 1000 s: minutes on its own
    assert build_axis(long, "time").label.startswith("training time (min")
    axes = shared_axes([short, long], "time")
    assert {a.label for a in axes} == {"training time (min)"}
    assert axes[0].values[-1] == pytest.approx(10 / 60)


# --- drawing -------------------------------------------------------------------------------------------------------


def test_plots_use_log_scale_smoothing_and_resume_marks(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    from trainwell.report.plots import run_figures

    run = _run(tmp_path, _history(steps=60, resume_at=30))
    figures = run_figures(run)
    loss_ax = figures["loss"].axes[0]
    assert loss_ax.get_yscale() == "log" and "log scale" in loss_ax.get_ylabel()
    assert figures["learning_rate"].axes[0].get_yscale() == "linear"  # a schedule is never put on a log scale
    assert figures["grad_norm"].axes[0].get_yscale() == "linear"  # constant: nothing to span
    lines = {line.get_label(): line for line in loss_ax.get_lines()}
    smoothed = next(line for label, line in lines.items() if label.startswith("train loss (smoothed"))
    raw = next(line for line in loss_ax.get_lines() if line.get_alpha() == 0.25)
    assert len(raw.get_xdata()) == len(smoothed.get_xdata()) == 60 and raw.get_color() == smoothed.get_color()
    assert max(smoothed.get_ydata()[40:]) - min(smoothed.get_ydata()[40:]) < 0.3 * 0.5  # the 0.3 zigzag is damped
    assert "validation loss" in lines
    resume = [line for line in loss_ax.get_lines() if list(line.get_xdata()) == [30, 30]]
    assert resume and resume[0].get_linestyle() == "--"
    assert [t.get_text() for t in loss_ax.texts] == [" resumed at step 30"]
    unsmoothed = run_figures(run, smoothing=0.0)["loss"].axes[0]
    assert not any(line.get_alpha() == 0.25 for line in unsmoothed.get_lines())
    assert run_figures(run, x="tokens")["loss"].axes[0].get_xlabel() == "input tokens seen"


def test_the_comparison_shares_its_axes(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    from trainwell.report.plots import comparison_figure

    runs = [_run(tmp_path, _history(steps=20), name="a"), _run(tmp_path, _history(steps=40, start=5.0), name="b")]
    fig = comparison_figure(runs, x="epoch")
    panels = fig.axes
    assert [ax.get_title() for ax in panels] == ["train loss", "validation loss", "learning rate", "grad norm"]
    assert all(ax.get_xlabel() == "epoch" for ax in panels)
    assert all(ax.get_shared_x_axes().joined(panels[0], ax) for ax in panels[1:])
    assert panels[0].get_yscale() == "log"  # run a spans decades: one log axis for both runs
    for ax in panels:
        assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"a", "b"} or ax is panels[0]
    with pytest.raises(AxisError, match="num_input_tokens_seen"):
        comparison_figure([runs[0], _run(tmp_path, _history(steps=20, tokens=False), name="c")], x="tokens")


# --- labels a person reads -------------------------------------------------------------------------------------------


def test_a_resume_between_two_logging_steps_is_marked_at_its_checkpoint(tmp_path):
    """Ctrl-C writes checkpoint-7 of a run logging every 5 steps: the resumed call's first loss is at 10 and
    the step before it in the history is 5, but its summary (3 steps trained, ending at 10) says it began at 7."""
    from tests.common.models import RegressionDataset, RegressionModel
    from tests.conftest import make_args
    from trainwell import Trainer
    from trainwell.report import summary

    out = str(tmp_path / "out")

    def train(resume=None):
        args = make_args(out, max_steps=10, logging_steps=5, save_strategy="steps", save_steps=7,
                         per_device_train_batch_size=4)
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64))
        trainer.train(resume_from_checkpoint=resume)
        trainer.save_state()

    train()
    train(resume=f"{out}/checkpoint-7")
    run = load_run(out)
    assert [(s.start_step, s.end_step) for s in run.sessions] == [(0, 5), (7, 10)]
    assert summary(run)["sessions"] == "2 (resumed at step 7)"
    assert build_axis(run, "step").marks == [(7.0, "resumed at step 7")]


def test_a_summary_that_cannot_pin_the_resume_step_leaves_the_logged_one(tmp_path):
    history = _history(steps=40, resume_at=20)
    # the reference before 5.x counted the whole schedule's steps in train_steps_per_second: 40 steps, not 20
    history[-1] = {**history[-1], "train_steps_per_second": 4.0}
    assert [s.start_step for s in _run(tmp_path, history, "whole").sessions] == [0, 20]
    # a call of an hour: the rate's 3 decimals leave several steps it could have started from
    history[-1] = {**history[-1], "train_steps_per_second": 20 / 3600 + 0.00049, "train_runtime": 3600.0}
    assert [s.start_step for s in _run(tmp_path, history, "long").sessions] == [0, 20]


def test_log_scale_ticks_are_plain_numbers_and_throughput_is_not_called_loss(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    from trainwell.report.plots import plain_number, run_figures

    assert [plain_number(v) for v in (0.6, 0.06, 0.30000000000000004, 2.5, 30, 2000, 1e-5, 2.5e7, 0.0)] == [
        "0.6", "0.06", "0.3", "2.5", "30", "2000", "1e-5", "2.5e7", "0"]
    history = []
    for step in range(1, 41):
        history.append({"loss": 0.3 + 6 * math.exp(-step / 4), "step": step})
        if step % 10 == 0:  # without token counting, the evaluations' two speeds are the throughput figure
            history.append({"eval_loss": 1.0, "eval_runtime": 0.5, "eval_samples_per_second": 64.0 + step,
                            "eval_steps_per_second": 2.0, "step": step})
    figures = run_figures(_run(tmp_path, history))
    loss_ax = figures["loss"].axes[0]
    figures["loss"].canvas.draw()
    ticks = [t.get_text() for t in loss_ax.get_yticklabels() + loss_ax.yaxis.get_minorticklabels()]
    assert loss_ax.get_yscale() == "log" and {"0.4", "1", "2"} <= set(ticks), ticks
    assert not [t for t in ticks if "e" in t], ticks  # never 6e−01
    speed_ax = figures["throughput"].axes[0]
    assert len(speed_ax.get_legend().get_texts()) == 2 and speed_ax.get_ylabel() == "per second (log scale)"
