"""What a checkpoint holds, as one explicit list, and how it is saved and restored.

A checkpoint of step N holds, in ``checkpoint-N/``:

* the model (``model.safetensors``, or ``save_pretrained`` output) and the processing class (``save_pretrained``);
* ``training_args.json`` (JSON, never a pickle);
* unless ``save_only_model``: ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt`` (fp16 with a scaler) and the RNG
  states of every process (``rng_state.pth`` or ``rng_state_{rank}.pth``);
* ``trainer_state.json`` (with the callback states), written last.

The data position needs no file of its own for sized data: the sampler's order is a function of (seed,
epoch), and ``global_step`` says how many windows of the current epoch were consumed.

The folder is written under a temporary name and renamed into place after every process has written its
part (``trainwell.checkpoint.io.AtomicDirectory``), so a crash never leaves a ``checkpoint-N`` that resume
would pick up and fail on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwell.checkpoint.io import AtomicDirectory, safe_torch_load, torch_save
from trainwell.checkpoint.layout import (
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    checkpoint_path,
    rng_file_name,
    rotate_checkpoints,
)
from trainwell.checkpoint.rng import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from trainwell.trainer import Trainer

logger = logging.getLogger(__name__)


def save_checkpoint(trainer: Trainer, run_dir: str) -> Path:
    """Write ``checkpoint-{global_step}`` atomically and apply ``save_total_limit``; returns its path."""
    args, runtime, state = trainer.args, trainer.runtime, trainer.state
    final = checkpoint_path(run_dir, state.global_step)
    atomic = AtomicDirectory(final)
    if args.should_save:
        atomic.create()
    runtime.wait_for_everyone()
    tmp = atomic.tmp
    trainer._save(str(tmp))  # model + processing class + training args (main process only)
    if not args.save_only_model:
        _save_training_state(trainer, tmp)
    if args.should_save:
        _update_best_checkpoint(trainer, run_dir)
        state.record_callback_states(trainer.callback_handler.callbacks + [trainer.control])
        state.save_to_json(str(tmp / TRAINER_STATE_NAME))
    runtime.wait_for_everyone()  # every rank's RNG file is in the temporary folder
    if args.should_save:
        atomic.publish()
        rotate_checkpoints(
            run_dir, args.save_total_limit, protected=(state.best_model_checkpoint, trainer._resumed_from)
        )
    runtime.wait_for_everyone()
    return final


def _save_training_state(trainer: Trainer, directory: Path) -> None:
    runtime = trainer.runtime
    if trainer.args.should_save:
        torch_save(trainer.optimizer.state_dict(), directory / OPTIMIZER_NAME)
        torch_save(trainer.lr_scheduler.state_dict(), directory / SCHEDULER_NAME)
        if runtime.scaler is not None:
            torch_save(runtime.scaler.state_dict(), directory / SCALER_NAME)
    rng_file = directory / rng_file_name(runtime.process_index, runtime.num_processes)
    torch_save(get_rng_state(), rng_file)


def _update_best_checkpoint(trainer: Trainer, run_dir: str) -> None:
    """Point ``best_model_checkpoint`` at the checkpoint of the best step, once that step has one."""
    state = trainer.state
    if state.best_global_step is None:
        return
    best = checkpoint_path(run_dir, state.best_global_step)
    if state.best_global_step == state.global_step or best.is_dir():
        state.best_model_checkpoint = str(best)


def load_optimizer_and_scheduler(trainer: Trainer, checkpoint: str) -> None:
    """Restore optimizer, scheduler and scaler states (after the optimizer was prepared)."""
    path = Path(checkpoint)
    optimizer_file, scheduler_file = path / OPTIMIZER_NAME, path / SCHEDULER_NAME
    if not optimizer_file.is_file():
        logger.warning(
            "%s has no %s (saved with save_only_model?): the optimizer starts fresh, so training will not "
            "continue exactly where it stopped.",
            checkpoint,
            OPTIMIZER_NAME,
        )
        return
    device = trainer.runtime.device
    trainer.optimizer.load_state_dict(safe_torch_load(optimizer_file, map_location=device))
    if scheduler_file.is_file():
        trainer.lr_scheduler.load_state_dict(safe_torch_load(scheduler_file))
    scaler_file = path / SCALER_NAME
    if trainer.runtime.scaler is not None and scaler_file.is_file():
        trainer.runtime.scaler.load_state_dict(safe_torch_load(scaler_file))


def restore_rng(trainer: Trainer, checkpoint: str) -> None:
    """Restore this process's RNG states; a checkpoint without them (or from another world size) warns."""
    runtime = trainer.runtime
    path = Path(checkpoint) / rng_file_name(runtime.process_index, runtime.num_processes)
    if not path.is_file():
        logger.warning(
            "%s has no RNG state for process %d: random draws (dropout, augmentation) after resume will differ "
            "from the uninterrupted run.",
            checkpoint,
            runtime.process_index,
        )
        return
    state: Any = safe_torch_load(path)
    set_rng_state(state)
