"""Reading the live log back (``OUTPUT_DIR/live_log.jsonl``, written by ``trainwell.loop.live_log``): its lines
parsed into records (``parse_lines``), and the records folded into a run's history (``rebuild``: the logs of each
``train()`` session, the system metrics and the heartbeat). The format is described in ``trainwell.loop.live_log``,
which writes it; everything here only reads, and takes every byte as hostile (a line that is not a record is
counted and skipped, never raised). Standard library only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from trainwell.loop.live_log import MAX_LINE_BYTES


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], int, int]:
    """``(records, consumed, skipped)``: the records of the complete lines of ``data`` (bytes of a live log
    from some offset), how many bytes they span (an unfinished last line is left for the next read), and how
    many lines were not records (not JSON, too long, not a ``log`` or ``session`` object)."""
    records: list[dict[str, Any]] = []
    end = data.rfind(b"\n") + 1
    skipped = 0
    for raw in data[:end].split(b"\n")[:-1]:
        record = _record(raw) if len(raw) <= MAX_LINE_BYTES else None
        if record is None:
            skipped += raw.strip() != b""
        else:
            records.append(record)
    return records, end, skipped


def _record(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    if any(isinstance(record.get(kind), dict) for kind in ("log", "session", "system")):
        return record
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None


def _is_summary(entry: dict[str, Any]) -> bool:
    return "train_loss" in entry or "train_samples_per_second" in entry or "train_steps_per_second" in entry


@dataclass
class LiveHistory:
    """What a live log says: the ``log_history`` it implies (``entries``, as a checkpoint's state would hold it
    followed by what each later session logged), the sessions that led to it (``sessions``: one resumed from a
    later step than a newer one is dropped with the entries it logged), and whether it begins with a fresh start
    (then ``entries`` is the run's whole history)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False
    last_time: float | None = None
    #: the system-metric lines (``trainwell.loop.system_sampler``), each with its ``time``; the newest last
    system: list[dict[str, Any]] = field(default_factory=list)
    #: the writing process's last heartbeat: ``pid``, ``host``, ``ended`` (its sampler stopped), ``time``
    process: dict[str, Any] | None = None
    #: the time each step was logged at (the newest log of that step)
    step_times: dict[int, float] = field(default_factory=dict)

    def add(self, record: dict[str, Any]) -> None:
        """Take one record (from ``parse_lines``) into account."""
        when = record.get("time")
        if isinstance(when, (int, float)) and not isinstance(when, bool) and math.isfinite(when):
            self.last_time = float(when)
        if "log" in record:
            self.entries.append(record["log"])
            step = _int(record["log"].get("step"))
            if step is not None and self.last_time is not None:
                self.step_times[step] = self.last_time
            return
        if "session" not in record:
            self._add_system(record["system"])
            return
        session = record["session"]
        self.process = None  # a new train() call: its own sampler writes its heartbeat next
        start = _int(session.get("start_step"))
        if start is None or start < 0:
            return
        if start == 0 and not session.get("resumed_from"):
            self.entries, self.sessions, self.complete = [], [{**session, "start_step": 0}], True
            self.system, self.process, self.step_times = [], None, {}
            return
        # Sessions that resumed from a later step belong to the future this resume discards.
        kept = [s for s in self.sessions if s["start_step"] < start]
        if not session.get("rollback"):
            kept.append({**session, "start_step": start})
        elif len(kept) < len(self.sessions):  # the call rolled back past its own start: it now starts there
            kept.append({**self.sessions[-1], "start_step": start})
        self.sessions = kept
        # A resume: the checkpoint's history holds what was logged up to its step, and not the end-of-train()
        # summary of the call that saved it (logged after its last save).
        self.entries = [e for e in self.entries if (step := _int(e.get("step"))) is None or step < start
                        or step == start and not _is_summary(e)]


    def _add_system(self, sample: dict[str, Any]) -> None:
        when = self.last_time
        self.process = {"pid": _int(sample.get("pid")), "host": sample.get("host"), "ended": sample.get("ended") is
                        True, "time": when}
        if when is not None and not sample.get("ended"):
            self.system.append({**sample, "time": when})


def rebuild(records: list[dict[str, Any]], history: LiveHistory | None = None) -> LiveHistory:
    """``history`` (a new one when None) with ``records`` added, in order."""
    history = history if history is not None else LiveHistory()
    for record in records:
        history.add(record)
    return history


__all__ = ["LiveHistory", "parse_lines", "rebuild"]
