"""``auto_find_batch_size``: on an out-of-memory error, train again with a smaller micro-batch.

Owns recognising an out-of-memory error (CUDA, MPS, the CPU allocator, HPU; ``torch.OutOfMemoryError``), the
next micro-batch, and :class:`BatchSearch`, its policy in the retry room of one ``train()`` call
(``trainwell.techniques.retry``). Where the reference only shrinks the batch (by 10% at
a time, so the optimization changes), trainwell keeps the global batch: the micro-batch becomes the largest
divisor of the global batch at most half the previous one, and ``gradient_accumulation_steps`` grows to match,
so the loss curve is the one that was asked for. The choice is logged, kept in ``trainer_state.json``
(``train_batch_size``) and taken back by a resume.

A retry starts over only while no optimizer step has changed the weights; an error later (a longer batch deep
into an epoch) resumes from the run's last checkpoint of this ``train()`` call when there is one, and is
otherwise raised with the size to pass. An out-of-memory error in an evaluation is never a reason to shrink the
training batch: it is raised, naming ``per_device_eval_batch_size``.
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any

import torch

from trainwell.args.storage import local_output_dir
from trainwell.utils.batch_size import eval_out_of_memory, is_out_of_memory  # noqa: F401  (used here; re-exported)

if TYPE_CHECKING:
    from trainwell.checkpoint.resume import Resume

logger = logging.getLogger(__name__)


def smaller_micro_batch(micro_batch: int, global_batch: int) -> int | None:
    """The largest divisor of ``global_batch`` at most half of ``micro_batch`` (None below 1)."""
    for size in range(micro_batch // 2, 0, -1):
        if global_batch % size == 0:
            return size
    return None


class BatchSearch:
    """The retry room's policy for ``auto_find_batch_size`` (``trainwell.techniques.retry``): after an out-of-memory
    error, the next micro-batch, from the same start or this call's newest checkpoint."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def begin(self, resume: Resume | None) -> None:
        self.trainer.runtime.engine.check_batch_search()  # DeepSpeed fixes the micro-batch in its config
        restore_chosen_size(self.trainer, resume)

    def recovers(self, error: Exception) -> bool:
        return is_out_of_memory(error)

    def retry(self, error: Exception, resume: Resume | None) -> Resume | None:
        trainer, args = self.trainer, self.trainer.args
        resume = _retry_point(trainer, error, resume)
        micro, steps = trainer._train_batch_size, args.gradient_accumulation_steps
        smaller = smaller_micro_batch(micro, micro * steps)
        if smaller is None:
            raise RuntimeError(
                "auto_find_batch_size: out of memory with a micro-batch of 1; the model does not fit at any batch "
                "size (try bf16, activation_checkpointing, or a smaller model)."
            ) from error
        _free_memory(trainer)
        trainer._train_batch_size = smaller
        args.gradient_accumulation_steps = micro * steps // smaller
        logger.warning(
            "auto_find_batch_size: out of memory with a micro-batch of %d; training again with %d x %d "
            "accumulation steps (the global batch of %d is kept).", micro, smaller,
            args.gradient_accumulation_steps, micro * steps,
        )
        return resume


def restore_chosen_size(trainer: Any, resume: Resume | None) -> None:
    """On a resume, take back the micro-batch an earlier search chose (kept in the checkpoint's state, as parsed
    when the checkpoint was found)."""
    if resume is None:
        return
    chosen, micro = resume.saved_state.get("train_batch_size"), trainer._train_batch_size
    steps = trainer.args.gradient_accumulation_steps
    if isinstance(chosen, int) and 0 < chosen < micro and (micro * steps) % chosen == 0:
        trainer.args.gradient_accumulation_steps = micro * steps // chosen
        trainer._train_batch_size = chosen
        logger.info("auto_find_batch_size: resuming with the micro-batch of %d chosen before (x %d accumulation "
                    "steps).", chosen, trainer.args.gradient_accumulation_steps)


def _retry_point(trainer: Any, error: BaseException, resume: Resume | None) -> Resume | None:
    """Where the next attempt starts: over (no step taken), or this call's newest checkpoint."""
    from trainwell.checkpoint.resume import Resume, get_last_checkpoint

    start = trainer.training_run.initial_global_step if trainer.training_run is not None else 0
    if trainer.state.global_step <= start:
        return resume  # no optimizer step changed the weights: the same start again
    newest = get_last_checkpoint(local_output_dir(trainer.args))
    if newest is not None and int(newest.rsplit("-", 1)[-1]) > start:
        return Resume.of(trainer, newest)
    raise RuntimeError(
        f"auto_find_batch_size: out of memory at step {trainer.state.global_step}, after the weights had changed "
        "and with no checkpoint of this run to go back to. Resume from a checkpoint with a smaller "
        "per_device_train_batch_size, or save more often (save_steps)."
    ) from error


def _free_memory(trainer: Any) -> None:
    if trainer.optimizer is not None:
        trainer.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
