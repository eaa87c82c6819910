"""The live log: ``OUTPUT_DIR/live_log.jsonl``, each log entry of a run as it is logged, for watching a run live.

Written only when ``report_to`` names ``"live"`` (``trainwell.args.trackers.SWITCHES``; ``trainwell demo`` and
``trainwell train`` add it), so that a plain run's folder holds what the reference's holds: the wiring then adds
:class:`LiveLogCallback`, which writes the session line at ``on_train_begin`` and each log at ``on_log``.

Between two checkpoints a run writes nothing else that a reader could see: ``trainer_state.json`` is written with
each checkpoint only (and by ``save_state()``). The live log fills that gap, so ``trainwell report`` (and its live
page, ``--watch``) shows a run up to its last log, reading nothing but the run folder (a shared disk is enough; no
socket to the training process).

Format, one JSON object per line (``\\n`` ends every complete line; a reader ignores an unfinished last line):

* ``{"session": {"start_step", "resumed_from", "max_steps", "num_input_tokens_seen"}, "time": T}``: a ``train()``
  call starts, at ``start_step`` (the checkpoint's step when it resumed from ``resumed_from``, the checkpoint
  folder's name; None for a fresh start);
* ``{"log": ENTRY, "time": T}``: ENTRY is exactly what went into ``state.log_history`` (``{**logs, "step": N}``).
* ``{"system": {...}, "time": T}``: system metrics and the heartbeat, from ``trainwell.loop.system_sampler``'s
  timer thread (never in ``log_history``).

``T`` is the UNIX time of the write. A fresh start (step 0, no checkpoint) replaces the file (its session line is
written to a temporary name and renamed onto it, which replaces a link rather than following it); a resume, and
every log, append one line with one ``write`` to a file opened with ``O_APPEND | O_NOFOLLOW`` (a link or anything
but a regular file is refused, never written through).

Cost: one small append per log on the process that saves checkpoints (``args.should_save``), at log steps only,
never per step; nothing is read from the device for it (the entry holds Python numbers already). A failure to
write (a read-only or full disk, a link planted at the name) warns once and stops the live log; training goes on.

``parse_lines`` and ``rebuild`` read the format back (``trainwell.report.live`` uses them); standard library only.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from trainwell.events.callback import TrainerCallback
from trainwell.utils.safe_files import UnsafeFileError, append_bytes, write_file

logger = logging.getLogger(__name__)

LIVE_LOG_NAME = "live_log.jsonl"
#: a line longer than this is not one the writer wrote: skipped when read
MAX_LINE_BYTES = 1 << 20

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO at the name fails to open instead of blocking the run


def _line(record: dict[str, Any]) -> bytes:
    record["time"] = round(time.time(), 3)
    # default=str: a value json cannot write (a tensor a subclass logged) is written as its text, never lost
    return (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode("utf-8", "backslashreplace")


class LiveLog:
    """Appends a run's log entries to its live log. Made by :meth:`begin` at the start of each ``train()``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.broken = False

    @classmethod
    def begin(cls, folder: str, start_step: int, resumed_from: str | None, max_steps: int,
              tokens_seen: int = 0, rollback: dict[str, Any] | None = None) -> LiveLog:
        """The live log of the run in ``folder``, its session line written: a new file for a fresh start, one
        more line for a resume (``resumed_from``: the checkpoint's path). ``rollback``: this start is
        ``rollback_on_spike`` going back to ``resumed_from`` inside the same ``train()`` call; its record (the
        ``log_history`` entry) follows the session line, which is marked so that readers keep one session."""
        log = cls(os.path.join(folder, LIVE_LOG_NAME))
        session = {"start_step": start_step, "resumed_from": os.path.basename(os.path.normpath(resumed_from))
                   if resumed_from else None, "max_steps": max_steps, "num_input_tokens_seen": tokens_seen}
        if rollback is not None:
            session["rollback"] = True
        line = _line({"session": session})
        if resumed_from is None and start_step == 0:
            log._guarded(log._replace, line)
        else:
            log._guarded(log._append, line)
        if rollback is not None:
            log.append(rollback)
        return log

    def append(self, entry: dict[str, Any]) -> None:
        """Add one ``log_history`` entry (one ``write``; nothing when an earlier write failed)."""
        if not self.broken:
            self._guarded(self._append, _line({"log": entry}))

    def _guarded(self, write: Any, data: bytes) -> None:
        try:
            write(data)
        except OSError as err:
            self.broken = True
            reason = ("it is not a regular file" if err.errno is None else "it is a symbolic link"
                      if err.errno == errno.ELOOP else err.strerror or str(err))
            logger.warning("Cannot write the live log %s (%s): it stops here, training goes on; `trainwell report` "
                           "shows the run from its checkpoints.", self.path, reason)

    def _append(self, data: bytes) -> None:
        try:
            append_bytes(self.path, data)  # a regular file only: never through a link, never into a FIFO
        except UnsafeFileError as err:  # said as the warning says it: "it is a symbolic link" / "not a regular file"
            raise OSError(errno.ELOOP, str(err)) if "a symbolic link" in str(err) else OSError(str(err)) from None

    def _replace(self, data: bytes) -> None:
        write_file(self.path, data)  # a fresh temporary name, then a rename: replaces a link, never follows it


class LiveLogCallback(TrainerCallback):
    """Keeps the run folder's live log, on the process that saves (``args.should_save``): a session line when a
    ``train()`` call begins (its start step, the checkpoint it resumed, and the rollback that chose it:
    ``trainer.checkpointer.resume``), then each ``log_history`` entry as it is logged (before the callbacks after
    it see the log). Added by the wiring when ``report_to`` names ``"live"``; ``trainer``: the facade, read at
    ``on_train_begin`` only."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer
        self.log: LiveLog | None = None  #: the live log of the last train() call (None before one)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not args.should_save:
            return
        trainer = self._trainer
        resume = trainer.checkpointer.resume
        folder = trainer._get_output_dir(getattr(trainer, "_trial", None))
        self.log = LiveLog.begin(folder, state.global_step, resume.path if resume is not None else None,
                                 state.max_steps, state.num_input_tokens_seen,
                                 rollback=resume.rollback if resume is not None else None)
        from trainwell.loop.system_sampler import SystemSampler  # it writes through this module's LiveLog

        # system metrics and the heartbeat on a timer thread, stopped however this train() call ends
        trainer.training_run.on_close(SystemSampler.begin(self.log.path).stop)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.log is not None:  # one line appended to the run folder, at log time only
            self.log.append(state.log_history[-1])


# --- reading ---------------------------------------------------------------------------------------------------------


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


__all__ = ["LIVE_LOG_NAME", "LiveHistory", "LiveLog", "LiveLogCallback", "parse_lines", "rebuild"]
