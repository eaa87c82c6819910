"""The live page's interactions in a real browser (issue 41; Qt WebEngine from the test extras): hover shows the
values, a dragged box zooms (every chart on the same x with it) and a double-click resets, the smoothing slider
changes the smoothed curve, the x axis and the log scale are chosen on the page, runs are hidden from the table, a
chart's data comes as CSV, and a run killed with SIGKILL turns to "stopped unexpectedly"."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

import pytest

from tests.common.timing import hang_timeout
from tests.test_report_browser import _qt_missing
from tests.test_report_watch_state import kill, start_child, wait_for_checkpoint
from trainwell.report.watch import watch_runs

_POLL = 0.2  # seconds between two looks for the browser's answer (not a limit)

# Runs the JavaScript of each line read from stdin ({"id": N, "js": "..."}) on the page; prints "RESULT N <json>".
_QT_DRIVER = """
import json, queue, sys, threading
from PyQt6.QtCore import QTimer, QUrl
from PyQt6.QtWidgets import QApplication
from PyQt6.QtWebEngineWidgets import QWebEngineView
app = QApplication(sys.argv[:1])
view = QWebEngineView()
view.resize(1280, 900)
commands = queue.Queue()
def read():
    for line in sys.stdin:
        commands.put(json.loads(line))
    commands.put(None)
threading.Thread(target=read, daemon=True).start()
def tick():
    while not commands.empty():
        command = commands.get()
        if command is None:
            app.quit()
            return
        view.page().runJavaScript(command["js"], lambda r, n=command["id"]: print("RESULT", n, json.dumps(r),
                                                                                   flush=True))
view.load(QUrl(sys.argv[1]))
view.show()
timer = QTimer()
timer.timeout.connect(tick)
timer.start(50)
app.exec()
"""

# Helpers on the page for the commands: a chart's state, and synthetic pointer events at a fraction of its plot area.
_HELPERS = r"""
window.T = {
  chart: function (key) {
    var f = document.querySelector('figure[data-key="' + key + '"]'); if (!f) { return null; }
    var s = f.querySelector('svg'), out = {};
    ['points', 'x0', 'x1', 'y0', 'y1', 'xkind'].forEach(function (k) { out[k] = s.getAttribute('data-' + k); });
    out.title = f.querySelector('figcaption .title').textContent;
    out.tip = f.querySelector('.tip').style.display === 'block' ? f.querySelector('.tip').textContent : '';
    out.curves = Array.prototype.map.call(f.querySelectorAll('g[data-series]'), function (g) {
      return [Number(g.getAttribute('data-run')), g.getAttribute('data-series'), Number(g.getAttribute('data-last'))];
    });
    return out;
  },
  at: function (key, type, fx, fy, deltaY) {
    var s = document.querySelector('figure[data-key="' + key + '"] svg'), b = s.getBoundingClientRect();
    var x = b.left + b.width * (62 + fx * 526) / 600, y = b.top + b.height * (12 + fy * 252) / 300;
    var init = {clientX: x, clientY: y, bubbles: true, cancelable: true, deltaY: deltaY || 0};
    s.dispatchEvent(type === 'wheel' ? new WheelEvent(type, init) : new MouseEvent(type, init));
  },
  drag: function (key, a, b) {
    T.at(key, 'mousedown', a, 0.05); T.at(key, 'mousemove', (a + b) / 2, 0.5); T.at(key, 'mouseup', b, 0.95);
  },
  set: function (id, value) {
    var e = document.getElementById(id); e.value = value;
    e.dispatchEvent(new Event(e.tagName === 'SELECT' ? 'change' : 'input', {bubbles: true}));
  },
  rows: function () {
    return Array.prototype.map.call(document.querySelectorAll('#runs tr[data-state]'), function (r) {
      return [r.getAttribute('data-state'), r.lastChild.textContent]; });
  }
};
true
"""


class Browser:
    """The page in Qt WebEngine in a child process; ``js(code)`` is what ``code`` evaluates to there."""

    def __init__(self, url: str) -> None:
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "QTWEBENGINE_CHROMIUM_FLAGS": "--disable-gpu"}
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env["QTWEBENGINE_DISABLE_SANDBOX"] = "1"
        self.proc = subprocess.Popen([sys.executable, "-c", _QT_DRIVER, url], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.results: queue.Queue = queue.Queue()
        self.count = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                _, number, value = line.rstrip("\n").split(" ", 2)
                self.results.put((int(number), json.loads(value)))

    def js(self, code: str):
        self.count += 1
        self.proc.stdin.write(json.dumps({"id": self.count, "js": code}) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + hang_timeout(60)
        while time.monotonic() < deadline:
            try:
                number, value = self.results.get(timeout=_POLL)
            except queue.Empty:
                if self.proc.poll() is not None:
                    pytest.fail(f"the browser ended (exit {self.proc.returncode}): {self.proc.stderr.read()[-3000:]}")
                continue
            if number == self.count:
                return value
        pytest.fail(f"the browser did not answer {code[:80]!r} within the hang guard")

    def wait(self, code: str, condition, what: str):
        """``code``'s value once ``condition(value)`` holds (the page redraws each second)."""
        deadline = time.monotonic() + hang_timeout(60)
        while time.monotonic() < deadline:
            value = self.js(code)
            if condition(value):
                return value
            time.sleep(0.1)
        pytest.fail(f"{what}: not shown within the hang guard; the page shows {value}")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=hang_timeout(30))
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def _static_run(folder) -> None:
    folder.mkdir()
    history = [{"loss": 3.0 / (1 + i) + (0.3 if i % 2 else -0.3) / (1 + i), "learning_rate": 0.1, "epoch": i / 10,
                "step": i} for i in range(1, 401)]  # 400 steps: the live run's few do not widen the x range
    state = {"global_step": 400, "max_steps": 400, "log_history": history}
    (folder / "trainer_state.json").write_text(json.dumps(state))


