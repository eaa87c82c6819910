"""What a checkpoint holds, as one table, and how each piece is written and read back.

``CONTENTS`` below is the list. Each row names a piece, its file in ``checkpoint-N/``, whether every process
writes its own copy (``rng_state_{rank}.pth``) or one writer process writes it, whether ``save_only_model``
leaves it out, when ``train(resume_from_checkpoint=...)`` restores it (:class:`Phase`), and the Trainer
methods (the reference's names, so subclass overrides are honoured) that save and restore it. A piece with no
restoring method is the state of a part of the run the loop registers with the run's checkpointer (a
``state_dict``/``load_state_dict`` provider: the data position, the epoch's loader seed, the log window); some
of those are entries of the RNG file (``entry``). The table drives all three uses, through the run's
checkpointer (``trainwell.checkpoint.checkpointer.Checkpointer``):

* saving (:func:`write_pieces`): the ``saved_by`` methods run in table order, into a temporary folder
  published atomically once every process wrote its part, so a crash never leaves a ``checkpoint-N`` that
  resume would pick and fail on; ``trainer_state.json`` is last;
* resuming: each phase runs the ``restored_by`` methods of its rows and hands its providers their saved states;
* validating (``trainwell.checkpoint.resume.incomplete_reason``): the ``required`` rows must be present.

Sized data needs no position file: the sampler's order is a function of (seed, epoch), and ``global_step``
says how many windows of the current epoch were consumed. Loading never unpickles code
(``safe_torch_load``). The functions here are the default bodies of the Trainer's save/load methods.
"""

from __future__ import annotations

import copy
import enum
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwell.backend import deepspeed as ds
from trainwell.backend import engines, sharded
from trainwell.checkpoint import adapters
from trainwell.checkpoint.io import (
    load_model_weights,
    read_model_weights,
    safe_torch_load,
    save_model_weights,
    torch_save,
    write_json,
)
from trainwell.checkpoint.layout import (
    LEGACY_WEIGHTS_NAME,
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    per_rank_name,
)
from trainwell.checkpoint.optimizer_state import (
    align_optimizer_state,
    align_scheduler_state,
    check_optimizer_state,
)
from trainwell.checkpoint.rng import get_rng_state, set_rng_state
from trainwell.utils import filehash
from trainwell.utils import model as model_utils

if TYPE_CHECKING:
    from trainwell.checkpoint.background import HostStaging
    from trainwell.hooks import TrainerHooks

logger = logging.getLogger(__name__)

RNG_NAME = "rng_state.pth"


class Phase(enum.Enum):
    """When a resumed ``train()`` restores a piece, in this order."""

    WEIGHTS = 1  #: before the model is prepared (wrapped, placed)
    #: when the run's ``TrainerState`` is set up, before the step arithmetic is used; its methods take no argument
    #: (the state is ``trainer.state`` by then), as the reference's ``_load_callback_state()``
    STATE = 2
    OPTIMIZER = 3  #: once the optimizer and scheduler exist and are prepared
    #: when the resumed epoch's iterator is built: where the checkpoint stood inside its epoch, so only when the run
    #: resumes mid-epoch (a row naming ``entry_at_epoch_start`` is restored from that entry otherwise)
    DATA = 4
    RNG = 5  #: right after that, before the resumed epoch's first batch
    NEVER = 6  #: written for other tools (``from_pretrained``, the reference), not read on resume


@dataclass(frozen=True)
class Piece:
    name: str
    file: str  #: file name in the checkpoint folder; per-rank files add ``_{rank}`` with several processes
    per_rank: bool  #: every process writes its own file (else: the writer processes write one)
    training_state: bool  #: left out by ``save_only_model``
    required: bool  #: a checkpoint without it is incomplete (training-state pieces: unless ``save_only_model``)
    restored: Phase
    saved_by: str  #: the Trainer method that writes it
    #: the Trainer method that restores it (None: the provider the loop registers under ``name`` does)
    restored_by: str | None
    replaces: tuple[str, ...] = ()  #: the pieces this one stands in for (their sharded form, under FSDP or ZeRO)
    #: the TrainingArguments flag without which ``restored_by`` is not called (None: always called)
    restored_if: str | None = None
    entry: str | None = None  #: the key of the RNG file's dictionary that holds it (None: it has its own file)
    #: the entry restored instead when the run resumes at the start of an epoch (``Phase.DATA`` rows)
    entry_at_epoch_start: str | None = None


