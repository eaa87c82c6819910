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

from trainwell.loop.live_log import LIVE_LOG_NAME, LiveHistory, parse_lines, rebuild
from trainwell.report.files import open_regular

#: the most of a live log read at once; a longer one is read from its last MAX_BYTES (its start then unknown)
MAX_BYTES = 256 << 20


class LiveLogReader:
    """Reads ``folder/live_log.jsonl`` as it grows: :meth:`poll` takes in the complete lines added since the last
    call (the file replaced or shortened: read again from its start) and says whether anything changed."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = Path(folder) / LIVE_LOG_NAME
        self.history: LiveHistory | None = None
        self.skipped = 0
        self._identity: tuple[int, int] | None = None
        self._offset = 0

    def poll(self) -> bool:
        fd = open_regular(self.path)
        if fd is None:
            changed = self.history is not None
            self.history, self._identity, self._offset, self.skipped = None, None, 0, 0
            return changed
        try:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if identity != self._identity or info.st_size < self._offset:
                self.history, self._identity, self._offset, self.skipped = None, identity, 0, 0
            start = self._offset
            if start == 0 and info.st_size > MAX_BYTES:
                start = info.st_size - MAX_BYTES  # its start cannot be read: the history is incomplete
            if info.st_size <= start and self.history is not None:
                return False
            os.lseek(fd, start, os.SEEK_SET)
            data = _read(fd, min(info.st_size - start, MAX_BYTES))
        finally:
            os.close(fd)
        if start > self._offset:  # began in the middle of a line: skip to the next one
            cut = data.find(b"\n") + 1
            data, start = data[cut:], start + cut
        records, consumed, skipped = parse_lines(data)
        self._offset = start + consumed
        self.skipped += skipped
        fresh = self.history is None
        self.history = rebuild(records, self.history)
        return bool(records) or fresh


def _read(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_live_log(folder: str | os.PathLike[str]) -> LiveHistory | None:
    """The live log of the run in ``folder`` (None when there is none, or it is not a regular file)."""
    reader = LiveLogReader(folder)
    reader.poll()
    return reader.history


def _key(entry: Any) -> str:
    return json.dumps(entry, sort_keys=True, default=str)


def merge_state(state: dict[str, Any] | None, live: LiveHistory | None) -> dict[str, Any] | None:
    """The state with the live log's newer entries: ``state``'s ``log_history`` followed by the live entries after
    the live log's copy of its last entry (``state`` itself when the live log holds no such copy: another run's,
    or older). Without a state, the live log's history when it starts with a fresh start. ``global_step`` and
    ``max_steps`` follow the newest session. ``state`` is not modified."""
    if live is None or not live.entries:
        return state if state is not None or live is None or not live.complete else _from_live({}, [], live)
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list) or not history:
        return _from_live(state or {}, [], live) if live.complete or state is not None else None
    last = _key(history[-1])
    for position in range(len(live.entries) - 1, -1, -1):
        if _key(live.entries[position]) == last:
            return _from_live(state, history, live, live.entries[position + 1:])
    return state


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
