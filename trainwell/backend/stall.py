"""``step_timeout``: a process that stops making progress stops the run within seconds, naming where it was.

Owns the progress counter and the watchdog thread. Progress is the run's :class:`Heartbeat` (``trainer.heartbeat``,
one per Trainer: two trainings in one process, as threaded Optuna or Ray Tune trials run, each have theirs, and a
stall of one is not hidden by the other's progress): ``beats``, a plain int the training thread adds one to per
training micro-batch and optimizer step (``trainwell.loop.step``), evaluation batch (``trainwell.loop.evaluation``)
and at each end of a checkpoint save (``trainwell.loop.boundary``): no lock, no clock read, no device tensor.
While a ``train()`` attempt runs (:func:`watch`), a :class:`StallWatchdog` thread in every process reads it about
four times per timeout. It arms once the first optimizer step is done (the
first step may compile), and when the count has not moved for ``step_timeout`` seconds it:

1. tells the other processes what this one was doing, through the process group's key-value store (the launcher
   hosts it, as ``trainwell.backend.failures`` uses it): its count, the innermost frame of its training thread that is
   not the standard library's or torch's, what trainwell was doing there, and whether that is a collective;
2. waits a few seconds for the others' reports, and settles on the stuck process: one that did not report, or is
   not inside a collective while the others wait in theirs (the fewest beats breaks a tie); the first process to
   decide writes the verdict to the store, so every process names the same one;
3. prints its Python stack (``faulthandler``, every thread) and the one error to stderr;
4. raises :class:`StepTimeout` in the training thread (the one that called ``train()``: the main thread of a
   script, a worker thread of Ray Tune or of an Optuna search with ``n_jobs``); a training thread that does not
   return to Python (blocked in a collective, a long sleep, C code) is ended with ``os._exit(1)`` after a grace
   period, ``GRACE_STUCK`` for the stuck process (a process alone included; its exit makes the others' collectives
   fail, and :func:`watch` turns that into the same error), ``GRACE_WAITING`` for the others;
5. (world process zero) appends the stop to ``output_dir/step_timeout.jsonl`` for the run report, inside the grace
   period: by a thread of its own, waited for until the grace period ends at most, opened without following a
   link nor waiting on a FIFO, and only when it is a regular file; whatever sits at that name, the stop is on
   time.

The thread is stopped and joined when the attempt ends, however it ends: none is left running after ``train()``.

``step_timeout="auto"`` takes ``AUTO_FACTOR`` times the median time between beats, measured over the steps after the
first ``AUTO_WARMUP`` beats, and never less than ``AUTO_FLOOR`` seconds. Saves and ``compute_metrics`` beat only at
their ends: a timeout must be longer than the longest checkpoint write and metric computation.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import logging
import os
import statistics
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

from trainwell.args.storage import local_output_dir
from trainwell.backend.failures import (
    OPERATIONS,
    NewestCheckpoint,
    describe,
    names_from_frame,
    process_store,
    resume_hint,
)
from trainwell.utils.safe_files import append_bytes

logger = logging.getLogger(__name__)

AUTO_FACTOR = 20.0  #: "auto": this many times the median time between beats ...
AUTO_FLOOR = 600.0  #: ... and never less than this (NCCL's own default timeout)
AUTO_WARMUP = 10  #: beats left out of the median (compilation, caches, the first evaluation)
AUTO_SAMPLES = 20  #: samples of the time between beats taken before the timeout is set ...
AUTO_POLL = 0.25  #: ... one per this many seconds
REPORT_WAIT = 5.0  #: how long a process waits for the others' reports
GRACE_STUCK, GRACE_WAITING = 2.0, 10.0  #: how long training may take to raise StepTimeout before os._exit
PREFIX = "trainwell/stall"
RECORD_FILE = "step_timeout.jsonl"  #: in output_dir: one line per stop, read by the run report
_LIBRARY_DIRS = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
_COLLECTIVES = frozenset(key for key, _ in OPERATIONS if key != "prepare")


class Heartbeat:
    """A run's progress counter: ``beats`` only ever grows, written by the training thread alone."""

    __slots__ = ("beats",)

    def __init__(self) -> None:
        self.beats = 0