CONTENTS: tuple[Piece, ...] = (
    Piece("model", WEIGHTS_NAME, False, False, True, Phase.WEIGHTS, "save_model", "_load_from_checkpoint"),
    Piece("training_args", TRAINING_ARGS_NAME, False, False, False, Phase.NEVER, "save_model", None),
    Piece("optimizer", OPTIMIZER_NAME, False, True, True, Phase.OPTIMIZER, "_save_optimizer_and_scheduler",
          "_load_optimizer_and_scheduler"),
    Piece("scheduler", SCHEDULER_NAME, False, True, True, Phase.OPTIMIZER, "_save_optimizer_and_scheduler",
          "_load_optimizer_and_scheduler"),
    # Under FSDP or tensor parallelism (trainwell.backend.sharded): every process writes its shards, the coordinator
    # .metadata last.
    Piece("model_shards", f"{sharded.MODEL_DIR}/{sharded.METADATA}", False, True, False, Phase.WEIGHTS,
          "_save_optimizer_and_scheduler", "_load_from_checkpoint", replaces=("model",)),
    Piece("optimizer_shards", f"{sharded.OPTIMIZER_DIR}/{sharded.METADATA}", False, True, False, Phase.OPTIMIZER,
          "_save_optimizer_and_scheduler", "_load_optimizer_and_scheduler", replaces=("optimizer",)),
    # Under DeepSpeed: its own checkpoint (global_step{N}/, partitioned), `latest` naming it written last.
    Piece("deepspeed_state", ds.LATEST, False, True, False, Phase.OPTIMIZER, "_save_optimizer_and_scheduler",
          "_load_optimizer_and_scheduler", replaces=("model", "optimizer")),
    Piece("scaler", SCALER_NAME, False, True, False, Phase.OPTIMIZER, "_save_scaler", "_load_scaler"),
    Piece("rng", RNG_NAME, True, True, True, Phase.RNG, "_save_rng_state", "_load_rng_state"),
    # The state of the loop's parts (restored_by None: the providers it registers with the run's checkpointer).
    # The CPU RNG state the resumed epoch's loader seed is drawn from: mid-epoch the one the checkpoint's epoch
    # drew from; at an epoch's start the checkpoint's own (that epoch begins after it).
    Piece("epoch_seed", RNG_NAME, True, True, False, Phase.DATA, "_save_rng_state", None, entry="loader",
          entry_at_epoch_start="cpu"),
    # The RNG states the batch read ahead of the checkpoint's step was read from, to read it again identically.
    Piece("pending_batch", RNG_NAME, True, True, False, Phase.DATA, "_save_rng_state", None, entry="read_ahead"),
    # The log window in progress: the first log after a resume averages the same steps as the uninterrupted run's.
    Piece("log_window", RNG_NAME, True, True, False, Phase.RNG, "_save_rng_state", None, entry="log_window"),
    Piece("data_position", "data_state.pth", True, True, False, Phase.DATA, "_save_rng_state", None),
    Piece("trainer_state", TRAINER_STATE_NAME, False, False, True, Phase.STATE, "_save_checkpoint",
          "_load_callback_state", restored_if="restore_callback_states_from_checkpoint"),
)
# The model piece also covers the processing class (``save_pretrained`` files), a sharded
# ``model.safetensors.index.json``, and a PEFT model's adapters (``adapter_model.safetensors``, a non-default adapter
# in a subfolder: ``trainwell.checkpoint.adapters``); ``trainwell.checkpoint.resume`` accepts those and the
# reference's ``pytorch_model.bin`` as model weights.

PIECES = {piece.name: piece for piece in CONTENTS}


def piece_file(directory: str | os.PathLike, name: str, process_index: int = 0, num_processes: int = 1) -> Path:
    """The path of piece ``name`` in ``directory`` as process ``process_index`` writes and reads it."""
    piece = PIECES[name]
    file = per_rank_name(piece.file, process_index, num_processes) if piece.per_rank else piece.file
    return Path(directory) / file


