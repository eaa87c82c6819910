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

``trainwell.report.live_reader`` reads the format back (``parse_lines``, ``rebuild``).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import Any

from trainwell.events.callback import TrainerCallback
from trainwell.utils.jsonl import json_line
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
    return json_line(record)  # the one JSONL encoding, shared with report_to="jsonl"


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


__all__ = ["LIVE_LOG_NAME", "MAX_LINE_BYTES", "LiveLog", "LiveLogCallback"]
