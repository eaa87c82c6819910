"""One room for retries: the attempts of a ``train()`` call, trained again after an error a policy recovers from.

Owns :func:`train_with_retries` and the policies' protocol (:class:`RetryPolicy`). ``Trainer.train`` finds the
checkpoint to start from once, then hands this loop one attempt (``Trainer._train_attempt``) and that start. When
an attempt raises, the first policy that ``recovers`` the error says where the next attempt starts (a
:class:`~trainwell.checkpoint.resume.Resume`, or None for a fresh start), or raises the error that ends the call;
an error no policy recovers ends it as it is. The policies, in the order they are asked:

* :class:`SpikeRollback` (``rollback_on_spike``): a :class:`~trainwell.loop.rollback.Rollback` raised by the spike
  watch goes back to the newest usable checkpoint at or before the last step known good, the record of the rollback
  on the ``Resume`` it returns (``resume.rollback``: the fit loop appends it to the resumed ``log_history``); after
  ``MAX_ROLLBACKS`` rollbacks it stops with an error;
* ``BatchSearch`` (``auto_find_batch_size``, ``trainwell.techniques.batch_size``): an out-of-memory error trains
  again with a smaller micro-batch, from the same start or this call's newest checkpoint.

The next resilience feature that retries is one more policy here: no loop file and no ``Trainer.train`` edit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from trainwell.args.resilience import MAX_ROLLBACKS
from trainwell.checkpoint.checkpointer import Checkpointer
from trainwell.checkpoint.layout import checkpoint_step
from trainwell.loop.rollback import Rollback, last_good_checkpoint

if TYPE_CHECKING:
    from trainwell.checkpoint.resume import Resume

logger = logging.getLogger(__name__)


class RetryPolicy(Protocol):
    """What a retry policy answers, for one ``train()`` call."""

    def begin(self, resume: Resume | None) -> None:
        """Before the first attempt, which starts from ``resume``."""

    def recovers(self, error: Exception) -> bool:
        """Whether this policy recovers from ``error``."""

    def retry(self, error: Exception, resume: Resume | None) -> Resume | None:
        """Where the next attempt starts (the last one started from ``resume``); raises when it cannot go on."""


def policies(trainer: Any) -> list[RetryPolicy]:
    """The retry policies the Trainer's arguments ask for, in the order they are asked."""
    from trainwell.techniques.batch_size import BatchSearch

    chosen: list[RetryPolicy] = []
    if trainer.args.rollback_on_spike is not None:
        chosen.append(SpikeRollback(trainer))
    if trainer.args.auto_find_batch_size:
        chosen.append(BatchSearch(trainer))
    return chosen


def train_with_retries(trainer: Any, train_once: Callable[[Resume | None], Any], resume: Resume | None) -> Any:
    """``train_once(resume)``, trained again from where a policy says after each error it recovers from."""
    chosen = policies(trainer)
    for policy in chosen:
        policy.begin(resume)
    while True:
        try:
            return train_once(resume)
        except Exception as error:
            policy = next((p for p in chosen if p.recovers(error)), None)
            if policy is None:
                raise
            resume = policy.retry(error, resume)


class SpikeRollback:
    """``rollback_on_spike``: back to the last good checkpoint after a spike (see the module docstring)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.factor: float = trainer.args.rollback_on_spike
        self.done = 0  # this call's rollbacks (an older checkpoint's history may not hold the records of all of them)

    def begin(self, resume: Resume | None) -> None:
        self.done = 0

    def recovers(self, error: Exception) -> bool:
        return isinstance(error, Rollback)

    def retry(self, error: Exception, resume: Resume | None) -> Resume | None:
        spike: Rollback = error  # type: ignore[assignment]  (recovers() said so)
        spike.count = max(spike.count, self.done)
        point, record = self._point(spike)
        found = Checkpointer.find(self.trainer, point)  # as train() finds one
        found.rollback = record  # the fit loop appends it to the resumed state's log_history
        self.done = spike.count + 1
        return found

    def _point(self, spike: Rollback) -> tuple[str, dict[str, Any]]:
        """The checkpoint to go back to, and the ``log_history`` record of this rollback."""
        trainer, factor = self.trainer, self.factor
        what = (f"the logged loss {spike.loss:.6g} at step {spike.step} is "
                + (f"above {factor:g} x the median {spike.median:.6g} of the recent logged losses"
                   if math.isfinite(spike.loss) else "not finite"))
        if spike.count >= MAX_ROLLBACKS:
            raise RuntimeError(
                f"rollback_on_spike: {what}, after {spike.count} rollbacks in this run (trainer_state.json's "
                "log_history records them): the spikes keep coming back, so the data windows skipped were not the "
                "cause. Stopping. Lower learning_rate, set max_grad_norm (e.g. 1.0), add warmup, or check the data "
                "and the model."
            ) from spike
        output_dir = trainer._get_output_dir(getattr(trainer, "_trial", None))
        checkpoint = last_good_checkpoint(output_dir, spike.good_step)
        if checkpoint is None:
            raise RuntimeError(
                f"rollback_on_spike: {what}, but {output_dir} holds no usable checkpoint at or before step "
                f"{spike.good_step} (the last step logged before the spike) to go back to. Save more often than the "
                "spikes come (save_steps), keep older checkpoints (save_total_limit of 2 or more), or set "
                "rollback_on_spike=None."
            ) from spike
        step = checkpoint_step(checkpoint)
        logger.warning("rollback_on_spike: %s. Going back to %s and skipping the data of steps %d-%d (rollback %d of "
                       "at most %d).", what, checkpoint, step + 1, spike.step, spike.count + 1, MAX_ROLLBACKS)
        return checkpoint, spike.record(step)
