"""``trainwell report --watch RUN [RUN ...]``: a page on localhost that follows runs while they train.

Owns watching the run folders and building what the page shows. Every second a background thread looks at each
run's files (``trainer_state.json`` of the folder and of its newest checkpoint: a ``stat`` each; the live log,
``live_log.jsonl``: only the bytes added since the last look) and, when something changed, rebuilds that run's
curves (``trainwell.report.history``, merged with the live log by ``trainwell.report.live``). The page
(``trainwell.report.watch_page``, served by ``trainwell.report.watch_server``) asks for them every second and
redraws, so a log shows within about two seconds. Nothing but the run folders is read, so a run on another
machine is watched through a shared disk; the training process is never contacted (its state comes from the
heartbeat it writes to the live log: ``trainwell.report.watch_state``, which on the same machine only asks the
system whether its pid still exists).

Safety: the server (``watch_server``) answers only requests carrying its token. Nothing is written. Every file is
hostile: read only when it is a regular file reached without a symbolic link (a ``checkpoint-N`` that is a link
is passed over: it could lead to another run's state), never blocking on a FIFO, a state file of at most
``MAX_STATE_BYTES``, the live log in bounded chunks with its older points thinned (``LiveLogReader``); a file
that cannot be read, a value that is not a finite number, or a run folder gone is reported on the page as that
run's error and its last good curves are kept. Nothing a file holds can stop the watcher thread. Names and metric
keys reach the page as JSON and are shown as text, never as markup.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

from trainwell.loop.live_log import LIVE_LOG_NAME, MAX_LINE_BYTES
from trainwell.report.curves import downsample, spans_decade
from trainwell.report.files import read_regular_file
from trainwell.report.history import STATE_FILE, RunHistory, parse_state, run_from_state, summary
from trainwell.report.live import LiveLogReader, merge_state
from trainwell.report.plots import plot_groups
from trainwell.report.watch_server import WatchServer
from trainwell.report.watch_state import run_state, step_axes, system_series

logger = logging.getLogger(__name__)

MAX_STATE_BYTES = 1 << 30
#: the most live-log points kept per curve (older ones thinned, ``LiveLogReader``): memory bounded however long
LIVE_POINTS = 2000
_POINTS = 400  # buckets per curve sent to the page (curves.downsample keeps about twice as many points)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_LINEAR_ONLY = frozenset({"learning_rate"})
_SPEED_UNITS = ("tokens", "samples", "steps")
_LABELS = {"loss": "train loss", "eval_loss": "validation loss"}


def _regular(path: Path) -> os.stat_result | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


class WatchedRun:
    """One run folder (or checkpoint, or state file), re-read when its files change."""

    def __init__(self, path: str | os.PathLike[str], name: str) -> None:
        self.path = Path(path)
        self.name = name
        self.reader: LiveLogReader | None = None
        self._seen = False  #: the path has existed (before that, the run is waited for)
        self.run: RunHistory | None = None
        self.error: str | None = None  #: why a file could not be read (the last good curves are kept)
        self.bad_value: str | None = None  #: a number of the state that is not finite (the last good curves kept)
        self.waiting: str | None = None  #: why there is nothing to show yet
        self._state_key: tuple[Any, ...] | None = None
        self._state: tuple[Path, dict[str, Any]] | None = None
        self._pending = False
        self._built_at = 0.0
        self._cost = 0.0
        self.state: dict[str, Any] = {}  #: what the page says of the run's state (``watch_state.run_state``)
        self.extras: dict[str, Any] = {}  #: the run's x axes besides the step, and its system metrics

    def _appeared(self) -> bool:
        """Whether the path exists; the first time it does, its live log reader is made (for a run folder)."""
        if not os.path.exists(self.path):
            return False
        if not self._seen:
            self._seen = True
            if self.path.is_dir() and not _CHECKPOINT.match(self.path.name):
                self.reader = LiveLogReader(self.path, max_points=LIVE_POINTS)
        return True

    def _candidates(self) -> list[tuple[Path, os.stat_result]]:
        """The state files a report could read: the folder's and its newest checkpoint's (or the file named)."""
        if not self.path.is_dir():
            info = _regular(self.path)
            return [(self.path, info)] if info else []
        found = [self.path / STATE_FILE]
        try:  # a checkpoint-N that is a link is passed over: it may lead anywhere, another run's state included
            steps = [(int(m.group(1)), e.name) for e in os.scandir(self.path)
                     if (m := _CHECKPOINT.match(e.name)) and e.is_dir(follow_symlinks=False)]
        except OSError:
            steps = []
        for _, name in sorted(steps, reverse=True):
            if _regular(self.path / name / STATE_FILE):
                found.append(self.path / name / STATE_FILE)
                break
        return [(p, info) for p in found if (info := _regular(p)) is not None]

    def _read_state(self) -> bool:
        """Re-read the state files when one changed (by ``stat``); True when they did. ``error`` says why the
        newest could not be read (the last good state is kept)."""
        candidates = self._candidates()
        key = tuple((str(p), i.st_ino, i.st_size, i.st_mtime_ns) for p, i in candidates)
        if key == self._state_key:
            return False
        self._state_key, self.error = key, None
        states = []
        for path, _ in candidates:
            try:
                states.append((path, parse_state(read_regular_file(path, MAX_STATE_BYTES), path)))
            except ValueError as err:
                self.error = str(err)
        if states:
            self._state = max(states, key=lambda ps: _step(ps[1]))  # the newest; a tie goes to the folder's
        return True

    def refresh(self) -> bool:
        """Look at the files again; True when what the page shows of this run changed (its state included:
        a run whose process died changes with no file changing)."""
        changed = self._refresh()
        live = self.reader.history if self.reader is not None else None
        run = self.run
        session = run.sessions[-1] if run is not None and run.sessions else None
        finished = session is not None and session.summary is not None
        state = run_state(self.path, live, run.state.get("global_step") if run else None, finished, time.time())
        if run is None:
            state = {}
        if state != self.state:
            self.state, changed = state, True
        return changed

    def _refresh(self) -> bool:
        before = self.problem
        if not self._seen and not self._appeared():
            waiting = f"waiting for {self.path} to be created (the run has not started yet)"
            changed, self.waiting = waiting != self.waiting, waiting
            return changed
        if not self._appeared():
            self.error = f"{self.path} is gone (deleted or moved?): the last curves read are kept"
            self._state_key = None
            return self.problem != before
        changed = self.reader.poll() if self.reader is not None else False
        changed = self._read_state() or changed or self._pending
        if not changed:
            return False
        now = time.monotonic()
        if now - self._built_at < 4 * self._cost:  # a long history: rebuilt at most a fifth of the time
            self._pending = True
            return self.problem != before
        self._pending, self._built_at = False, now
        live = self.reader.history if self.reader is not None else None
        path, state = self._state if self._state is not None else (None, None)
        merged = merge_state(state, live, thinned=self.reader is not None and self.reader.thinned) or state
        if merged is None:
            waiting = f"nothing to show yet: no {STATE_FILE} and no live log in {self.path} (waiting for the run)"
            changed, self.waiting = waiting != self.waiting, waiting
            return changed or self.problem != before
        source = path if path is not None else self.path / LIVE_LOG_NAME
        self.bad_value = _non_finite(merged, source)
        if self.bad_value is not None:
            return self.problem != before
        self.run, self.waiting = run_from_state(source, merged, live, self.name), None
        # built with the curves (and throttled with them), not at each payload: a long history costs a pass
        self.extras = {"axes": step_axes(self.run, live), "system": system_series(live)}
        self._cost = time.monotonic() - now
        return True

    @property
    def problem(self) -> str | None:
        """What the page says went wrong with this run (None when nothing did)."""
        return self.bad_value or self.error

    def note(self) -> str | None:
        """What the page says of the live log's lines it left out or thinned (None when none)."""
        reader = self.reader
        if reader is None or not (reader.skipped or reader.thinned):
            return None
        parts = [f"{reader.skipped} line{'s' if reader.skipped != 1 else ''} of {LIVE_LOG_NAME} skipped (not a "
                 f"record, or longer than {MAX_LINE_BYTES >> 20} MiB)"] if reader.skipped else []
        if reader.thinned:
            parts.append(f"older live-log points thinned to about {LIVE_POINTS} per curve")
        return "; ".join(parts)


