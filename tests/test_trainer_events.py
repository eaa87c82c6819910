"""Callback events fired by a real Trainer run: which, how often, in what order, with which arguments."""

from __future__ import annotations

import io

import pytest

from tests.common.events import EventRecorder
from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import EarlyStoppingCallback, PrinterCallback, ProgressCallback, Trainer, TrainerCallback
from trainwell.events.flow import DefaultFlowCallback

STEP = ["on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]


def expected_events(epochs, steps_per_epoch, eval_batches=0, log_steps=(), eval_epoch=False, final_log=True):
    events = ["on_init_end", "on_train_begin"]
    step = 0
    for _ in range(epochs):
        events.append("on_epoch_begin")
        for _ in range(steps_per_epoch):
            step += 1
            events += STEP
            if step in log_steps:
                events.append("on_log")
        events.append("on_epoch_end")
        if eval_epoch:
            events += ["on_prediction_step"] * eval_batches + ["on_log", "on_evaluate"]
    if final_log:
        events.append("on_log")
    events.append("on_train_end")
    return events


def run(out_dir, **kwargs):
    recorder = EventRecorder()
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, **kwargs), train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=24), callbacks=[recorder])
    trainer.train()
    return trainer, recorder


def test_default_run_event_order(out_dir):
    _, rec = run(out_dir)
    assert rec.events == expected_events(3, 8)


def test_logging_steps_event_order(out_dir):
    _, rec = run(out_dir, logging_steps=5)
    assert rec.events == expected_events(3, 8, log_steps=(5, 10, 15, 20))


def test_eval_each_epoch_event_order_and_counts(out_dir):
    _, rec = run(out_dir, eval_strategy="epoch")
    assert rec.events == expected_events(3, 8, eval_batches=3, eval_epoch=True)
    counts = rec.counts()
    assert counts["on_step_begin"] == 24 and counts["on_evaluate"] == 3 and counts["on_prediction_step"] == 9


def test_gradient_accumulation_substeps(out_dir):
    _, rec = run(out_dir, gradient_accumulation_steps=3, per_device_train_batch_size=8)
    counts = rec.counts()
    # 8 batches per epoch → windows of 3, 3, 2: 3 optimizer steps and 5 sub-steps per epoch.
    assert counts["on_step_begin"] == 9 and counts["on_step_end"] == 9
    assert counts["on_substep_end"] == 15


def test_steps_save_and_eval_event_order(out_dir):
    _, rec = run(out_dir, eval_strategy="steps", eval_steps=4, save_strategy="steps", save_steps=8, max_steps=8)
    events = rec.events
    # log → evaluate → save at step 8, which is also the last step
    i = max(idx for idx, e in enumerate(events) if e == "on_step_end")
    assert events[i + 1:i + 7] == ["on_prediction_step"] * 3 + ["on_log", "on_evaluate", "on_save"]
    assert rec.counts()["on_evaluate"] == 2 and rec.counts()["on_save"] == 1


def test_event_kwargs(out_dir):
    _, rec = run(out_dir, eval_strategy="epoch", logging_steps=5)
    common = {"model", "processing_class", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"}
    assert rec.kwargs["on_step_end"] >= common
    assert "logs" in rec.kwargs["on_log"]
    assert "metrics" in rec.kwargs["on_evaluate"]


def test_predict_fires_prediction_steps_and_on_predict(out_dir):
    trainer, rec = run(out_dir, max_steps=1)
    rec.events.clear()
    trainer.predict(RegressionDataset(length=20))
    assert rec.events == ["on_prediction_step"] * 3 + ["on_predict"]


def test_logging_first_step_and_eval_on_start(out_dir):
    _, rec = run(out_dir, logging_first_step=True, eval_on_start=True, eval_strategy="epoch", max_steps=2)
    events = rec.events
    assert events[:6] == ["on_init_end", "on_train_begin", "on_prediction_step", "on_prediction_step",
                          "on_prediction_step", "on_log"]
    first_step_end = events.index("on_step_end")
    assert events[first_step_end + 1] == "on_log"


def test_callback_can_stop_training(out_dir):
    class StopAt3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                control.should_training_stop = True

    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir), train_dataset=RegressionDataset(),
                      callbacks=[StopAt3])
    assert trainer.train().global_step == 3


