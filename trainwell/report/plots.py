"""Drawing a run's curves as PNG files with matplotlib (an optional dependency: ``trainwell[report]``).

Owns which metrics go on which figure (``plot_groups``) and the drawing: the x axis chosen (step, epoch, tokens,
time; ``trainwell.report.curves`` computes it), the train loss smoothed over its faint raw curve, a log-scale y
for curves spanning more than a decade, a dashed line at each resume point, and on the loss figure the incidents
(skipped non-finite steps, rollbacks, step_timeout stops: ``trainwell.report.incidents``). Only matplotlib's
object API on the Agg canvas is used (``Figure``, never ``pyplot``), so making a report never changes the backend
or global state of the program that calls it, and works without a display.
"""

from __future__ import annotations

import bisect
import functools
import io
import math
import os
from pathlib import Path
from typing import Any

from trainwell.report.curves import (
    Axis,
    auto_weight,
    axis_series,
    build_axis,
    downsample,
    shared_axes,
    smooth,
    spans_decade,
    values_of,
)
from trainwell.report.files import file_names, report_folder
from trainwell.report.history import RunHistory
from trainwell.report.incidents import incidents
from trainwell.report.sessions import entry_step
from trainwell.report.tables import one_line
from trainwell.utils.safe_files import SafeFolder

_SKIP_EVAL = ("_runtime",)  # eval timings are throughput, drawn on their own figure
# Curves whose y is never put on a log scale: a schedule decaying linearly to ~0 would look like a cliff.
_LINEAR_ONLY = frozenset({"learning_rate"})
Points = list[tuple[float, float]]
_LONGEST_LABEL = 80  # characters of a title or legend entry; a longer metric or run name is cut, with "…"
# The y axis title of a figure holding several metrics (one metric's figure is titled by the metric).
_GROUP_YLABELS = {"loss": "loss", "throughput": "per second"}


