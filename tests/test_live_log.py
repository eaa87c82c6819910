"""The live log (``OUTPUT_DIR/live_log.jsonl``, issue 34): each log entry in the run folder as it is logged, between
checkpoints too, so a report (and the live page) shows a run up to its last log; its session lines make a
resume point exact in the report. Written atomically, never through a link, never blocking on a FIFO; read back
as a hostile file."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.loop.live_log import LIVE_LOG_NAME, MAX_LINE_BYTES, LiveLog
from trainwell.report import load_run, summary
from trainwell.report.live import LiveLogReader, merge_state
from trainwell.report.live_reader import parse_lines, rebuild


class Peek(TrainerCallback):
    """At each log: the live log's entries and the checkpoints there are at that moment."""

    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        lines = (open(os.path.join(args.output_dir, LIVE_LOG_NAME), encoding="utf-8").read().splitlines())
        checkpoints = sorted(n for n in os.listdir(args.output_dir) if n.startswith("checkpoint-"))
        self.seen.append((json.loads(lines[-1])["log"], state.log_history[-1], checkpoints))


class CrashAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError("crash")


def _trainer(out, callbacks=(), **overrides):
    args = dict(output_dir=str(out), max_steps=30, logging_steps=4, save_steps=7, report_to="live",
                disable_tqdm=True, use_cpu=True)
    return Trainer(model=RegressionModel(), args=TrainingArguments(**{**args, **overrides}),
                   train_dataset=RegressionDataset(length=64), callbacks=list(callbacks))


def _records(out):
    return [json.loads(line) for line in (out / LIVE_LOG_NAME).read_text().splitlines()]


def test_each_log_is_in_the_live_log_when_it_is_logged(tmp_path):
    peek = Peek()
    _trainer(tmp_path, [peek], max_steps=12, save_steps=10).train()
    assert [entry for entry, _, _ in peek.seen] == [logged for _, logged, _ in peek.seen]  # exactly the history's
    assert [c for _, _, c in peek.seen[:2]] == [[], []]  # steps 4 and 8: before any checkpoint
    records = _records(tmp_path)
    assert records[0]["session"] == {"start_step": 0, "resumed_from": None, "max_steps": 12,
                                     "num_input_tokens_seen": 0}
    assert all(isinstance(r["time"], float) for r in records) and "train_loss" in records[-1]["log"]


def test_a_fresh_start_replaces_the_file_and_a_resume_appends_its_session(tmp_path):
    _trainer(tmp_path, max_steps=8).train()
    first = _records(tmp_path)
    _trainer(tmp_path, max_steps=8).train()  # a fresh run in the same folder: its own history only
    assert len(_records(tmp_path)) == len(first)
    _trainer(tmp_path, max_steps=12).train(resume_from_checkpoint=str(tmp_path / "checkpoint-7"))
    sessions = [r["session"] for r in _records(tmp_path) if "session" in r]
    assert [(s["start_step"], s["resumed_from"], s["max_steps"]) for s in sessions] == [
        (0, None, 8), (7, "checkpoint-7", 12)]


def test_the_report_marks_each_resume_at_its_checkpoint_step(tmp_path):
    """Crashes between logging steps leave no mark in the history (no summary, no step going back): the history
    alone misses a resume or only brackets it; the live log's session lines give 7 and 14."""
    for crash in (10, 17):
        with pytest.raises(RuntimeError, match="crash"):
            _trainer(tmp_path, [CrashAt(crash)]).train(resume_from_checkpoint=crash != 10 or None)
    _trainer(tmp_path).train(resume_from_checkpoint=True)
    run = load_run(tmp_path)
    assert [s.start_step for s in run.sessions] == [0, 7, 14]
    assert summary(run)["sessions"].startswith("3 (resumed at steps 7, 14)")
    os.unlink(tmp_path / LIVE_LOG_NAME)
    assert [s.start_step for s in load_run(tmp_path).sessions] != [0, 7, 14]  # the history alone cannot tell


def test_the_report_of_a_running_run_reaches_its_last_log(tmp_path):
    with pytest.raises(RuntimeError, match="crash"):
        _trainer(tmp_path, [CrashAt(13)]).train()  # logs at 4, 8, 12; a checkpoint at 7 only
    run = load_run(tmp_path)
    assert run.state_path.endswith("checkpoint-7/trainer_state.json")
    assert [step for step, _ in run.series["loss"]] == [4, 8, 12] and run.state["global_step"] == 12
    assert [s for s, _ in load_run(tmp_path / "checkpoint-7").series["loss"]] == [4]  # a checkpoint: as saved
    shutil.rmtree(tmp_path / "checkpoint-7")  # no state file at all: the live log alone
    run = load_run(tmp_path)
    assert run.state_path.endswith(LIVE_LOG_NAME) and [s for s, _ in run.series["loss"]] == [4, 8, 12]
    assert summary(run)["steps"] == "12 / 30"


