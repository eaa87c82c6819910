"""``rollback_on_spike``: a loss spike sends the run back to its last good checkpoint, past the data that led to it.

Owns the three parts of a rollback, and the record that ties them together:

* :class:`SpikeWatch`, a callback the wiring adds last when ``rollback_on_spike`` is set, looks at each logged
  training loss (its ``on_log``, after the other callbacks have shown it): above
  ``rollback_on_spike`` times the median of the last ``RECENT`` logged losses (once ``MIN_HISTORY`` of them exist
  and their median is positive), or not finite at all (with ``logging_nan_inf_filter``, the default, that means every
  loss of the log window was), it raises :class:`Rollback` before the step's evaluation and save;
* the retry room's ``SpikeRollback`` policy (``trainwell.techniques.retry``) catches it around the ``train()``
  attempts: it picks the newest usable checkpoint at or before
  the last step known good (the previous log), and trains again from it through the ordinary resume, with the
  record of the rollback on that :class:`~trainwell.checkpoint.resume.Resume` (``resume.rollback``), which the fit
  loop appends to the resumed state's ``log_history``; after ``MAX_ROLLBACKS`` it stops with an
  error;
* :class:`DataSkips` reads every such record from ``log_history`` and the fit loop passes over the recorded steps:
  their batches are read and dropped, no forward, no optimizer or scheduler step, no event; ``global_step`` moves on
  with them, so every position (epochs, the data order, checkpoints, a later resume) stays where it was.

The record is a ``log_history`` entry (``trainer_state.json``, which the reference reads too)::

    {"rollback": 1, "rollback_to_step": 6, "skipped_steps_from": 7, "skipped_steps_to": 8,
     "spike_loss": 812.5, "spike_median": 1.02, "step": 8}

so a resume from any later checkpoint skips the same steps, and a rerun from an earlier one meets the same spike and
skips them again. The skipped steps are every step from the checkpoint to the spike (the PaLM routine: restart before
the spike and skip past it), not only the log window that showed it: a spike often starts a little before it shows.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainwell.checkpoint.layout import checkpoint_step, list_checkpoints
from trainwell.checkpoint.resume import unusable_reason
from trainwell.events.callback import TrainerCallback

if TYPE_CHECKING:
    from trainwell.state import TrainerState

logger = logging.getLogger(__name__)

RECENT = 10  #: the logged losses the median is taken over
MIN_HISTORY = 3  #: a spike is judged against at least this many earlier logged losses (NaN/inf always is one)
FIRST, LAST = "skipped_steps_from", "skipped_steps_to"


class Rollback(Exception):  # noqa: N818 - control flow, not an error: caught by the retry room
    """A spike at ``step``: train again from a checkpoint at or before ``good_step``."""

    #: not a failure of this process: ``trainwell.backend.failures`` lets it pass (every process raises it alike)
    _trainwell_together = True

    def __init__(self, step: int, good_step: int, loss: float, median: float | None, count: int) -> None:
        super().__init__(f"loss {loss} at step {step}")
        self.step, self.good_step, self.loss, self.median, self.count = step, good_step, loss, median, count

    def record(self, checkpoint: int) -> dict[str, Any]:
        """The ``log_history`` entry of this rollback to ``checkpoint``'s step."""
        return {"rollback": self.count + 1, "rollback_to_step": checkpoint, FIRST: checkpoint + 1, LAST: self.step,
                "spike_loss": self.loss, "spike_median": self.median, "step": self.step}


def rollbacks(log_history: list[Any]) -> list[dict[str, Any]]:
    """The rollback records of a ``log_history``, in order."""
    return [e for e in log_history if isinstance(e, dict) and isinstance(e.get(FIRST), int)
            and isinstance(e.get(LAST), int)]


class SpikeWatch(TrainerCallback):
    """Judges each logged training loss of a run (see the module docstring). ``in_train``: whether a ``train()`` call
    is in progress (a loss logged outside one is not judged)."""

    def __init__(self, factor: float, in_train: Callable[[], bool] = lambda: True) -> None:
        self.factor = factor
        self._in_train = in_train

    def on_log(self, args: Any, state: TrainerState, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs is not None and "loss" in logs and self._in_train():
            self.check(state)

    def check(self, state: TrainerState) -> None:
        """Raise :class:`Rollback` when the loss just logged (the last entry of ``state.log_history``) spiked."""
        history = state.log_history
        loss = history[-1]["loss"]
        # The last RECENT entries before it that hold a loss or a rollback record, newest first: read from the end,
        # since log_history grows all run long (a whole scan per log is quadratic in the run's logs).
        before: list[dict[str, Any]] = []
        for entry in itertools.islice(reversed(history), 1, None):
            if _loss(entry) is not None or FIRST in entry:
                before.append(entry)
                if len(before) == RECENT:
                    break
        recent = [v for e in before if (v := _loss(e)) is not None and math.isfinite(v)]
        median = statistics.median(recent) if len(recent) >= MIN_HISTORY else None
        spiked = not math.isfinite(loss) or (median is not None and median > 0 and loss > self.factor * median)
        if not spiked:
            return
        good_step = before[0]["step"] if before else 0
        raise Rollback(state.global_step, int(good_step), loss, median, len(rollbacks(history)))


def _loss(entry: dict[str, Any]) -> float | None:
    value = entry.get("loss")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class DataSkips:
    """The steps the fit loop passes over: every ``skipped_steps_from``..``skipped_steps_to`` of ``log_history``.

    ``next_from`` is the ``global_step`` before the next step to pass over (``inf``: none left), the one number the
    loop compares with per step.
    """

    def __init__(self, ranges: list[tuple[int, int]], global_step: int) -> None:
        self.ranges = sorted(ranges)
        self.next_from: float = math.inf
        self.advance(global_step)

    @classmethod
    def of(cls, state: TrainerState) -> DataSkips:
        return cls([(e[FIRST], e[LAST]) for e in rollbacks(state.log_history)], state.global_step)

    def advance(self, global_step: int) -> None:
        """Point ``next_from`` past ``global_step`` (the steps up to it are done)."""
        upcoming = [first for first, last in self.ranges if last > global_step]
        self.next_from = max(min(upcoming) - 1, global_step) if upcoming else math.inf

    def skips(self, step: int) -> bool:
        """Whether step number ``step`` (1-based) is passed over."""
        return any(first <= step <= last for first, last in self.ranges)


def last_good_checkpoint(output_dir: str, good_step: int) -> str | None:
    """The newest usable checkpoint of ``output_dir`` at or before ``good_step``."""
    for path in reversed(list_checkpoints(output_dir)):
        step = checkpoint_step(path)
        if step is not None and step <= good_step and unusable_reason(path) is None:
            return str(path)
    return None
