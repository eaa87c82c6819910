"""Callbacks without a Trainer: the handler, the default flow, progress/printer output and early stopping.

The end-to-end event-order test with a real Trainer lives elsewhere; here a fake loop that follows the
pseudocode on ``TrainerCallback`` drives the handler.
"""

from __future__ import annotations

import io
import logging
import re
from collections import Counter
from types import SimpleNamespace

import pytest

from trainwell.events import (
    EVENTS,
    CallbackHandler,
    DefaultFlowCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    format_logs,
    greater_is_better,
    is_improvement,
    metric_key,
)
from trainwell.events import progress as progress_module
from trainwell.outputs import IntervalStrategy, SaveStrategy
from trainwell.state import TrainerControl, TrainerState

HANDLER_LOGGER = "trainwell.events.handler"


def make_args(**overrides):
    """A TrainingArguments stand-in with the reference defaults the callbacks read."""
    values = dict(
        logging_strategy=IntervalStrategy.STEPS,
        eval_strategy=IntervalStrategy.NO,
        save_strategy=SaveStrategy.STEPS,
        logging_steps=500,
        eval_steps=None,
        save_steps=500,
        logging_first_step=False,
        eval_delay=0,
        metric_for_best_model=None,
        greater_is_better=None,
        load_best_model_at_end=False,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def make_state(args, max_steps, **overrides):
    state = TrainerState(max_steps=max_steps, **overrides)
    state.compute_steps(args, max_steps)
    return state


class Recorder(TrainerCallback):
    """Records each event with the flags it saw on entry and the keyword arguments it received."""

    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name in EVENTS:
            return lambda args, state, control, **kw: self.calls.append((name, control.state()["args"], kw))
        return super().__getattribute__(name)


# -- the base class ---------------------------------------------------------------------------------


def test_base_class_has_the_16_events_as_no_ops():
    assert len(EVENTS) == 16
    callback, control = TrainerCallback(), TrainerControl()
    for event in EVENTS:
        assert getattr(callback, event)(make_args(), TrainerState(), control, model=None, logs={}) is None


def test_docstring_pseudocode_lists_every_event_once_in_firing_order():
    pseudocode = TrainerCallback.__doc__.split("::", 1)[1]
    found = re.findall(r"\bon_[a-z_]+\b", pseudocode)
    first_seen = list(dict.fromkeys(found))
    assert first_seen == [
        "on_init_end",
        "on_train_begin",
        "on_epoch_begin",
        "on_step_begin",
        "on_substep_end",
        "on_pre_optimizer_step",
        "on_optimizer_step",
        "on_step_end",
        "on_epoch_end",
        "on_train_end",
        "on_prediction_step",
        "on_evaluate",
        "on_predict",
        "on_log",
        "on_save",
        "on_push_begin",
    ]
    assert sorted(first_seen) == sorted(EVENTS)
    assert "never fired" in pseudocode


# -- the handler: the list --------------------------------------------------------------------------


def test_add_accepts_classes_and_instances_and_warns_on_duplicates(caplog):
    printer = PrinterCallback()
    with caplog.at_level(logging.WARNING, logger=HANDLER_LOGGER):
        handler = CallbackHandler([DefaultFlowCallback, printer], None, None, None, None)
    assert caplog.records == []
    assert isinstance(handler.callbacks[0], DefaultFlowCallback) and handler.callbacks[1] is printer
    with caplog.at_level(logging.WARNING, logger=HANDLER_LOGGER):
        handler.add_callback(PrinterCallback)
    assert str(PrinterCallback) in caplog.text
    assert handler.callback_list == "DefaultFlowCallback\nPrinterCallback\nPrinterCallback"


def test_pop_and_remove():
    flow, first, second = DefaultFlowCallback(), PrinterCallback(), PrinterCallback()
    handler = CallbackHandler([flow, first, second], None, None, None, None)
    assert handler.pop_callback(second) is second
    assert handler.pop_callback(second) is None
    assert handler.pop_callback(ProgressCallback) is None
    assert handler.pop_callback(PrinterCallback) is first
    handler.add_callback(second)
    handler.remove_callback(PrinterCallback)
    assert handler.callbacks == [flow]
    with pytest.raises(ValueError, match="PrinterCallback"):
        handler.remove_callback(PrinterCallback)
    with pytest.raises(ValueError, match="not among the Trainer's callbacks"):
        handler.remove_callback(first)
    handler.remove_callback(flow)
    assert handler.callbacks == []


def test_missing_flow_warns_once(caplog):
    with caplog.at_level(logging.WARNING, logger=HANDLER_LOGGER):
        handler = CallbackHandler([PrinterCallback()], None, None, None, None)
        handler.on_train_begin(make_args(), TrainerState(), TrainerControl())
    assert len(caplog.records) == 1 and "DefaultFlowCallback" in caplog.text


def test_flow_removed_after_construction_warns_at_train_begin(caplog):
    handler = CallbackHandler([DefaultFlowCallback()], None, None, None, None)
    handler.remove_callback(DefaultFlowCallback)
    with caplog.at_level(logging.WARNING, logger=HANDLER_LOGGER):
        handler.on_train_begin(make_args(), TrainerState(), TrainerControl())
        handler.on_train_begin(make_args(), TrainerState(), TrainerControl())
    assert len(caplog.records) == 1


# -- the handler: events ----------------------------------------------------------------------------

ALL_FLAGS = ("should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log")
CLEARED = {
    "on_train_begin": {"should_training_stop"},
    "on_epoch_begin": {"should_epoch_stop"},
    "on_step_begin": {"should_log", "should_evaluate", "should_save"},
    "on_log": {"should_log"},
    "on_evaluate": {"should_evaluate"},
    "on_save": {"should_save"},
}


@pytest.mark.parametrize("event", EVENTS)
def test_each_event_clears_its_flags_then_passes_the_common_kwargs(event):
    recorder = Recorder()
    handler = CallbackHandler([DefaultFlowCallback(), recorder], "model", "tok", "opt", "sched")
    handler.train_dataloader, handler.eval_dataloader = "train_dl", "eval_dl"
    control = TrainerControl(*(True,) * len(ALL_FLAGS))
    extra = {"logs": {"loss": 1.0}} if event == "on_log" else {}
    if event in ("on_evaluate", "on_predict"):
        extra = {"metrics": {"eval_loss": 1.0}}
    result = getattr(handler, event)(make_args(), TrainerState(max_steps=10), control, **extra)
    assert result is control
    ((name, flags, kwargs),) = recorder.calls
    assert name == event
    assert {flag for flag in ALL_FLAGS if not flags[flag]} == CLEARED.get(event, set())
    assert kwargs == {
        "model": "model",
        "processing_class": "tok",
        "optimizer": "opt",
        "lr_scheduler": "sched",
        "train_dataloader": "train_dl",
        "eval_dataloader": "eval_dl",
        **extra,
    }


def test_metrics_and_logs_may_be_passed_positionally():
    recorder = Recorder()
    handler = CallbackHandler([DefaultFlowCallback(), recorder], None, None, None, None)
    handler.on_evaluate(make_args(), TrainerState(), TrainerControl(), {"eval_loss": 2.0})
    handler.on_log(make_args(), TrainerState(), TrainerControl(), {"loss": 1.0})
    assert [kw.get("metrics", kw.get("logs")) for _, _, kw in recorder.calls] == [{"eval_loss": 2.0}, {"loss": 1.0}]


def test_returned_control_replaces_and_none_keeps():
    replacement = TrainerControl(should_save=True)
    seen = []

    class Replacer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            return replacement

    class Watcher(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(control)

    handler = CallbackHandler([DefaultFlowCallback(), Watcher(), Replacer(), Watcher()], None, None, None, None)
    original = TrainerControl()
    assert handler.on_step_end(make_args(), TrainerState(max_steps=10, global_step=1), original) is replacement
    assert seen == [original, replacement] and seen[0] is original


def test_a_non_control_return_value_is_a_clear_error():
    class Sloppy(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            return True

    handler = CallbackHandler([DefaultFlowCallback(), Sloppy()], None, None, None, None)
    with pytest.raises(TypeError, match=r"Sloppy\.on_log returned a bool"):
        handler.on_log(make_args(), TrainerState(), TrainerControl(), logs={})


# -- the default flow -------------------------------------------------------------------------------


def run_steps(args, max_steps, epochs=1):
    """Drive the flow through a whole run; return {step: flags} after each on_step_end and epoch end."""
    flow, control = DefaultFlowCallback(), TrainerControl()
    state = make_state(args, max_steps)
    per_epoch = max_steps // epochs
    decisions = {}
    for step in range(1, max_steps + 1):
        control._new_step()
        state.global_step, state.epoch = step, step / per_epoch
        flow.on_step_end(args, state, control)
        decisions[step] = _flags(control)
        if step % per_epoch == 0:
            control._new_step()
            flow.on_epoch_end(args, state, control)
            decisions[f"epoch{step // per_epoch}"] = _flags(control)
    return decisions


def _flags(control):
    return {name[len("should_") :] for name in ALL_FLAGS if getattr(control, name)}


def steps_with(decisions, flag):
    return [key for key, flags in decisions.items() if flag in flags]


def test_logging_every_n_steps_and_first_step():
    decisions = run_steps(make_args(logging_steps=4, logging_first_step=True, save_strategy="no"), 10)
    assert steps_with(decisions, "log") == [1, 4, 8]
    assert steps_with(decisions, "training_stop") == [10, "epoch1"]  # the flag stays set once raised


def test_logging_strategy_no_never_logs_even_with_first_step():
    decisions = run_steps(make_args(logging_strategy="no", logging_steps=1, logging_first_step=True), 5)
    assert steps_with(decisions, "log") == []


def test_evaluation_every_n_steps_with_delay_and_at_the_final_step():
    args = make_args(eval_strategy=IntervalStrategy.STEPS, eval_steps=3, eval_delay=4, save_strategy="no")
    assert steps_with(run_steps(args, 11), "evaluate") == [6, 9, 11]
    args.eval_delay = 12
    assert steps_with(run_steps(args, 11), "evaluate") == []


def test_eval_steps_ratio_is_resolved_against_max_steps():
    args = make_args(eval_strategy="steps", eval_steps=0.25, save_strategy="no")
    assert steps_with(run_steps(args, 20), "evaluate") == [5, 10, 15, 20]


def test_periodic_saves_end_with_a_final_checkpoint():
    decisions = run_steps(make_args(save_steps=4), 10)
    assert steps_with(decisions, "save") == [4, 8, 10]


def test_the_last_step_is_saved_even_before_save_steps_is_reached():
    # As the reference: checkpoint-10 with save_steps=500 (scripts rely on checkpoint-{max_steps} existing).
    assert steps_with(run_steps(make_args(), 10), "save") == [10]
    assert steps_with(run_steps(make_args(save_steps=10), 10), "save") == [10]


def test_epoch_strategies():
    args = make_args(
        logging_strategy=IntervalStrategy.EPOCH,
        eval_strategy=IntervalStrategy.EPOCH,
        save_strategy=SaveStrategy.EPOCH,
        eval_delay=2,
    )
    decisions = run_steps(args, 12, epochs=3)
    assert steps_with(decisions, "log") == ["epoch1", "epoch2", "epoch3"]
    assert steps_with(decisions, "evaluate") == ["epoch2", "epoch3"]
    assert steps_with(decisions, "save") == ["epoch1", "epoch2", "epoch3"]
    assert steps_with(decisions, "training_stop") == [12, "epoch3"]


def test_best_save_strategy_is_left_to_the_trainer():
    args = make_args(save_strategy=SaveStrategy.BEST, save_steps=2, eval_strategy="steps", eval_steps=2)
    assert steps_with(run_steps(args, 6), "save") == []


def test_a_zero_interval_never_divides_by_zero():
    flow, state, control = DefaultFlowCallback(), TrainerState(global_step=3, max_steps=10), TrainerControl()
    state.logging_steps = state.save_steps = 0
    flow.on_step_end(make_args(), state, control)
    assert _flags(control) == set()


def fake_train(handler, args, state, control, epochs, steps_per_epoch, accumulation, eval_batches):
    """The loop of the TrainerCallback pseudocode, with no model: enough to count events."""
    control = handler.on_train_begin(args, state, control)
    for _ in range(epochs):
        control = handler.on_epoch_begin(args, state, control)
        for _ in range(steps_per_epoch):
            control = handler.on_step_begin(args, state, control)
            for _ in range(accumulation - 1):
                control = handler.on_substep_end(args, state, control)
            control = handler.on_pre_optimizer_step(args, state, control)
            control = handler.on_optimizer_step(args, state, control)
            state.global_step += 1
            control = handler.on_step_end(args, state, control)
            control = act_on_flags(handler, args, state, control, eval_batches)
            if control.should_epoch_stop or control.should_training_stop:
                break
        control = handler.on_epoch_end(args, state, control)
        control = act_on_flags(handler, args, state, control, eval_batches)
        if control.should_training_stop:
            break
    control = handler.on_log(args, state, control, logs={"train_loss": 1.0})
    return handler.on_train_end(args, state, control)


def act_on_flags(handler, args, state, control, eval_batches):
    if control.should_log:
        control = handler.on_log(args, state, control, logs={"loss": 1.0})
    if control.should_evaluate:
        for _ in range(eval_batches):
            control = handler.on_prediction_step(args, state, control)
        control = handler.on_log(args, state, control, logs={"eval_loss": 1.0})
        control = handler.on_evaluate(args, state, control, metrics={"eval_loss": 1.0})
    if control.should_save:
        control = handler.on_save(args, state, control)
    return control


def test_event_counts_of_a_simulated_run():
    recorder = Recorder()
    handler = CallbackHandler([DefaultFlowCallback(), recorder], None, None, None, None)
    args = make_args(logging_steps=4, eval_strategy="steps", eval_steps=5, save_steps=6)
    state = make_state(args, 12)
    fake_train(handler, args, state, TrainerControl(), epochs=3, steps_per_epoch=4, accumulation=2, eval_batches=2)
    counts = Counter(name for name, _, _ in recorder.calls)
    assert counts == {
        "on_train_begin": 1,
        "on_epoch_begin": 3,
        "on_step_begin": 12,
        "on_substep_end": 12,
        "on_pre_optimizer_step": 12,
        "on_optimizer_step": 12,
        "on_step_end": 12,
        "on_epoch_end": 3,
        "on_log": 3 + 3 + 1,  # steps 4, 8, 12; evaluations at 5, 10, 12; the train summary
        "on_prediction_step": 6,
        "on_evaluate": 3,
        "on_save": 2,  # steps 6 and 12
        "on_train_end": 1,
    }


# -- progress and printer ---------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_format_logs_copies_and_shortens():
    logs = {"loss": 0.123456789, "step": 3, "note": "x" * 20, "total_flos": 1e12}
    shown = format_logs(logs, max_str_len=10)
    assert shown == {"loss": "0.1235", "step": 3, "note": "[string of 20 characters > max_str_len=10, not shown]"}
    assert logs["total_flos"] == 1e12 and logs["loss"] == 0.123456789


def test_progress_prints_plain_lines_when_not_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(ProgressCallback, "_bar", lambda self, **kw: pytest.fail("no bar off a terminal"))
    stream = io.StringIO()
    progress = ProgressCallback(max_str_len=5, stream=stream)
    ticks = iter([100.0, 110.0])
    progress._clock = lambda: next(ticks)
    args, state, control = make_args(), TrainerState(max_steps=10), TrainerControl()
    progress.on_train_begin(args, state, control)
    state.global_step = 2
    progress.on_step_end(args, state, control)
    logs = {"loss": 0.5, "learning_rate": 1e-4, "total_flos": 3.0, "tag": "abcdefgh"}
    progress.on_prediction_step(args, state, control, eval_dataloader=[1, 2])
    progress.on_log(args, state, control, logs=logs)
    progress.on_train_end(args, state, control)
    out = capsys.readouterr().out
    assert out.startswith("[2/10 20% | eta 0:00:40] {'loss': '0.5', 'learning_rate': '0.0001', 'tag': '[string")
    assert "total_flos" not in out
    assert logs == {"loss": 0.5, "learning_rate": 1e-4, "total_flos": 3.0, "tag": "abcdefgh"}
    assert stream.getvalue() == ""


def test_progress_is_silent_off_the_main_process_and_outside_training(capsys):
    progress = ProgressCallback(stream=io.StringIO())
    args, control = make_args(), TrainerControl()
    progress.on_log(args, TrainerState(), control, logs={"eval_loss": 1.0})  # a standalone evaluate()
    replica = TrainerState(max_steps=4, is_world_process_zero=False)
    progress.on_train_begin(args, replica, control)
    progress.on_log(args, replica, control, logs={"loss": 1.0})
    assert capsys.readouterr().out == ""


def test_progress_draws_bars_on_a_terminal(capsys):
    stream = FakeTerminal()
    progress = ProgressCallback(stream=stream)
    args, state, control = make_args(), TrainerState(max_steps=10, global_step=2), TrainerControl()
    progress.on_train_begin(args, state, control)  # resumed at step 2
    bar = progress.training_bar
    assert (bar.total, bar.n) == (10, 2)
    state.global_step = 3
    progress.on_step_end(args, state, control)
    assert bar.n == 3
    logs = {"loss": 0.25, "learning_rate": 0.001, "total_flos": 1.0}
    progress.on_log(args, state, control, logs=logs)
    assert "loss=0.25" in bar.postfix and "lr=0.001" in bar.postfix
    assert "total_flos" in logs and "'loss': '0.25'" in capsys.readouterr().out
    for _ in range(3):
        progress.on_prediction_step(args, state, control, eval_dataloader=[0] * 3)
    assert (progress.prediction_bar.total, progress.prediction_bar.n) == (3, 3)
    progress.on_evaluate(args, state, control, metrics={})
    assert progress.prediction_bar is None
    progress.on_train_end(args, state, control)
    assert progress.training_bar is None and "10" in stream.getvalue()


def test_progress_skips_the_prediction_bar_for_unsized_loaders():
    progress = ProgressCallback(stream=FakeTerminal())
    progress.on_prediction_step(make_args(), TrainerState(), TrainerControl(), eval_dataloader=iter([1]))
    assert progress.prediction_bar is None


def test_tqdm_is_imported_lazily():
    with open(progress_module.__file__, encoding="utf-8") as f:
        source = f.read()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not any("tqdm" in line for line in top_level)


def test_printer_prints_without_total_flos_and_leaves_the_dict_alone(capsys):
    logs = {"train_loss": 0.123456, "total_flos": 5e9, "epoch": 3}
    PrinterCallback().on_log(make_args(), TrainerState(), TrainerControl(), logs=logs)
    assert capsys.readouterr().out == "{'train_loss': '0.1235', 'epoch': 3}\n"
    assert logs == {"train_loss": 0.123456, "total_flos": 5e9, "epoch": 3}
    PrinterCallback().on_log(make_args(), TrainerState(is_local_process_zero=False), TrainerControl(), logs=logs)
    assert capsys.readouterr().out == ""


# -- monitor and early stopping ---------------------------------------------------------------------


def test_metric_key_and_direction():
    assert metric_key(make_args(metric_for_best_model="accuracy")) == "eval_accuracy"
    assert metric_key(make_args(metric_for_best_model="eval_loss")) == "eval_loss"
    with pytest.raises(ValueError, match="metric_for_best_model"):
        metric_key(make_args())
    assert greater_is_better(make_args(metric_for_best_model="loss")) is False
    assert greater_is_better(make_args(metric_for_best_model="accuracy")) is True
    assert greater_is_better(make_args(metric_for_best_model="loss", greater_is_better=True)) is True


@pytest.mark.parametrize(
    ("new", "best", "greater", "threshold", "expected"),
    [
        (1.0, None, True, 0.0, True),
        (1.0, float("nan"), False, 0.0, True),
        (float("nan"), 1.0, False, 0.0, False),
        (2.0, 1.0, True, 0.0, True),
        (1.0, 1.0, True, 0.0, False),
        (0.5, 1.0, False, 0.0, True),
        (0.5, 1.0, False, 0.5, False),
        (0.49, 1.0, False, 0.5, True),
        (1.5, 1.0, False, 0.0, False),
    ],
)
def test_is_improvement(new, best, greater, threshold, expected):
    assert is_improvement(new, best, greater, threshold) is expected


def test_early_stopping_requires_a_metric_and_evaluations(caplog):
    callback = EarlyStoppingCallback()
    with pytest.raises(ValueError, match="metric_for_best_model="):
        callback.on_train_begin(make_args(eval_strategy="steps"), TrainerState(), TrainerControl())
    with pytest.raises(ValueError, match=r"eval_strategy='no'.*eval_strategy='steps'"):
        callback.on_train_begin(make_args(metric_for_best_model="loss"), TrainerState(), TrainerControl())
    with caplog.at_level(logging.WARNING):
        args = make_args(metric_for_best_model="loss", eval_strategy=IntervalStrategy.EPOCH)
        callback.on_train_begin(args, TrainerState(), TrainerControl())
    assert caplog.records == []  # no load_best_model_at_end warning: it is not needed


def evaluate_sequence(callback, args, values):
    """Feed eval values; after each on_evaluate update best_metric (no threshold) as the Trainer does."""
    state, control, counters = TrainerState(), TrainerControl(), []
    for value in values:
        callback.on_evaluate(args, state, control, metrics={metric_key(args): value})
        counters.append(callback.early_stopping_patience_counter)
        if is_improvement(value, state.best_metric, greater_is_better(args)):
            state.best_metric = value
        if control.should_training_stop:
            break
    return counters, control.should_training_stop


def test_early_stopping_counts_evaluations_without_improvement():
    args = make_args(metric_for_best_model="loss", eval_strategy="steps")
    counters, stopped = evaluate_sequence(EarlyStoppingCallback(3), args, [1.0, 0.9, 0.95, 0.9, 0.8, 0.85, 0.8, 0.81])
    assert counters == [0, 0, 1, 2, 0, 1, 2, 3] and stopped


def test_early_stopping_threshold_and_greater_is_better():
    args = make_args(metric_for_best_model="acc", eval_strategy="steps")
    callback = EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.05)
    # gains over the best so far: -, 0.03 (within the threshold), 0.07, 0.01, 0.01
    counters, stopped = evaluate_sequence(callback, args, [0.80, 0.83, 0.90, 0.91, 0.92])
    assert counters == [0, 1, 0, 1, 2] and stopped


def test_early_stopping_skips_an_evaluation_without_the_metric(caplog):
    callback = EarlyStoppingCallback()
    args = make_args(metric_for_best_model="f1", eval_strategy="steps")
    control = TrainerControl()
    with caplog.at_level(logging.WARNING):
        callback.on_evaluate(args, TrainerState(best_metric=0.5), control, metrics={"eval_loss": 1.0})
    assert "eval_f1" in caplog.text and "eval_loss" in caplog.text
    assert callback.early_stopping_patience_counter == 0 and not control.should_training_stop


def test_early_stopping_rejects_bad_settings():
    with pytest.raises(ValueError, match="early_stopping_patience=0"):
        EarlyStoppingCallback(0)
    with pytest.raises(ValueError, match=r"early_stopping_threshold=-0\.1"):
        EarlyStoppingCallback(1, -0.1)
    assert EarlyStoppingCallback(2, None).early_stopping_threshold == 0.0


def test_early_stopping_state_survives_a_checkpoint(tmp_path):
    callback = EarlyStoppingCallback(early_stopping_patience=4, early_stopping_threshold=0.01)
    callback.early_stopping_patience_counter = 2
    assert callback.state() == {
        "args": {"early_stopping_patience": 4, "early_stopping_threshold": 0.01},
        "attributes": {"early_stopping_patience_counter": 2},
    }
    state = TrainerState(stateful_callbacks=[DefaultFlowCallback(), callback, TrainerControl()])
    state.save_to_json(tmp_path / "trainer_state.json")
    stored = TrainerState.load_from_json(tmp_path / "trainer_state.json").stateful_callbacks
    restored = EarlyStoppingCallback.from_state(stored["EarlyStoppingCallback"])
    assert restored.state() == callback.state()
