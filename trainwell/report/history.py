"""Reading a run: ``trainer_state.json`` (written by trainwell or by the reference Trainer) into series.

Owns finding the state file of a run folder, turning ``log_history`` into per-metric ``(step, value)``
series (the sessions of a resumed run are told apart by ``trainwell.report.sessions``), and the short text
summary: totals over sessions, honest throughput, hyperparameters. Drawing belongs to
``trainwell.report.plots``; the HTML page to ``trainwell.report.page``. Only the standard library is used
here, so summaries work without matplotlib.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwell.loop.live_log import LIVE_LOG_NAME
from trainwell.report.curves import NOT_CURVES
from trainwell.report.incidents import incidents
from trainwell.report.live import merge_state, read_live_log, resume_points
from trainwell.report.live_reader import LiveHistory
from trainwell.report.run_info import run_info, session_hyperparameters, with_session_values
from trainwell.report.sessions import (
    Session,
    bad_step,
    entry_step,
    merged_entries,
    number,
    split_sessions,
    trained_spans,
    weighted_mean_loss,
)
from trainwell.report.tables import one_line, session_rows, text_table
from trainwell.state import STATE_LIMIT
from trainwell.utils.safe_files import read_bytes

STATE_FILE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

_INDEX_KEYS = frozenset({"step", "epoch"})


@dataclass
class RunHistory:
    """One run, as read from its state file.

    ``series`` maps a metric to its ``(step, value)`` points; ``final`` holds the numbers of the last
    end-of-``train()`` summary; ``sessions`` the ``train()`` calls of a resumed run (one for a run trained in one
    go); ``entries`` the ``(session index, log entry)`` pairs the curves are drawn from (overlaps resolved,
    summaries apart); ``info`` the hyperparameters and recorded versions (``trainwell.report.run_info``);
    ``log`` the entries of ``log_history`` the report reads, and ``skipped`` the positions of those it cannot
    (an entry that is not a JSON object, or whose ``step`` is not a finite number).
    """

    name: str
    state_path: str
    state: dict[str, Any]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)
    sessions: list[Session] = field(default_factory=list)
    entries: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)

    @property
    def run_dir(self) -> str:
        """The run folder (the parent of a checkpoint when the state came from one)."""
        folder = Path(self.state_path).parent
        return str(folder.parent if _CHECKPOINT.match(folder.name) else folder)


def find_state_file(path: str | os.PathLike[str]) -> Path:
    """The ``trainer_state.json`` for ``path``: the file itself; else the newer (by ``global_step``) of
    ``path/trainer_state.json`` (a finished run, or a checkpoint) and that of the newest ``checkpoint-N`` inside
    ``path`` that is not a symbolic link (a run still training, perhaps resumed after an earlier ``save_state()``);
    a tie goes to the first.

    Raises ``FileNotFoundError`` saying where it looked.
    """
    p = Path(path)
    if p.is_file():
        return p
    found = [p / STATE_FILE] if (p / STATE_FILE).is_file() else []
    if p.is_dir():
        # a checkpoint-N that is a link is passed over: whoever could write into the run put it, and it may lead
        # to another run's state (the folder named by the user may itself be a link)
        checkpoints = [(int(m.group(1)), c) for c in p.iterdir() if (m := _CHECKPOINT.match(c.name))
                       and not c.is_symlink()]
        newest = next((c / STATE_FILE for _, c in sorted(checkpoints, key=lambda x: x[0], reverse=True)
                       if (c / STATE_FILE).is_file()), None)
        if newest is not None:
            found.append(newest)
    if len(found) > 1:
        return max(found, key=_global_step)  # max keeps the first of equal keys
    if found:
        return found[0]  # not parsed here: load_run reads it once (a long history takes a while to parse)
    raise FileNotFoundError(
        f"no {STATE_FILE} in {os.fspath(path)!r} nor in a checkpoint-N folder inside it: pass a run's output_dir "
        "(after trainer.save_state() or at least one checkpoint), a checkpoint folder, or the file itself."
    )


def _global_step(state_file: Path) -> int:
    try:
        return int(json.loads(read_bytes(state_file, STATE_LIMIT).decode("utf-8")).get("global_step") or 0)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
        return -1  # unreadable: any readable state wins


def expand_search_folders(paths: list[str]) -> list[str]:
    """Each path, or, for a folder with no run of its own whose subfolders are runs (a hyperparameter search's
    ``output_dir`` with its ``run-*`` trials), those subfolders in name order."""
    out: list[str] = []
    for path in paths:
        try:
            find_state_file(path)
            out.append(path)
            continue
        except FileNotFoundError:
            if not Path(path).is_dir():
                raise
        trials = [str(sub) for sub in sorted(Path(path).iterdir()) if sub.is_dir() and _has_run(sub)]
        if not trials:
            find_state_file(path)  # raises, saying where it looked
        out.extend(trials)
    return out


def _has_run(folder: Path) -> bool:
    try:
        find_state_file(folder)
        return True
    except FileNotFoundError:
        return False


def series_from_log_history(log_history: list[dict[str, Any]]) -> tuple[dict[str, list[tuple[int, float]]],
                                                                          dict[str, float]]:
    """``(series, final)``: every numeric key of ``log_history`` as ``(step, value)`` points, in order, and the
    numbers of the last end-of-``train()`` summary (``train_runtime``, ``train_loss``, ...). Non-numeric values
    are skipped; where sessions of a resumed run overlap, the later session's entries win."""
    sessions = split_sessions(usable_entries(log_history)[0])
    return _step_series(merged_entries(sessions)), _final(sessions)