def _non_finite(state: dict[str, Any], source: Path) -> str | None:
    """Why ``state`` cannot be shown (a step count or epoch that is not a finite number), or None."""
    for key in ("global_step", "max_steps", "epoch"):
        value = state.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return f"{source}: {key} is {value}, not a finite number (the last good curves are kept)"
    return None


def _clean(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None: what JSON can carry."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _step(state: dict[str, Any]) -> int:
    step = state.get("global_step")
    return step if isinstance(step, int) and not isinstance(step, bool) else -1


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _points(points: list[tuple[float, float]]) -> list[list[float | None]]:
    return [[x, _finite(y)] for x, y in downsample(points, _POINTS)]


def _status(watched: WatchedRun) -> dict[str, Any]:
    run = watched.run
    out: dict[str, Any] = {"name": watched.name, "folder": str(watched.path), "note": watched.note(),
                           "error": watched.problem or (watched.waiting if watched.run is None else None)}
    if run is None:
        return out
    state, session = run.state, run.sessions[-1] if run.sessions else None
    live = watched.reader.history if watched.reader is not None else None
    out.update({"step": state.get("global_step"), "max_steps": state.get("max_steps"),
                "sessions": len(run.sessions), "finished": session is not None and session.summary is not None,
                "last_log": live.last_time if live is not None else None,
                "resumed_at": [s.start_step for s in run.sessions[1:]],
                "start_step": session.start_step if session else 0, "state": watched.state.get("state"),
                "state_text": watched.state.get("text"), "checkpoint": watched.state.get("checkpoint"),
                **watched.extras})
    head = summary(run)
    out["summary"] = {k: v for k, v in head.items() if k not in ("run", "state file")}
    for key in ("loss", "eval_loss"):
        points = run.series.get(key)
        out[key] = _finite(points[-1][1]) if points else None
    return out


def _groups(shown: list[tuple[int, RunHistory]]) -> dict[str, list[str]]:
    """``plot_groups`` over every run's metrics, the throughput split by unit: tokens/s, samples/s and steps/s
    differ by orders of magnitude and are not one quantity, so each gets its own chart."""
    groups: dict[str, list[str]] = {}
    for _, run in shown:
        for name, keys in plot_groups(run.series).items():
            if name == "throughput":
                for key in keys:
                    unit = next((u for u in _SPEED_UNITS if key.endswith(f"{u}_per_second")), "other")
                    groups.setdefault(f"throughput_{unit}", [])
                    groups[f"throughput_{unit}"] += [key] if key not in groups[f"throughput_{unit}"] else []
                continue
            groups.setdefault(name, [])
            groups[name] += [k for k in keys if k not in groups[name]]
    return groups


def figures(runs: list[WatchedRun]) -> list[dict[str, Any]]:
    """The figures of the page: every run's metrics grouped as in the written report (``_groups``), each curve
    on the step axis and cut to a few hundred points (``curves.downsample``), each run's resume points. The page
    smooths the training series itself (its slider, which starts at the ``Watcher``'s ``smoothing``); ``smooth``
    marks them."""
    shown = [(index, w.run) for index, w in enumerate(runs) if w.run is not None]
    out = []
    for name, keys in _groups(shown).items():
        series: list[dict[str, Any]] = []
        for index, run in shown:
            for key in keys:
                points = run.series.get(key)
                if points:
                    series.append({"run": index, "key": key, "label": _LABELS.get(key, key),
                                   "points": _points(points), "smooth": not key.startswith(("eval_", "test_"))})
        values = [y for s in series for _, y in s["points"] if y is not None]
        marks = [{"run": index, "x": s.start_step, "label": f"resumed at step {s.start_step}"}
                 for index, run in shown for s in run.sessions[1:]]
        unit = name.partition("_")[2] if name.startswith("throughput_") else None
        title = f"throughput ({unit}/s)" if unit else name.replace("_", " ")
        out.append({"key": name, "title": title, "series": series, "marks": marks,
                    "log": name not in _LINEAR_ONLY and spans_decade(values)})
    return out


def _guarded_status(watched: WatchedRun) -> dict[str, Any]:
    """``_status`` made JSON-safe; a failure becomes the run's error."""
    try:
        return _clean(_status(watched))
    except Exception as err:  # noqa: BLE001 - whatever a hostile file provokes, the page says so and goes on
        return {"name": watched.name, "folder": str(watched.path), "error": f"cannot show {watched.path}: "
                f"{type(err).__name__}: {err}"}


def _guarded_refresh(run: WatchedRun) -> bool:
    """``run.refresh()``; a failure is shown as the run's error (the watcher thread must outlive any file)."""
    try:
        return run.refresh()
    except Exception as err:  # noqa: BLE001 - whatever a hostile file provokes, the page says so and goes on
        run.error = f"cannot read {run.path}: {type(err).__name__}: {err}"
        return True


class Watcher:
    """The runs being watched, refreshed by a background thread; ``payload(since)`` is what ``/data`` answers."""

    def __init__(self, runs: list[WatchedRun], interval: float = 1.0, smoothing: float | None = None,
                 x: str = "step") -> None:
        self.runs = runs
        self.x = x
        self.interval = interval
        self.smoothing = smoothing
        self.version = 0
        self._payload: bytes = b""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainwell-watch", daemon=True)

    def refresh(self) -> None:
        """Look at every run again and, when anything changed, build the next payload. Never raises: what
        goes wrong is put on the page (the run's error, or the page's when the figures cannot be built)."""
        changed = [_guarded_refresh(run) for run in self.runs]
        if not (any(changed) or not self._payload):  # the page learns of a change by the version
            return
        body: dict[str, Any] = {"version": self.version + 1, "runs": [_guarded_status(r) for r in self.runs],
                                "smoothing": self.smoothing, "x": self.x}
        try:
            body["figures"], body["error"] = _clean(figures(self.runs)), None
        except Exception as err:  # noqa: BLE001 - the table still shows, with what went wrong
            body["figures"], body["error"] = [], f"cannot draw the figures: {type(err).__name__}: {err}"
        data = json.dumps(body, allow_nan=False, default=str, separators=(",", ":")).encode("utf-8")
        with self._lock:
            self.version, self._payload = self.version + 1, data

    def payload(self, since: int | None) -> bytes:
        with self._lock:
            if since == self.version:
                return json.dumps({"version": self.version, "unchanged": True, "time": time.time()}).encode()
            return self._payload[:-1] + b',"time":' + json.dumps(time.time()).encode() + b"}"

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - refresh() catches what a file provokes; the thread must outlive a bug
                logger.exception("trainwell report --watch: refreshing the page failed; it tries again")


def watch_runs(paths: list[str], names: list[str], port: int = 0, interval: float = 1.0,
               smoothing: float | None = None, token: str | None = None, x: str = "step") -> WatchServer:
    """A started server (its watcher refreshing in the background) for the runs at ``paths``, answering requests
    that carry ``token`` (random when None; ``server.url`` holds it); call ``serve_forever()`` on it, and
    ``shutdown()`` and ``watcher.stop()`` to end it. ``x``: the page's first x axis (one of ``curves.AXES``); a path
    that does not exist yet is waited for."""
    watcher = Watcher([WatchedRun(p, n) for p, n in zip(paths, names)], interval, smoothing, x)
    server = WatchServer(watcher, port, token)
    watcher.start()
    return server


__all__ = ["MAX_STATE_BYTES", "WatchServer", "WatchedRun", "Watcher", "figures", "watch_runs"]
