"""One writer per ``output_dir``: the lock a training run holds on its folder for the life of ``train()``.

Two runs started on one ``output_dir`` by mistake replace each other's checkpoints, and a later resume continues
the other run's weights without a word. So the process that saves (world process zero) holds an OS lock
(``flock``) on ``output_dir/.trainwell.lock`` while it trains, with its pid, host, start time and command written
inside. A second run is stopped at construction (``check_free``) and again when it starts training, with an
error naming the holder.

- The kernel drops an ``flock`` when its process dies, however it dies, so a lock can never outlive its run. A
  file still naming a holder when the lock is free was left by a run that was killed: it is taken over with a
  warning naming that run.
- Within one process, trainers may share a folder (a script trains, then builds a second trainer to resume):
  the lock is counted per process, not per trainer.
- A file system that cannot lock (some network mounts) gets one warning, and the run goes on unlocked.
- The file is removed when ``train()`` ends. Removing a locked file is safe only if every taker checks, once it
  holds the lock, that the path still names the file it locked; :func:`_lock_file` does.
- Only runs that write into ``output_dir`` lock it (:func:`writes`): a run with ``save_strategy="no"`` trains in a
  folder it cannot write to, as with the reference.
- The lock file is opened without following a link and without blocking (``O_NOFOLLOW | O_NONBLOCK``) and used only
  when it is a regular file: a link planted under its name is never written through (the file it points to is
  never truncated), and a FIFO, a folder or a device there is an error naming it, not a hang.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from trainwell.utils.safe_files import UNWRITABLE, UnsafeFileError, open_existing, unwritable

try:
    import fcntl
except ImportError:  # Windows: no flock; the run goes on unlocked, with a warning
    fcntl = None

logger = logging.getLogger(__name__)

LOCK_NAME = ".trainwell.lock"
_RETRY_SECONDS = 0.5  # a construction-time check holds the lock for microseconds: do not mistake it for a run

_held: dict[str, list] = {}  # real path of output_dir -> [fd, count], this process's locks
_guard = threading.Lock()


class OutputDirInUseError(RuntimeError):
    """Another live process holds the lock of this ``output_dir``."""


class UnusableLockError(RuntimeError):
    """The lock file's name holds something that is not a regular file (a link, a FIFO, a folder, a device)."""


def writes(args: Any) -> bool:
    """Whether a run with ``args`` writes into ``output_dir`` while it trains (checkpoints, a preemption save, Hub
    pushes): only those take the lock."""
    return args.save_strategy != "no" or bool(args.enable_jit_checkpoint) or bool(args.push_to_hub)


def prepare(output_dir: str, should_save: bool, is_world_zero: bool, writes: bool = True) -> None:
    """At a Trainer's construction: create ``output_dir`` where this process saves (as the reference does), and
    stop at once when another run trains into it (world process zero checks, in a run that ``writes``: the one
    that locks)."""
    if should_save:
        _make_dir(output_dir)
    if is_world_zero and writes:
        check_free(output_dir)


def check_free(output_dir: str) -> None:
    """Raise :class:`OutputDirInUseError` when another process trains into ``output_dir`` now, and
    :class:`UnusableLockError` when the lock's name holds something else than a regular file; otherwise nothing.

    Reads only: nothing is created, so a read-only or missing folder passes (``train()`` says what is wrong then).
    """
    path = os.path.join(output_dir, LOCK_NAME)
    if fcntl is None or _real(output_dir) in _held or not os.path.lexists(path):
        return
    try:
        fd = _open_regular(path, output_dir, os.O_RDONLY)
    except (PermissionError, FileNotFoundError):
        return
    try:
        if not _try_flock(fd, fcntl.LOCK_SH):
            raise OutputDirInUseError(_in_use_message(output_dir, _holder(fd)))
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding(output_dir: str, enabled: bool = True) -> Iterator[None]:
    """Hold the lock of ``output_dir`` (created if missing) while the block runs; ``enabled=False`` does nothing.

    Raises :class:`OutputDirInUseError` naming the holder when another process holds it, and ``PermissionError``
    naming the folder and the fix when the folder cannot be written.
    """
    if not enabled or fcntl is None:
        if enabled:
            logger.warning("This platform has no flock: %s is not locked against a second run.", output_dir)
        yield
        return
    key = _acquire(output_dir)
    try:
        yield
    finally:
        _release(key)


