"""When one process of a multi-process run stops, the others stop too, saying which one and where.

Owns the failure protocol of a run with several processes. A collective with a process that died fails at once
on gloo (its socket closes) and after ``ddp_timeout`` with a process that hangs, but the error names a socket
address, not a process or an operation. :func:`stop_together` wraps a Trainer's training, evaluation and
prediction:

* on a **communication error**, this process writes ``stopped/<rank>`` to the process group's key-value store
  (which the launcher hosts, so it outlives any worker), waits a moment for the others' notes, and raises
  :class:`ProcessFailure` naming the processes that left no note (killed, or hanging), those that reported an
  error (with it), the operation this process was in (from its stack: the gradient all-reduce of a step, saving
  a checkpoint, an evaluation, the logged-loss average, ...) and the newest complete checkpoint to resume from;
* on **any other error** (a Python exception on this process), it writes ``failed/<rank>`` with the error and
  counts it in ``failures``. A process that then exits closes its sockets, so the others' collectives fail at
  once and name it and its error. A process that stays (the script caught the error: a notebook, a search loop)
  keeps its sockets open, as DDP holds the group; so each process also runs a :class:`Watchdog` thread while in
  the block, which reads the ``failures`` count once a second. When another process has failed and this one has
  not stopped on its own within a grace period, the watchdog prints the same kind of message (what this process
  was doing comes from its main thread's stack) and ends the process: its next collective could only wait
  ``ddp_timeout`` for a process that will never come, and everything saved stays resumable.

Nothing of this runs in a single process, and nothing per step (the watchdog is one store read per second).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

#: ``output_dir -> the newest checkpoint a restart would resume from`` (None: none yet)
NewestCheckpoint = Callable[[str], "str | None"]

PREFIX = "trainwell/failure"
# How long a survivor waits for the other survivors' notes while more than one process is silent. A process that
# failed on an exception wrote its note before it left; a launcher (torchrun) may stop the survivors soon.
NOTE_WAIT_SECONDS = 1.0
WATCH_SECONDS = 1.0  # how often the watchdog reads the failure count
GRACE_SECONDS = 5.0  # how long it then lets this process stop on its own (a collective error names things best)

#: Functions on the stack -> what the process was doing (innermost match wins for the operation); every key but
#: "prepare" is a collective (``trainwell.backend.stall`` reads that).
OPERATIONS = (
    ("gather_loss_sum", "averaging the logged loss over processes"),
    ("mean_loss_sum", "averaging the logged loss over processes"),
    ("backward", "the backward pass (its gradient all-reduce)"),
    ("clip_grad_norm_", "clipping gradients (the norm over processes)"),
    ("save_model_shards", "writing the model's shards"),
    ("save_optimizer_shards", "writing the optimizer's shards"),
    ("full_model_state", "gathering the full weights to save them"),
    ("wait_for_everyone", "waiting for the other processes (a barrier)"),
    ("_gather_tensor", "gathering evaluation outputs"),
    ("_gather_objects", "gathering evaluation outputs"),
    ("_max_shapes", "gathering evaluation output shapes"),
    ("reduce_data_sum", "summing token counts over processes"),
    ("reduce_sum", "a sum over processes"),
    ("gather", "gathering values from every process"),
    ("prepare", "preparing the model (Accelerate)"),
)
# Enclosing phases (the innermost on the stack wins: a save inside the end of a step is "while saving").
_PHASES = (
    ("save_checkpoint", "while saving checkpoint-{step}"),
    ("evaluation_loop", "in an evaluation at step {step}"),
    ("run_window", "in training step {next_step}"),
    ("maybe_log_save_evaluate", "at the end of step {step}"),
)


class ProcessFailure(RuntimeError):
    """Another process of the run stopped (or this one lost contact with it); this process stops too."""


def is_communication_error(err: BaseException) -> bool:
    """Whether ``err`` comes from a collective whose peer went away (gloo/NCCL/c10d errors, timeouts)."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(mark in text for mark in (
        "gloo/transport", "Connection closed by peer", "Connection reset by peer", "Timed out waiting",
        "NCCL error", "ProcessGroupNCCL", "Socket Timeout",
    ))


_active = threading.local()  # the watchdog of the outermost block on this thread


