"""A run's live log (``OUTPUT_DIR/live_log.jsonl``, written by ``trainwell.loop.live_log``) read into its state.

Owns reading the live log as a hostile file (a regular file only, never through a link, never blocking on a FIFO,
at most ``MAX_BYTES`` of it, a malformed line skipped) and merging it with the state file the report found:
``trainer_state.json`` is written at checkpoints only, the live log at every log, so the merged history is the
state's followed by what the live log holds after the state's last entry. The live log's session lines also give
each resume's exact step (``resume_steps``), which the history alone only brackets (``trainwell.report.sessions``).

``LiveLogReader`` reads a growing file incrementally (only the bytes added since the last read): the live page of
``trainwell report --watch`` polls it every second or two. Standard library only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainwell.loop.live_log import LIVE_LOG_NAME, MAX_LINE_BYTES
from trainwell.report.files import open_regular
from trainwell.report.live_reader import LiveHistory, parse_lines, rebuild

#: the most of a live log read at once; a longer one is read from its last MAX_BYTES (its start then unknown)
MAX_BYTES = 256 << 20
#: the live log is read this much at a time: with the line carried over, the most held in memory while reading
CHUNK_BYTES = 256 << 10
_KINDS = 16


class LiveLogReader:
    """Reads ``folder/live_log.jsonl`` as it grows: :meth:`poll` takes in the complete lines added since the last
    call (the file replaced or shortened: read again from its start) and says whether anything changed.

    Memory stays bounded however long the log: it is read ``CHUNK_BYTES`` at a time, a line longer than
    ``MAX_LINE_BYTES`` is skipped (counted in ``skipped``) without being held, and with ``max_points`` the older
    entries are thinned (``thin_entries``: about ``max_points`` kept per kind of entry, the newest ``max_points``
    all kept; ``thinned`` then says so). Without ``max_points`` every entry is kept (a written report)."""

    def __init__(self, folder: str | os.PathLike[str], max_points: int | None = None) -> None:
        self.path = Path(folder) / LIVE_LOG_NAME
        self.max_points = max_points
        self.history: LiveHistory | None = None
        self.skipped = 0
        self.thinned = False
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._skipping = False  # inside a line that is skipped (too long, or cut by a start past MAX_BYTES)

    def _reset(self, identity: tuple[int, int] | None) -> None:
        self.history, self._identity, self._offset, self.skipped = None, identity, 0, 0
        self.thinned, self._skipping = False, False

    def poll(self) -> bool:
        fd = open_regular(self.path)
        if fd is None:
            changed = self.history is not None
            self._reset(None)
            return changed
        try:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if identity != self._identity or info.st_size < self._offset:
                self._reset(identity)
            if self._offset == 0 and info.st_size > MAX_BYTES:
                # its start cannot be read: the history is incomplete; the first line read may be cut
                self._offset, self._skipping = info.st_size - MAX_BYTES, True
            if info.st_size <= self._offset and self.history is not None:
                return False
            fresh = self.history is None
            self.history = self.history if self.history is not None else LiveHistory()
            return self._read_from(fd, info.st_size) or fresh
        finally:
            os.close(fd)

    def _read_from(self, fd: int, size: int) -> bool:
        """Take in the complete lines between the offset and ``size``, a chunk at a time; True when any."""
        assert self.history is not None
        position, pending, changed = self._offset, b"", False
        while position < size:
            chunk = os.pread(fd, min(CHUNK_BYTES, size - position), position)
            if not chunk:
                break
            position += len(chunk)
            data = pending + chunk
            if self._skipping:
                cut = data.find(b"\n")
                if cut < 0:  # still inside the skipped line: nothing of it is kept
                    pending, self._offset = b"", position
                    continue
                data, self._skipping = data[cut + 1:], False
            records, consumed, skipped = parse_lines(data)
            self.skipped += skipped
            pending = data[consumed:]
            if len(pending) > MAX_LINE_BYTES:  # a line longer than any the writer writes: skipped, not held
                pending, self._skipping, self.skipped = b"", True, self.skipped + 1
            self._offset = position - len(pending)
            if records:
                changed = True
                rebuild(records, self.history)
                if self.max_points is not None and len(self.history.entries) > 8 * self.max_points:
                    self.history.entries = thin_entries(self.history.entries, self.max_points)
                    steps = {e.get("step") for e in self.history.entries}
                    self.history.step_times = {k: v for k, v in self.history.step_times.items() if k in steps}
                    self.thinned = True
                if self.max_points is not None and len(self.history.system) > 8 * self.max_points:
                    self.history.system = thin_entries(self.history.system, self.max_points)
        return changed


def thin_entries(entries: list[dict[str, Any]], per_kind: int) -> list[dict[str, Any]]:
    """``entries`` with the older ones thinned: the newest ``per_kind`` are all kept; before them, the entries of
    each kind (the same keys: the train logs, the evaluations, ...; past ``_KINDS`` kinds, one kind for the rest)
    are halved, every other one kept (the first
    included), until at most ``per_kind`` of that kind are left. Called whenever the list grows past a bound, this
    keeps each curve's older points with a stride that doubles, so a log of any length costs the same memory."""
    cut = max(len(entries) - per_kind, 0)
    kinds: dict[frozenset[str] | None, list[int]] = {}
    for position in range(cut):
        kind: frozenset[str] | None = frozenset(entries[position])
        if kind not in kinds and len(kinds) >= _KINDS:
            kind = None  # a log whose every entry has other keys: its entries share one kind beyond the first few
        kinds.setdefault(kind, []).append(position)
    kept: set[int] = set()
    for positions in kinds.values():
        while len(positions) > per_kind:
            positions = positions[::2]
        kept.update(positions)
    return [e for p, e in enumerate(entries[:cut]) if p in kept] + entries[cut:]


