"""What a checkpoint holds, as one explicit list, and how it is saved and restored.

A checkpoint of step N holds, in ``checkpoint-N/``:

* the model (``model.safetensors``, or ``save_pretrained`` output) and the processing class (``save_pretrained``);
* ``training_args.json`` (JSON, never a pickle);
* unless ``save_only_model``: ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt`` (fp16 with a scaler) and the RNG
  states of every process (``rng_state.pth`` or ``rng_state_{rank}.pth``);
* unless ``save_only_model``, for an ``IterableDataset`` with ``state_dict``/``load_state_dict`` read in the main
  process (``dataloader_num_workers=0``): its position as of the last batch trained on (not the batch a
  loader read ahead, see ``trainwell.data.position``), ``data_state.pth`` / ``data_state_{rank}.pth``;
* ``trainer_state.json`` (with the callback states), written last.

The data position needs no file of its own for sized data: the sampler's order is a function of (seed,
epoch), and ``global_step`` says how many windows of the current epoch were consumed.

Restored on resume: model weights (before the model is prepared), ``TrainerState``, callback states (with
``restore_callback_states_from_checkpoint``), optimizer + scheduler + scaler (after preparation), the data
position, and the RNG states (at the start of the resumed epoch, after its iterator exists).

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
    data_state_file_name,
    rng_file_name,
    rotate_checkpoints,
)
from trainwell.checkpoint.optimizer_state import align_optimizer_state, align_scheduler_state
from trainwell.checkpoint.rng import get_rng_state, load_rng_file, set_rng_state
from trainwell.utils import model as model_utils

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
        # The folder just written is protected too: after resuming from an older checkpoint, a higher-numbered
        # one left by the earlier run would otherwise count as "the newest" and this one be deleted.
        rotate_checkpoints(
            run_dir, args.save_total_limit, protected=(state.best_model_checkpoint, trainer._resumed_from, final)
        )
    runtime.wait_for_everyone()
    return final


def _save_training_state(trainer: Trainer, directory: Path) -> None:
    """Optimizer, scheduler and scaler (writer processes); RNG and data position (every process)."""
    runtime = trainer.runtime
    if trainer.args.should_save:
        torch_save(trainer.optimizer.state_dict(), directory / OPTIMIZER_NAME)
        torch_save(trainer.lr_scheduler.state_dict(), directory / SCHEDULER_NAME)
        if runtime.scaler is not None:
            torch_save(runtime.scaler.state_dict(), directory / SCALER_NAME)
    rng_file = directory / rng_file_name(runtime.process_index, runtime.num_processes)
    torch_save(get_rng_state(), rng_file)
    position = getattr(trainer, "_data_position", None)
    if position is not None:
        torch_save(position.state_dict(), directory / data_state_file_name(runtime.process_index, runtime.num_processes))


def is_stateful(dataset: Any, args: Any) -> bool:
    """Whether the training ``dataset`` (the object the loader iterates) can save and restore its own position.

    Only an ``IterableDataset`` read in the main process (``dataloader_num_workers=0``): with workers, each
    worker iterates its own copy and the main process's object never moves, so its state would be meaningless.
    """
    from torch.utils.data import IterableDataset

    if not isinstance(dataset, IterableDataset) or args.dataloader_num_workers > 0:
        return False
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def restore_data_state(trainer: Trainer, checkpoint: str) -> bool:
    """Load the dataset position saved in ``checkpoint``; False when there is none to load (replay instead)."""
    position = getattr(trainer, "_data_position", None)
    if position is None:
        return False
    runtime = trainer.runtime
    path = Path(checkpoint) / data_state_file_name(runtime.process_index, runtime.num_processes)
    if not path.is_file():
        logger.warning("%s has no %s: the iterable dataset is replayed to skip the consumed batches.", checkpoint, path.name)
        return False
    position.dataset.load_state_dict(safe_torch_load(path))
    position.restored()
    return True


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
    saved = safe_torch_load(optimizer_file, map_location=device)
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    aligned, group_map = align_optimizer_state(saved, inner, model_utils.unwrap(trainer.model))
    trainer.optimizer.load_state_dict(aligned)
    if scheduler_file.is_file():
        scheduler_state = safe_torch_load(scheduler_file)
        if isinstance(scheduler_state, dict):
            scheduler_state = align_scheduler_state(scheduler_state, group_map, len(saved["param_groups"]))
        trainer.lr_scheduler.load_state_dict(scheduler_state)
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
    set_rng_state(load_rng_file(path))


def restore_callback_states(trainer: Trainer) -> None:
    """Rebuild the stateful callbacks (and ``TrainerControl``) from ``state.stateful_callbacks``.

    Each attached callback whose class name was stored is replaced, in place, by ``type(cb).from_state(...)``
    (several instances of a class are matched in order). Stored classes that are not attached are named in a
    warning and ignored: the checkpoint never decides which code runs.
    """
    from trainwell.state import ExportableState, TrainerControl

    stored = trainer.state.stateful_callbacks or {}
    callbacks = trainer.callback_handler.callbacks
    missing = []
    for name, data in stored.items():
        states = data if isinstance(data, list) else [data]
        if name == type(trainer.control).__name__:
            trainer.control = TrainerControl.from_state(states[0])
            continue
        positions = [i for i, cb in enumerate(callbacks) if type(cb).__name__ == name and isinstance(cb, ExportableState)]
        if not positions:
            missing.append(name)
        for position, callback_state in zip(positions, states):
            callbacks[position] = type(callbacks[position]).from_state(callback_state)
    if missing:
        logger.warning(
            "The checkpoint stores states of callbacks that are not attached to this Trainer, ignored: %s",
            ", ".join(missing),
        )
