"""Drawing a run's curves as PNG files with matplotlib (an optional dependency: ``trainwell[report]``).

Owns which metrics go on which figure (``plot_groups``) and the drawing. Only matplotlib's object API on the
Agg canvas is used (``Figure``, never ``pyplot``), so making a report never changes the backend or global
state of the program that calls it, and works without a display.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainwell.report.history import RunHistory

_SKIP_EVAL = ("_runtime",)  # eval timings are throughput, drawn on their own figure


def matplotlib_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot_groups(series: dict[str, Any]) -> dict[str, list[str]]:
    """Figure name -> the metrics it shows, for the metrics present in ``series``.

    ``loss`` (training and validation loss together), ``learning_rate``, ``grad_norm``, one figure per other
    evaluation metric, and ``throughput`` (every ``*_per_second`` key).
    """
    groups: dict[str, list[str]] = {}
    loss = [k for k in ("loss", "eval_loss") if k in series]
    if loss:
        groups["loss"] = loss
    for key in ("learning_rate", "grad_norm"):
        if key in series:
            groups[key] = [key]
    for key in sorted(series):
        if key.startswith("eval_") and key != "eval_loss" and not key.endswith(("_per_second",) + _SKIP_EVAL):
            groups[key] = [key]
    speed = sorted(k for k in series if k.endswith("_per_second"))
    training_speed = [k for k in speed if k.startswith("train_")]
    speed = training_speed or speed  # eval speeds are on another scale; show them only when alone
    if speed:
        groups["throughput"] = speed
    return groups


def _label(key: str) -> str:
    return {"loss": "train loss", "eval_loss": "validation loss"}.get(key, key.replace("_", " "))


def _figure(title: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure  # deferred: matplotlib is optional and slow to import

    fig = Figure(figsize=(7, 3.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    return fig, ax


def _draw(ax: Any, points: list[tuple[int, float]], label: str) -> None:
    steps, values = zip(*points)
    style = {"marker": "o", "markersize": 3} if len(points) < 30 else {}
    ax.plot(steps, values, label=label, **style)


def plot_run(run: RunHistory, out_dir: str | os.PathLike[str]) -> list[Path]:
    """One PNG per figure of ``plot_groups`` in ``out_dir``; returns their paths in display order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, keys in plot_groups(run.series).items():
        fig, ax = _figure(f"{_label(name) if len(keys) == 1 else name.replace('_', ' ')} — {run.name}")
        for key in keys:
            _draw(ax, run.series[key], _label(key))
        if name == "learning_rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        if len(keys) > 1:
            ax.legend()
        else:  # e.g. throughput: say which speed (tokens or samples per second) is drawn
            ax.set_ylabel(_label(keys[0]))
        path = out / f"{name}.png"
        fig.savefig(path)
        written.append(path)
    return written


def plot_comparison(runs: list[RunHistory], out_dir: str | os.PathLike[str]) -> Path:
    """One PNG comparing runs: a panel per metric that at least one run has (losses and learning rate first)."""
    from matplotlib.figure import Figure

    present = {k for run in runs for k in run.series}
    first = [k for k in ("loss", "eval_loss", "learning_rate", "grad_norm") if k in present]
    others = sorted(k for k in present if k.startswith("eval_") and k not in first
                    and not k.endswith(("_per_second",) + _SKIP_EVAL))
    keys = first + others or sorted(present)[:1]
    cols = 2 if len(keys) > 1 else 1
    rows = -(-len(keys) // cols) or 1
    fig = Figure(figsize=(6 * cols, 3.4 * rows), dpi=100, layout="constrained")
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.set_title(_label(key))
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        for run in runs:
            if run.series.get(key):
                _draw(ax, run.series[key], run.name)
        ax.legend(fontsize="small")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "comparison.png"
    fig.savefig(path)
    return path