def matplotlib_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot_groups(series: dict[str, Any]) -> dict[str, list[str]]:
    """Figure name -> the metrics it shows, for the metrics present in ``series``.

    ``loss`` (training and validation loss together), ``learning_rate``, ``grad_norm``, one figure per other
    evaluation metric, ``throughput`` (the training ``*_per_second`` keys; evaluation speeds when alone) and
    ``mfu``.
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
    # training speeds: log_throughput's per-window tokens_per_second, and the cumulative train_*_per_second
    training_speed = [k for k in speed if k.startswith("train_") or k == "tokens_per_second"]
    speed = training_speed or speed  # eval speeds are on another scale; show them only when alone
    if speed:
        groups["throughput"] = speed
    if "mfu" in series:  # log_throughput on a GPU of known peak: model FLOPs utilization, a fraction
        groups["mfu"] = ["mfu"]
    return groups


def _text(text: str) -> str:
    """``text`` as matplotlib should show it, literally: on one line, cut to ``_LONGEST_LABEL`` characters, and
    with ``$`` escaped, since matplotlib reads ``$...$`` as mathtext (a metric named ``$x$`` would be typeset,
    and one named ``$\\frac$`` would fail the whole figure)."""
    text = one_line(text)
    if len(text) > _LONGEST_LABEL:
        text = text[:_LONGEST_LABEL - 1] + "…"
    return text.replace("$", r"\$")


def _label(key: str) -> str:
    return _text({"loss": "train loss", "eval_loss": "validation loss"}.get(key, key.replace("_", " ")))


def _style_axes(ax: Any, title: str, xlabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)


def _draw(ax: Any, points: Points, label: str | None, color: Any = None, **style: Any) -> Any:
    """One line; a long series is drawn from its ``curves.downsample`` (the same envelope, a few thousand points),
    so a million-step log plots in a moment."""
    if len(points) < 30 and "alpha" not in style:
        style = {"marker": "o", "markersize": 3, **style}
    xs, values = zip(*downsample(points))
    return ax.plot(xs, values, label=label, color=color, **style)[0]


def _draw_key(ax: Any, key: str, points: Points, label: str, weight: float | None, color: Any = None) -> None:
    """One curve; the train loss smoothed (exponential average, ``curves.smooth``) over its raw curve drawn
    faint, when there is anything to smooth."""
    w = auto_weight(len(points)) if weight is None else weight
    if key != "loss" or w == 0 or len(points) < 3:
        _draw(ax, points, label, color)
        return
    raw = _draw(ax, points, None, color, alpha=0.25, linewidth=0.8)
    smoothed = list(zip([x for x, _ in points], smooth(values_of(points), w)))
    _draw(ax, smoothed, f"{label} (smoothed {w:.2g})", raw.get_color(), linewidth=1.6)


def plain_number(value: float) -> str:
    """A tick value as a person writes it: ``0.6``, ``0.05``, ``2.5``, ``30``, ``2000``, to 3 significant digits;
    only below 1e-4 or from 1e6 on an exponent (``1e-5``, ``2e6``), never the ``6e-01`` of matplotlib's log
    formatter."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    rounded = float(f"{value:.3g}")
    if 1e-4 <= abs(rounded) < 1e6:
        return f"{rounded:f}".rstrip("0").rstrip(".")
    mantissa, _, exponent = f"{rounded:.2e}".partition("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


@functools.lru_cache(maxsize=1)
def _plain_log_formatter() -> type:
    """matplotlib's ``LogFormatter`` (which ticks get a label: decades, and the 2s and 5s when a curve spans few
    decades) writing its labels with ``plain_number``."""
    from matplotlib.ticker import LogFormatter

    class PlainLogFormatter(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:  # noqa: ARG002
            return plain_number(x)

    return PlainLogFormatter


def _finish(ax: Any, keys: list[str], curves: list[Points], ylabel: str) -> None:
    """Log-scale y when the curves span more than a decade (and are not a learning rate)."""
    if not set(keys) & _LINEAR_ONLY and spans_decade(*(values_of(c) for c in curves)):
        formatter = _plain_log_formatter()
        ax.set_yscale("log")
        # plain numbers (0.6, 30, 100) rather than 6e-01 or 2 x 10^1: a loss or perplexity is read, not derived
        ax.yaxis.set_major_formatter(formatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(formatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ylabel += " (log scale)"
    ax.set_ylabel(ylabel)
    if set(keys) & _LINEAR_ONLY:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if len(ax.get_legend_handles_labels()[0]) > 1:
        ax.legend(fontsize="small")


_NAMED_RESUMES = 12  # resume points drawn one by one, each with its label; more are drawn as one collection


def _mark_resumes(ax: Any, axis: Axis, color: Any = "0.45") -> None:
    """A dashed line at each resume point, labelled; past ``_NAMED_RESUMES`` (a history appended to itself many
    times), all of them as one line collection and one label giving their number, which draws in a moment."""
    if len(axis.marks) > _NAMED_RESUMES:
        xs = [x for x, _ in axis.marks]
        ax.vlines(xs, 0, 1, transform=ax.get_xaxis_transform(), colors=color, linestyles="--", linewidth=0.9,
                  alpha=0.8)
        ax.text(xs[0], 0.98, f" {len(xs)} resume points", transform=ax.get_xaxis_transform(), va="top",
                fontsize=7, color=color)
        return
    for x, text in axis.marks:
        ax.axvline(x, color=color, linestyle="--", linewidth=0.9, alpha=0.8)
        ax.text(x, 0.98, f" {text}", transform=ax.get_xaxis_transform(), va="top", fontsize=7, color=color)


def _step_to_x(run: RunHistory, axis: Axis) -> Any:
    """step -> x on ``axis``: that of the last entry logged at or before the step (the first entry's before it)."""
    if axis.name == "step":
        return float
    pairs = sorted((entry_step(e), x) for (_, e), x in zip(run.entries, axis.values) if x is not None)
    steps = [step for step, _ in pairs]

    def x_at(step: int) -> float:
        i = bisect.bisect_right(steps, step) - 1
        return pairs[max(i, 0)][1] if pairs else 0.0

    return x_at


def _mark_incidents(ax: Any, run: RunHistory, axis: Axis) -> None:
    """On the loss figure: an x at the foot of each log window with skipped non-finite steps, a shaded span over
    the steps each rollback skipped, a red line at each step_timeout stop (docs/resilience.md)."""
    found = incidents(run)
    if not found:
        return
    x_at = _step_to_x(run, axis)
    foot = ax.get_xaxis_transform()  # x in data, y in axes fractions
    if found.skipped:
        xs = [x_at(step) for step, _ in found.skipped]
        total = sum(count for _, count in found.skipped)
        ax.plot(xs, [0.03] * len(xs), "x", color="tab:orange", transform=foot, clip_on=False,
                label=f"skipped non-finite steps ({total})")
    for i, record in enumerate(found.rollbacks):
        start, end = x_at(record.get("rollback_to_step", record["skipped_steps_from"] - 1)), x_at(
            record["skipped_steps_to"])
        ax.axvspan(start, end, color="tab:red", alpha=0.12, label="rollback: steps skipped" if i == 0 else None)
        ax.text(end, 0.9, f" rollback {record.get('rollback', i + 1)}", transform=foot, fontsize=7, color="tab:red")
    for stop in found.stops:
        x = x_at(stop["step"])
        ax.axvline(x, color="tab:red", linewidth=1.2)
        ax.text(x, 0.8, f" step_timeout at step {stop['step']}", transform=foot, fontsize=7, color="tab:red")


def _save(fig: Any, folder: SafeFolder, name: str) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return folder.write_bytes(name, buffer.getvalue())


def plot_run(run: RunHistory, out_dir: str | os.PathLike[str] | SafeFolder, x: str = "step",
             smoothing: float | None = None) -> list[Path]:
    """One PNG per figure of ``plot_groups`` in ``out_dir`` (a folder path, created if needed, or an open
    ``SafeFolder``), against the ``x`` axis (``curves.AXES``); returns their paths in display order. Each is
    named after its metric, made a safe and unique file name (``files.file_names``: ``eval_acc/top1`` gives
    ``eval_acc_top1-<hash>.png``), and written atomically, never through a link. ``smoothing`` is the train
    loss's averaging weight (None: chosen from the number of points, ``curves.auto_weight``; 0: none).
    ``AxisError`` before any file is written when the history cannot give ``x``."""
    figures = run_figures(run, x, smoothing)
    names = file_names(figures)
    folder = report_folder(out_dir, named_by_user=True)
    try:
        return [_save(fig, folder, names[name]) for name, fig in figures.items()]
    finally:
        if folder is not out_dir:
            folder.close()


def run_figures(run: RunHistory, x: str = "step", smoothing: float | None = None) -> dict[str, Any]:
    """Figure name -> the matplotlib ``Figure`` that ``plot_run`` saves (for tests and for embedding)."""
    from matplotlib.figure import Figure  # deferred: matplotlib is optional and slow to import

    axis = build_axis(run, x)
    series = axis_series(run, axis)
    figures = {}
    for name, keys in plot_groups(series).items():
        fig = Figure(figsize=(7, 3.6), dpi=100, layout="constrained")
        ax = fig.add_subplot()
        title = _label(name) if len(keys) == 1 else name.replace("_", " ")
        _style_axes(ax, f"{title} — {_text(run.name)}", axis.label)
        for key in keys:
            _draw_key(ax, key, series[key], _label(key), smoothing)
        _mark_resumes(ax, axis)
        if name == "loss":
            _mark_incidents(ax, run, axis)
        _finish(ax, keys, [series[k] for k in keys], _label(keys[0]) if len(keys) == 1 else _GROUP_YLABELS[name])
        figures[name] = fig
    return figures


def comparison_keys(runs: list[RunHistory]) -> list[str]:
    """The metrics compared: losses, learning rate and gradient norm first, then the evaluation metrics."""
    present = {k for run in runs for k in run.series}
    first = [k for k in ("loss", "eval_loss", "learning_rate", "grad_norm") if k in present]
    others = sorted(k for k in present if k.startswith("eval_") and k not in first
                    and not k.endswith(("_per_second",) + _SKIP_EVAL))
    return first + others or sorted(present)[:1]


def plot_comparison(runs: list[RunHistory], out_dir: str | os.PathLike[str] | SafeFolder, x: str = "step",
                    smoothing: float | None = None) -> Path:
    """One PNG comparing runs (``comparison.png`` in ``out_dir``, written as ``plot_run`` writes): a panel per
    metric that at least one run has, every run on the same axes (one colour per run in every panel, panels
    sharing the x axis), log-scale y when the runs together span more than a decade. ``AxisError`` names the
    run that cannot give ``x``."""
    fig = comparison_figure(runs, x, smoothing)
    folder = report_folder(out_dir, named_by_user=True)
    try:
        return _save(fig, folder, "comparison.png")
    finally:
        if folder is not out_dir:
            folder.close()


def comparison_figure(runs: list[RunHistory], x: str = "step", smoothing: float | None = None) -> Any:
    """The ``Figure`` that ``plot_comparison`` saves."""
    from matplotlib.figure import Figure

    axes = shared_axes(runs, x)
    series = [axis_series(run, axis) for run, axis in zip(runs, axes)]
    keys = comparison_keys(runs)
    cols = 2 if len(keys) > 1 else 1
    rows = -(-len(keys) // cols) or 1
    fig = Figure(figsize=(6 * cols, 3.4 * rows), dpi=100, layout="constrained")
    grid = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, key in zip(grid, keys):
        _style_axes(ax, _label(key), axes[0].label)
        ax.xaxis.set_tick_params(labelbottom=True)  # every panel keeps its numbers: a row may end early
        curves = []
        for run, axis, run_series, color in zip(runs, axes, series, colors):
            if run_series.get(key):
                _draw_key(ax, key, run_series[key], _text(run.name), smoothing, color)
                _mark_resumes(ax, axis, color)
                curves.append(run_series[key])
        _finish(ax, [key], curves, _label(key))
        ax.legend(fontsize="small")
    for ax in grid[len(keys):]:
        ax.remove()
    return fig
