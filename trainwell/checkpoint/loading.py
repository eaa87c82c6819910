"""The default bodies of the Trainer's restoring methods: each piece of ``trainwell.checkpoint.contents.CONTENTS``
read back and checked before anything is loaded into the run.

``Trainer._load_from_checkpoint``, ``_load_optimizer_and_scheduler``, ``_load_scaler``, ``_load_rng_state`` and
``_load_callback_state`` (the reference's names: a subclass's override is the one the run's checkpointer calls)
hand the work here, with what it needs: the trainer's parts, and the checkpoint as listed and parsed once
(``trainwell.checkpoint.io.CheckpointFiles``) or the RNG states the checkpointer read once. Nothing here sees the
checkpointer. What is wrong with a file is an error naming the file and the fix, raised before any kernel or
generator sees its content: the optimizer's state (its structure, shapes, kinds, ``step``, the entries its optimizer
reads), the scheduler's values, the RNG states; weights of another dtype are named in a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwell.backend import engines, sharded
from trainwell.checkpoint import adapters
from trainwell.checkpoint.contents import RNG_NAME, piece_name
from trainwell.checkpoint.io import (
    CheckpointFiles,
    load_model_weights,
    read_model_weights,
    safe_torch_load,
    warn_other_dtypes,
)
from trainwell.checkpoint.layout import (
    LEGACY_WEIGHTS_NAME,
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from trainwell.checkpoint.optimizer_state import (
    align_optimizer_state,
    align_scheduler_state,
    check_optimizer_state,
    scheduler_state_problem,
)
from trainwell.utils import model as model_utils
from trainwell.utils.seed import rng_state_problem, set_rng_state

if TYPE_CHECKING:
    from trainwell.checkpoint.contents import Owner

logger = logging.getLogger(__name__)


def load_best_model(model: Any, files: CheckpointFiles, best_metric: float | None) -> None:
    """``load_best_model_at_end``: the best checkpoint's weights (``files``) into the prepared ``model``."""
    logger.info("Loading best model from %s (score: %s).", files.path, best_metric)
    load_model(model, files, strict=False)


def load_model(model: Any, files: CheckpointFiles, strict: bool = True) -> None:
    """The checkpoint's weights (shards or full) into ``model`` (sharded or not, a DeepSpeed engine): read by the
    checkpoint's form (``files``: the checkpoint as listed), whichever engine runs."""
    engine = engines.state_owner(files.sizes)
    full = any(files.has(name) for name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, LEGACY_WEIGHTS_NAME))
    if engine is not None and not full:
        engine.load_own_weights(model, str(files.path))  # only in the engine's own state (ZeRO-3)
        return
    model = model_utils.unwrap(model)  # a compiled model's weights are its original module's
    if model_utils.is_peft_model(model) and not full:
        adapters.load_adapters(model, files.path, strict=strict)  # the reference's checkpoints hold adapters only
    elif files.has(f"{sharded.MODEL_DIR}/{sharded.METADATA}"):
        sharded.load_model_shards(model, files.path)
    elif sharded.is_sharded(model):
        weights = read_model_weights(files.path, files)
        warn_other_dtypes(model, weights, files.path)
        sharded.load_full_state(model, weights)
    else:
        load_model_weights(model, files.path, strict=strict, files=files)


def load_optimizer_and_scheduler(owner: Owner, files: CheckpointFiles) -> None:
    """Restore the optimizer and scheduler states (after the optimizer was prepared), each checked before it is
    loaded; errors name the file."""
    checkpoint = files.path
    optimizer_file, scheduler_file = checkpoint / piece_name("optimizer"), checkpoint / piece_name("scheduler")
    engine = owner.runtime.engine
    problem = engines.checkpoint_engine_problem(engine, files.sizes)  # DeepSpeed's resumes under DeepSpeed only
    if problem is not None:
        raise ValueError(f"{checkpoint} {problem}")
    group_map, saved_groups = None, 0  # how the saved optimizer groups map onto this run's (plain files only)
    # The engine's own state first (shards, DeepSpeed's checkpoint), else the optimizer's full state_dict
    if not engine.load_state(owner.model_wrapped, owner.optimizer, str(checkpoint), optimizer_file):
        if not files.has(OPTIMIZER_NAME):
            logger.warning(
                "%s has no %s (saved with save_only_model?): the optimizer starts fresh, so training will not "
                "continue exactly where it stopped.", checkpoint, OPTIMIZER_NAME,
            )  # fmt: skip
            return
        group_map, saved_groups = _load_full_optimizer_state(owner, files, optimizer_file)
    if files.has(SCHEDULER_NAME):
        _load_scheduler(owner.lr_scheduler, safe_torch_load(scheduler_file, data=files.read(SCHEDULER_NAME)),
                        scheduler_file,
                        group_map, saved_groups)