def _step_series(entries: list[tuple[int, dict[str, Any]]]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for _, entry in entries:
        step = entry_step(entry)
        for key, raw in entry.items():
            value = raw if type(raw) is float else number(raw)  # the common case without a call: 1M entries
            if value is not None and key not in NOT_CURVES:
                points = series.get(key)
                if points is None:
                    points = series[key] = []
                points.append((step, value))
    return series


def _final(sessions: list[Session]) -> dict[str, float]:
    summaries = [s.summary for s in sessions if s.summary]
    if not summaries:
        return {}
    return {k: v for k, raw in summaries[-1].items() if (v := number(raw)) is not None and k not in _INDEX_KEYS}


@contextlib.contextmanager
def _without_gc() -> Iterator[None]:
    """The cyclic garbage collector paused: reading a long history makes millions of dicts and tuples (none in a
    cycle), and each collection they trigger walks all of them, a third of the time of a 1,000,000-entry log."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_run(path: str | os.PathLike[str], name: str | None = None) -> RunHistory:
    """Read the run at ``path`` (see ``find_state_file``); ``ValueError`` if the file is not a trainer state.
    Linear in the length of ``log_history``: a 1,000,000-entry history is read in a few seconds."""
    with _without_gc():
        return _load_run(path, name)


def _load_run(path: str | os.PathLike[str], name: str | None) -> RunHistory:
    # A run folder's live log (not a checkpoint's, nor a state file named by the user): the logs since its state.
    folder = Path(path)
    live = read_live_log(folder) if folder.is_dir() and not _CHECKPOINT.match(folder.name) else None
    try:
        state_path = find_state_file(path)
    except FileNotFoundError:
        state = merge_state(None, live)
        if state is None:
            raise
        return _run_of(folder / LIVE_LOG_NAME, state, live, name, path)
    state = parse_state(read_bytes(state_path, STATE_LIMIT), state_path)  # a regular file (no link, no FIFO), bounded
    return run_from_state(state_path, merge_state(state, live) or state, live, name, path)


def parse_state(data: bytes, state_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state a ``trainer_state.json``'s bytes hold; ``ValueError`` naming the file when they are not one."""
    try:
        state = json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{state_path} is not valid JSON ({err.msg}); is the run still writing it?") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{state_path} is not UTF-8 text ({err.reason} at byte {err.start}): it is not a "
                         "trainer_state.json.") from None
    except RecursionError:
        raise ValueError(f"{state_path} is nested too deeply to read: it is not a trainer_state.json.") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ValueError(f"{state_path} has no log_history list: it is not a trainer_state.json.")
    return state


