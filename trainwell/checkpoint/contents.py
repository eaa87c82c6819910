"""What a checkpoint holds, as one table, and how each piece is staged, written and read back.

``CONTENTS`` below is the list. Each row names a piece, its file in ``checkpoint-N/``, whether every process
writes its own copy (``rng_state_{rank}.pth``) or one writer process writes it, whether ``save_only_model``
leaves it out, when ``train(resume_from_checkpoint=...)`` restores it (:class:`Phase`), the Trainer methods (the
reference's names, so subclass overrides are honoured) that save and restore it, and how ``save_async`` stages
it (:class:`Staging`), with the functions that take its state from the run, write it and read it back. A piece
with no restoring method is the state of a part of the run registered with the run's checkpointer (a
``state_dict``/``load_state_dict`` provider: the loop's data position, the epoch's loader seed, the log window;
some of those are entries of the RNG file, ``entry``); a piece with no saving method either is written from its
provider by the checkpointer itself, in both kinds of save. The table drives every use, through the run's
checkpointer (``trainwell.checkpoint.checkpointer.Checkpointer``):

* the synchronous save (:func:`write_pieces`): the ``saved_by`` methods in table order, then the providers' own
  rows, into a temporary folder published atomically once every process wrote its part; ``trainer_state.json``
  is last;
* ``save_async`` (:func:`stage_pieces`): the rows written now are written now, the others staged (copied to host
  buffers, or deep-copied) and written by the background writer, each by its row's ``write``;
* resuming: each phase runs the ``restored_by`` methods of its rows and hands its providers their saved states;
* validating (``trainwell.checkpoint.resume``): the ``required`` rows must be present.

The functions here are the default bodies of the Trainer's saving methods (the restoring ones are
``trainwell.checkpoint.loading``'s). They are handed what they need (the trainer's parts, the providers' states)
and never see the checkpointer.
"""

from __future__ import annotations

import copy
import enum
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainwell.args.storage import is_url, local_output_dir, staging_dir_for
from trainwell.backend import deepspeed as ds
from trainwell.backend import sharded
from trainwell.checkpoint import adapters, store
from trainwell.checkpoint.io import save_model_weights, torch_save, write_json
from trainwell.checkpoint.layout import (
    OPTIMIZER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_NAME,
    per_rank_name,
)
from trainwell.utils import filehash
from trainwell.utils import model as model_utils
from trainwell.utils.safe_files import staged
from trainwell.utils.seed import get_rng_state

if TYPE_CHECKING:
    from torch import nn

    from trainwell.backend.precision import Precision
    from trainwell.backend.runtime import Runtime
    from trainwell.checkpoint.background import HostStaging
    from trainwell.state import TrainerState

logger = logging.getLogger(__name__)

RNG_NAME = "rng_state.pth"


class Owner(Protocol):
    """What the checkpoint layer sees of the Trainer (``trainwell.hooks.TrainerHooks`` holds all of it): the parts a
    checkpoint holds, and the methods the table names, always called on the Trainer by name (so a subclass's
    override runs)."""

    args: Any
    runtime: Runtime
    precision: Precision
    state: TrainerState
    control: Any
    callback_handler: Any
    model: nn.Module
    model_wrapped: nn.Module
    optimizer: Any
    lr_scheduler: Any
    processing_class: Any
    data_collator: Any
    is_in_train: bool

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None: ...
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...


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


class Staging(enum.Enum):
    """How ``save_async`` takes a piece while training goes on (a synchronous save writes each piece at once)."""

    NOW = 1  #: written before the save returns: small files, and what every process gives (RNG states)
    HOST = 2  #: its tensors copied into host buffers kept from one save to the next; written in the background
    COPY = 3  #: deep-copied (small state); written in the background
    ENGINE = 4  #: the engine's own state, written by every process: engines that write it refuse ``save_async``


