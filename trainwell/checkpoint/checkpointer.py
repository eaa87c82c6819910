"""The checkpoints of one ``train()`` call: its saves, its resume, and the state the loop hands it.

One :class:`Checkpointer` per ``train()`` call (``trainer.checkpointer``; a plain one from ``Trainer()`` on, for saves
outside it). It saves and restores the Trainer's parts (model, optimizer, scheduler, scaler, RNG states, callbacks)
through the save and load methods that ``trainwell.checkpoint.contents.CONTENTS`` names for each piece (the
reference's names, so a subclass's overrides run), and the other parts (the loop's data position, the epoch's loader
seed, the batch read ahead, the log window; any piece a row adds) as ``state_dict``/``load_state_dict`` providers
registered under the names of their rows; and the pieces the Trainer's callbacks add (a ``checkpoint_piece`` with
``state_dict``/``load_state_dict``: ``trainwell.checkpoint.pieces``), rows of the run's table after ``CONTENTS``'s
(:meth:`Checkpointer.rows`). The checkpointer holds the rest of what a save and a resume need, and
nothing outside it does:

* the :class:`~trainwell.checkpoint.resume.Resume` (which checkpoint, found and validated once per ``train()`` call,
  agreed by every process, its files listed and parsed once) and the restore, phase by phase:
  :meth:`Checkpointer.restore` runs a phase's rows of the table, its Trainer methods and its providers, for all five
  phases. The resumed checkpoint's RNG file is read once;
* the save (:meth:`Checkpointer.save_checkpoint`): the pieces written as the table says (synchronously, or staged
  for ``save_async``: host staging and the background writer, ``trainwell.checkpoint.background``), checksummed into
  the manifest, published atomically once every process wrote its part, then rotated;
* the run's housekeeping on ``output_dir``: :meth:`begin_run` (which processes see the writers' folder, the
  temporary folders of an interrupted save) and :meth:`end_run` (``save_total_limit=1`` keeps only the best).

This layer sits below the loop and the Trainer and imports neither: the loop hands over its step plan (where in
the data a checkpoint's step stands) and its providers; the Trainer is seen as ``contents.Owner``. The contents'
bodies never see the checkpointer: the Trainer's methods hand them what it holds (:meth:`provided`,
:meth:`saved_rng`, :meth:`files`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainwell.args.storage import local_output_dir
from trainwell.checkpoint import contents, disks, manifest, pieces, store
from trainwell.checkpoint import lock as output_lock
from trainwell.checkpoint.background import BackgroundWriter, HostStaging
from trainwell.checkpoint.contents import Phase
from trainwell.checkpoint.finite import check_finite_weights
from trainwell.checkpoint.io import AtomicDirectory, CheckpointFiles, load_rng_file, safe_torch_load, writing
from trainwell.checkpoint.layout import (
    TRAINER_STATE_NAME,
    checkpoint_path,
    clean_temporary,
    keep_only_best,
    per_rank_name,
    rotate_checkpoints,
)
from trainwell.checkpoint.resume import Resume, RunPlan
from trainwell.utils import filehash
from trainwell.utils.safe_files import check_writable

if TYPE_CHECKING:
    from trainwell.checkpoint.contents import Owner

logger = logging.getLogger(__name__)


class Stateful(Protocol):
    """A part of the run whose state a checkpoint keeps."""

    def state_dict(self) -> Any:
        """Its state as of now (None: nothing to save)."""
        ...

    def load_state_dict(self, state: Any) -> None:
        """Continue from ``state``, saved by ``state_dict`` in an earlier run."""
        ...


@dataclass(frozen=True)
class Provider:
    """A :class:`Stateful` made of two callables: for state that is not one object's own (it lives in several)."""

    state_dict: Callable[[], Any]
    load_state_dict: Callable[[Any], None]


# What a resume loses without a provider's piece: said in a warning (the other pieces are quietly optional).
_WITHOUT = {"data_position": "the iterable dataset is replayed to skip the consumed batches"}