def test_early_stopping(out_dir):
    class Plateau(RegressionModel):
        pass

    args = make_args(out_dir, eval_strategy="steps", eval_steps=1, metric_for_best_model="loss", learning_rate=0.0,
                     max_steps=20)
    trainer = Trainer(model=Plateau(), args=args, train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset(length=8), callbacks=[EarlyStoppingCallback(2)])
    # lr 0: the loss never improves after the first evaluation, so patience 2 stops at step 3.
    assert trainer.train().global_step == 3


def test_add_pop_remove_callback(out_dir):
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir))
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names == ["DefaultFlowCallback", "PrinterCallback"]
    rec = EventRecorder()
    trainer.add_callback(rec)
    assert trainer.pop_callback(EventRecorder) is rec
    trainer.add_callback(rec)
    trainer.remove_callback(rec)
    assert rec not in trainer.callback_handler.callbacks
    assert isinstance(trainer.pop_callback(DefaultFlowCallback), DefaultFlowCallback)


def test_progress_callback_without_terminal_prints_lines(out_dir, capsys):
    stream = io.StringIO()  # not a terminal: no bar, plain lines on stdout
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, disable_tqdm=False, logging_steps=8),
                      train_dataset=RegressionDataset())
    trainer.pop_callback(ProgressCallback)
    trainer.add_callback(ProgressCallback(stream=stream))
    trainer.train()
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.strip()]
    assert any("8/24" in line and "'loss'" in line for line in lines), lines
    assert "\r" not in printed and stream.getvalue() == ""  # plain lines, no bar redraws


def test_printer_callback_keeps_total_flos(out_dir):
    # The reference's PrinterCallback deletes total_flos from the train metrics; trainwell's does not.
    trainer, _ = run(out_dir, max_steps=2)
    assert any(isinstance(cb, PrinterCallback) for cb in trainer.callback_handler.callbacks)
    assert "total_flos" in trainer.state.log_history[-1]


def test_log_adds_epoch_to_the_callers_dict_as_the_reference(out_dir):
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir), train_dataset=RegressionDataset())
    trainer.train()
    logs = {"custom": 1.0}
    trainer.log(logs)
    assert logs == {"custom": 1.0, "epoch": 3.0}  # tests/test_dropin_observables.py compares with the reference
    assert trainer.state.log_history[-1] == {"custom": 1.0, "epoch": 3.0, "step": trainer.state.global_step}
    logs["later"] = 2.0  # the history holds a copy
    assert "later" not in trainer.state.log_history[-1]
    assert "epoch" in trainer.evaluate(RegressionDataset(length=8))


def test_default_flow_saves_the_last_step(out_dir):
    import os
    import shutil

    _, rec = run(out_dir, save_strategy="steps")  # save_steps=500 > 24 steps: the reference saves step 24 anyway
    assert rec.counts()["on_save"] == 1
    assert sorted(n for n in os.listdir(out_dir) if n.startswith("checkpoint-")) == ["checkpoint-24"]
    shutil.rmtree(out_dir)
    _, rec = run(out_dir, save_strategy="steps", save_steps=10)
    assert rec.counts()["on_save"] == 3  # steps 10, 20, and the last (24): periodic runs end with a checkpoint
    assert sorted(os.listdir(out_dir)) == ["checkpoint-10", "checkpoint-20", "checkpoint-24"]


@pytest.mark.parametrize("strategy", ["epoch", "steps"])
def test_eval_delay(out_dir, strategy):
    kwargs = {"eval_delay": 2, "eval_strategy": strategy}
    if strategy == "steps":
        kwargs["eval_steps"] = 1
        kwargs["max_steps"] = 4
    _, rec = run(out_dir, **kwargs)
    assert rec.counts()["on_evaluate"] == (2 if strategy == "epoch" else 3)