def read_live_log(folder: str | os.PathLike[str]) -> LiveHistory | None:
    """The live log of the run in ``folder`` (None when there is none, or it is not a regular file)."""
    reader = LiveLogReader(folder)
    reader.poll()
    return reader.history


def _key(entry: Any) -> str:
    return json.dumps(entry, sort_keys=True, default=str)


def merge_state(state: dict[str, Any] | None, live: LiveHistory | None, thinned: bool = False
                ) -> dict[str, Any] | None:
    """The state with the live log's newer entries: ``state``'s ``log_history`` followed by the live entries after
    the live log's copy of its last entry (``state`` itself when the live log holds no such copy: another run's,
    or older). Without a state, the live log's history when it starts with a fresh start. ``global_step`` and
    ``max_steps`` follow the newest session. ``state`` is not modified. ``thinned``: the live log's older entries
    were thinned (``thin_entries``), so the copy may be gone: then the live entries after the last entry's step
    follow it, when the live log reaches back that far."""
    if live is None or not live.entries:
        return state if state is not None or live is None or not live.complete else _from_live({}, [], live)
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list) or not history:
        return _from_live(state or {}, [], live) if live.complete or state is not None else None
    last = _key(history[-1])
    for position in range(len(live.entries) - 1, -1, -1):
        if _key(live.entries[position]) == last:
            return _from_live(state, history, live, live.entries[position + 1:])
    step = _step_of(history[-1])
    if thinned and step is not None and (_step_of(live.entries[0]) or 0) <= step:
        return _from_live(state, history, live, [e for e in live.entries if (_step_of(e) or -1) > step])
    return state


def _step_of(entry: Any) -> int | None:
    step = entry.get("step") if isinstance(entry, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _from_live(state: dict[str, Any], history: list[Any], live: LiveHistory,
               newer: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    newer = live.entries if newer is None else newer
    merged = {**state, "log_history": [*history, *newer]}
    steps = [s for e in merged["log_history"] if isinstance(e, dict) and isinstance(s := e.get("step"), int)
             and not isinstance(s, bool)]
    current = state.get("global_step")
    if steps and not (isinstance(current, int) and current >= max(steps)):
        merged["global_step"] = max(steps)
    merged.setdefault("global_step", 0)
    session_max = live.sessions[-1].get("max_steps") if live.sessions else None
    if isinstance(session_max, int) and not isinstance(session_max, bool) and newer:
        merged["max_steps"] = session_max
    merged.setdefault("max_steps", session_max if isinstance(session_max, int) else 0)
    epochs = [e["epoch"] for e in newer if isinstance(e, dict) and isinstance(e.get("epoch"), (int, float))]
    if epochs:
        merged["epoch"] = epochs[-1]
    return merged


def resume_points(live: LiveHistory | None) -> dict[int, float]:
    """The steps the live log's sessions resumed from (a fresh start left out), each with the input tokens seen
    by then (0 when not counted)."""
    points: dict[int, float] = {}
    for session in live.sessions if live is not None else []:
        if session["start_step"] > 0 or session.get("resumed_from"):
            tokens = session.get("num_input_tokens_seen")
            ok = isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and tokens == tokens
            points[session["start_step"]] = float(tokens) if ok else 0.0
    return points


__all__ = ["LIVE_LOG_NAME", "LiveLogReader", "MAX_BYTES", "merge_state", "read_live_log", "resume_points"]