@contextlib.contextmanager
def stop_together(trainer: Any, newest_checkpoint: NewestCheckpoint) -> Iterator[None]:
    """Run the block; in a multi-process run turn a lost peer into :class:`ProcessFailure` (module docstring).

    ``newest_checkpoint(output_dir)`` names the checkpoint a restart would resume from (None: none yet), for the
    error's advice; the checkpoint layer hands it in (this one sits below it).
    """
    runtime = getattr(trainer, "runtime", None)
    distributed = runtime is not None and runtime.distributed and _initialized()
    watchdog = None
    if distributed and getattr(_active, "watchdog", None) is None:
        watchdog = _active.watchdog = Watchdog.start_for(trainer, newest_checkpoint)
    try:
        yield
    except ProcessFailure:
        raise
    except BaseException as err:
        if not distributed:
            raise
        if is_communication_error(err):
            raise _survivor_error(trainer, err, newest_checkpoint) from err
        if _should_leave(trainer, err):
            err._trainwell_left = True  # type: ignore[attr-defined]  # an enclosing block must not leave again
            _leave(runtime.process_index, err)
        raise
    finally:
        if watchdog is not None:
            watchdog.stop()
            _active.watchdog = None


def _should_leave(trainer: Any, err: BaseException) -> bool:
    """Not for KeyboardInterrupt/SystemExit (they stop every process anyway), nor for an out-of-memory error
    that ``auto_find_batch_size`` retries with a smaller batch (on every process)."""
    if not isinstance(err, Exception) or getattr(err, "_trainwell_left", False):
        return False
    if getattr(err, "_trainwell_together", False):  # raised by every process alike (a rollback_on_spike rollback)
        return False
    if trainer.args.auto_find_batch_size:
        from trainwell.utils.batch_size import is_out_of_memory

        return not is_out_of_memory(err)
    return True


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def process_store() -> Any:
    """The process group's key-value store (the launcher hosts it), or None without one."""
    import torch.distributed as dist

    # Only calls that never wait are made on it (set, add, check, and get after check): its timeout, which
    # the process group's own rendezvous relies on, is left alone.
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no store (a process group made without one): the messages cannot name processes
        return None


def _leave(rank: int, err: BaseException) -> None:
    """Tell the others why this process stops, then destroy the group so their collectives fail now."""
    import torch.distributed as dist

    store = process_store()
    if store is not None:
        with contextlib.suppress(Exception):
            store.set(f"{PREFIX}/failed/{rank}", f"{type(err).__name__}: {err}"[:500])
            store.add(f"{PREFIX}/failures", 1)
    logger.error("Process %d stops on %s; the other processes are told to stop too.", rank, type(err).__name__)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()  # closes the sockets unless something (DDP) still holds the group


def _notes(rank: int, world: int, doing: str) -> tuple[list[int], dict[int, str]] | None:
    """(processes that left no note, {process: its error}) after a short wait; None without a store."""
    store = process_store()
    if store is None:
        return None
    try:
        store.set(f"{PREFIX}/stopped/{rank}", doing)
        failed: dict[int, str] = {}
        deadline = time.monotonic() + NOTE_WAIT_SECONDS
        while True:
            silent = []
            for other in range(world):
                if store.check([f"{PREFIX}/failed/{other}"]):
                    failed[other] = store.get(f"{PREFIX}/failed/{other}").decode(errors="replace")
                elif not store.check([f"{PREFIX}/stopped/{other}"]):
                    silent.append(other)
            if len(silent) <= 1 or time.monotonic() > deadline:  # one silent process is the one that is gone
                return silent, failed
            time.sleep(0.1)
    except Exception:  # the store went away with the launcher: say what is known
        return None


def _survivor_error(trainer: Any, err: BaseException, newest_checkpoint: NewestCheckpoint) -> ProcessFailure:
    runtime = trainer.runtime
    doing = describe_operation(err.__traceback__, trainer.state.global_step)
    notes = _notes(runtime.process_index, runtime.num_processes, doing)
    cause = f"the communication error was: {str(err).strip()[:300]}"
    return ProcessFailure(_message(trainer, notes, doing, cause, newest_checkpoint))


def _message(trainer: Any, notes: tuple[list[int], dict[int, str]] | None, doing: str, cause: str,
             newest_checkpoint: NewestCheckpoint) -> str:
    """Which processes stopped (and how), what this one was doing, and where the run can resume from."""
    rank, world = trainer.runtime.process_index, trainer.runtime.num_processes
    parts = []
    if notes is not None:
        silent, failed = notes
        parts = [f"process {r} failed ({message})" for r, message in sorted(failed.items())]
        if silent:
            listed = ", ".join(str(r) for r in silent)
            parts.append(f"process{'es' if len(silent) > 1 else ''} {listed} stopped without a word "
                         "(killed: out of memory, a signal, a crash?) or stopped responding")
    who = "; ".join(parts) if parts else "another process of this run stopped"
    return (f"{who[0].upper()}{who[1:]} while process {rank} of {world} was {doing}; process {rank} stops too. "
            f"{resume_hint(trainer.args.output_dir, newest_checkpoint)} ({cause})")