@dataclass(frozen=True)
class Piece:
    name: str
    file: str  #: file name in the checkpoint folder; per-rank files add ``_{rank}`` with several processes
    per_rank: bool  #: every process writes its own file (else: the writer processes write one)
    training_state: bool  #: left out by ``save_only_model``
    required: bool  #: a checkpoint without it is incomplete (training-state pieces: unless ``save_only_model``)
    restored: Phase
    #: the Trainer method that writes it (None: the checkpointer writes the state of the provider registered under
    #: ``name``, with ``write``; such a row is written by the writer processes, not per rank)
    saved_by: str | None
    #: the Trainer method that restores it (None: the provider registered under ``name`` does)
    restored_by: str | None
    replaces: tuple[str, ...] = ()  #: the pieces this one stands in for (their sharded form, under FSDP or ZeRO)
    #: the TrainingArguments flag without which ``restored_by`` is not called (None: always called)
    restored_if: str | None = None
    entry: str | None = None  #: the key of the RNG file's dictionary that holds it (None: it has its own file)
    #: the entry restored instead when the run resumes at the start of an epoch (``Phase.DATA`` rows)
    entry_at_epoch_start: str | None = None
    staged: Staging = Staging.NOW  #: how ``save_async`` takes it
    #: its state as the run holds it now, for ``save_async`` (None: its provider's ``state_dict``, or ``staged`` NOW)
    state: Callable[[Owner], Any] | None = None
    #: ``write(owner, piece, state, folder)`` writes ``state`` into the checkpoint folder (None: ``torch_save`` to
    #: :func:`own_file`)
    write: Callable[[Owner, Piece, Any, str], None] | None = None
    #: ``read(path, data)``: a provider's saved state back from the bytes of its file at ``path``, read once through
    #: the checkpoint folder's descriptor and checked against the manifest (None: ``safe_torch_load`` of them)
    read: Callable[[Path, bytes], Any] | None = None
    #: its state is this process's part of a model the engine shards: under such an engine (FSDP2, tensor
    #: parallelism, DeepSpeed: ``Engine.every_process_writes``) every process writes its own file (``{stem}_{rank}``),
    #: elsewhere the writer processes write the one file (every process holds the same state)
    sharded: bool = False


# ----------------------------------------------------------------------------------------------- rows' functions
def _model_state(owner: Owner) -> Any:
    return adapters.state_to_snapshot(model_utils.unwrap(owner.model))  # a PeftModel: its adapters only


def _write_model(owner: Owner, piece: Piece, state: Any, folder: str) -> None:
    save_model_weights(model_utils.unwrap(owner.model), folder, state_dict=state)


def _write_arguments(owner: Owner, piece: Piece, state: Any, folder: str) -> None:
    save_model_files(owner, folder, weights=False)  # training_args.json and the processing class


def _write_file(owner: Owner, piece: Piece, state: Any, folder: str) -> None:
    torch_save(state, Path(folder) / own_file(piece, owner.runtime))