# ----------------------------------------------------------------------------------------------- saving
def saving_methods(save_only_model: bool) -> list[str]:
    """The Trainer methods that write a checkpoint's pieces, in table order (``trainer_state.json`` aside)."""
    pieces = [p for p in CONTENTS if p.saved_by != "_save_checkpoint" and not (save_only_model and p.training_state)]
    return list(dict.fromkeys(p.saved_by for p in pieces))


def write_pieces(trainer: TrainerHooks, tmp: str) -> None:
    """The synchronous save: the saving methods of ``CONTENTS``, in table order (nothing left to run later)."""
    for method in saving_methods(trainer.args.save_only_model):
        if method == "save_model":
            trainer.save_model(tmp, _internal_call=True)  # the reference's flag: a checkpoint's model
        else:
            getattr(trainer, method)(tmp)


_SNAPSHOT_METHODS = ("save_model", "_save", "_save_optimizer_and_scheduler", "_save_scaler")


def _is_trainers_own(method: Any) -> bool:
    """Whether ``method`` is the Trainer's own body (``trainwell.trainer``), not an override: told by where it was
    defined, since this layer sits below the Trainer and never imports it."""
    return getattr(method, "__module__", None) == "trainwell.trainer" and method.__qualname__.startswith("Trainer.")


def stage_pieces(trainer: TrainerHooks, tmp: str, staging: HostStaging) -> Callable[[], None] | None:
    """``save_async``: write the small pieces now, copy the large ones to host buffers (``staging``: the run's,
    reused from one save to the next), and return the job that writes those copies (None on processes that
    write nothing more)."""
    overridden = [m for m in _SNAPSHOT_METHODS if not _is_trainers_own(getattr(type(trainer), m))]
    if overridden:
        raise ValueError(
            f"save_async=True writes checkpoints from a snapshot and cannot call the overridden {overridden}: set "
            "save_async=False to keep the overrides."
        )
    args = trainer.args
    if not args.save_only_model:
        trainer._save_rng_state(tmp)  # every process: its RNG states and data position
    if not args.should_save:
        return None
    save_model_files(trainer, tmp, weights=False)  # arguments and processing class
    model = model_utils.unwrap(trainer.model)
    weights = staging.snapshot("model", adapters.state_to_snapshot(model))
    states = {}
    if not args.save_only_model:
        states[OPTIMIZER_NAME] = staging.snapshot("optimizer", trainer.optimizer.state_dict())
        states[SCHEDULER_NAME] = copy.deepcopy(trainer.lr_scheduler.state_dict())
        scaler = trainer.precision.state_dict()
        if scaler is not None:
            states[SCALER_NAME] = copy.deepcopy(scaler)

    def write() -> None:
        save_model_weights(model, tmp, state_dict=weights)
        for name, state in states.items():
            torch_save(state, os.path.join(tmp, name))

    return write


def save_model(trainer: TrainerHooks, output_dir: str | None, internal_call: bool) -> None:
    """``save_model``: the full weights, gathered from every process first by a sharding engine (a collective there).

    A checkpoint whose engine keeps the model in its own state (sharded FSDP checkpoints, ZeRO-3) skips the
    gathering: the model is written with the optimizer (``_save_optimizer_and_scheduler``); only the arguments and
    processing class come here.
    """
    engine, model = trainer.runtime.engine, trainer.model_wrapped
    if internal_call and engine.checkpoint_keeps_model(model, trainer.args.save_only_model):
        if trainer.args.should_save:
            save_model_files(trainer, output_dir or trainer.args.output_dir, weights=False)
        return
    state_dict = engine.full_state_dict(model)
    if state_dict is None:
        trainer._save(output_dir)  # the model's own state_dict, read where it is written
    else:
        trainer._save(output_dir, state_dict=state_dict)


