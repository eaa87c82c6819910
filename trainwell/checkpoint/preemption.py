"""Saving a checkpoint when the job is asked to stop: SIGTERM (preemption) and SIGINT (Ctrl-C).

Owns ``JITCheckpointCallback``, attached by the Trainer when ``enable_jit_checkpoint=True``, and
:func:`ending_train`, what ``train()`` does with it when it returns. During
``train()`` it replaces the SIGTERM and SIGINT handlers with one that only records the request (a signal
handler must not write files: it can run in the middle of an optimizer step or of another save). The next
step boundary then finishes normally and the callback asks the loop to save and stop, so the checkpoint
holds the first step completed after the signal and resumes exactly.

* SIGTERM: ``train()`` returns after the save (as the reference does), so the script can exit cleanly.
* SIGINT: after the save, ``train()`` raises ``KeyboardInterrupt`` as Ctrl-C would have. A second Ctrl-C
  before the save raises ``KeyboardInterrupt`` at once (the user wants out now).
* Several processes: they must save at the same step (a save has barriers), so each step's end sums the
  request flag over processes: one tiny all-reduce per step, paid only by multi-process runs with
  ``enable_jit_checkpoint``. A single process pays a Python attribute read per step.

Differences from the reference: no ``kill_wait`` timer before the request counts (the save starts at the
next step end, which leaves the most time before a SIGKILL), and Ctrl-C saves too.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from trainwell.events.callback import TrainerCallback

logger = logging.getLogger(__name__)


class JITCheckpointCallback(TrainerCallback):
    """Turn SIGTERM / SIGINT during training into "finish this step, save, stop".

    ``reduce_sum`` (a process-group sum of a tensor) is given in multi-process runs so all ranks agree on
    the step; ``None`` in a single process.
    """

    def __init__(self, reduce_sum: Callable[[Any], Any] | None = None) -> None:
        self.reduce_sum = reduce_sum
        self.requested: int | None = None  # the signal number received, None while none
        self.interrupted = False  # the save was caused by SIGINT: train() re-raises KeyboardInterrupt
        self._handled = False
        self._previous: dict[int, Any] = {}

    # -- signal handlers ------------------------------------------------------------------------------
    def install(self) -> None:
        """Install the handlers (main thread only: elsewhere Python cannot, and a warning says so)."""
        self.requested, self.interrupted, self._handled = None, False, False
        if threading.current_thread() is not threading.main_thread():
            logger.warning("enable_jit_checkpoint: train() runs outside the main thread, so no signal handler "
                           "can be installed; SIGTERM/SIGINT will not save a checkpoint.")
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        """Put the handlers that were there before ``install`` back (idempotent)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # second Ctrl-C: stop now, without the checkpoint
            return  # repeated SIGTERM: the save is already on its way
        self.requested = signum
        logger.warning("Received %s: the current step finishes, then a checkpoint is saved and training stops.",
                       signal.Signals(signum).name)

    # -- events ---------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.install()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.uninstall()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._maybe_stop(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._maybe_stop(control)

    def _maybe_stop(self, control: Any) -> None:
        if self._handled or not self._agreed():
            return
        self._handled = True  # one checkpoint per request: the epoch end that follows must not save again
        control.should_save = True
        control.should_training_stop = True
        self.interrupted = self.requested == signal.SIGINT

    def _agreed(self) -> bool:
        """Whether any process has a request (one all-reduce and host sync when several processes run)."""
        local = self.requested is not None
        if self.reduce_sum is None:
            return local
        import torch

        anyone = float(self.reduce_sum(torch.tensor([float(local)])).sum()) > 0
        if anyone and not local:
            self.requested = signal.SIGTERM  # another process got the signal: save with it
        return anyone


@contextlib.contextmanager
def ending_train(handler: Any) -> Iterator[None]:
    """Around one ``train()`` call: when it ends, the signal handlers of ``handler``'s JITCheckpointCallback (if
    it has one) are put back, and after a Ctrl-C that stopped training (once its checkpoint is saved)
    ``KeyboardInterrupt`` is raised, as Ctrl-C would have."""
    try:
        yield
    finally:
        callback = next((cb for cb in handler.callbacks if isinstance(cb, JITCheckpointCallback)), None)
        if callback is not None:
            callback.uninstall()
    if callback is not None and callback.interrupted:
        raise KeyboardInterrupt