class StepTimeout(RuntimeError):
    """No progress for ``step_timeout`` seconds: the run stopped on every process (the message names the stuck one)."""


def thread_report(thread: threading.Thread, rank: int, beats: int, global_step: int) -> dict[str, Any]:
    """What the training ``thread`` is doing: its innermost own frame, trainwell's description, whether in a
    collective."""
    frame = sys._current_frames().get(thread.ident)
    names = names_from_frame(frame) if frame is not None else []
    in_torch_distributed = frame is not None and any(
        "torch/distributed/" in f.f_code.co_filename.replace("\\", "/") for f, _ in traceback.walk_stack(frame))
    return {"rank": rank, "beats": beats, "frame": innermost_frame(frame), "doing": doing(names, global_step),
            "collective": in_torch_distributed or bool(_COLLECTIVES.intersection(names))}


def doing(names: list[str], global_step: int) -> str:
    """What a training thread stuck in trainwell's functions ``names`` (outermost first) was doing: a callback's event
    or reading the training data, where ``trainwell.backend.failures.describe`` names no collective or phase."""
    if "call_event" in names and names.index("call_event") > 0:
        return f"a callback's {names[names.index('call_event') - 1]} at step {global_step}"
    if "_windows" in names and "run_window" not in names:
        return f"reading the training data of step {global_step + 1}"
    return describe(names, global_step)


def innermost_frame(frame: Any) -> str:
    """``file:line in function`` of the innermost frame that is neither the standard library's nor torch's (the
    innermost one when all are)."""
    if frame is None:
        return "an unknown place (no Python frame)"
    stack = [f for f, _ in traceback.walk_stack(frame)]
    own = next((f for f in stack if not _library(f.f_code.co_filename)), stack[0])
    return f"{os.path.basename(own.f_code.co_filename)}:{own.f_lineno} in {own.f_code.co_name}"


