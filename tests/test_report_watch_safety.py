"""The live page against a hostile machine and hostile files (issue 39): its token, values that are not finite,
a run folder gone, ``checkpoint-N`` links, idle connections, and memory bounded however long the live log."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request

import pytest

from tests.common.timing import hang_timeout
from trainwell.loop.live_log import LIVE_LOG_NAME, MAX_LINE_BYTES
from trainwell.report import load_run
from trainwell.report.live import LiveLogReader, merge_state
from trainwell.report.watch import WatchedRun, Watcher, watch_runs


def _state(step: int, loss: float = 1.0, **extra) -> str:
    return json.dumps({"global_step": step, "max_steps": 9, "log_history": [{"loss": loss, "step": step}], **extra})


@pytest.fixture
def serve():
    servers = []

    def start(paths, **kwargs):
        server = watch_runs([str(p) for p in paths], [os.path.basename(str(p)) for p in paths], interval=0.05,
                            **kwargs)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.watcher.stop()
        server.server_close()


def _fetch(server, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=hang_timeout(10)) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _data(server) -> dict:
    code, body = _fetch(server, f"/data?token={server.token}")
    assert code == 200, body
    return json.loads(body)


def _wait(server, condition) -> dict:
    """The data once ``condition(data)`` holds (the watcher looks every 0.05 s)."""
    deadline = time.monotonic() + hang_timeout(30)
    while time.monotonic() < deadline:
        data = _data(server)
        if condition(data):
            return data
        time.sleep(0.05)
    pytest.fail(f"the page never showed it; it shows {data}")


# --- the token ------------------------------------------------------------------------------------------------------


def test_the_page_and_its_data_need_the_token(serve, tmp_path):
    (tmp_path / "trainer_state.json").write_text(_state(2))
    server = serve([tmp_path])
    assert server.url == f"http://127.0.0.1:{server.port}/?token={server.token}" and len(server.token) >= 32
    for path in ("/", "/data", "/data?since=1", "/?token=", f"/?token={server.token[:-1]}",
                 f"/data?token={server.token}x", f"/data?token=a&token={server.token}x"):
        code, body = _fetch(server, path)
        assert code == 403 and b"needs its token" in body, path
        assert server.token.encode() not in body
    code, body = _fetch(server, f"/?token={server.token}")
    assert code == 200 and b"encodeURIComponent(TOKEN)" in body  # the page's script passes it on
    assert _data(server)["runs"][0]["step"] == 2
    assert _fetch(server, f"/data?a=1&b=2&c=3&d=4&token={server.token}")[0] == 400
    assert serve([tmp_path]).token != server.token  # random each time
    chosen = "a-token.chosen_by~me"
    assert serve([tmp_path], token=chosen).url.endswith(f"?token={chosen}")
    from trainwell.report.watch_server import check_token

    for bad in ("short", "has space in it!!!", "x" * 201, "é" * 20):
        with pytest.raises(ValueError, match="a token is 16 to 200 characters"):
            check_token(bad)


def test_the_cli_takes_a_token_for_watch_only(tmp_path, capsys):
    from trainwell.cli import main

    (tmp_path / "trainer_state.json").write_text(_state(2))
    assert main(["report", str(tmp_path), "--token", "a" * 20]) != 0
    assert "--token is for --watch" in capsys.readouterr().err
    assert main(["report", "--watch", str(tmp_path), "--token", "short"]) != 0
    assert "a token is 16 to 200 characters" in capsys.readouterr().err


# --- hostile values and folders -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [{"max_steps": float("nan")}, {"epoch": float("nan")}, {"global_step": float("inf")}])
def test_a_value_that_is_not_finite_is_an_error_on_the_page_and_the_watcher_goes_on(serve, tmp_path, bad):
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(_state(2)), **bad}))  # json writes NaN / Infinity
    server = serve([tmp_path])  # it used to be refused: "Out of range float values are not JSON compliant"
    key = next(iter(bad))
    data = _data(server)
    assert f"{key} is {bad[key]}, not a finite number" in data["runs"][0]["error"]
    state.write_text(_state(3, loss=0.5))
    data = _wait(server, lambda d: d["runs"][0].get("step") == 3)
    assert data["runs"][0]["error"] is None and data["runs"][0]["loss"] == 0.5
    state.write_text(json.dumps({**json.loads(_state(4)), **bad}))  # it used to kill the watcher thread
    data = _wait(server, lambda d: "not a finite number" in (d["runs"][0]["error"] or ""))  # may be seen half written
    assert data["runs"][0]["step"] == 3  # the last good data
    state.write_text(_state(5))
    _wait(server, lambda d: d["runs"][0].get("step") == 5 and d["runs"][0]["error"] is None)  # the watcher lives on


def test_a_malformed_file_and_a_run_gone_are_errors_and_the_watcher_goes_on(serve, tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    (run / "trainer_state.json").write_text(_state(2))
    (other / "trainer_state.json").write_text(_state(7))
    server = serve([run, other])
    (run / "trainer_state.json").write_text('{"log_history": [1, 2')
    data = _wait(server, lambda d: "trainer_state.json is not valid JSON" in (d["runs"][0]["error"] or ""))
    assert data["runs"][0]["step"] == 2
    shutil.rmtree(run)
    data = _wait(server, lambda d: "is gone" in (d["runs"][0]["error"] or ""))
    assert data["runs"][1]["step"] == 7 and data["runs"][1]["error"] is None
    run.mkdir()
    (run / "trainer_state.json").write_text(_state(8))
    _wait(server, lambda d: d["runs"][0].get("step") == 8 and d["runs"][0]["error"] is None)


def test_a_broken_figure_is_an_error_on_the_page_and_the_watcher_goes_on(tmp_path, monkeypatch):
    from trainwell.report import watch

    (tmp_path / "trainer_state.json").write_text(_state(2))
    monkeypatch.setattr(watch, "figures", lambda *a, **k: 1 / 0)
    watcher = Watcher([WatchedRun(tmp_path, "run")])
    watcher.refresh()
    data = json.loads(watcher.payload(None))
    assert data["error"] == "cannot draw the figures: ZeroDivisionError: division by zero"
    assert data["runs"][0]["step"] == 2 and data["figures"] == []


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_checkpoint_link_is_not_followed_by_the_page_nor_the_report(serve, tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    (other / "checkpoint-5").mkdir(parents=True)
    (other / "checkpoint-5" / "trainer_state.json").write_text(_state(5, loss=42.0))
    (run / "checkpoint-1").mkdir(parents=True)
    (run / "checkpoint-1" / "trainer_state.json").write_text(_state(1, loss=2.0))
    (run / "checkpoint-99").symlink_to(other / "checkpoint-5", target_is_directory=True)
    named = tmp_path / "named-link"  # the folder the user names may itself be a link
    named.symlink_to(run, target_is_directory=True)
    for path in (run, named):
        loaded = load_run(path)
        assert loaded.state["global_step"] == 1 and "checkpoint-1" in loaded.state_path, path
    server = serve([run, named])
    for status in _data(server)["runs"]:
        assert status["step"] == 1 and status["loss"] == 2.0 and status["error"] is None


# --- connections ----------------------------------------------------------------------------------------------------


def _silent_connection(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=hang_timeout(30))
    sock.sendall(b"GET /data HTTP/1.1\r\n")  # a request begun, never finished
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass  # the 408 some versions send before closing
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def _wait_for_threads(condition) -> None:
    deadline = time.monotonic() + hang_timeout(20)
    while not condition(threading.active_count()):
        assert time.monotonic() < deadline, threading.enumerate()
        time.sleep(0.02)


def test_idle_connections_time_out_and_are_bounded(tmp_path):
    from trainwell.report.watch_server import WatchServer

    (tmp_path / "trainer_state.json").write_text(_state(2))
    watcher = Watcher([WatchedRun(tmp_path, "run")])
    watcher.refresh()
    server = WatchServer(watcher, idle_timeout=0.5, max_connections=3)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        baseline = threading.active_count()
        started = time.monotonic()
        assert _closed_within(_silent_connection(server.port), 20)  # it used to wait for ever
        assert time.monotonic() - started < 10
        server.idle_timeout = 60
        _wait_for_threads(lambda n: n <= baseline)  # its thread ended: its slot is free again
        idle = [_silent_connection(server.port) for _ in range(3)]
        _wait_for_threads(lambda n: n >= baseline + 3)  # each served by a thread of its own
        threads = threading.active_count()
        assert _closed_within(_silent_connection(server.port), 20)  # a fourth: closed at once, no thread for it
        assert threading.active_count() <= threads
        for sock in idle:
            sock.close()  # their slots come free
        deadline = time.monotonic() + hang_timeout(20)
        while True:
            try:
                if _fetch(server, f"/data?token={server.token}")[0] == 200:
                    break
            except OSError:  # refused (closed) while the slots are still being freed
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        server.shutdown()
        server.server_close()


# --- a long live log in bounded memory ------------------------------------------------------------------------------


def _write_log(path, steps: int, eval_every: int = 100) -> None:
    with open(path, "w") as f:
        f.write(json.dumps({"session": {"start_step": 0, "resumed_from": None, "max_steps": steps}, "time": 1.0})
                + "\n")
        for step in range(1, steps + 1):
            entry = {"loss": 1.0 / step, "grad_norm": 0.5, "learning_rate": 1e-4, "epoch": step / 1000, "step": step}
            f.write(json.dumps({"log": entry, "time": 1.0}) + "\n")
            if step % eval_every == 0:
                f.write(json.dumps({"log": {"eval_loss": 2.0 / step, "epoch": step / 1000, "step": step},
                                    "time": 1.0}) + "\n")


def _peak(function) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = function()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_live_log_is_read_in_bounded_memory(tmp_path):
    _write_log(tmp_path / LIVE_LOG_NAME, 100_000)
    reader = LiveLogReader(tmp_path, max_points=500)
    _, peak = _peak(reader.poll)
    # every entry kept: about 0.9 kB each, 90 MB here (930 MB for 1,000,000 lines; benchmarks/live_memory.py)
    assert peak < 20 << 20, peak
    entries = reader.history.entries
    assert reader.thinned and len(entries) <= 6 * 500
    assert entries[0]["step"] == 1 and entries[-1]["step"] == 100_000  # the first and the newest points stay
    steps = [e["step"] for e in entries]
    assert steps == sorted(steps) and len({s for s in steps[-400:]}) >= 300  # in order, the newest all there
    evals = [e for e in entries if "eval_loss" in e]
    assert 250 <= len(evals) <= 1000 and evals[-1]["step"] == 100_000


def test_a_line_without_an_end_is_skipped_with_a_note_in_bounded_memory(tmp_path):
    log = tmp_path / LIVE_LOG_NAME
    _write_log(log, 3)
    with open(log, "a") as f:
        f.write("x" * (24 << 20))  # 24 MB with no newline: a line longer than any the writer writes
    watched = WatchedRun(tmp_path, "run")
    _, peak = _peak(watched.refresh)
    assert peak < 8 << 20, peak  # it used to hold all of it (and read it again at every look)
    assert watched.reader.skipped == 1 and watched.run.state["global_step"] == 3
    assert watched.note() == f"1 line of {LIVE_LOG_NAME} skipped (not a record, or longer than " \
                             f"{MAX_LINE_BYTES >> 20} MiB)"
    _, peak = _peak(watched.refresh)
    assert peak < 1 << 20  # nothing read again
    with open(log, "a") as f:
        f.write("xx\n" + json.dumps({"log": {"loss": 0.1, "step": 4}}) + "\n")
    deadline = time.monotonic() + hang_timeout(20)
    while watched.run.state["global_step"] != 4:  # a rebuild may wait a moment (a long history's is throttled)
        assert time.monotonic() < deadline
        watched.refresh()
        time.sleep(0.05)
    assert watched.reader.skipped == 1


def test_thinning_keeps_each_kind_of_entry_with_a_doubling_stride():
    from trainwell.report.live import thin_entries

    train = [{"loss": 1.0, "step": s} for s in range(1, 10_001)]
    evals = [{"eval_loss": 1.0, "step": s} for s in range(100, 10_001, 100)]
    entries = sorted(train + evals, key=lambda e: (e["step"], "eval_loss" in e))
    thinned = thin_entries(entries, 100)
    assert thinned[-100:] == entries[-100:] and thinned[0] == entries[0]
    old = thinned[:-100]
    assert sum("loss" in e for e in old) <= 100 and [e for e in old if "eval_loss" in e] == \
        [e for e in entries[:-100] if "eval_loss" in e]  # 99 evaluations: all kept
    odd = [{f"metric_{i}": 1.0, "step": i} for i in range(10_000)]  # every entry with keys of its own
    assert len(thin_entries(odd, 100)) <= 17 * 100 + 100


def test_a_state_is_merged_with_a_thinned_live_log(tmp_path):
    _write_log(tmp_path / LIVE_LOG_NAME, 20_000)
    reader = LiveLogReader(tmp_path, max_points=200)
    reader.poll()
    history = [{"loss": 1.0 / s, "grad_norm": 0.5, "learning_rate": 1e-4, "epoch": s / 1000, "step": s}
               for s in range(1, 1001)]  # a checkpoint at step 1000: its copy in the live log was thinned away
    state = {"global_step": 1000, "max_steps": 20_000, "log_history": history}
    assert merge_state(state, reader.history) is state  # without knowing it was thinned: the live log unused
    merged = merge_state(state, reader.history, thinned=reader.thinned)
    assert merged["global_step"] == 20_000 and merged["log_history"][:1000] == history
    steps = [e["step"] for e in merged["log_history"][1000:]]
    assert steps == sorted(steps) and steps[0] > 1000 and steps[-1] == 20_000