def save_model_files(
    trainer: TrainerHooks, output_dir: str, state_dict: dict | None = None, weights: bool = True
) -> None:
    """The model (safetensors, or ``save_pretrained``), the processing class and ``training_args.json``."""
    os.makedirs(output_dir, exist_ok=True)
    before = set(os.listdir(output_dir))
    if weights:
        save_model_weights(model_utils.unwrap(trainer.model), output_dir, state_dict=state_dict)
    processing = trainer.processing_class or getattr(trainer.data_collator, "tokenizer", None)
    if processing is not None and hasattr(processing, "save_pretrained"):
        processing.save_pretrained(output_dir)
    write_json(trainer.args.to_dict(), os.path.join(output_dir, TRAINING_ARGS_NAME))
    recorder = filehash.recording_for(os.path.join(output_dir, TRAINING_ARGS_NAME))
    if recorder is not None and trainer.runtime.num_processes == 1:
        # A checkpoint's model files (written by safetensors or save_pretrained, not through trainwell's writers)
        # are read back for the manifest while the optimizer is written. Alone here: no other process writes.
        written = sorted(set(os.listdir(output_dir)) - before)
        recorder.hash_soon([Path(output_dir) / n for n in written if os.path.isfile(os.path.join(output_dir, n))])


def save_optimizer_and_scheduler(trainer: TrainerHooks, directory: str) -> None:
    """The optimizer (in the engine's own state where it keeps one: shards, DeepSpeed's checkpoint, with the model
    where the checkpoint keeps it there) and the scheduler."""
    should_save = trainer.args.should_save
    own = trainer.runtime.engine.save_state(trainer.model_wrapped, trainer.optimizer, directory)  # every process
    if not own and should_save:
        torch_save(trainer.optimizer.state_dict(), piece_file(directory, "optimizer"))
    if should_save:
        torch_save(trainer.lr_scheduler.state_dict(), piece_file(directory, "scheduler"))


def save_scaler(trainer: TrainerHooks, directory: str) -> None:
    state = trainer.precision.state_dict()
    if state is not None and trainer.args.should_save:
        torch_save(state, piece_file(directory, "scaler"))


def save_rng_and_data_position(trainer: TrainerHooks, directory: str) -> None:
    """Every process's RNG states and the state of the loop's parts (the pieces its providers give the run's
    checkpointer: the epoch's loader seed, the pending batch, the log window, a stateful dataset's position).
    Every process calls it (a provider may be a collective: the log window's mean over processes).

    With several processes they are gathered, and the writers (``args.should_save``) write all of them: only writers
    touch a checkpoint folder (no two processes write one file), the folder is complete on a disk the others cannot
    see, and each node's copy with ``save_on_each_node`` holds every process's state, so a restart that numbers the
    nodes differently (torchrun's c10d rendezvous does) still finds its files.
    """
    files: dict[str, Any] = {"rng": get_rng_state()}  # before any provider runs: the generators as they stand
    for piece, state in trainer.checkpointer.provided("_save_rng_state"):
        if piece.entry is not None:
            files["rng"][piece.entry] = state
        else:
            files[piece.name] = state
    runtime = trainer.runtime
    if runtime.num_processes == 1:
        everyone = [files]
    else:
        everyone = runtime.all_gather_object(files)  # a few KiB per process
        if not trainer.args.should_save:
            return
    for rank, pieces in enumerate(everyone):
        for name, value in pieces.items():
            torch_save(value, piece_file(directory, name, rank, runtime.num_processes))


# ----------------------------------------------------------------------------------------------- loading
def load_model(model: Any, checkpoint: str, strict: bool = True) -> None:
    """The checkpoint's weights (shards or full) into ``model`` (sharded or not, a DeepSpeed engine): read by the
    checkpoint's form, whichever engine runs."""
    owner = engines.state_owner(checkpoint)
    if owner is not None and not _has_full_weights(checkpoint):
        owner.load_own_weights(model, checkpoint)  # only in the engine's own state (ZeRO-3)
        return
    model = model_utils.unwrap(model)  # a compiled model's weights are its original module's
    if model_utils.is_peft_model(model) and not _has_full_weights(checkpoint):
        adapters.load_adapters(model, checkpoint, strict=strict)  # the reference's checkpoints hold adapters only
    elif sharded.has_shards(checkpoint, sharded.MODEL_DIR):
        sharded.load_model_shards(model, checkpoint)
    elif sharded.is_sharded(model):
        sharded.load_full_state(model, read_model_weights(checkpoint))
    else:
        load_model_weights(model, checkpoint, strict=strict)