def run_from_state(state_path: str | os.PathLike[str], state: dict[str, Any], live: LiveHistory | None = None,
                   name: str | None = None, path: str | os.PathLike[str] | None = None) -> RunHistory:
    """The run a parsed state describes (``state_path``: where it came from; ``live``: the run's live log, for
    its resume points); ``name`` defaults to the run folder's."""
    with _without_gc():
        return _run_of(Path(state_path), state, live, name, path if path is not None else state_path)


def _run_of(state_path: Path, state: dict[str, Any], live: LiveHistory | None, name: str | None,
            path: str | os.PathLike[str]) -> RunHistory:
    log, skipped = usable_entries(state["log_history"])
    sessions = split_sessions(log, resume_points(live))
    entries = merged_entries(sessions)
    run = RunHistory(name or "", str(state_path), state, _step_series(entries), _final(sessions), sessions, entries,
                     log=log, skipped=skipped)
    run.name = name or Path(run.run_dir).name or str(path)
    run.info = run_info(run.run_dir, state_path, state)
    if len(sessions) > 1 and run.info:  # a resume may have changed them: each session's value where it did
        spans = trained_spans(sessions, state.get("global_step"))
        run.info = with_session_values(run.info, session_hyperparameters(run.run_dir, spans))
    return run


def usable_entries(log_history: list[Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """``(entries, skipped)``: the log entries the report can place (JSON objects whose ``step`` is absent or a
    finite number), and the positions of the others, which are left out (the summary counts them)."""
    log, skipped = [], []
    for position, entry in enumerate(log_history):
        if isinstance(entry, dict) and bad_step(entry) is None:
            log.append(entry)
        else:
            skipped.append(position)
    return log, skipped


def _json_kind(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return {str: "a string", list: "a list", int: "a number", float: "a number"}.get(type(value), "a value")


def _skipped_text(run: RunHistory, shown: int = 3) -> str:
    """``"2 (log_history[3]: a str, not a JSON object; ...)"``: how many entries were left out, and why."""
    history = run.state["log_history"]
    reasons = []
    for position in run.skipped[:shown]:
        entry = history[position]
        why = bad_step(entry) if isinstance(entry, dict) else f"{_json_kind(entry)}, not a JSON object"
        reasons.append(f"log_history[{position}]: {why}")
    more = "; ..." if len(run.skipped) > shown else ""
    return f"{len(run.skipped)} ({'; '.join(reasons)}{more})"


def last_value(run: RunHistory, key: str) -> tuple[int, float] | None:
    points = run.series.get(key)
    return points[-1] if points else None


def summary(run: RunHistory) -> dict[str, Any]:
    """The headline numbers of a run, as a flat dict (absent values are left out). Runtime and throughput are
    totals over the run's sessions (``sessions_summary``); the hyperparameters are apart, in ``run.info``."""
    state = run.state
    out: dict[str, Any] = {"run": run.name, "state file": run.state_path,
                           "steps": f"{state.get('global_step', '?')} / {state.get('max_steps', '?')}"}
    if isinstance(state.get("trial_params"), dict) and state["trial_params"]:  # a search trial: what it tried
        out["trial"] = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in state["trial_params"].items())
    epoch = number(state.get("epoch"))
    if epoch is not None:
        out["epoch"] = round(epoch, 3) if math.isfinite(epoch) else epoch
    if run.skipped:
        out["skipped log entries"] = _skipped_text(run)
    out.update(sessions_summary(run))
    for key, label in (("loss", "train loss"), ("eval_loss", "validation loss")):
        points = run.series.get(key)
        if points:
            first, last = points[0], points[-1]
            out[label] = f"{first[1]:.4g} (step {first[0]}) -> {last[1]:.4g} (step {last[0]})"
    mean = weighted_mean_loss([e for _, e in run.entries])
    if mean is not None:
        out["mean train loss"] = f"{mean:.4g} (over every step, from the logged losses)"
    if run.series.get("eval_loss"):
        step, best = min(run.series["eval_loss"], key=lambda p: p[1])
        # Perplexity only means something for a language model's cross-entropy: shown when the run logged it.
        perplexity = dict(run.series.get("eval_perplexity", [])).get(step)
        out["lowest validation loss"] = f"{best:.4g} at step {step}" + (
            f" (perplexity {perplexity:.4g})" if perplexity is not None else "")
    if state.get("best_metric") is not None:
        best_metric = number(state["best_metric"])
        out["best metric"] = f"{best_metric:.6g}" if best_metric is not None else str(state["best_metric"])
    if state.get("best_model_checkpoint"):
        out["best checkpoint"] = state["best_model_checkpoint"]
    return out


def sessions_summary(run: RunHistory) -> dict[str, str]:
    """Sessions, runtime and throughput of the whole run. Runtime is the sum over sessions; a session that
    logged none is named (the total is then a lower bound). Throughput is work over time, computed here
    (summed steps, samples and tokens over summed runtime) rather than copied from one session's summary, which
    covers only that ``train()`` call."""
    sessions = run.sessions
    out: dict[str, str] = {}
    if len(sessions) > 1:
        out["sessions"] = _resumes(sessions)
    timed = [s for s in sessions if s.runtime]
    untimed = [s for s in sessions if s.runtime is None and (s.entries or s.summary)]
    if timed:
        total = sum(s.runtime or 0.0 for s in timed)
        lower = untimed or any(not s.runtime_is_complete for s in timed)
        out["runtime"] = ("at least " if lower else "") + _duration(total) + (
            f" over {len(sessions)} sessions" if len(sessions) > 1 else "")
    if untimed:
        out["runtime not logged"] = ", ".join(f"session {s.index} (steps {s.start_step}-{s.end_step})"
                                              for s in untimed)
    for name, amount in (("steps", lambda s: s.trained_steps), ("samples", lambda s: s.samples),
                         ("tokens", lambda s: s.tokens)):
        known = [s for s in timed if amount(s) is not None]
        if known and (seconds := sum(s.runtime or 0.0 for s in known)):
            rate = sum(amount(s) or 0.0 for s in known) / seconds
            partial = (f" (session{'s' if len(known) > 1 else ''} {', '.join(str(s.index) for s in known)} only)"
                       if len(known) < len(sessions) else "")
            out[f"train {name} per second"] = f"{rate:.4g}{partial}"
    return out


def _resumes(sessions: list[Session]) -> str:
    points = ", ".join(str(s.start_step) for s in sessions[1:11]) + (
        f" and {len(sessions) - 11} more" if len(sessions) > 11 else "")
    text = f"{len(sessions)} (resumed at step{'s' if len(sessions) > 2 else ''} {points})"
    covered = max(s.end_step for s in sessions) - sessions[0].start_step
    repeated = sum(s.trained_steps for s in sessions) - covered
    return text + (f"; {repeated} steps trained more than once" if repeated > 0 else "")


def summary_text(run: RunHistory, head: dict[str, Any] | None = None) -> str:
    """The summary (``head``, when already computed by ``summary``) as aligned ``key  value`` lines, then the
    sessions of a resumed run and the hyperparameters; one line per value (``key_values``)."""
    text = key_values(summary(run) if head is None else head)
    if len(run.sessions) > 1 or incidents(run):
        text += "\n\nsessions:\n" + text_table(session_rows(run))
    if run.info:
        text += "\n\nhyperparameters:\n" + key_values(run.info, indent="  ")
    return text


def key_values(rows: dict[str, Any], indent: str = "") -> str:
    """Aligned ``key  value`` lines, one per row: a line break or other control character in a key or a value
    is written escaped (``tables.one_line``), so no value can start a line of its own."""
    rows = {one_line(k): one_line(v) for k, v in rows.items()}
    width = max(map(len, rows), default=0)
    return "\n".join(f"{indent}{key:<{width}}  {value}" for key, value in rows.items())


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d} ({seconds:.1f} s)"
