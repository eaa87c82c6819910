"""Writing a checkpoint while training goes on (``save_async=True``).

Owns the two halves of a background save: :class:`HostStaging`, which copies the model's and the optimizer's
tensors into host buffers kept from one save to the next (the only part the training loop waits for: one copy,
no allocation after the first save, no disk), and :class:`BackgroundWriter`, the one thread that then writes
those copies, fsyncs them and publishes the folder (``trainwell.checkpoint.io.AtomicDirectory``).

The guarantees are those of a synchronous save: the folder is renamed into place only once every file is
written and synced, so a crash during the background write leaves a temporary folder that resume skips and
removes; a save waits for the previous one to be published before it overwrites the buffers; ``train()`` waits
for the last one before it returns (or raises), so a finished run's checkpoints are all on disk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)


class HostStaging:
    """Host copies of nested states (dicts and lists of tensors), in buffers reused by later snapshots."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._seen: dict[tuple[Any, ...], torch.Tensor] = {}  # this snapshot's copies, by the memory they copy

    def snapshot(self, name: str, state: Any) -> Any:
        """``state`` with every tensor replaced by a host copy, its dicts, lists and tuples rebuilt around them
        (other values are kept: numbers, strings, None).

        Tensors that are views of the same memory (tied weights) share one copy, as they share storage.
        """
        self._seen = {}
        copied = self._copy(state, (name,))
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the device-to-host copies were queued without waiting
        return copied

    def _copy(self, value: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            alias = (value.device, value.untyped_storage().data_ptr(), value.storage_offset(), value.shape,
                     value.dtype)
            if alias in self._seen:
                return self._seen[alias]
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                pin = value.device.type == "cuda"
                buffer = torch.empty(value.shape, dtype=value.dtype, device="cpu", pin_memory=pin)
                self._buffers[path] = buffer
            buffer.copy_(value.detach(), non_blocking=True)
            self._seen[alias] = buffer
            return buffer
        if isinstance(value, dict):
            return type(value)((k, self._copy(v, (*path, k))) for k, v in value.items())
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(self._copy(v, (*path, i)) for i, v in enumerate(value))
        return value  # numbers, strings, None: immutable


class BackgroundWriter:
    """Runs one save job at a time on a thread; :meth:`wait` joins it and re-raises what it raised."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._what = ""
        self._lock = threading.Lock()
        self._follow_ups: list[Callable[[], None]] = []
        self._ending = False  # the running job is done and its follow-ups are being taken

    def submit(self, what: str, job: Callable[[], None]) -> None:
        self.wait()
        self._what, self._ending = what, False

        def run() -> None:
            try:
                job()
            except BaseException as err:  # re-raised in the training thread by wait()
                self._error = err
            with self._lock:
                self._ending, follow_ups, self._follow_ups = True, self._follow_ups, []
            for follow_up in follow_ups:
                follow_up()

        self._thread = threading.Thread(target=run, name=f"trainwell-save-{what}", daemon=False)
        self._thread.start()

    def then(self, follow_up: Callable[[], None]) -> None:
        """Run ``follow_up`` on the writer's thread as soon as the running job ends, however it ended (at once,
        here, when none is running); it must not raise. Before a later ``submit`` can start another job."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and not self._ending:
                self._follow_ups.append(follow_up)
                return
        follow_up()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def finish_quietly(self) -> None:
        """Let the running job end without raising (training already failed: that error is the one to see)."""
        try:
            self.wait()
        except RuntimeError as err:
            logger.error("%s", err)

    def wait(self) -> None:
        """Block until the running job ends; raise its error (naming the checkpoint) if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(
                f"The background save of {self._what} failed ({type(error).__name__}: {error}); the checkpoint was "
                "not published, earlier checkpoints are intact."
            ) from error
