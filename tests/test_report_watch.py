"""``trainwell report --watch`` (issue 34): a page on localhost that follows runs while they train.

In a real browser (Qt WebEngine, as ``test_report_browser.py`` uses: ``pip install PyQt6-WebEngine``), a run trains
in this process while the page is open, and each of its logs must appear on the page within a few seconds, before
the run logs again. Without a browser: the server answers only GET on / and /data from a loopback Host, writes
nothing, and treats every file of a run folder as hostile (a FIFO, a link, garbage lines, a huge line).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.test_report_browser import _qt_missing
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.loop.live_log import LIVE_LOG_NAME
from trainwell.report.watch import watch_runs

# Polls the page every 0.2 s and prints what it shows, as one JSON line, until a file named by argv[2] appears.
_QT_WATCHER = """
import json, os, sys
from PyQt6.QtCore import QTimer, QUrl
from PyQt6.QtWidgets import QApplication
from PyQt6.QtWebEngineWidgets import QWebEngineView
url, stop = sys.argv[1], sys.argv[2]
app = QApplication(sys.argv[:1])
view = QWebEngineView()
view.resize(1280, 900)
PROBE = '''JSON.stringify({version: document.body.getAttribute('data-version'),
  figures: Array.prototype.map.call(document.querySelectorAll('figure'), function (f) {
    return [f.getAttribute('data-key'), Number(f.querySelector('svg').getAttribute('data-points')),
            f.querySelector('figcaption .title').textContent]; }),
  curves: Array.prototype.map.call(document.querySelectorAll('figure[data-key=loss] g'), function (g) {
    return [Number(g.getAttribute('data-run')), g.getAttribute('data-series'), Number(g.getAttribute('data-points'))];
  }),
  rows: document.querySelectorAll('#runs tr').length - 1, text: document.getElementById('runs').textContent,
  status: document.getElementById('status').textContent, width: document.documentElement.scrollWidth,
  viewport: document.documentElement.clientWidth,
  fetched: performance.getEntriesByType('resource').map(function (r) { return r.name; })})'''
def shown(result):
    print("STATE " + str(result), flush=True)
def tick():
    if os.path.exists(stop):
        app.quit()
    view.page().runJavaScript(PROBE, shown)
