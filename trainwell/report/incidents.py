"""What healed or stopped a run: skipped non-finite steps, rollbacks and ``step_timeout`` stops (docs/resilience.md).

Owns reading them: the first two from ``log_history`` (a log entry's ``skipped_nonfinite_steps``, the steps of its
window that ``skip_nonfinite_steps`` did not apply; a rollback's record, with ``skipped_steps_from``/``_to``), the
stops from the run folder's ``step_timeout.jsonl`` (one JSON object per line, written by the watchdog; read as a
hostile file: a regular file only, never through a link, at most ``MAX_STOP_BYTES``, a line that is not a record left
out). These keys are events, not curves: ``EVENT_KEYS`` are kept out of the plotted series. The plots mark them on
the loss figure, the sessions table counts them per session. Standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwell.report.files import open_regular
from trainwell.report.sessions import entry_step, is_summary, number

if TYPE_CHECKING:
    from trainwell.report.history import RunHistory
    from trainwell.report.sessions import Session

SKIPPED = "skipped_nonfinite_steps"
ROLLBACK_KEYS = frozenset({"rollback", "rollback_to_step", "skipped_steps_from", "skipped_steps_to", "spike_loss",
                           "spike_median"})
EVENT_KEYS = ROLLBACK_KEYS | {SKIPPED}
STOP_FILE = "step_timeout.jsonl"
MAX_STOP_BYTES = 1 << 20


@dataclass
class Incidents:
    """``skipped``: (log step, steps skipped in its window); ``rollbacks``: the records; ``stops``: the watchdog's."""

    skipped: list[tuple[int, int]] = field(default_factory=list)
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.skipped or self.rollbacks or self.stops)


def is_rollback(entry: dict[str, Any]) -> bool:
    return isinstance(entry.get("skipped_steps_from"), int) and isinstance(entry.get("skipped_steps_to"), int)


def incidents(run: RunHistory) -> Incidents:
    """The run's incidents, in step order (its entries, overlaps resolved, and its run folder's stop file)."""
    found = Incidents()
    for _, entry in run.entries:
        if is_summary(entry):
            continue
        count = number(entry.get(SKIPPED))
        if count:
            found.skipped.append((entry_step(entry), int(count)))
        if is_rollback(entry):
            found.rollbacks.append(entry)
    found.stops = read_stops(run.run_dir)
    return found


def read_stops(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ``step_timeout`` stops recorded in ``run_dir`` (see the module docstring)."""
    fd = open_regular(Path(run_dir) / STOP_FILE)
    if fd is None:
        return []  # none, a link (nothing is followed out of the folder), a FIFO (never waited on)
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(MAX_STOP_BYTES).decode("utf-8", errors="replace")
    stops = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and type(record.get("step")) is int:
            stops.append(record)
    return sorted(stops, key=lambda r: r["step"])


def stop_text(stop: dict[str, Any]) -> str:
    """``"stopped by step_timeout at step 4 (process 1 stuck in x.py:3 in f)"``."""
    processes = stop.get("processes")
    who = ", ".join(str(p) for p in processes) if isinstance(processes, list) else "?"
    frame = stop.get("frame")
    return f"stopped by step_timeout at step {stop['step']} (process {who} stuck" + (
        f" in {frame})" if isinstance(frame, str) else ")")


def session_incidents(session: Session, found: Incidents, sessions: list[Session]) -> dict[str, str]:
    """The sessions table's cells for ``session``: its skipped steps, its rollbacks, and how it ended when a
    ``step_timeout`` stop falls after its start (and before the next session's)."""
    own = {id(e) for e in session.entries}
    skipped = sum(count for step, count in found.skipped if session.start_step < step <= session.end_step)
    rollbacks = [r for r in found.rollbacks if id(r) in own]
    later = [s.start_step for s in sessions if s.index > session.index]
    stops = [s for s in found.stops if s["step"] > session.start_step and (not later or s["step"] <= min(later))]
    cells = {"skipped steps": str(skipped) if skipped else "",
             "rollbacks": ", ".join(f"to {r.get('rollback_to_step')} (steps {r['skipped_steps_from']}-"
                                    f"{r['skipped_steps_to']} skipped)" for r in rollbacks)}
    if stops:
        cells["ended"] = stop_text(stops[-1])
    return cells
