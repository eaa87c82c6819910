"""Progress display beyond the basics in test_callbacks_unit: periodic plain lines, throughput, log levels,
and which process prints."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.events.progress import PrinterCallback, ProgressCallback, apply_log_level
from trainwell.state import TrainerControl, TrainerState


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def _ticking(progress, clock):
    progress._clock = lambda: clock[0]


def test_plain_lines_appear_periodically_when_logs_are_rare(capsys):
    progress = ProgressCallback(stream=io.StringIO(), plain_interval=30)
    clock = [0.0]
    _ticking(progress, clock)
    args, state, control = make_args("o"), TrainerState(max_steps=100), TrainerControl()
    progress.on_train_begin(args, state, control)
    for step in range(1, 11):  # 10 s per step: a line every 3 steps (30 s)
        clock[0] = 10.0 * step
        state.global_step = step
        progress.on_step_end(args, state, control)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[3/100 3% | eta 0:16:10] 10 s/step", "[6/100 6% | eta 0:15:40] 10 s/step",
                     "[9/100 9% | eta 0:15:10] 10 s/step"]


def test_a_log_line_resets_the_period_and_shows_the_rate(capsys):
    progress = ProgressCallback(stream=io.StringIO(), plain_interval=30)
    clock = [0.0]
    _ticking(progress, clock)
    args, state, control = make_args("o"), TrainerState(max_steps=40), TrainerControl()
    progress.on_train_begin(args, state, control)
    clock[0] = 25.0
    state.global_step = 10
    progress.on_step_end(args, state, control)  # 25 s < 30 s since the start: no progress line
    progress.on_log(args, state, control, logs={"loss": 1.5})
    clock[0] = 40.0
    progress.on_step_end(args, state, control)  # 15 s after the log line: no progress line yet
    progress.on_log(args, state, control, logs={"loss": 1.0, "train_tokens_per_second": 99.0})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[10/40 25% | eta 0:01:15] {'loss': '1.5'} (2.5 s/step)"
    assert out[1].endswith("'train_tokens_per_second': '99'}") and len(out) == 2  # throughput already shown


def test_plain_interval_zero_turns_periodic_lines_off(capsys):
    progress = ProgressCallback(stream=io.StringIO(), plain_interval=0)
    args, state, control = make_args("o"), TrainerState(max_steps=3), TrainerControl()
    progress.on_train_begin(args, state, control)
    state.global_step = 1
    progress.on_step_end(args, state, control)
    assert capsys.readouterr().out == ""


def test_bar_shows_loss_lr_and_token_throughput():
    progress = ProgressCallback(stream=FakeTerminal())
    args, state, control = make_args("o"), TrainerState(max_steps=10), TrainerControl()
    progress.on_train_begin(args, state, control)
    state.global_step = 2
    progress.on_step_end(args, state, control)
    progress.on_log(args, state, control, logs={"loss": 0.5, "learning_rate": 3e-4, "train_tokens_per_second": 1234.5})
    postfix = progress.training_bar.postfix
    assert "loss=0.5" in postfix and "lr=0.0003" in postfix and "tok/s=1234" in postfix
    assert "<" in str(progress.training_bar)  # tqdm's elapsed<remaining: the ETA
    progress.on_train_end(args, state, control)


def test_an_evaluation_log_keeps_the_loss_on_the_bar():
    """The bar's postfix is the last training log's: an evaluation (or the summary) has no loss to show, and
    replaced it with the step rate (issue 34)."""
    progress = ProgressCallback(stream=FakeTerminal())
    args, state, control = make_args("o"), TrainerState(max_steps=10), TrainerControl()
    progress.on_train_begin(args, state, control)
    state.global_step = 2
    progress.on_step_end(args, state, control)
    progress.on_log(args, state, control, logs={"loss": 0.5, "learning_rate": 3e-4, "train_tokens_per_second": 99.0})
    progress.on_log(args, state, control, logs={"eval_loss": 0.7, "eval_runtime": 1.0, "eval_samples_per_second": 9.0})
    postfix = progress.training_bar.postfix
    assert "loss=0.5" in postfix and "tok/s=99" in postfix and "step/s" not in postfix
    progress.on_train_end(args, state, control)


def test_a_message_logged_while_the_bar_is_drawn_starts_on_its_own_line(monkeypatch):
    """Ctrl-C's "Received SIGINT: ..." (a warning through Python's handler of last resort) was written onto the
    bar's line; it now clears the bar's line first and the bar is redrawn below it (issue 34)."""
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # no handler configured: the last resort prints
    library = logging.getLogger("trainwell.checkpoint.preemption")
    monkeypatch.setattr(library, "propagate", True)
    before = logging.lastResort
    progress = ProgressCallback()
    args, state, control = make_args("o"), TrainerState(max_steps=10), TrainerControl()
    progress.on_train_begin(args, state, control)
    state.global_step = 3
    progress.on_step_end(args, state, control)
    progress.training_bar.refresh()
    library.warning("Received SIGINT: the current step finishes, then a checkpoint is saved and training stops.")
    text = terminal.getvalue()
    at = text.index("Received SIGINT")
    assert text[at - 1] in "\r\n" and "3/10" in text[:at]  # the bar was drawn, then its line cleared
    assert "3/10" in text[at:]  # and redrawn below the message
    progress.on_train_end(args, state, control)
    assert logging.lastResort is before


def test_a_train_that_ended_without_on_train_end_leaves_no_bar_or_routing_behind(monkeypatch):
    """rollback_on_spike trains again after a Rollback, and a train() that raised never saw on_train_end: the next
    on_train_begin closes the earlier bar and puts the log routing back, so on_train_end restores it whole."""
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    before = logging.lastResort
    progress = ProgressCallback()
    args, state, control = make_args("o"), TrainerState(max_steps=10), TrainerControl()
    progress.on_train_begin(args, state, control)
    first = progress.training_bar
    progress.on_train_begin(args, state, control)  # no on_train_end in between
    assert first.disable and progress.training_bar is not first  # closed (tqdm disables a closed bar)
    progress.on_train_end(args, state, control)
    assert logging.lastResort is before


def test_only_the_world_main_process_prints(capsys):
    args, control = make_args("o"), TrainerControl()
    replica = TrainerState(max_steps=4, is_world_process_zero=False, is_local_process_zero=True)
    PrinterCallback().on_log(args, replica, control, logs={"loss": 1.0})
    progress = ProgressCallback(stream=io.StringIO(), plain_interval=1e-9)
    progress.on_train_begin(args, replica, control)
    replica.global_step = 1
    progress.on_step_end(args, replica, control)
    progress.on_log(args, replica, control, logs={"loss": 1.0})
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("level, replica, expected", [("info", "warning", logging.INFO),
                                                      ("error", "debug", logging.ERROR)])
def test_log_level_applies_to_the_trainwell_logger(level, replica, expected, monkeypatch):
    logger = logging.getLogger("trainwell")
    monkeypatch.setattr(logger, "level", logger.level)  # restored after the test
    apply_log_level(make_args("o", log_level=level, log_level_replica=replica))
    assert logger.level == expected


def test_log_level_replica_applies_off_the_main_process(monkeypatch):
    logger = logging.getLogger("trainwell")
    monkeypatch.setattr(logger, "level", logger.level)
    args = make_args("o", log_level="info", log_level_replica="error")
    monkeypatch.setattr(type(args), "should_log", property(lambda self: False))
    apply_log_level(args)
    assert logger.level == logging.ERROR


def test_passive_leaves_the_level_alone(monkeypatch):
    logger = logging.getLogger("trainwell")
    monkeypatch.setattr(logger, "level", logging.CRITICAL)
    apply_log_level(make_args("o"))
    assert logger.level == logging.CRITICAL


def test_trainer_applies_log_level_and_disable_tqdm(out_dir, monkeypatch, capsys):
    logger = logging.getLogger("trainwell")
    monkeypatch.setattr(logger, "level", logger.level)
    args = make_args(out_dir, max_steps=2, logging_steps=1, log_level="error", disable_tqdm=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    assert logger.level == logging.ERROR
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert "PrinterCallback" in names and "ProgressCallback" not in names
    trainer.train()
    assert "'loss'" in capsys.readouterr().out


def test_bar_shows_the_window_throughput_and_mfu_of_log_throughput():
    progress = ProgressCallback(stream=FakeTerminal())
    args, state, control = make_args("o"), TrainerState(max_steps=10), TrainerControl()
    progress.on_train_begin(args, state, control)
    state.global_step = 2
    progress.on_step_end(args, state, control)
    progress.on_log(args, state, control, logs={"loss": 0.5, "train_tokens_per_second": 1.0,
                                                "tokens_per_second": 98765.0, "mfu": 0.4213})
    postfix = progress.training_bar.postfix
    assert "tok/s=9.876e+04" in postfix and "mfu=42.1%" in postfix
    progress.on_train_end(args, state, control)


# --- the compact line the command line uses ------------------------------------------------------------------------


def test_compact_lines_one_per_log_numbers_unquoted_evaluations_marked(capsys):
    from trainwell.events.progress import compact_log, compact_number

    assert [compact_number(v) for v in (2.34567, 0.0019634, 16650.3, 2e-05, 3, True)] == [
        "2.346", "0.001963", "16650", "2e-5", "3", "True"]
    train = {"loss": 2.34567, "grad_norm": 0.84123, "learning_rate": 0.0019634, "epoch": 0.42,
             "num_input_tokens_seen": 204800, "train_runtime": 12.3, "train_tokens_per_second": 16650.3}
    evaluation = {"eval_loss": 2.1012, "eval_runtime": 3.12, "eval_samples_per_second": 41.0,
                  "eval_steps_per_second": 0.641, "epoch": 0.5, "eval_perplexity": 8.1745}
    done = {"train_runtime": 120.53, "train_samples_per_second": 132.7, "train_steps_per_second": 8.297,
            "total_flos": 1e12, "train_loss": 2.1234, "epoch": 3.0}
    assert compact_log(train) == ("train", "loss 2.346  grad_norm 0.8412  lr 0.001963  epoch 0.42  16650 tok/s")
    assert compact_log(evaluation) == ("eval", "loss 2.101  perplexity 8.175  (3.12 s)")
    assert compact_log(done) == ("done", "train_loss 2.123  (120.5 s)  132.7 samples/s  8.297 steps/s")

    terminal = FakeTerminal()
    progress = ProgressCallback(stream=terminal, compact=True)
    args, state, control = make_args("o"), TrainerState(max_steps=1000, global_step=100), TrainerControl()
    progress.on_train_begin(args, state, control)
    for logs in (train, evaluation, done):
        progress.on_log(args, state, control, logs=dict(logs))
    progress.on_train_end(args, state, control)
    written = [line for line in capsys.readouterr().out.splitlines() if line]
    assert written == ["step 100/1000  loss 2.346  grad_norm 0.8412  lr 0.001963  epoch 0.42  16650 tok/s",
                       "eval at step 100  loss 2.101  perplexity 8.175  (3.12 s)",
                       "done at step 100  train_loss 2.123  (120.5 s)  132.7 samples/s  8.297 steps/s"]
    PrinterCallback(compact=True).on_log(args, state, control, logs=dict(evaluation))
    assert capsys.readouterr().out == "eval at step 100  loss 2.101  perplexity 8.175  (3.12 s)\n"
    # the default stays the reference's dict, for library users
    PrinterCallback().on_log(args, state, control, logs={"loss": 0.5})
    assert capsys.readouterr().out == "{'loss': '0.5'}\n"


def test_each_line_is_written_once_where_print_is_replaced_as_on_ray_train_workers(capsys, monkeypatch):
    """Ray Train (V2) replaces ``print`` on its workers with one that writes the line and also logs it (shown again
    by the root logger's console handler): the driver showed each progress line twice. The lines bypass print."""
    import builtins

    def doubling_print(*objects, **kwargs):  # what Ray's patched print amounts to where sys.stdout is wrapped
        for _ in range(2):
            sys.stdout.write(" ".join(map(str, objects)) + "\n")

    monkeypatch.setattr(builtins, "print", doubling_print)
    args, state, control = make_args("o"), TrainerState(max_steps=10, global_step=5), TrainerControl()
    progress = ProgressCallback(stream=io.StringIO(), plain_interval=30)
    progress.on_train_begin(args, state, control)
    progress.on_log(args, state, control, logs={"loss": 1.5})
    for printer in (PrinterCallback(), PrinterCallback(compact=True)):
        printer.on_log(args, state, control, logs={"loss": 1.5})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and len(set(lines)) == 3, lines