def test_hover_zoom_smoothing_and_a_killed_run_in_a_browser(tmp_path):
    missing = _qt_missing()
    if missing:
        pytest.skip(missing)
    static, live = tmp_path / "static", tmp_path / "live"
    _static_run(static)
    server = watch_runs([str(static), str(live)], ["static", "live"], interval=0.25, smoothing=0.5)
    proc = start_child(live)  # named before its folder exists: the page waits for it
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    page = Browser(server.url)
    try:
        page.wait("document.body.getAttribute('data-version')", bool, "the first drawing")
        assert page.js(_HELPERS) is True
        wait_for_checkpoint(live, proc)
        rows = page.wait("T.rows()", lambda r: len(r) == 2 and r[1][0] == "training", "the live run training")
        assert rows[0][1] == "training, or stopped before its end"  # no heartbeat in a finished run's state only
        before = page.js("T.chart('loss')")
        assert before["xkind"] == "step" and float(before["x1"]) == 400
        # hover: the values of every shown run at the pointer
        # hovered again until the live run's first losses reached the chart (its state can arrive before them)
        tip = page.wait("(T.at('loss', 'mousemove', 0.5, 0.5), T.chart('loss').tip)", lambda t: "live:" in (t or ""),
                        "the live run's value under the pointer")
        assert re.search(r"static: train loss = [\d.]+ \(smoothed [\d.]+\), step \d+", tip), tip
        assert re.search(r"live: train loss = [\d.]+( \(smoothed [\d.]+\))?, step \d+, at (\d+m)?\d+s", tip), tip
        page.js("T.set('smoothing', '0.5')")  # a redraw (new data does the same): the values stay shown
        assert page.js("T.chart('loss').tip").split("live:")[0] == tip.split("live:")[0]
        # zoom: a box over the middle half, the page redrawn mid-drag (the redraw waits for the drag's end); the
        # learning rate's chart (same x) follows; a double-click resets
        page.js("T.at('loss', 'mousedown', 0.25, 0.05); T.set('smoothing', '0.5'); T.at('loss', 'mousemove', 0.5, 0.5);"
                " T.at('loss', 'mouseup', 0.75, 0.95)")
        zoomed, linked = page.js("T.chart('loss')"), page.js("T.chart('learning_rate')")
        span = float(before["x1"]) - float(before["x0"])
        assert abs(float(zoomed["x1"]) - float(zoomed["x0"]) - span / 2) < span * 0.02, (before, zoomed)
        assert (linked["x0"], linked["x1"]) == (zoomed["x0"], zoomed["x1"])
        assert float(zoomed["y1"]) < float(before["y1"])  # the box's y range: the top of the chart cut off
        page.js("T.at('loss', 'dblclick', 0.5, 0.5)")
        assert page.js("T.chart('loss').x0") == before["x0"]
        page.js("T.at('loss', 'wheel', 0.5, 0.5, -100)")  # the wheel towards the chart: x zooms in at the pointer
        wheeled = page.js("T.chart('loss')")
        assert float(before["x0"]) < float(wheeled["x0"]) < float(wheeled["x1"]) < float(before["x1"]), wheeled
        page.js("document.getElementById('reset').click()")
        assert page.js("T.chart('loss').x1") == before["x1"]
        # the slider: 0.5 (--smooth) to 0.95 changes the smoothed curve; 0 draws none
        smoothed = {c[1]: c[2] for c in page.js("T.chart('loss').curves") if c[0] == 0}
        page.js("T.set('smoothing', '0.95')")
        heavier = {c[1]: c[2] for c in page.js("T.chart('loss').curves") if c[0] == 0}
        assert heavier["train loss"] == smoothed["train loss"]  # the raw curve stays
        assert heavier["train loss (smoothed)"] != smoothed["train loss (smoothed)"]
        page.js("T.set('smoothing', '0')")
        assert "train loss (smoothed)" not in [c[1] for c in page.js("T.chart('loss').curves")]
        # the x axis and the log scale, chosen on the page
        page.js("T.set('xaxis', 'epoch')")
        epoch = page.js("T.chart('loss')")
        assert epoch["xkind"] == "epoch" and float(epoch["x1"]) <= 40.0, epoch
        assert page.js("Array.prototype.map.call(document.querySelectorAll('#xaxis option'), o => o.value)") == [
            "step", "epoch", "time"]  # no run logged input tokens; the live run's lines have times
        page.js("T.set('xaxis', 'time')")
        assert {c[0] for c in page.js("T.chart('loss').curves")} == {1}  # the static run has no live log
        page.js("T.set('xaxis', 'step')")
        log = page.js("T.chart('loss').title")
        page.js("document.querySelector('figure[data-key=loss] button.log').click()")
        assert page.js("T.chart('loss').title") != log
        # CSV of what the chart shows; hiding a run takes it off every chart
        text = page.js("window.trainwellCsv('loss')")
        assert text.startswith("run,series,step,x,value,smoothed\n") and "\nstatic,train loss,400,400," in text
        page.js("document.querySelector('input.show[data-run=\"0\"]').click()")
        assert {c[0] for c in page.js("T.chart('loss').curves")} == {1}
        assert "\nstatic," not in page.js("window.trainwellCsv('loss')")
        # system metrics beside the curves
        assert page.js("T.chart('system_cpu_percent') !== null") is True
        kill(proc)
        rows = page.wait("T.rows()", lambda r: r[1][0] == "stopped", "the killed run")
        assert rows[1][1].startswith("stopped unexpectedly at step ") and "resume from checkpoint-" in rows[1][1]
    finally:
        if proc.poll() is None:
            kill(proc)
        page.close()
        server.shutdown()
        server.watcher.stop()
        server.server_close()
