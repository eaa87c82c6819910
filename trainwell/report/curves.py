"""Pure functions on a run's curves: the x axis (step, epoch, tokens, time), smoothing and the log-scale rule.

Owns what the numbers on a plot are; drawing them belongs to ``trainwell.report.plots``. Standard library only,
so everything here is tested without matplotlib.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainwell.report.incidents import EVENT_KEYS
from trainwell.report.sessions import PrefixMax, Session, entry_step, number

if TYPE_CHECKING:
    from trainwell.report.history import RunHistory

AXES = ("step", "epoch", "tokens", "time")
# Columns of a log entry that index it (where and when it was logged) rather than measure the model.
INDEX_KEYS = frozenset({"step", "epoch", "train_runtime"})
#: keys that are not drawn as curves: the index columns, and the incidents (marked on the loss plot instead)
NOT_CURVES = INDEX_KEYS | EVENT_KEYS
_TOKENS_FIX = "train with include_num_input_tokens_seen=True (or 'non_padding') to log it"


class AxisError(ValueError):
    """The history cannot give the x axis asked for; the message says what is missing and how to get it."""


@dataclass
class Axis:
    """An x axis of one run: ``values[i]`` is the x of ``run.entries[i]`` (None: no value, left off the plot),
    ``marks`` the ``(x, text)`` of each resume point, ``label`` the axis title."""

    name: str
    label: str
    values: list[float | None]
    marks: list[tuple[float, str]] = field(default_factory=list)


def shared_axes(runs: list[RunHistory], name: str = "step") -> list[Axis]:
    """``build_axis`` for each run, the time axes in one unit (that of the longest run) so runs compare."""
    if name != "time":
        return [build_axis(run, name) for run in runs]
    longest = max(sum(s.runtime or 0.0 for s in run.sessions) for run in runs)
    return [build_axis(run, name, seconds_per_unit=_time_unit(longest)[0]) for run in runs]


def build_axis(run: RunHistory, name: str = "step", seconds_per_unit: float | None = None) -> Axis:
    """The ``name`` axis of ``run`` (one of ``AXES``); ``AxisError`` when the history cannot give it.
    ``seconds_per_unit`` fixes the unit of a time axis (default: s, min or h, from the run's length)."""
    if name not in AXES:
        raise AxisError(f"x axis {name!r}: pass one of {', '.join(AXES)}")
    entries = [e for _, e in run.entries]
    if name == "step":
        axis = Axis(name, "step", [float(entry_step(e)) for e in entries])
    elif name == "epoch":
        axis = Axis(name, "epoch", _same_step_fill(run, [number(e.get("epoch")) for e in entries]))
        if all(v is None for v in axis.values):
            raise AxisError(f"--x epoch: no log entry of {run.name} has an 'epoch' value; use --x step")
    elif name == "tokens":
        axis = Axis(name, "input tokens seen",
                    _same_step_fill(run, [number(e.get("num_input_tokens_seen")) for e in entries]))
        _check_tokens(run, axis.values)
    else:
        return _time_axis(run, seconds_per_unit)
    axis.marks = _marks(run, axis.values, exact=name == "step")
    return axis


def _same_step_fill(run: RunHistory, values: list[float | None]) -> list[float | None]:
    """An entry without a value takes that of the entry before it when both were logged by one session at one
    step (an evaluation logged right after its step's training log, by a logger that did not repeat it)."""
    out = list(values)
    for i in range(1, len(out)):
        (session, entry), (previous_session, previous) = run.entries[i], run.entries[i - 1]
        if out[i] is None and session == previous_session and entry_step(entry) == entry_step(previous):
            out[i] = out[i - 1]
    return out


def _check_tokens(run: RunHistory, values: list[float | None]) -> None:
    present = [v for v in values if v is not None]
    if not present:
        raise AxisError(f"--x tokens: the log entries of {run.name} have no num_input_tokens_seen; {_TOKENS_FIX}")
    if not any(present):
        raise AxisError(f"--x tokens: num_input_tokens_seen is 0 in every log entry of {run.name}: the batches "
                        "had no tensor under the model's main input name (input_ids) to count")


def _marks(run: RunHistory, values: list[float | None], exact: bool = False) -> list[tuple[float, str]]:
    """The x of each resume point: its step on a step axis (``exact``); otherwise that of the last entry logged
    at or before it by an earlier session, else the session's own first x. ``run.entries`` go by session, so
    "an earlier session" is a prefix of them; the last entry of that prefix at or below a step comes from a
    ``PrefixMax`` over the steps (one pass in all)."""
    if len(run.sessions) < 2:
        return []
    if exact:  # a step axis: the resume point is its own x, even between two logged steps
        return [(float(s.start_step), f"resumed at step {s.start_step}") for s in run.sessions[1:]]
    steps = sorted({entry_step(e) for _, e in run.entries})
    latest = PrefixMax(len(steps))  # by step: the position of the last entry added at that step
    first_own: dict[int, float] = {}
    for (index, _), x in zip(run.entries, values):
        if x is not None:
            first_own.setdefault(index, x)
    marks, added = [], 0
    for session in run.sessions[1:]:
        while added < len(run.entries) and run.entries[added][0] < session.index:
            if values[added] is not None:
                latest.update(bisect.bisect_left(steps, entry_step(run.entries[added][1])), added)
            added += 1
        found = latest.query(bisect.bisect_right(steps, session.start_step))
        x = values[found] if found >= 0 else first_own.get(session.index)
        if x is not None:
            marks.append((x, f"resumed at step {session.start_step}"))
    return marks


def _time_axis(run: RunHistory, seconds_per_unit: float | None) -> Axis:
    """Training time, sessions laid end to end: within a session, the per-log ``train_runtime`` when it was
    logged, else the session's ``train_runtime`` spread evenly over its steps (the label then says estimated)."""
    offsets, estimated = {}, False
    total = 0.0
    for session in run.sessions:
        if session.runtime is None:
            raise AxisError(_no_time(run, session))
        offsets[session.index] = total
        total += session.runtime
        estimated = estimated or session.clock is None
    values: list[float | None] = []
    clock = {s.index: 0.0 for s in run.sessions}
    # Per session, once (each is a pass over its entries): logged clock or not, start, span and runtime.
    spread = {s.index: (s.clock is None, s.start_step, max(s.end_step - s.start_step, 1), s.runtime or 0.0)
              for s in run.sessions}
    for index, entry in run.entries:
        unclocked, start, span, runtime = spread[index]
        if not unclocked:
            clock[index] = number(entry.get("train_runtime")) or clock[index]
            values.append(offsets[index] + clock[index])
        else:
            fraction = min(max((entry_step(entry) - start) / span, 0.0), 1.0)
            values.append(offsets[index] + fraction * runtime)
    scale = _time_unit(total)[0] if seconds_per_unit is None else seconds_per_unit
    unit = _UNITS.get(scale, f"x {scale:g} s")
    label = f"training time ({unit}{', estimated from each session runtime' if estimated else ''})"
    marks = [(offsets[s.index] / scale, f"resumed at step {s.start_step}") for s in run.sessions[1:]]
    return Axis("time", label, [v / scale if v is not None else None for v in values], marks)


def _no_time(run: RunHistory, session: Session) -> str:
    return (f"--x time: session {session.index} of {run.name} (steps {session.start_step}-{session.end_step}) "
            "logged no time: it has no train() summary with train_runtime (a resumed run's earlier sessions lose "
            "theirs, since the checkpoint was saved before it) and its log entries carry no train_runtime (logged "
            "with include_num_input_tokens_seen=True); use --x step")


_UNITS = {3600.0: "h", 60.0: "min", 1.0: "s"}


def _time_unit(seconds: float) -> tuple[float, str]:
    """Hours from 2 h on, minutes from 2 min on, else seconds."""
    scale = next(s for s in _UNITS if seconds >= 2 * s or s == 1.0)
    return scale, _UNITS[scale]


def axis_series(run: RunHistory, axis: Axis) -> dict[str, list[tuple[float, float]]]:
    """Every metric of ``run.entries`` as ``(x, value)`` points on ``axis`` (entries without an x left out)."""
    if axis.name == "step" and run.series:
        return run.series  # the same points (run.series is drawn from run.entries by step too), already built
    series: dict[str, list[tuple[float, float]]] = {}
    for (_, entry), x in zip(run.entries, axis.values):
        if x is None:
            continue
        for key, raw in entry.items():
            value = raw if type(raw) is float else number(raw)  # the common case without a call: 1M entries
            if value is not None and key not in NOT_CURVES:
                points = series.get(key)
                if points is None:
                    points = series[key] = []
                points.append((x, value))
    return series


def downsample(points: list[tuple[float, float]], buckets: int = 2000) -> list[tuple[float, float]]:
    """At most about ``2 * buckets + 2`` of ``points``, for drawing a long series faithfully: the first and the
    last point, and in each of ``buckets`` runs of consecutive points the lowest and the highest value (and the
    first non-finite one, so a NaN still breaks the line), in their order. A plot a few thousand pixels wide
    shows the same envelope, spikes included, as with every point; shorter series are returned as they are."""
    n = len(points)
    if n <= 2 * buckets + 2:
        return points
    values = [v for _, v in points]
    size = -(-n // buckets)
    keep = {0, n - 1}
    for start in range(0, n, size):
        chunk = values[start:start + size]
        if all(map(math.isfinite, chunk)):  # the common case, at C speed
            keep.add(start + chunk.index(min(chunk)))
            keep.add(start + chunk.index(max(chunk)))
            continue
        finite = [i for i, v in enumerate(chunk) if math.isfinite(v)]
        odd = next(i for i, v in enumerate(chunk) if not math.isfinite(v))
        keep.add(start + odd)
        if finite:
            keep.add(start + min(finite, key=chunk.__getitem__))
            keep.add(start + max(finite, key=chunk.__getitem__))
    return [points[i] for i in sorted(keep)]


def auto_weight(points: int) -> float:
    """The smoothing weight used when none is given: an exponential average over about 5% of the points
    (``1 / (1 - weight)`` points), so the smoothed curve keeps the shape of a run whatever its logging
    frequency; 0 (no smoothing) below 40 points, where every point matters."""
    span = points / 20
    return 0.0 if span < 2 else 1.0 - 1.0 / span


def smooth(values: list[float], weight: float) -> list[float]:
    """The exponential moving average of ``values`` with ``weight`` (0: none, towards 1: smoother), debiased
    as TensorBoard's smoothing is: point ``i`` is the average of the points so far weighted by
    ``weight ** (i - j)``, so the start is not pulled towards 0. Non-finite values (a NaN loss) are carried
    over from the previous point instead of poisoning what follows."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight {weight}: pass a number in [0, 1), e.g. 0.9, or 0 for none")
    out: list[float] = []
    average = norm = 0.0
    for value in values:
        if not math.isfinite(value):
            out.append(out[-1] if out else value)
            continue
        average = weight * average + (1.0 - weight) * value
        norm = weight * norm + (1.0 - weight)
        out.append(average / norm)
    return out


def spans_decade(*curves: list[float]) -> bool:
    """Whether a log-scale y axis suits these values: all positive and the largest more than 10 times the
    smallest (a loss or perplexity that starts high would otherwise flatten everything after the start)."""
    finite = [v for curve in curves for v in curve if math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) > 10 * min(finite)


def values_of(points: list[tuple[Any, float]]) -> list[float]:
    return [v for _, v in points]