def _load_full_optimizer_state(owner: Owner, files: CheckpointFiles, file: Path) -> tuple[list[int] | None, int]:
    """``optimizer.pt`` into the optimizer, its groups aligned with this run's and checked first; returns how the
    saved groups map onto this run's and how many were saved (for the scheduler's per-group lists)."""
    saved = safe_torch_load(file, map_location=owner.runtime.device, data=files.read(OPTIMIZER_NAME))
    inner = getattr(owner.optimizer, "optimizer", owner.optimizer)
    model = model_utils.unwrap(owner.model)
    saved_args = files.json_or_none(TRAINING_ARGS_NAME)
    saved_optim = saved_args.get("optim") if isinstance(saved_args, dict) else None
    fix = f"Resume with the model and optimizer that wrote it, or delete {file} to start the optimizer from scratch."
    try:
        aligned, group_map = align_optimizer_state(saved, inner, model)
        check_optimizer_state(aligned, inner, {id(p): n for n, p in model.named_parameters()}, saved_optim)
    except ValueError as err:
        raise ValueError(f"{file} {err} {fix}") from None
    owner.optimizer.load_state_dict(aligned)
    return group_map, len(saved["param_groups"])


def _load_scheduler(scheduler: Any, saved: Any, file: Path, group_map: list[int] | None, saved_groups: int) -> None:
    if isinstance(saved, dict):
        saved = align_scheduler_state(saved, group_map, saved_groups)
    problem = scheduler_state_problem(saved, scheduler)
    if problem is not None:
        raise ValueError(f"{file} does not fit this run's learning-rate schedule: {problem}. Resume with the "
                         f"lr_scheduler_type that wrote it, or delete {file.name} to restart the schedule.")
    scheduler.load_state_dict(saved)


def load_scaler(owner: Owner, files: CheckpointFiles) -> None:
    if owner.precision.can_skip_steps and files.has(SCALER_NAME):
        file = files.path / piece_name("scaler")
        try:
            owner.precision.load_state_dict(safe_torch_load(file, data=files.read(SCALER_NAME)))
        except (TypeError, KeyError, ValueError, AttributeError) as err:
            raise ValueError(f"{file} is not a loss scaler's state ({type(err).__name__}: {err}). Delete it to "
                             "restart the fp16 loss scale.") from None


def load_rng_state(saved: dict[str, Any] | None, checkpoint: str, process_index: int) -> None:
    """Restore this process's RNG states ``saved`` (read once by the run's checkpointer from ``checkpoint``'s file;
    None: it has none, which warns). A state that cannot be restored is an error naming the file, checked before
    any generator is set."""
    if saved is None:
        logger.warning(
            "%s has no RNG state for process %d: random draws (dropout, augmentation) after resume will differ "
            "from the uninterrupted run.", checkpoint, process_index,
        )  # fmt: skip
        return
    problem = rng_state_problem(saved)
    if problem is not None:
        raise ValueError(f"The RNG states of process {process_index} in {checkpoint} cannot be restored: {problem}. "
                         f"Delete its {RNG_NAME.split('.')[0]} file to resume with fresh random draws.")
    set_rng_state(saved)


def load_callback_state(owner: Owner) -> None:
    """Rebuild the stateful callbacks (and ``TrainerControl``) from ``state.stateful_callbacks``.

    Each attached callback whose class name was stored is replaced, in place, by ``type(cb).from_state(...)``
    (several instances of a class are matched in order). Stored classes that are not attached are named in a
    warning and ignored: the checkpoint never decides which code runs.
    """
    from trainwell.state import ExportableState, TrainerControl

    stored = owner.state.stateful_callbacks or {}
    callbacks = owner.callback_handler.callbacks
    missing = []
    for name, data in stored.items():
        states = data if isinstance(data, list) else [data]
        if name == type(owner.control).__name__:
            owner.control = TrainerControl.from_state(states[0])
            continue
        positions = [i for i, cb in enumerate(callbacks)
                     if type(cb).__name__ == name and isinstance(cb, ExportableState)]
        if not positions:
            missing.append(name)
        for position, callback_state in zip(positions, states):
            callbacks[position] = type(callbacks[position]).from_state(callback_state)
    if missing:
        logger.warning("The checkpoint stores states of callbacks that are not attached to this Trainer, ignored: %s",
                       ", ".join(missing))
