"""The remaining time the progress display shows holds still: evaluations and saves are not counted as step time,
one slow step barely moves it, and a lasting change of pace still shows (``StepPace``, ``ProgressCallback``).

Everything runs on a fake clock: ``ProgressCallback._clock`` is replaced, tqdm never decides what is shown."""

from __future__ import annotations

import io
import re

import pytest

from tests.conftest import make_args
from trainwell.events.progress import ProgressCallback, StepPace
from trainwell.state import TrainerControl, TrainerState


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


class Run:
    """A ProgressCallback driven through the Trainer's events on a fake clock."""

    def __init__(self, stream, max_steps=1000):
        self.clock = [0.0]
        self.progress = ProgressCallback(stream=stream, plain_interval=0)
        self.progress._clock = lambda: self.clock[0]
        self.args, self.state, self.control = make_args("o"), TrainerState(max_steps=max_steps), TrainerControl()
        self.progress.on_train_begin(self.args, self.state, self.control)

    def steps(self, count, seconds):
        for _ in range(count):
            self.clock[0] += seconds
            self.state.global_step += 1
            self.progress.on_step_end(self.args, self.state, self.control)

    def evaluate_and_save(self, eval_seconds, save_seconds):
        self.clock[0] += eval_seconds
        self.progress.on_evaluate(self.args, self.state, self.control, metrics={})
        self.clock[0] += save_seconds
        self.progress.on_save(self.args, self.state, self.control)

    def eta_seconds(self):
        text = self.progress._progress(self.state, self.progress.pace.rate())
        hours, minutes, seconds = map(int, re.search(r"eta (\d+):(\d\d):(\d\d)", text).groups())
        return 3600 * hours + 60 * minutes + seconds


def test_an_evaluation_and_a_save_do_not_move_the_eta():
    run = Run(io.StringIO())
    run.steps(100, 0.7)
    before = run.eta_seconds()
    assert before == pytest.approx(900 * 0.7, abs=1)
    run.evaluate_and_save(eval_seconds=45.0, save_seconds=30.0)  # 75 s: as long as 107 steps
    run.steps(1, 0.7)
    after = run.eta_seconds()
    assert abs(after - before) <= 0.01 * before  # one step's worth of progress, nothing of the pause
    assert run.progress.pace.seconds_per_step == pytest.approx(0.7)


def test_one_slow_step_moves_the_eta_by_a_small_fraction():
    run = Run(io.StringIO())
    run.steps(100, 1.0)
    before = run.eta_seconds()
    run.steps(1, 30.0)  # an unannounced stall (a slow batch, a collection pause): 30 times a step
    assert run.eta_seconds() <= 1.07 * before
    run.steps(20, 1.0)
    assert run.progress.pace.seconds_per_step == pytest.approx(1.0, rel=0.04)  # and it fades


def test_a_lasting_change_of_pace_shows_within_a_few_dozen_steps():
    run = Run(io.StringIO())
    run.steps(100, 1.0)
    run.steps(50, 2.0)  # e.g. longer sequences from here on
    assert run.progress.pace.seconds_per_step > 1.75  # three quarters of the way after 50 steps
    run.steps(50, 2.0)
    assert run.progress.pace.seconds_per_step == pytest.approx(2.0, rel=0.05)
    run.steps(100, 0.5)
    assert run.progress.pace.seconds_per_step == pytest.approx(0.5, rel=0.15)  # 1 - 0.97 ** 100 = 95 % of the way


def test_the_bar_shows_the_smoothed_rate_and_remaining_time():
    run = Run(FakeTerminal(), max_steps=100)
    bar = run.progress.training_bar
    run.steps(30, 1.0)
    run.evaluate_and_save(eval_seconds=60.0, save_seconds=20.0)
    run.steps(1, 1.0)
    assert bar.format_dict["rate"] == pytest.approx(1.0)
    assert "<01:09," in str(bar)  # 69 steps left at 1 s each; tqdm's own rate would use the real clock
    run.progress.on_train_end(run.args, run.state, run.control)


def test_the_plain_lines_and_postfix_use_the_same_rate(capsys):
    run = Run(io.StringIO(), max_steps=40)
    run.steps(10, 2.5)
    run.progress.on_log(run.args, run.state, run.control, logs={"loss": 1.5})
    assert capsys.readouterr().out == "[10/40 25% | eta 0:01:15] {'loss': '1.5'} (2.5 s/step)\n"


def test_a_step_end_reads_the_clock_once():
    progress = ProgressCallback(stream=FakeTerminal())
    reads = []
    progress._clock = lambda: reads.append(1) or float(len(reads))
    args, state, control = make_args("o"), TrainerState(max_steps=10), TrainerControl()
    progress.on_train_begin(args, state, control)
    del reads[:]
    for step in range(1, 6):
        state.global_step = step
        progress.on_step_end(args, state, control)
    progress.on_log(args, state, control, logs={"loss": 1.0})
    assert len(reads) == 5
    progress.on_train_end(args, state, control)


def test_step_pace_averages_several_steps_at_once_and_checks_its_arguments():
    pace = StepPace()
    assert pace.rate() is None
    pace.start(10.0, step=4)  # a resumed run
    pace.step(16.0, step=7)  # three steps reported together
    assert pace.seconds_per_step == pytest.approx(2.0)
    pace.step(17.0, step=7)  # no new step: nothing changes
    assert pace.seconds_per_step == pytest.approx(2.0) and pace.rate() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="smoothing"):
        StepPace(smoothing=0.0)
