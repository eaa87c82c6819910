"""The report's tables as rows of display strings: the sessions of a run, and the comparison of several runs.

Owns which columns a table has and how each cell reads; ``trainwell.report.page`` turns rows into HTML and
``text_table`` into aligned text. A table is a list of dicts (one per row, the keys its columns, in order).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from trainwell.report.incidents import incidents, session_incidents
from trainwell.report.sessions import Session, trained_spans, weighted_mean_loss

if TYPE_CHECKING:
    from trainwell.report.history import RunHistory

Rows = list[dict[str, str]]
# Evaluation keys that are timings, not results: left out of "final metrics".
_NOT_RESULTS = ("_runtime", "_per_second", "_mem_", "jit_compilation_time")
# What must not reach a line of text as is: control characters (line breaks, tabs, terminal escapes), the
# characters Python and editors also break lines at (U+0085, U+2028, U+2029), bidirectional overrides (which
# reorder what a reader sees) and lone surrogates (which no UTF-8 file can hold).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(value: Any) -> str:
    """``str(value)`` with each character of ``_UNSAFE`` written as its escape (``\\n``, ``\\x1b``,
    ``\\u2028``), as ``repr`` writes it: a value always stays on its own line of a text summary, whatever a
    hyperparameter, a metric name or a folder name holds. Other text (backslashes included) is left as is."""
    return _UNSAFE.sub(_escape, str(value))


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def short_duration(seconds: float | None) -> str:
    """``h:mm:ss``, or seconds with a decimal under a minute (a short test run is not "0:00:00")."""
    if seconds is None:
        return "not logged"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def session_rows(run: RunHistory) -> Rows:
    """One row per ``train()`` call: the steps it trained (to the next one's resume point, not to its last log),
    runtime, throughput and training loss."""
    rows = []
    found = incidents(run)  # skipped non-finite steps, rollbacks and step_timeout stops
    for session, (first, last) in zip(run.sessions, trained_spans(run.sessions, run.state.get("global_step"))):
        losses = [e["loss"] for e in session.entries if isinstance(e.get("loss"), (int, float))]
        healing = session_incidents(session, found, run.sessions)
        rows.append({
            "session": str(session.index),
            "steps": f"{first}-{last}",
            # "≥": a call without its summary is timed to its last log only
            "runtime": ("" if session.runtime_is_complete or session.runtime is None else "≥ ")
            + short_duration(session.runtime),
            "steps/s": _number(session.rate(session.trained_steps)),
            "samples/s": _number(session.rate(session.samples)),
            "tokens/s": _number(session.rate(session.tokens)),
            "mean train loss": _number(session.mean_loss),
            "last train loss": _number(losses[-1] if losses else None),
            "skipped steps": healing["skipped steps"],
            "rollbacks": healing["rollbacks"],
            "ended": healing.get("ended") or _ending(session, run.sessions),
        })
    return _drop_empty_columns(rows)


def _ending(session: Session, sessions: list[Session]) -> str:
    """How the call ended, as far as the history tells: an earlier call's summary is usually gone (the resumed
    checkpoint was saved before it was logged), so "no summary" there does not mean it failed."""
    if session.summary is not None:
        return "train() returned"
    return "running or interrupted" if session is sessions[-1] else "no summary in this history"


def _drop_empty_columns(rows: Rows) -> Rows:
    keep = [k for k in dict.fromkeys(k for row in rows for k in row) if any(row.get(k) for row in rows)]
    return [{k: row.get(k, "") for k in keep} for row in rows]


def _is_result(key: str) -> bool:
    return key.startswith("eval_") and not any(part in key for part in _NOT_RESULTS)


def comparison_rows(runs: list[RunHistory]) -> Rows:
    """One row per run: its trial parameters, steps, runtime, final and mean train loss, best validation loss
    and its step, and the last value of every evaluation metric any run logged."""
    metrics = sorted({k for run in runs for k in run.series if _is_result(k)},
                     key=lambda k: (k != "eval_loss", k))
    rows = []
    for run in runs:
        loss = run.series.get("loss")
        row = {"run": run.name, "trial": _trial(run), "steps": str(run.state.get("global_step", "")),
               "runtime": _total_runtime(run),
               "final train loss": f"{loss[-1][1]:.4g} (step {loss[-1][0]})" if loss else "",
               "mean train loss": _number(weighted_mean_loss([e for _, e in run.entries]))}
        evals = [p for p in run.series.get("eval_loss", []) if math.isfinite(p[1])]
        if evals:
            step, best = min(evals, key=lambda p: p[1])
            row["best eval_loss"] = f"{best:.4g} (step {step})"
        for key in metrics:
            points = run.series.get(key)
            row[f"final {key}"] = f"{points[-1][1]:.4g}" if points else ""
        rows.append(row)
    return _drop_empty_columns(rows)


def _trial(run: RunHistory) -> str:
    params = run.state.get("trial_params") or {}
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _total_runtime(run: RunHistory) -> str:
    timed = [s.runtime for s in run.sessions if s.runtime is not None]
    if not timed:
        return ""
    lower = len(timed) < len(run.sessions) or not all(s.runtime_is_complete for s in run.sessions)
    return ("≥ " if lower else "") + short_duration(sum(timed))


def info_rows(runs: list[RunHistory]) -> tuple[Rows, set[str]]:
    """One row per run with its hyperparameters and versions, and the columns whose values differ."""
    columns = list(dict.fromkeys(k for run in runs for k in run.info))
    rows = [{"run": run.name, **{k: run.info.get(k, "") for k in columns}} for run in runs]
    differing = {k for k in columns if len({row[k] for row in rows}) > 1}
    return (rows if columns else []), differing


def text_table(rows: Rows, indent: str = "  ") -> str:
    """``rows`` as aligned plain-text columns under a header line."""
    if not rows:
        return ""
    rows = [{one_line(k): one_line(v) for k, v in row.items()} for row in rows]  # one line per row, always
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(row.get(c, ""))) for row in rows)) for c in columns}
    lines = [indent + "  ".join(f"{c:<{widths[c]}}" for c in columns).rstrip()]
    lines += [indent + "  ".join(f"{str(row.get(c, '')):<{widths[c]}}" for c in columns).rstrip() for row in rows]
    return "\n".join(lines)


def describe(value: Any) -> str:
    """A cell for any JSON value: floats to 5 significant digits, the rest as written."""
    return f"{value:.5g}" if isinstance(value, float) else str(value)