def test_merging_takes_the_live_entries_after_the_states_last_one():
    live = rebuild([{"session": {"start_step": 0}}, {"log": {"loss": 1.0, "step": 1}},
                    {"log": {"loss": 0.5, "step": 2}}, {"log": {"loss": 0.25, "step": 3}}])
    state = {"global_step": 2, "max_steps": 9, "log_history": [{"loss": 1.0, "step": 1}, {"loss": 0.5, "step": 2}]}
    merged = merge_state(state, live)
    assert [e["step"] for e in merged["log_history"]] == [1, 2, 3] and merged["global_step"] == 3
    assert state["global_step"] == 2 and len(state["log_history"]) == 2  # not modified
    other = {"global_step": 1, "max_steps": 9, "log_history": [{"loss": 7.0, "step": 1}]}
    assert merge_state(other, live) is other  # another run's live log: left out
    # a resume drops what the earlier call logged after the checkpoint, and its end-of-train() summary
    resumed = rebuild([{"log": {"loss": 0.1, "step": 4}}, {"log": {"train_loss": 0.3, "step": 3}},
                       {"session": {"start_step": 3, "resumed_from": "checkpoint-3"}}], live)
    assert [e["step"] for e in resumed.entries] == [1, 2, 3] and not any("train_loss" in e for e in resumed.entries)


def test_a_rollback_inside_a_call_drops_the_discarded_steps_and_keeps_one_session():
    """rollback_on_spike goes back to a checkpoint inside the same train() call: its session line is marked, the
    steps after the checkpoint are dropped as for a resume, and the call stays one session."""
    live = rebuild([{"session": {"start_step": 0}}, *({"log": {"loss": 1.0, "step": s}} for s in (2, 4, 6, 8)),
                    {"session": {"start_step": 6, "resumed_from": "checkpoint-6", "rollback": True}},
                    {"log": {"rollback": 1, "rollback_to_step": 6, "step": 8}}, {"log": {"loss": 1.0, "step": 10}}])
    assert [s["start_step"] for s in live.sessions] == [0]
    assert [e["step"] for e in live.entries] == [2, 4, 6, 8, 10] and "rollback" in live.entries[3]
    # a call that resumed at 10 and rolled back to 6 starts at 6 now, still one session after the first
    later = rebuild([{"session": {"start_step": 10, "resumed_from": "checkpoint-10"}},
                     {"session": {"start_step": 6, "resumed_from": "checkpoint-6", "rollback": True}}], live)
    assert [(s["start_step"], s.get("resumed_from")) for s in later.sessions] == [(0, None), (6, "checkpoint-10")]


def test_lines_that_are_not_records_are_skipped():
    good = json.dumps({"log": {"loss": 1.0, "step": 1}}).encode()
    data = b"\n".join([good, b"not json", b"[1]", b'{"log": 3}', b"x" * (MAX_LINE_BYTES + 1), good, b'{"log": {'])
    records, consumed, skipped = parse_lines(data)
    assert len(records) == 2 and skipped == 4 and consumed == data.rfind(b"\n") + 1  # the unfinished line waits


def test_the_writer_never_writes_through_a_link_nor_blocks(tmp_path, caplog):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / LIVE_LOG_NAME).symlink_to(victim)
    log = LiveLog.begin(str(run), 5, str(run / "checkpoint-5"), 10)  # a resume appends: refused
    log.append({"loss": 1.0, "step": 6})
    assert log.broken and "it is a symbolic link" in caplog.text and victim.read_text() == "precious\n"
    assert LiveLogReader(run).poll() is False  # the reader does not follow it either
    LiveLog.begin(str(run), 0, None, 10)  # a fresh start replaces the link by a file
    assert not (run / LIVE_LOG_NAME).is_symlink() and victim.read_text() == "precious\n"
    if hasattr(os, "mkfifo"):
        os.unlink(run / LIVE_LOG_NAME)
        os.mkfifo(run / LIVE_LOG_NAME)
        assert LiveLog.begin(str(run), 5, "checkpoint-5", 10).broken  # no reader on the FIFO: fails, never waits
        assert LiveLogReader(run).poll() is False


def test_the_reader_takes_only_what_was_added(tmp_path):
    reader = LiveLogReader(tmp_path)
    log = LiveLog.begin(str(tmp_path), 0, None, 10)
    assert reader.poll() and reader.history.entries == [] and reader.history.complete
    assert reader.poll() is False
    log.append({"loss": 1.0, "step": 1})
    assert reader.poll() and reader.history.entries == [{"loss": 1.0, "step": 1}]
    LiveLog.begin(str(tmp_path), 0, None, 10)  # replaced by a fresh run: read again from its start
    assert reader.poll() and reader.history.entries == []


def test_a_plain_run_writes_no_live_log_and_the_watch_follows_it_from_its_checkpoints(tmp_path):
    # The reference's users count the entries of output_dir (its test_best_model_checkpoint_behavior does): with
    # report_to="none" the folder holds what the reference's holds; the live log is asked for with "live".
    from trainwell.report.watch import WatchedRun

    with pytest.raises(RuntimeError, match="crash"):
        _trainer(tmp_path, [CrashAt(15)], report_to="none").train()  # logs at 4, 8, 12; checkpoints at 7, 14
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-14", "checkpoint-7"]
    watched = WatchedRun(tmp_path, "run")
    assert watched.refresh()
    assert [step for step, _ in watched.run.series["loss"]] == [4, 8, 12]
    assert watched.run.state_path.endswith("checkpoint-14/trainer_state.json")


def test_live_is_a_report_to_switch_that_all_never_picks():
    from trainwell.args.normalize import normalize_report_to
    from trainwell.integrations import reporting_callbacks

    assert normalize_report_to(["live", "jsonl"]) == ["live", "jsonl"]
    assert "live" not in normalize_report_to("all")
    assert [type(c).__name__ for c in reporting_callbacks(["live", "jsonl"])] == ["JsonlLoggerCallback"]
    with pytest.raises(ValueError, match="'liv' is not a tracker.*'live'"):
        normalize_report_to("liv")