class Checkpointer:
    """The checkpoints of one ``train()`` call over the Trainer ``hooks``, resuming ``resume`` (None: a fresh run).

    ``background``: ``save_async`` saves may be written by a background thread (a ``train()`` call, which waits for
    the last one before it returns); without it, and for a save outside ``train()`` (also through the checkpointer
    of a finished call), every save is synchronous.
    """

    def __init__(self, hooks: Owner, resume: Resume | None = None, background: bool = False) -> None:
        self.hooks, self.resume = hooks, resume
        self.writer = BackgroundWriter() if background else None
        self.staging = HostStaging() if background else None  # host copies, reused from one save to the next
        self._providers: dict[str, Stateful] = {}
        self._plan: RunPlan | None = None
        self._rng: dict[str, Any] | None = None  # the resumed checkpoint's RNG file, once read
        self._rng_read = False

    @staticmethod
    def find(hooks: Owner, resume_from_checkpoint: str | bool | None) -> Resume | None:
        """The checkpoint ``train(resume_from_checkpoint=...)`` resumes, found and validated: once per ``train()``
        call, a collective with several processes (all resume the same one, or all raise the same error)."""
        return Resume.of(hooks, resume_from_checkpoint)

    @classmethod
    def of(cls, hooks: Owner, resume: Resume | None) -> Checkpointer:
        """The checkpointer of one attempt of a ``train()`` call, resuming ``resume`` (:meth:`find`'s)."""
        return cls(hooks, resume, background=True)

    # ------------------------------------------------------------------------------------------- the run's folder
    def begin_run(self) -> None:
        """Before the first step: with several processes, refuse a placement of ``output_dir`` that cannot work
        (``trainwell.checkpoint.disks``: a collective); remove the temporary folders of an interrupted save."""
        args, runtime = self.hooks.args, self.hooks.runtime
        remote = store.of(args)  # an object store is shared by every process: no placement to probe
        if runtime.distributed and remote is None:
            placement = disks.probe(args.output_dir, args.should_save, runtime.all_gather_object)
            disks.check(placement, args, runtime.engine.every_process_writes, runtime.is_main_process,
                        one_folder=runtime.engine.one_folder)
        if args.should_save:
            if output_lock.writes(args):  # a read-only disk: named now, not at the first save
                check_writable(local_output_dir(args))
            clean_temporary(local_output_dir(args))
            if remote is not None:  # a missing bucket or refused credentials are said before the first step
                remote.check()
                remote.clean()

    def end_run(self, run_dir: str) -> None:
        """When training is done: ``save_total_limit=1`` keeps only the best checkpoint of ``run_dir`` (the newest
        was kept beside it while a resume could need it), as the reference does."""
        args, best = self.hooks.args, self.hooks.state.best_model_checkpoint
        if args.should_save and args.save_total_limit == 1 and best is not None:
            remote = store.of(args, run_dir)
            if remote is not None:
                store.keep_only(remote, os.path.basename(best))
            keep_only_best(run_dir, best)

    # ------------------------------------------------------------------------------------------- what the loop hands
    def register(self, name: str, provider: Stateful) -> None:
        """Save and restore ``provider`` as the piece ``name`` of ``CONTENTS`` (a row without a restoring method)."""
        piece = contents.PIECES.get(name)
        if piece is None or piece.restored_by is not None:
            open_rows = [p.name for p in contents.CONTENTS if p.restored_by is None and p.restored is not Phase.NEVER]
            raise ValueError(f"No provider can be registered as {name!r}: the pieces restored by a provider are "
                             f"{open_rows} (trainwell.checkpoint.contents.CONTENTS).")
        if piece.saved_by is None and piece.per_rank:
            raise ValueError(f"The row {name!r} has no saving method and is per rank: the checkpointer writes a "
                             "provider's own row from the writer processes only; save per-rank state with "
                             "saved_by='_save_rng_state' (gathered to the writers).")
        self._providers[name] = provider

    @property
    def registered(self) -> tuple[str, ...]:
        """The pieces providers were registered for, in registration order."""
        return tuple(self._providers)

    def rows(self) -> tuple[list[contents.Piece], dict[str, Stateful]]:
        """The run's table, ``CONTENTS`` then the rows its callbacks add (``trainwell.checkpoint.pieces``), and the
        providers of the rows without a restoring method: the registered ones and those callbacks."""
        added = pieces.added(getattr(self.hooks.callback_handler, "callbacks", ()))
        return [*contents.CONTENTS, *(p for p, _ in added)], {**self._providers, **dict((p.name, c) for p, c in added)}

    def use_plan(self, max_steps: int, global_batch: int,
                 position_at: Callable[[int, float | None, int | None], tuple[int, int]],
                 position_of_samples: Callable[[int, int], tuple[int, int] | None] | None = None) -> None:
        """What a resume needs of the run's step plan (``trainwell.loop.plan.StepPlan``): how long the run is, its
        global batch, and ``position_at(global_step, epoch, saved_max_steps) -> (epoch, windows of it trained)``,
        where in the data a checkpoint's step stands (``position_of_samples(epoch, samples)``: the same from the
        sample places of its epoch used, when the checkpoint recorded them)."""
        self._plan = RunPlan(max_steps, global_batch, position_at, position_of_samples)

    def provided(self, saved_by: str | None) -> list[tuple[contents.Piece, Any]]:
        """The pieces written by the Trainer method ``saved_by`` (None: by no method, the checkpointer writes them)
        that providers hold, with their states, in table order (a piece whose provider has nothing to save is left
        out). Every process calls it, in the same order: a provider may be a collective."""
        table, providers = self.rows()
        states = [(p, providers[p.name].state_dict()) for p in table if p.saved_by == saved_by and p.name in providers]
        return [(piece, state) for piece, state in states if state is not None]

    # ------------------------------------------------------------------------------------------- saving
    def save_checkpoint(self, run_dir: str) -> Path:
        """Write ``checkpoint-{global_step}`` atomically and apply ``save_total_limit``; returns its path.

        With ``save_async`` (in a ``train()`` call) the rows of ``CONTENTS`` that are not written at once (the model,
        optimizer, scheduler and scaler, and any provider's row staged so) are copied here, to host buffers or deep
        copies, and written, synced and published by the background writer; the small files (RNG states, data
        position, arguments, trainer state) are written before this returns, as in a synchronous save.
        """
        hooks = self.hooks
        args, runtime, state = hooks.args, hooks.runtime, hooks.state
        # Only inside train(), which waits for the last background save: after it returns this checkpointer is
        # still the Trainer's, and a save then must be published (or fail) before it returns.
        background = self.writer if args.save_async and hooks.is_in_train else None
        if background is not None:
            background.wait()  # the previous save is published before this one reuses the host buffers
        final = checkpoint_path(run_dir, state.global_step)
        _check_weights(hooks, final)  # NaN weights are never published: the previous checkpoint stays the newest
        atomic = AtomicDirectory(final)
        if args.should_save:
            atomic.create()
        runtime.wait_for_everyone()
        tmp = str(atomic.tmp)
        recorder = filehash.recording(tmp)  # the files this process writes are checksummed as they are written
        try:
            if background is not None:
                heavy = contents.stage_pieces(hooks, tmp, self.staging, self.provided)
            else:
                contents.write_pieces(hooks, tmp, self.provided)
                heavy = None
            # Every process: load_best_model_at_end reloads the best weights on all of them (under FSDP, together).
            _update_best_checkpoint(hooks, run_dir)
            if args.should_save:
                _write_trainer_state(hooks, tmp)
            # Also the barrier after which every rank's files are in the temporary folder.
            recorded = runtime.all_gather_object(recorder.snapshot())
        except BaseException:
            recorder.stop()
            raise
        if not args.should_save:
            recorder.stop()
        else:
            # The folder just written is protected too: after resuming from an older checkpoint, a higher-numbered
            # one left by the earlier run would otherwise count as "the newest" and this one be deleted. The one
            # resumed from is not: it rotates out as any other, as on the reference.
            protected = (state.best_model_checkpoint, final)
            remote = store.of(args, run_dir)

            def finish() -> None:
                try:
                    if heavy is not None:
                        heavy()
                    _write_manifest(tmp, [*recorded, recorder.snapshot()])
                finally:
                    recorder.stop()
                atomic.publish()
                if remote is not None:  # staged, then uploaded (manifest last); a failure keeps every staged copy
                    remote.upload(final, final.name)
                    store.rotate(remote, run_dir, args.save_total_limit, protected)
                rotate_checkpoints(run_dir, args.save_total_limit, protected=protected)

            if background is not None:
                background.submit(final.name, finish)
            else:
                finish()
        runtime.wait_for_everyone()
        return final

    def write_into(self, folder: str) -> None:
        """A complete checkpoint written straight into ``folder``, without publishing, rotation or best-model
        bookkeeping: a copy handed to another tool (Ray Tune's trial checkpoints)."""
        _check_weights(self.hooks, folder)
        os.makedirs(folder, exist_ok=True)
        with filehash.recording(folder) as recorder:
            contents.write_pieces(self.hooks, folder, self.provided)
            if self.hooks.args.should_save:
                _write_trainer_state(self.hooks, folder)
                _write_manifest(folder, [recorder.snapshot()])

    def wait(self) -> None:
        """Block until the background save in flight is published; raise its error if it failed."""
        if self.writer is not None:
            self.writer.wait()

    def finish_quietly(self) -> None:
        """Let a background save in flight reach the disk without raising (training already failed)."""
        if self.writer is not None:
            self.writer.finish_quietly()

    # ------------------------------------------------------------------------------------------- restoring
    def restore(self, phase: Phase) -> tuple[str, ...]:
        """Restore the resumed checkpoint's pieces of ``phase`` (nothing for a fresh run), as ``CONTENTS`` lists them:
        the ``restored_by`` Trainer methods of its rows, then the registered providers of its other rows.

        ``STATE`` first reads the checkpoint's ``TrainerState`` into ``trainer.state`` (checked against the plan
        handed to :meth:`use_plan`, which also says where the resumed run continues: ``resume.epoch`` and
        ``resume.windows_done``). Returns the names of the pieces handed to providers.
        """
        if self.resume is None:
            return ()
        hooks = self.hooks
        if phase is Phase.STATE:
            if self._plan is None:
                raise RuntimeError("Checkpointer.use_plan(plan) must come before the STATE phase is restored.")
            hooks.state = self.resume.read_state(hooks.args, self._plan, self._epoch_samples())
        table, providers = self.rows()
        rows = [p for p in table if p.restored is phase]
        methods = [p.restored_by for p in rows if p.restored_by and (p.restored_if is None
                                                                     or getattr(hooks.args, p.restored_if))]
        for method in dict.fromkeys(methods):
            if phase is Phase.STATE:
                getattr(hooks, method)()  # the state is trainer.state by now (the reference's signature)
            else:
                getattr(hooks, method)(self.resume.path)
        restored = []
        for piece in (p for p in rows if p.name in providers):  # rows without a method (register says so)
            state = self._saved(piece)
            if state is not None:
                providers[piece.name].load_state_dict(state)
                restored.append(piece.name)
        return tuple(restored)

    def _epoch_samples(self) -> Any:
        """Where the resumed checkpoint stood in its epoch, in samples (``"epoch_samples"``): the same in every
        process's RNG file, so a process of a run on more processes than wrote it, or a single process (which reads
        ``rng_state.pth``), reads it from process 0's file."""
        saved = self.saved_rng(self.resume.path)
        if saved is None:
            files = self.resume.files
            name = next((n for n in (contents.piece_name("rng", 0, 2), contents.piece_name("rng")) if files.has(n)),
                        None)
            saved = load_rng_file(files.path / name) if name is not None else None
        return saved.get(contents.PIECES["epoch_samples"].entry) if saved else None

    def _saved(self, piece: contents.Piece) -> Any:
        """What the resumed checkpoint holds of a provider's ``piece`` for this process (None: nothing to restore)."""
        if piece.restored is Phase.DATA and not self.resume.windows_done:  # the epoch starts over: no position in it
            if piece.entry_at_epoch_start is None:
                return None
            key = piece.entry_at_epoch_start
        else:
            key = piece.entry
        if key is not None:
            saved = self.saved_rng(self.resume.path)
            return None if saved is None else saved.get(key)
        runtime, files = self.hooks.runtime, self.resume.files
        name = contents.own_file(piece, runtime)
        if piece.name not in contents.PIECES and not _added_piece_is_there(piece, runtime, files):  # a callback's
            return None
        if not files.has(name):
            if piece.name in _WITHOUT:
                logger.warning("%s has no %s: %s.", files.path, name, _WITHOUT[piece.name])
            return None
        data = files.read(name)  # read once, through the folder's descriptor, checked against the manifest
        if piece.read is not None:
            return piece.read(files.path / name, data)
        return safe_torch_load(files.path / name, data=data)

    def saved_rng(self, checkpoint: str) -> dict[str, Any] | None:
        """This process's saved RNG states in ``checkpoint`` (None without its file). The resumed checkpoint's file
        is read once, whoever asks (the loader's seed, the pending batch, ``_load_rng_state``, the log window)."""
        resumed = self.resume is not None and os.fspath(checkpoint) == self.resume.path
        if resumed and self._rng_read:
            return self._rng
        runtime = self.hooks.runtime
        name = contents.piece_name("rng", runtime.process_index, runtime.num_processes)
        path = Path(checkpoint) / name
        if resumed:  # read once through the checkpoint's descriptor, checked against its manifest
            files = self.resume.files
            saved = load_rng_file(path, files.read(name)) if files.has(name) or name in files.others else None
        else:
            saved = load_rng_file(path) if os.path.lexists(path) else None  # a link is named by the reader
        if resumed:
            self._rng, self._rng_read = saved, True
        return saved

    def files(self, checkpoint: str | os.PathLike) -> CheckpointFiles:
        """``checkpoint``'s files, listed once: the resumed checkpoint's as found (parsed once, whoever asks), any
        other listed now (``load_best_model_at_end``'s best checkpoint)."""
        if self.resume is not None and os.fspath(checkpoint) == self.resume.path:
            return self.resume.files
        remote = store.of(self.hooks.args, os.path.dirname(os.fspath(checkpoint)))
        if remote is not None and not os.path.isdir(checkpoint):  # the best one, resumed on another machine
            remote.fetch(os.path.basename(checkpoint), Path(checkpoint), store.wanted_by(
                self.hooks.runtime.process_index))
        return CheckpointFiles(checkpoint)