CONTENTS: tuple[Piece, ...] = (
    Piece("model", WEIGHTS_NAME, False, False, True, Phase.WEIGHTS, "save_model", "_load_from_checkpoint",
          staged=Staging.HOST, state=_model_state, write=_write_model),
    Piece("training_args", TRAINING_ARGS_NAME, False, False, False, Phase.NEVER, "save_model", None,
          write=_write_arguments),
    Piece("optimizer", OPTIMIZER_NAME, False, True, True, Phase.OPTIMIZER, "_save_optimizer_and_scheduler",
          "_load_optimizer_and_scheduler", staged=Staging.HOST, state=lambda owner: owner.optimizer.state_dict()),
    Piece("scheduler", SCHEDULER_NAME, False, True, True, Phase.OPTIMIZER, "_save_optimizer_and_scheduler",
          "_load_optimizer_and_scheduler", staged=Staging.COPY, state=lambda owner: owner.lr_scheduler.state_dict()),
    # Under FSDP or tensor parallelism (trainwell.backend.sharded): every process writes its shards, the coordinator
    # .metadata last.
    Piece("model_shards", f"{sharded.MODEL_DIR}/{sharded.METADATA}", False, True, False, Phase.WEIGHTS,
          "_save_optimizer_and_scheduler", "_load_from_checkpoint", replaces=("model",), staged=Staging.ENGINE),
    Piece("optimizer_shards", f"{sharded.OPTIMIZER_DIR}/{sharded.METADATA}", False, True, False, Phase.OPTIMIZER,
          "_save_optimizer_and_scheduler", "_load_optimizer_and_scheduler", replaces=("optimizer",),
          staged=Staging.ENGINE),
    # Under DeepSpeed: its own checkpoint (global_step{N}/, partitioned), `latest` naming it written last.
    Piece("deepspeed_state", ds.LATEST, False, True, False, Phase.OPTIMIZER, "_save_optimizer_and_scheduler",
          "_load_optimizer_and_scheduler", replaces=("model", "optimizer"), staged=Staging.ENGINE),
    Piece("scaler", SCALER_NAME, False, True, False, Phase.OPTIMIZER, "_save_scaler", "_load_scaler",
          staged=Staging.COPY, state=lambda owner: owner.precision.state_dict()),
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
    Piece("skipped_steps", RNG_NAME, True, True, False, Phase.RNG, "_save_rng_state", None, entry="skipped_steps"),
    Piece("data_position", "data_state.pth", True, True, False, Phase.DATA, "_save_rng_state", None),
    # Where the checkpoint stands in its epoch, in samples of all processes (``{"epoch", "samples"}``): a resume with
    # another global batch (another number of processes) continues at that sample, not at ``global_step`` x its batch.
    Piece("epoch_samples", RNG_NAME, True, True, False, Phase.STATE, "_save_rng_state", None, entry="epoch_samples"),
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
    return Path(directory) / piece_name(name, process_index, num_processes)


def piece_name(name: str, process_index: int = 0, num_processes: int = 1) -> str:
    """The file of piece ``name`` in a checkpoint folder (relative to it) as process ``process_index`` writes and
    reads it."""
    piece = PIECES[name]
    return per_rank_name(piece.file, process_index, num_processes) if piece.per_rank else piece.file


def writes_own(piece: Piece, runtime: Runtime) -> bool:
    """Whether every process writes (and reads) its own file of ``piece``: a per-rank piece, or a sharded one under an
    engine that shards the model."""
    return piece.per_rank or (piece.sharded and runtime.engine.every_process_writes)


def own_file(piece: Piece, runtime: Runtime) -> str:
    """The file of ``piece`` (relative to the checkpoint folder) that this process reads, and writes when it writes
    one: its own where :func:`writes_own`, else the piece's one file."""
    if writes_own(piece, runtime):
        return per_rank_name(piece.file, runtime.process_index, runtime.num_processes)
    return piece.file


# ----------------------------------------------------------------------------------------------- saving
#: ``provided(saved_by)``: the providers' states of the rows ``saved_by`` writes (None: the rows without a saving
#: method), as ``(piece, state)`` in table order; every process calls it, in the same order
Provided = Callable[[str | None], list[tuple[Piece, Any]]]


def _rows(save_only_model: bool) -> list[Piece]:
    return [p for p in CONTENTS if not (save_only_model and p.training_state)]


def saving_methods(save_only_model: bool) -> list[str]:
    """The Trainer methods that write a checkpoint's pieces, in table order (``trainer_state.json`` aside)."""
    return list(dict.fromkeys(p.saved_by for p in _rows(save_only_model) if p.saved_by not in (None,
                                                                                                "_save_checkpoint")))


def write_pieces(owner: Owner, tmp: str, provided: Provided) -> None:
    """The synchronous save: the saving methods of ``CONTENTS`` in table order, then the providers' own rows."""
    for method in saving_methods(owner.args.save_only_model):
        if method == "save_model":
            owner.save_model(tmp, _internal_call=True)  # the reference's flag: a checkpoint's model
        else:
            getattr(owner, method)(tmp)
    for piece, state in _own_rows(owner, provided):
        if owner.args.should_save or writes_own(piece, owner.runtime):  # a process's own shard: by every process
            (piece.write or _write_file)(owner, piece, state, tmp)


def _own_rows(owner: Owner, provided: Provided) -> list[tuple[Piece, Any]]:
    """The rows the checkpointer writes from their providers (``CONTENTS``' and any a callback adds), with their
    states, ``save_only_model``'s left out."""
    only_model = owner.args.save_only_model
    return [(piece, state) for piece, state in provided(None) if not (only_model and piece.training_state)]


_SNAPSHOT_METHODS = ("save_model", "_save", "_save_optimizer_and_scheduler", "_save_scaler")


def _is_trainers_own(method: Any) -> bool:
    """Whether ``method`` is the Trainer's own body (``trainwell.trainer``), not an override: told by where it was
    defined, since this layer sits below the Trainer and never imports it."""
    return getattr(method, "__module__", None) == "trainwell.trainer" and method.__qualname__.startswith("Trainer.")


def stage_pieces(owner: Owner, tmp: str, staging: HostStaging, provided: Provided) -> Callable[[], None] | None:
    """``save_async``: write the rows staged ``NOW`` now, copy the others (host buffers from ``staging``, the run's,
    reused from one save to the next; or deep copies), and return the job that writes those copies (None on
    processes that write nothing more). A saving method whose rows are all written now runs as it is (an override
    too); the others are taken apart row by row, so they must be the Trainer's own."""
    rows = _rows(owner.args.save_only_model)
    split = [m for m in saving_methods(owner.args.save_only_model)
             if any(p.staged is not Staging.NOW for p in rows if p.saved_by == m)]
    overridden = [m for m in _SNAPSHOT_METHODS if (m in split or m == "_save" and "save_model" in split)
                  and not _is_trainers_own(getattr(type(owner), m))]
    if overridden:
        raise ValueError(
            f"save_async=True writes checkpoints from a snapshot and cannot call the overridden {overridden}: set "
            "save_async=False to keep the overrides."
        )
    should_save, later = owner.args.should_save, []
    for method in saving_methods(owner.args.save_only_model):
        if method not in split:
            getattr(owner, method)(tmp)  # every process: its RNG states and data position
            continue
        for piece in (p for p in rows if p.saved_by == method and p.staged is not Staging.ENGINE and should_save):
            later += _stage(owner, piece, piece.state(owner) if piece.state else None, tmp, staging)
    for piece, state in _own_rows(owner, provided):  # providers are asked on every process (a collective may be)
        if should_save:
            later += _stage(owner, piece, state, tmp, staging)
        elif writes_own(piece, owner.runtime):  # its own shard, written now: only the writers write in the background
            (piece.write or _write_file)(owner, piece, state, tmp)
    if not should_save:
        return None

    def write() -> None:
        for piece, state in later:
            (piece.write or _write_file)(owner, piece, state, tmp)

    return write


def _stage(owner: Owner, piece: Piece, state: Any, tmp: str, staging: HostStaging) -> list[tuple[Piece, Any]]:
    """Write ``piece`` now (``Staging.NOW``), or its copy later: ``[(piece, copy)]``."""
    if piece.staged is Staging.NOW:
        (piece.write or _write_file)(owner, piece, state, tmp)
        return []
    if state is None:  # nothing to save (no scaler without fp16)
        return []
    return [(piece, staging.snapshot(piece.name, state) if piece.staged is Staging.HOST else copy.deepcopy(state))]


def save_model(owner: Owner, output_dir: str | None, internal_call: bool) -> None:
    """``save_model``: the full weights, gathered from every process first by a sharding engine (a collective there).

    A checkpoint whose engine keeps the model in its own state (sharded FSDP checkpoints, ZeRO-3) skips the
    gathering: the model is written with the optimizer (``_save_optimizer_and_scheduler``); only the arguments and
    processing class come here.
    """
    url = output_dir or owner.args.output_dir
    if not internal_call and (output_dir is None or is_url(output_dir)) and is_url(url):
        # an object store: written into the staging folder (the run's, or the URL's own), then its files uploaded
        own = url.rstrip("/") == str(owner.args.output_dir).rstrip("/")
        folder = local_output_dir(owner.args) if own else staging_dir_for(url)
        save_model(owner, folder, internal_call)
        if owner.args.should_save:
            store.open_url(url, owner.args.storage_options).upload_files(Path(folder))
        return
    engine, model = owner.runtime.engine, owner.model_wrapped
    if internal_call and engine.checkpoint_keeps_model(model, owner.args.save_only_model):
        if owner.args.should_save:
            save_model_files(owner, output_dir or local_output_dir(owner.args), weights=False)
        return
    state_dict = engine.full_state_dict(model)
    if state_dict is None:
        owner._save(output_dir)  # the model's own state_dict, read where it is written
    else:
        owner._save(output_dir, state_dict=state_dict)


def save_model_files(owner: Owner, output_dir: str, state_dict: dict | None = None, weights: bool = True) -> None:
    """The model (safetensors, or ``save_pretrained``), the processing class and ``training_args.json``."""
    os.makedirs(output_dir, exist_ok=True)
    before = set(os.listdir(output_dir))
    if weights:
        save_model_weights(model_utils.unwrap(owner.model), output_dir, state_dict=state_dict)
    processing = owner.processing_class or getattr(owner.data_collator, "tokenizer", None)
    if processing is not None and hasattr(processing, "save_pretrained"):
        with staged(output_dir) as stage:  # renamed into place: never written through a planted link
            processing.save_pretrained(str(stage))
    write_json(owner.args.to_dict(), os.path.join(output_dir, TRAINING_ARGS_NAME))
    recorder = filehash.recording_for(os.path.join(output_dir, TRAINING_ARGS_NAME))
    if recorder is not None and owner.runtime.num_processes == 1:
        # A checkpoint's model files (written by safetensors or save_pretrained, not through trainwell's writers)
        # are read back for the manifest while the optimizer is written. Alone here: no other process writes.
        written = sorted(set(os.listdir(output_dir)) - before)
        recorder.hash_soon([Path(output_dir) / n for n in written if os.path.isfile(os.path.join(output_dir, n))])


def save_optimizer_and_scheduler(owner: Owner, directory: str) -> None:
    """The optimizer (in the engine's own state where it keeps one: shards, DeepSpeed's checkpoint, with the model
    where the checkpoint keeps it there) and the scheduler, each by its row."""
    own = owner.runtime.engine.save_state(owner.model_wrapped, owner.optimizer, directory)  # every process
    if owner.args.should_save:
        for name in (("scheduler",) if own else ("optimizer", "scheduler")):
            _write_row(owner, name, directory)


def save_scaler(owner: Owner, directory: str) -> None:
    if owner.args.should_save:
        _write_row(owner, "scaler", directory)


def _write_row(owner: Owner, name: str, directory: str) -> None:
    piece = PIECES[name]
    state = piece.state(owner)  # type: ignore[misc]  (the rows written here have one)
    if state is not None:
        (piece.write or _write_file)(owner, piece, state, directory)


def save_rng_and_data_position(owner: Owner, directory: str, provided: list[tuple[Piece, Any]]) -> None:
    """Every process's RNG states and the state of the loop's parts (``provided``: the states its providers gave
    for the rows ``_save_rng_state`` writes: the epoch's loader seed, the pending batch, the log window, a stateful
    dataset's position). Every process calls it.

    With several processes they are gathered, and the writers (``args.should_save``) write all of them: only writers
    touch a checkpoint folder (no two processes write one file), the folder is complete on a disk the others cannot
    see, and each node's copy with ``save_on_each_node`` holds every process's state, so a restart that numbers the
    nodes differently (torchrun's c10d rendezvous does) still finds its files.
    """
    files: dict[str, Any] = {"rng": get_rng_state()}  # taken before the providers' states: the generators as they are
    for piece, state in provided:
        if piece.entry is not None:
            files["rng"][piece.entry] = state
        else:
            files[piece.name] = state
    runtime = owner.runtime
    if runtime.num_processes == 1:
        everyone = [files]
    else:
        everyone = runtime.all_gather_object(files)  # a few KiB per process
        if not owner.args.should_save:
            return
    for rank, pieces in enumerate(everyone):
        for name, value in pieces.items():
            torch_save(value, piece_file(directory, name, rank, runtime.num_processes))
