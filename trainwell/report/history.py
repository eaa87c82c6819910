"""Reading a run: ``trainer_state.json`` (written by trainwell or by the reference Trainer) into series.

Owns finding the state file of a run folder, turning ``log_history`` into per-metric ``(step, value)``
series, and the short text summary. Drawing belongs to ``trainwell.report.plots``; the HTML page to
``trainwell.report.page``. Only the standard library is used here, so summaries work without matplotlib.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

# Logged once, at the end of train(): summary values, not curves.
SUMMARY_KEYS = frozenset({
    "train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos",
})
# Bookkeeping columns of every log entry, never plotted as metrics.
_INDEX_KEYS = frozenset({"step", "epoch"})


@dataclass
class RunHistory:
    """One run, as read from its state file: ``series`` maps a metric to its ``(step, value)`` points."""

    name: str
    state_path: str
    state: dict[str, Any]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)

    @property
    def run_dir(self) -> str:
        """The run folder (the parent of a checkpoint when the state came from one)."""
        folder = Path(self.state_path).parent
        return str(folder.parent if _CHECKPOINT.match(folder.name) else folder)


def find_state_file(path: str | os.PathLike[str]) -> Path:
    """The ``trainer_state.json`` for ``path``: the file itself; ``path/trainer_state.json`` (a finished run
    or a checkpoint); else that of the newest ``checkpoint-N`` inside ``path`` (a run still training).

    Raises ``FileNotFoundError`` saying where it looked.
    """
    p = Path(path)
    if p.is_file():
        return p
    if (p / STATE_FILE).is_file():
        return p / STATE_FILE
    if p.is_dir():
        checkpoints = [(int(m.group(1)), c) for c in p.iterdir() if (m := _CHECKPOINT.match(c.name))]
        for _, ckpt in sorted(checkpoints, key=lambda x: x[0], reverse=True):
            if (ckpt / STATE_FILE).is_file():
                return ckpt / STATE_FILE
    raise FileNotFoundError(
        f"no {STATE_FILE} in {os.fspath(path)!r} nor in a checkpoint-N folder inside it: pass a run's output_dir "
        "(after trainer.save_state() or at least one checkpoint), a checkpoint folder, or the file itself."
    )


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


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def series_from_log_history(log_history: list[dict[str, Any]]) -> tuple[dict[str, list[tuple[int, float]]],
                                                                          dict[str, float]]:
    """``(series, final)``: every numeric key of ``log_history`` as ``(step, value)`` points, in order, and the
    once-per-run summary values (``train_runtime``, ``train_loss``, ...). Non-numeric values are skipped."""
    series: dict[str, list[tuple[int, float]]] = {}
    final: dict[str, float] = {}
    for entry in log_history:
        step = int(entry.get("step", 0) or 0)
        for key, raw in entry.items():
            value = _number(raw)
            if value is None or key in _INDEX_KEYS:
                continue
            if key in SUMMARY_KEYS:
                final[key] = value
            else:
                series.setdefault(key, []).append((step, value))
    return series, final


def load_run(path: str | os.PathLike[str], name: str | None = None) -> RunHistory:
    """Read the run at ``path`` (see ``find_state_file``); ``ValueError`` if the file is not a trainer state."""
    state_path = find_state_file(path)
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{state_path} is not valid JSON ({err.msg}); is the run still writing it?") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ValueError(f"{state_path} has no log_history list: it is not a trainer_state.json.")
    series, final = series_from_log_history(state["log_history"])
    run = RunHistory(name or "", str(state_path), state, series, final)
    run.name = name or Path(run.run_dir).name or str(path)
    return run


def last_value(run: RunHistory, key: str) -> tuple[int, float] | None:
    points = run.series.get(key)
    return points[-1] if points else None


def summary(run: RunHistory) -> dict[str, Any]:
    """The headline numbers of a run, as a flat dict (absent values are left out)."""
    state = run.state
    out: dict[str, Any] = {"run": run.name, "state file": run.state_path,
                           "steps": f"{state.get('global_step', '?')} / {state.get('max_steps', '?')}"}
    if state.get("trial_params"):  # a hyperparameter-search trial: what it tried
        out["trial"] = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in state["trial_params"].items())
    if state.get("epoch") is not None:
        out["epoch"] = round(float(state["epoch"]), 3)
    if "train_runtime" in run.final:
        out["runtime"] = _duration(run.final["train_runtime"])
    for key, label in (("loss", "train loss"), ("eval_loss", "validation loss")):
        points = run.series.get(key)
        if points:
            first, last = points[0], points[-1]
            out[label] = f"{first[1]:.4g} (step {first[0]}) -> {last[1]:.4g} (step {last[0]})"
    if run.series.get("eval_loss"):
        step, best = min(run.series["eval_loss"], key=lambda p: p[1])
        # Perplexity only means something for a language model's cross-entropy: shown when the run logged it.
        perplexity = dict(run.series.get("eval_perplexity", [])).get(step)
        out["lowest validation loss"] = f"{best:.4g} at step {step}" + (
            f" (perplexity {perplexity:.4g})" if perplexity is not None else "")
    if state.get("best_metric") is not None:
        out["best metric"] = f"{state['best_metric']:.6g}"
    if state.get("best_model_checkpoint"):
        out["best checkpoint"] = state["best_model_checkpoint"]
    for key in ("train_samples_per_second", "train_steps_per_second"):
        if key in run.final:
            out[key.replace("_", " ")] = f"{run.final[key]:.4g}"
    return out


def summary_text(run: RunHistory) -> str:
    rows = summary(run)
    width = max(map(len, rows))
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows.items())


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d} ({seconds:.1f} s)"