def _acquire(output_dir: str) -> str | None:
    with _guard:
        _make_dir(output_dir)
        key = _real(output_dir)
        if key in _held:
            _held[key][1] += 1
            return key
        fd = _lock_file(output_dir)
        if fd is None:
            return None
        _held[key] = [fd, 1]
        return key


def _release(key: str | None) -> None:
    with _guard:
        if key is None or key not in _held:
            return
        _held[key][1] -= 1
        if _held[key][1] > 0:
            return
        fd, _ = _held.pop(key)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(key, LOCK_NAME))  # while still locked: see the module docstring
        os.close(fd)


def _lock_file(output_dir: str) -> int | None:
    """Lock ``output_dir/LOCK_NAME`` and write this process in it; the open descriptor, or None if unlockable."""
    path = os.path.join(output_dir, LOCK_NAME)
    while True:
        fd = _open_for_lock(path, output_dir)
        try:
            if not _try_flock(fd, fcntl.LOCK_EX, retry_for=_RETRY_SECONDS):
                raise OutputDirInUseError(_in_use_message(output_dir, _holder(fd)))
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                logger.warning("Cannot lock %s on this file system (%s): it is not guarded against a second run.",
                               output_dir, err)
                return None
            raise
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file between our open and our lock: take the new one
    left = _holder(fd)
    if left:
        logger.warning("Taking over the lock of %s left by a run that ended without releasing it (%s).",
                       output_dir, _describe(left))
    # Written, then cut to its length: truncating to zero first would make ext4 (auto_da_alloc) flush the file to
    # disk when it is closed, a 3-4 ms wait at the end of every train() call.
    record = json.dumps(_this_process()).encode()
    os.pwrite(fd, record, 0)
    os.ftruncate(fd, len(record))
    return fd


def _open_for_lock(path: str, output_dir: str) -> int:
    try:
        return _open_regular(path, output_dir, os.O_RDWR | os.O_CREAT)
    except OSError as err:
        if err.errno not in UNWRITABLE:
            raise
        raise unwritable(output_dir, err) from None


def _open_regular(path: str, output_dir: str, flags: int) -> int:
    """``path`` opened with ``flags``, never through a link and never blocking; :class:`UnusableLockError` naming it
    when it is not a regular file (nothing was read from it or written to it)."""
    try:
        return open_existing(path, flags)  # in place (a lock cannot be renamed), by trainwell's one writer
    except UnsafeFileError:
        raise _unusable(path, output_dir, os.lstat(path).st_mode) from None


def _unusable(path: str, output_dir: str, mode: int) -> UnusableLockError:
    kind = "a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else \
        "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
    return UnusableLockError(
        f"{path} is {kind}, where trainwell keeps the lock of output_dir {output_dir!r} (a small regular file it "
        "creates and removes): it is neither followed nor written through. Remove it and train again.")


def _make_dir(output_dir: str) -> None:
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as err:
        raise type(err)(err.errno, f"output_dir {output_dir!r} cannot be created ({err.strerror}): pass an "
                                   "output_dir you can write to.", output_dir) from None


def _try_flock(fd: int, mode: int, retry_for: float = 0.0) -> bool:
    deadline = time.monotonic() + retry_for
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _same_file(fd: int, path: str) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _holder(fd: int) -> dict:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {"unreadable": True}
    return data if isinstance(data, dict) else {"unreadable": True}


def _this_process() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)[:500]}


def _describe(holder: dict) -> str:
    if "pid" not in holder:
        return "holder unknown"
    return (f"pid {holder.get('pid')} on host {holder.get('host', '?')}, started {holder.get('started', '?')}, "
            f"command: {holder.get('command', '?')}")


def _in_use_message(output_dir: str, holder: dict) -> str:
    return (f"output_dir {output_dir!r} is in use by another training run ({_describe(holder)}). Two runs writing "
            f"one folder replace each other's checkpoints. Wait for that run to end or stop it, or pass another "
            f"output_dir.")


def _real(output_dir: str) -> str:
    return os.path.realpath(output_dir)