def _names_from_traceback(tb: Any) -> list[str]:
    """trainwell's functions on the traceback, outermost first."""
    return [frame.f_code.co_name for frame, _ in traceback.walk_tb(tb) if _ours(frame)]


def names_from_frame(frame: Any) -> list[str]:
    """trainwell's functions on a running thread's stack, outermost first."""
    return list(reversed([f.f_code.co_name for f, _ in traceback.walk_stack(frame) if _ours(f)]))


def _ours(frame: Any) -> bool:
    return frame.f_globals.get("__name__", "").startswith("trainwell.")


def describe_operation(tb: Any, global_step: int) -> str:
    """What the traceback ``tb`` was doing (see :func:`describe`)."""
    return describe(_names_from_traceback(tb), global_step)


def describe(names: list[str], global_step: int) -> str:
    """What a stack of trainwell functions (outermost first) was doing, e.g. "the backward pass (its gradient
    all-reduce) in training step 5": the most specific known operation, in the innermost enclosing phase."""
    operation = next((text for key, text in OPERATIONS if key in names), None)
    phase = next((text for name in reversed(names) for key, text in _PHASES if name == key), None)
    if phase is not None:
        phase = phase.format(step=global_step, next_step=global_step + 1)
    if operation and phase:
        return f"{operation} {phase}"
    return operation or phase or f"in {names[-1] if names else 'a collective'}"


def resume_hint(output_dir: str, newest_checkpoint: NewestCheckpoint) -> str:
    """The sentence that ends a stop's message: the checkpoint to resume from, or that there is none."""
    try:
        checkpoint = newest_checkpoint(output_dir)
    except Exception:
        checkpoint = None
    if checkpoint is None:
        return f"{output_dir} holds no complete checkpoint yet: the run starts over."
    return (f"Its newest complete checkpoint is {checkpoint}: resume with train(resume_from_checkpoint=True) once "
            "every process runs again.")


class Watchdog(threading.Thread):
    """Ends this process when another one failed and left its sockets open (see the module docstring)."""

    def __init__(self, trainer: Any, store: Any, baseline: int, newest_checkpoint: NewestCheckpoint) -> None:
        super().__init__(name="trainwell-failure-watchdog", daemon=True)
        self.trainer, self.store, self.baseline = trainer, store, baseline
        self.newest_checkpoint = newest_checkpoint
        self.main = threading.main_thread()
        self._stopped = threading.Event()

    @classmethod
    def start_for(cls, trainer: Any, newest_checkpoint: NewestCheckpoint) -> Watchdog | None:
        store = process_store()
        if store is None:
            return None
        try:
            baseline = store.add(f"{PREFIX}/failures", 0)  # failures of earlier runs in this job do not count
        except Exception:
            return None
        watchdog = cls(trainer, store, baseline, newest_checkpoint)
        watchdog.start()
        return watchdog

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        rank = self.trainer.runtime.process_index
        while not self._stopped.wait(WATCH_SECONDS):
            try:
                if self.store.add(f"{PREFIX}/failures", 0) <= self.baseline:
                    continue
                if self.store.check([f"{PREFIX}/failed/{rank}"]):
                    return  # this process failed itself: it is stopping already
            except Exception:
                return  # the store went away with the launcher: the launcher stops this process
            if self._stopped.wait(GRACE_SECONDS):
                return  # this process stopped on its own (a collective error, with its own message)
            self._end_process()

    def _end_process(self) -> None:
        frame = sys._current_frames().get(self.main.ident)
        names = [] if frame is None else names_from_frame(frame)
        doing = describe(names, self.trainer.state.global_step)
        runtime = self.trainer.runtime
        notes = _notes(runtime.process_index, runtime.num_processes, doing)
        message = _message(self.trainer, notes, doing, "a failed process keeps the process group open, so this "
                           "process would otherwise wait ddp_timeout", self.newest_checkpoint)
        logger.error(message)
        sys.stderr.write(f"ProcessFailure: {message}\n")
        sys.stderr.flush()
        os._exit(1)