def _has_full_weights(checkpoint: str) -> bool:
    path = Path(checkpoint)
    return any((path / name).is_file() for name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, LEGACY_WEIGHTS_NAME))


def load_optimizer_and_scheduler(trainer: TrainerHooks, checkpoint: str) -> None:
    """Restore the optimizer and scheduler states (after the optimizer was prepared)."""
    optimizer_file, scheduler_file = piece_file(checkpoint, "optimizer"), piece_file(checkpoint, "scheduler")
    engine = trainer.runtime.engine
    engines.check_checkpoint_engine(engine, checkpoint)  # a DeepSpeed checkpoint resumes under DeepSpeed only
    group_map, saved_groups = None, 0  # how the saved optimizer groups map onto this run's (plain files only)
    # The engine's own state first (shards, DeepSpeed's checkpoint), else the optimizer's full state_dict
    if not engine.load_state(trainer.model_wrapped, trainer.optimizer, checkpoint, optimizer_file):
        if not optimizer_file.is_file():
            logger.warning(
                "%s has no %s (saved with save_only_model?): the optimizer starts fresh, so training will not "
                "continue exactly where it stopped.", checkpoint, OPTIMIZER_NAME,
            )  # fmt: skip
            return
        group_map, saved_groups = _load_full_optimizer_state(trainer, checkpoint, optimizer_file)
    if scheduler_file.is_file():
        scheduler_state = safe_torch_load(scheduler_file)
        if isinstance(scheduler_state, dict):
            scheduler_state = align_scheduler_state(scheduler_state, group_map, saved_groups)
        trainer.lr_scheduler.load_state_dict(scheduler_state)


def _load_full_optimizer_state(trainer: TrainerHooks, checkpoint: str, file: Path) -> tuple[list[int] | None, int]:
    """``optimizer.pt`` into the optimizer, its groups aligned with this run's and checked first; returns how the
    saved groups map onto this run's and how many were saved (for the scheduler's per-group lists)."""
    saved = safe_torch_load(file, map_location=trainer.runtime.device)
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    model = model_utils.unwrap(trainer.model)
    aligned, group_map = align_optimizer_state(saved, inner, model)
    names = {id(p): n for n, p in model.named_parameters()}
    check_optimizer_state(aligned, inner, names, str(file), _saved_argument(checkpoint, "optim"))
    trainer.optimizer.load_state_dict(aligned)
    return group_map, len(saved["param_groups"])


def _saved_argument(checkpoint: str, name: str) -> Any:
    """One value of the ``training_args.json`` of the run that wrote ``checkpoint`` (None when unknown)."""
    try:
        saved = json.loads((Path(checkpoint) / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return None
    return saved.get(name) if isinstance(saved, dict) else None


def load_scaler(trainer: TrainerHooks, checkpoint: str) -> None:
    file = piece_file(checkpoint, "scaler")
    if trainer.precision.can_skip_steps and file.is_file():
        trainer.precision.load_state_dict(safe_torch_load(file))


def load_rng_state(trainer: TrainerHooks, checkpoint: str) -> None:
    """Restore this process's RNG states; a checkpoint without them (or from another world size) warns. The file
    is the one the run's checkpointer read (once per resume)."""
    saved = trainer.checkpointer.saved_rng(checkpoint)
    if saved is None:
        logger.warning(
            "%s has no RNG state for process %d: random draws (dropout, augmentation) after resume will differ "
            "from the uninterrupted run.", checkpoint, trainer.runtime.process_index,
        )  # fmt: skip
        return
    set_rng_state(saved)


def load_callback_state(trainer: TrainerHooks) -> None:
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
        positions = [i for i, cb in enumerate(callbacks)
                     if type(cb).__name__ == name and isinstance(cb, ExportableState)]
        if not positions:
            missing.append(name)
        for position, callback_state in zip(positions, states):
            callbacks[position] = type(callbacks[position]).from_state(callback_state)
    if missing:
        logger.warning(
            "The checkpoint stores states of callbacks that are not attached to this Trainer, ignored: %s",
            ", ".join(missing),
        )
