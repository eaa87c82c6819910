"""The report marks what healed or stopped a run: skipped non-finite steps, rollbacks and step_timeout stops, on the
loss plot and in the sessions table (docs/resilience.md). The histories are written by hand, in the form
tests/test_nonfinite_steps.py, tests/test_rollback.py and tests/test_step_timeout.py check trainwell writes."""

from __future__ import annotations

import json
import os
import threading

import pytest

from trainwell.report import load_run
from trainwell.report.history import summary_text
from trainwell.report.incidents import incidents, read_stops
from trainwell.report.tables import session_rows

ROLLBACK = {"rollback": 1, "rollback_to_step": 6, "skipped_steps_from": 7, "skipped_steps_to": 8,
            "spike_loss": 812.5, "spike_median": 1.02, "step": 8}
STOP = {"step": 11, "processes": [1], "frame": "script.py:36 in on_step_end", "doing": "a callback's on_step_end",
        "seconds": 3.0, "time": 0.0}


def _run(tmp_path, stops=(STOP,)):
    history = [{"loss": 2.0 - 0.1 * step, "learning_rate": 0.1, "epoch": step / 24, "step": step}
               for step in (2, 4, 6)]
    history[1]["skipped_nonfinite_steps"] = 2
    history += [ROLLBACK, {"loss": 1.2, "learning_rate": 0.1, "epoch": 0.41, "step": 10}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 10, "max_steps": 12,
                                                             "log_history": history}))
    (tmp_path / "step_timeout.jsonl").write_text("".join(json.dumps(s) + "\n" for s in stops) + "not json\n")
    return load_run(tmp_path)


def test_incidents_are_read_from_the_history_and_the_stop_file(tmp_path):
    run = _run(tmp_path)
    found = incidents(run)
    assert found.skipped == [(4, 2)] and found.rollbacks == [ROLLBACK] and found.stops == [STOP]
    # events are not curves: no figure of "rollback_to_step" or "spike_loss"
    assert not {"skipped_nonfinite_steps", "spike_loss", "rollback", "skipped_steps_to"} & set(run.series)


def test_the_sessions_table_counts_them_and_says_how_the_run_ended(tmp_path):
    run = _run(tmp_path)
    [row] = session_rows(run)
    assert row["skipped steps"] == "2"
    assert row["rollbacks"] == "to 6 (steps 7-8 skipped)"
    assert row["ended"] == "stopped by step_timeout at step 11 (process 1 stuck in script.py:36 in on_step_end)"
    assert "sessions:" in summary_text(run)  # shown for one session when something happened in it


def test_a_stop_file_behind_a_link_is_not_read(tmp_path):
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps(STOP) + "\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _run(run_dir, stops=())
    os.remove(run_dir / "step_timeout.jsonl")
    os.symlink(elsewhere, run_dir / "step_timeout.jsonl")
    assert incidents(load_run(run_dir)).stops == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_stop_file_that_is_a_fifo_is_not_waited_on(tmp_path):
    """A FIFO at the stop file's name: opening it for reading would wait for a writer forever (the report hung)."""
    _run(tmp_path, stops=())
    os.remove(tmp_path / "step_timeout.jsonl")
    os.mkfifo(tmp_path / "step_timeout.jsonl")
    found = []
    reader = threading.Thread(target=lambda: found.append(read_stops(tmp_path)), daemon=True)
    reader.start()
    reader.join(10)
    assert found == [[]]


def test_the_loss_plot_marks_them(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    from trainwell.report.plots import run_figures

    for x in ("step", "epoch"):
        ax = run_figures(_run(tmp_path), x=x)["loss"].axes[0]
        labels = [line.get_label() for line in ax.get_lines()]
        assert "skipped non-finite steps (2)" in labels, labels
        assert [p.get_label() for p in ax.patches] == ["rollback: steps skipped"]
        texts = [t.get_text() for t in ax.texts]
        assert " rollback 1" in texts and " step_timeout at step 11" in texts, texts