view.load(QUrl(url))
view.show()
timer = QTimer()
timer.timeout.connect(tick)
timer.start(200)
QTimer.singleShot(180000, app.quit)
app.exec()
"""


class PageWatcher:
    """The browser in a child process; ``latest`` is the last thing it reported the page showing."""

    def __init__(self, url: str, stop_file: str) -> None:
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "QTWEBENGINE_CHROMIUM_FLAGS": "--disable-gpu"}
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            env["QTWEBENGINE_DISABLE_SANDBOX"] = "1"
        self.stop_file = stop_file
        self.proc = subprocess.Popen([sys.executable, "-c", _QT_WATCHER, url, stop_file], env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.latest: dict = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("STATE {"):  # "STATE None" while the page is loading
                self.latest = json.loads(line[len("STATE "):])

    def points(self, key: str) -> int:
        return {k: n for k, n, _ in self.latest.get("figures") or []}.get(key, 0)

    def train_loss_points(self, run: int) -> int:
        """Points of run ``run``'s train loss curve on the loss chart."""
        return next((n for r, label, n in self.latest.get("curves") or [] if r == run and label == "train loss"), 0)

    def wait_for(self, condition, timeout: float) -> float:
        """Seconds until ``condition(latest)`` held; fails after ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.latest and condition(self.latest):
                return time.monotonic() - start
            if self.proc.poll() is not None:
                pytest.fail(f"the browser ended (exit {self.proc.returncode}): {self.proc.stderr.read()[-3000:]}")
            time.sleep(0.05)
        pytest.fail(f"not shown within {timeout} s; the page shows {self.latest}")

    def close(self) -> None:
        open(self.stop_file, "w").close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class WaitForThePage(TrainerCallback):
    """At each log, waits until the page shows it (the train loss curve has one more point): the run goes on only
    once the browser has seen its last log, so every log is checked while the run is still training."""

    def __init__(self, page: PageWatcher) -> None:
        self.page, self.delays, self.checkpoints, self.states = page, [], [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in (logs or {}):
            self.checkpoints.append(sorted(n for n in os.listdir(args.output_dir) if n.startswith("checkpoint-")))
            expected = sum(1 for e in state.log_history if "loss" in e)
            self.delays.append(self.page.wait_for(lambda _: self.page.train_loss_points(0) >= expected, timeout=20))
            self.states.append(self.page.latest["text"])


def test_a_run_is_followed_live_in_a_browser(tmp_path):
    missing = _qt_missing()
    if missing:
        pytest.skip(missing)
    out, other = tmp_path / "live-run", tmp_path / "other-run"
    other.mkdir()
    (other / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 4, "log_history": [
        {"loss": 3.0 - i / 2, "learning_rate": 0.1, "step": i} for i in range(1, 5)]}))
    out.mkdir()  # the page is opened before the run starts: it waits for the run's first log
    server = watch_runs([str(out), str(other)], ["live-run", "other-run"], interval=0.25)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    page = PageWatcher(server.url, str(tmp_path / "stop"))
    try:
        page.wait_for(lambda s: s.get("version") and s["rows"] == 2, timeout=90)  # the browser starts, the page draws
        assert "nothing to show yet" in page.latest["text"] and page.train_loss_points(1) == 4  # the other run's
        assert page.train_loss_points(0) == 0
        waiting = WaitForThePage(page)
        args = TrainingArguments(output_dir=str(out), max_steps=12, logging_steps=3, save_steps=100,
                                 report_to="live", disable_tqdm=True, use_cpu=True)
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64),
                          callbacks=[waiting])
        trainer.train()
        assert len(waiting.delays) == 4 and max(waiting.delays) < 20, waiting.delays
        # while it trained, the table showed the run as training (not the waiting note it had before its first log);
        # the other run, without a live log and so without a heartbeat, may be training or stopped
        assert all(s.count("training, or stopped before its end") == 1 and s.count("training") == 2
                   for s in waiting.states), waiting.states
        assert waiting.checkpoints == [[]] * 4  # no checkpoint yet at any log: the page read the live log
        page.wait_for(lambda s: "finished" in s["text"], timeout=20)  # the summary entry: train() returned
        state = page.latest
        assert [(k, c) for k, _, c in state["figures"]][:3] == [
            ("loss", "loss (log scale)"), ("learning_rate", "learning rate"), ("grad_norm", "grad norm")]
        assert state["status"] == ""  # the server answered every poll
        assert "live-run" in state["text"] and "other-run" in state["text"] and "12 / 12" in state["text"]
        assert state["width"] <= state["viewport"]  # nothing sticks out sideways
        assert all(re.match(r"http://127\.0\.0\.1:\d+/data\?since=", u) for u in state["fetched"]), state["fetched"]
    finally:
        page.close()
        server.shutdown()
        server.watcher.stop()
        server.server_close()


# --- the server, without a browser ----------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 9, "log_history": [
        {"loss": 2.0, "step": 1}, {"loss": 1.5, "eval_acc/../x": 0.5, "step": 2}]}))
    server = watch_runs([str(run)], ["<b>run</b>"], interval=0.1)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server, run
    server.shutdown()
    server.watcher.stop()
    server.server_close()


def _get(server, path, host=None, method="GET", token=True):
    """``(status, headers, body)`` of a request to ``path``, with the server's token unless ``token`` is False."""
    if token:
        path += ("&" if "?" in path else "?") + f"token={server.token}"
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.request(method, path, headers={"Host": host or f"127.0.0.1:{server.port}"})
    response = connection.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def test_the_server_answers_get_from_loopback_only_and_writes_nothing(served):
    server, run = served
    before = sorted(os.listdir(run))
    assert server.url.startswith("http://127.0.0.1:") and server.socket.getsockname()[0] == "127.0.0.1"
    code, headers, body = _get(server, "/")
    nonce = re.search(r"script-src 'nonce-([^']+)'", headers["Content-Security-Policy"]).group(1)
    assert code == 200 and f"<script nonce='{nonce}'>" in body.decode() and "connect-src 'self'" in \
        headers["Content-Security-Policy"]
    assert "<b>run</b>" not in body.decode()  # names reach the page only as JSON data
    code, headers, body = _get(server, "/data")
    data = json.loads(body)
    assert code == 200 and headers["Content-Type"].startswith("application/json")
    assert data["runs"][0]["name"] == "<b>run</b>" and data["runs"][0]["step"] == 2
    assert [f["key"] for f in data["figures"]] == ["loss", "eval_acc/../x"]
    assert json.loads(_get(server, f"/data?since={data['version']}")[2])["unchanged"] is True
    assert _get(server, "/", host="evil.example:80")[0] == 403  # DNS rebinding: another name for this address
    assert _get(server, "/", host=f"localhost:{server.port}")[0] == 200
    for method in ("POST", "PUT", "DELETE"):
        assert _get(server, "/data", method=method)[0] == 405
    assert _get(server, "/../trainer_state.json")[0] == 404
    assert sorted(os.listdir(run)) == before