def _added_piece_is_there(piece: contents.Piece, runtime: Any, files: CheckpointFiles) -> bool:
    """Whether the checkpoint holds a callback's ``piece`` in the form this run reads (one file, or one per process
    where :func:`contents.writes_own`): False, with a warning, when it holds none (it starts afresh); ValueError in
    another form (written by another number of processes, or under another engine), the same on every process."""
    forms = pieces.written_forms(piece, files.sizes)
    if not forms:
        logger.warning("%s has no %s: the checkpoint piece %r starts afresh (the checkpoint was written without the "
                       "callback that adds it).", files.path, piece.file, piece.name)
        return False
    n = runtime.num_processes
    wanted = sorted({per_rank_name(piece.file, rank, n) for rank in range(n)}
                    if contents.writes_own(piece, runtime) else {piece.file})
    if forms != wanted:
        raise ValueError(f"{files.path} holds the checkpoint piece {piece.name!r} as {', '.join(forms)}, and this run "
                         f"reads {', '.join(wanted)}: it was written by another number of processes or under another "
                         "engine, and a sharded piece is read back by as many processes as wrote it. Resume on as "
                         "many processes with the same engine (or without the callback that adds the piece).")
    return True


def _check_weights(hooks: Owner, checkpoint: Any) -> None:
    runtime = hooks.runtime
    gather = runtime.all_gather_object if runtime.distributed else None
    check_finite_weights(hooks.model, str(checkpoint), gather, runtime.process_index)


def _write_trainer_state(hooks: Owner, folder: str) -> None:
    """``trainer_state.json``, with the callbacks' states as they are now (written last: it marks the folder done)."""
    hooks.state.record_callback_states(hooks.callback_handler.callbacks + [hooks.control])
    with writing(os.path.join(folder, TRAINER_STATE_NAME)):
        hooks.state.save_to_json(os.path.join(folder, TRAINER_STATE_NAME))


def _write_manifest(folder: str, recorded: list[dict[str, Any]]) -> None:
    with writing(os.path.join(folder, manifest.MANIFEST_NAME)):
        manifest.write(folder, manifest.build(folder, recorded))


def _update_best_checkpoint(hooks: Owner, run_dir: str) -> None:
    """Point ``best_model_checkpoint`` at the checkpoint of the best step, once that step has one."""
    state = hooks.state
    if state.best_global_step is None:
        return
    best = checkpoint_path(run_dir, state.best_global_step)
    if state.best_global_step == state.global_step or best.is_dir():
        state.best_model_checkpoint = str(best)