def _library(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return (path.startswith(_LIBRARY_DIRS) and "site-packages" not in path or "/site-packages/torch/" in path
            or "/site-packages/accelerate/" in path)


def verdict(reports: dict[int, dict[str, Any]], world: int) -> list[int]:
    """The stuck processes: those that did not report, else those outside a collective, else the fewest beats."""
    silent = [r for r in range(world) if r not in reports]
    if silent:
        return silent
    outside = [r for r, report in sorted(reports.items()) if not report["collective"]]
    candidates = outside or sorted(reports)
    fewest = min(reports[r]["beats"] for r in candidates)
    return [r for r in candidates if reports[r]["beats"] == fewest]


def auto_timeout(intervals: list[float]) -> float:
    """``step_timeout="auto"``: ``AUTO_FACTOR`` x the median interval between beats, at least ``AUTO_FLOOR``."""
    return max(AUTO_FLOOR, AUTO_FACTOR * statistics.median(intervals)) if intervals else AUTO_FLOOR


class StallWatchdog(threading.Thread):
    """Watches the run's ``heart`` during one ``train()`` attempt of ``trainer`` (see the module docstring)."""

    def __init__(self, trainer: Any, heart: Heartbeat, timeout: float | str, generation: int,
                 newest_checkpoint: NewestCheckpoint) -> None:
        super().__init__(name="trainwell-step-watchdog", daemon=True)
        self.trainer, self.generation, self.newest_checkpoint = trainer, generation, newest_checkpoint
        self.heart = heart
        self.timeout: float | None = None if timeout == "auto" else float(timeout)
        runtime = trainer.runtime
        self.rank, self.world = runtime.process_index, runtime.num_processes
        self.store = process_store() if runtime.distributed else None
        self.start_beats = heart.beats
        # one beat per micro-batch and one per optimizer step: armed once the first step is done (it may compile)
        self.arm_at = self.start_beats + trainer.args.gradient_accumulation_steps + 1
        self.message: str | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._training = threading.current_thread()  # built by watch(), in the thread that runs train()

    def stop(self) -> None:
        """End the watch and wait for the thread (at most the time its report exchange may take)."""
        with self._lock:
            self._stopped.set()
            if self.message is not None:  # fired, but training got out on its own: no exception left pending
                _raise_in(self._training, None)
        if self.is_alive() and self is not threading.current_thread():
            self.join(REPORT_WAIT + 1.0)

    def run(self) -> None:
        heart = self.heart
        beats, changed, intervals = heart.beats, time.monotonic(), []
        while not self._stopped.wait(min(1.0, self.timeout / 4) if self.timeout else AUTO_POLL):
            now, current = time.monotonic(), heart.beats
            if current != beats:
                if current - self.start_beats > AUTO_WARMUP:
                    intervals.append((now - changed) / (current - beats))
                if self.timeout is None and len(intervals) >= AUTO_SAMPLES:
                    self.timeout = auto_timeout(intervals)
                    logger.info("step_timeout='auto': %.0f s (median %.3f s between micro-batches).", self.timeout,
                                statistics.median(intervals))
                beats, changed = current, now
            elif self.timeout is not None and current >= self.arm_at and now - changed >= self.timeout:
                self._fire(now - changed)
                return

    # ------------------------------------------------------------------------------------------- stopping the run
    def _fire(self, quiet: float) -> None:
        trainer = self.trainer
        mine = thread_report(self._training, self.rank, self.heart.beats, trainer.state.global_step)
        reports = self._exchange(mine)
        stuck = self._agree(verdict(reports, self.world))
        message = _message(trainer, quiet, stuck, reports, self.world, self.newest_checkpoint)
        with self._lock:
            if self._stopped.is_set():
                return  # the attempt ended while this was decided
            self.message = message
        sys.stderr.write(f"trainwell step_timeout: the Python stack of process {self.rank}:\n")
        _dump_stacks()
        sys.stderr.write(f"StepTimeout: {message}\n")
        sys.stderr.flush()
        logger.error(message)
        # The grace period starts now, whatever the record below costs (a stuck disk, a FIFO at its name). One
        # process alone is the stuck one: nobody else's collective has to fail first.
        deadline = time.monotonic() + (GRACE_STUCK if self.rank in stuck else GRACE_WAITING)
        with self._lock:  # not once stop() ran: the exception would reach whatever the thread does after train()
            if self._stopped.is_set():
                return
            _raise_in(self._training, StepTimeout)
        if trainer.is_world_process_zero():
            _record_within(trainer, quiet, stuck, reports, deadline)
        if not self._stopped.wait(max(deadline - time.monotonic(), 0.0)):
            os._exit(1)  # training is blocked where no exception reaches it: the message is on stderr

    def _exchange(self, mine: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Every process's report that arrives within ``REPORT_WAIT`` (this one's alone without a store)."""
        reports = {self.rank: mine}
        if self.store is None:
            return reports
        key = f"{PREFIX}/{self.generation}/report"
        with contextlib.suppress(Exception):
            self.store.set(f"{key}/{self.rank}", json.dumps(mine))
            deadline = time.monotonic() + REPORT_WAIT
            while len(reports) < self.world and time.monotonic() < deadline:
                for other in range(self.world):
                    if other not in reports and self.store.check([f"{key}/{other}"]):
                        reports[other] = json.loads(self.store.get(f"{key}/{other}"))
                time.sleep(0.1)
        return reports

    def _agree(self, stuck: list[int]) -> list[int]:
        """The first verdict written to the store (every process names the same processes)."""
        if self.store is None:
            return stuck
        with contextlib.suppress(Exception):
            agreed = self.store.compare_set(f"{PREFIX}/{self.generation}/verdict", "", json.dumps(stuck))
            return [int(r) for r in json.loads(agreed)]
        return stuck


def _message(trainer: Any, quiet: float, stuck: list[int], reports: dict[int, dict[str, Any]], world: int,
             newest_checkpoint: NewestCheckpoint) -> str:
    def where(rank: int) -> str:
        report = reports.get(rank)
        if report is None:
            return "(it sent no report: frozen, or its watchdog could not run)"
        return f"in {report['frame']} ({report['doing']})"

    limit = trainer.args.step_timeout
    setting = f"step_timeout={limit!r}" + (f" ({quiet:.0f} s)" if limit == "auto" else "")
    if world == 1:
        head = f"No progress for {quiet:.0f} s ({setting}): the process was stuck in {reports[0]['frame']} " \
               f"({reports[0]['doing']})."
    else:
        waiting = [f"process {r} {where(r)}" for r in sorted(reports) if r not in stuck]
        named = "; ".join(f"process {r} of {world} is stuck {where(r)}" for r in stuck)
        head = (f"No progress for {quiet:.0f} s ({setting}): {named}"
                + (f"; the other processes were waiting for it: {'; '.join(waiting)}" if waiting else "") + ".")
    return (f"{head} Every process printed its Python stack to stderr and stops. "
            f"{resume_hint(trainer.args.output_dir, newest_checkpoint)}")


def _record_within(trainer: Any, quiet: float, stuck: list[int], reports: dict[int, dict[str, Any]],
                   deadline: float) -> None:
    """One line in ``output_dir/step_timeout.jsonl``, for the run report, written by a thread of its own and
    waited for until ``deadline`` at most: a disk that hangs delays the stop by nothing."""
    first = reports.get(stuck[0], {}) if stuck else {}
    line = {"step": trainer.state.global_step, "processes": stuck, "frame": first.get("frame"),
            "doing": first.get("doing"), "seconds": round(quiet, 1), "time": time.time()}
    path = os.path.join(local_output_dir(trainer.args), RECORD_FILE)
    writer = threading.Thread(target=_append_record, args=(path, (json.dumps(line) + "\n").encode()),
                              name="trainwell-step-timeout-record", daemon=True)
    writer.start()
    writer.join(max(deadline - time.monotonic(), 0.0))


def _append_record(path: str, data: bytes) -> None:
    """Append ``data`` to the regular file ``path`` through the one appending helper (a link, a FIFO or anything
    but a regular file is refused, never written through or waited on); a failure is a warning (the stop itself
    is on stderr already)."""
    try:
        append_bytes(path, data)
    except (OSError, ValueError) as err:  # ValueError: UnsafeFileError, a link or a FIFO at the record's name
        logger.warning("step_timeout: the stop is not recorded in %s (%s); the run report will not show it.", path,
                       getattr(err, "strerror", None) or err)


def _dump_stacks() -> None:
    try:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor (a notebook, a capture)
        for ident, frame in sys._current_frames().items():
            sys.stderr.write(f"Thread {ident}:\n{''.join(traceback.format_stack(frame))}")


def _raise_in(thread: threading.Thread, exception: type[BaseException] | None) -> None:
    """Raise ``exception`` in ``thread`` at its next Python instruction (None: cancel one still pending)."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(exception) if exception else None)


_generation = 0  # train() attempts watched in this process (the same count on every process: store keys)


@contextlib.contextmanager
def watch(trainer: Any, newest_checkpoint: NewestCheckpoint) -> Iterator[None]:
    """Run the block under a :class:`StallWatchdog` when ``step_timeout`` is set; an error that reaches here after
    the watchdog fired (the ``StepTimeout`` it raised, or the collective a stopped process broke) becomes one
    :class:`StepTimeout` with the watchdog's message. ``newest_checkpoint(output_dir)`` names the checkpoint to
    resume from (handed in by the layer that knows). The watchdog reads ``trainer.heartbeat``, the run's own."""
    global _generation
    timeout = trainer.args.step_timeout
    if timeout is None:
        yield
        return
    _generation += 1
    dog = StallWatchdog(trainer, trainer.heartbeat, timeout, _generation, newest_checkpoint)
    dog.start()
    try:
        yield
    except BaseException as err:
        if dog.message is not None:
            raise StepTimeout(dog.message) from err
        raise
    finally:
        dog.stop()