def _wait_for(server, condition) -> dict:
    """The data once ``condition(data)`` holds (the watcher looks every 0.1 s; a file may be seen half written)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        data = json.loads(_get(server, "/data")[2])
        if condition(data):
            return data
        time.sleep(0.05)
    pytest.fail(f"the page never showed it; it shows {data['runs']}")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and links")
def test_hostile_files_are_reported_not_followed_and_never_block(served, tmp_path):
    server, run = served
    version = json.loads(_get(server, "/data")[2])["version"]
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"global_step": 99, "max_steps": 99, "log_history": [{"loss": 42.0, "step": 99}]}))
    checkpoint = run / "checkpoint-50"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").symlink_to(secret)  # a link: never read
    os.mkfifo(run / LIVE_LOG_NAME)  # a FIFO: opening it must not block the watcher
    time.sleep(0.5)
    data = json.loads(_get(server, "/data")[2])
    assert data["runs"][0]["step"] == 2 and data["runs"][0]["error"] is None  # the link and the FIFO are ignored
    os.unlink(run / LIVE_LOG_NAME)
    lines = [json.dumps({"session": {"start_step": 0, "resumed_from": None, "max_steps": 9}}),
             json.dumps({"log": {"loss": 1.5, "eval_acc/../x": 0.5, "step": 2}}), "not json", "[1, 2]",
             json.dumps({"log": "not an entry"}), "x" * (2 << 20), json.dumps({"log": {"loss": 1.25, "step": 3}}),
             '{"log": {"loss": 1.0, "step": 4']  # the last line is unfinished: not read yet
    (run / LIVE_LOG_NAME).write_text("\n".join(lines))
    data = _wait_for(server, lambda d: d["runs"][0]["step"] == 3)
    assert data["runs"][0]["loss"] == 1.25 and data["version"] > version
    with open(run / LIVE_LOG_NAME, "a") as f:
        f.write("}}\n")  # the line completed
    _wait_for(server, lambda d: d["runs"][0]["step"] == 4)
    (run / "trainer_state.json").write_text("{not json")
    data = _wait_for(server, lambda d: "trainer_state.json is not valid JSON" in (d["runs"][0]["error"] or ""))
    assert data["runs"][0]["step"] == 4  # the last good curves stay


def test_a_failure_reading_a_run_is_shown_and_the_watcher_goes_on(tmp_path, monkeypatch):
    from trainwell.report import watch

    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1, "max_steps": 2,
                                                             "log_history": [{"loss": 1.0, "step": 1}]}))

    def broken(*args, **kwargs):
        raise RuntimeError("something no one foresaw")

    monkeypatch.setattr(watch, "run_from_state", broken)
    watcher = watch.Watcher([watch.WatchedRun(tmp_path, "run")])
    watcher.refresh()
    run = json.loads(watcher.payload(None))["runs"][0]
    assert run["error"] == f"cannot read {tmp_path}: RuntimeError: something no one foresaw"
