"""Resuming a run: which checkpoint, whether it can be resumed, and the state it was written in.

Owns :class:`Resume`, the one value that carries "which checkpoint is being resumed" through a
``train(resume_from_checkpoint=...)`` call: it is found (``True``: the newest complete checkpoint of
``output_dir``) and validated once per call, agreed on by every process (``trainwell.checkpoint.agreement``), and
keeps the checkpoint's files as listed and parsed then (``trainwell.checkpoint.io.CheckpointFiles``: no file is
parsed twice), from which it reads the checkpoint's ``TrainerState`` (:meth:`Resume.read_state`), checked against
this run's plan. Restoring the checkpoint's pieces, phase by phase, is the run's checkpointer's
(``trainwell.checkpoint.checkpointer.Checkpointer``, which holds this object); where in the data a step stands is
the loop's plan's (``StepPlan.position_at``).

Also here: the checks that say why a folder cannot be resumed (:func:`unusable_reason`: cheap, no tensor read, no
pickle opened, nothing but regular files opened), how it differs from its manifest (:func:`manifest_problem`, a
trainwell checkpoint without one included), and :func:`get_last_checkpoint`, the newest complete checkpoint.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwell.args.storage import is_url, local_output_dir
from trainwell.checkpoint import agreement, fetch, manifest, store
from trainwell.checkpoint.contents import CONTENTS
from trainwell.checkpoint.io import CheckpointFiles, index_shards
from trainwell.checkpoint.layout import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    LEGACY_WEIGHTS_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    checkpoint_step,
    checkpoints,
)
from trainwell.state import TrainerState, state_problems, unknown_fields
from trainwell.utils.safe_files import UnsafeFileError, open_regular

if TYPE_CHECKING:
    from trainwell.checkpoint.contents import Owner

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """What a resume needs of the run's step plan, handed to the checkpointer by the loop (this layer sits below it)."""

    max_steps: int  #: optimizer steps this run trains to
    global_batch: int  #: samples per optimizer step, over all processes
    #: ``(global_step, epoch, saved_max_steps) -> (epoch, windows of it already trained)``: where in the data a
    #: checkpoint's step stands (``trainwell.loop.plan.StepPlan.position_at``)
    position_at: Callable[[int, float | None, int | None], tuple[int, int]]
    #: ``(epoch, samples) -> (epoch, windows of it already trained)`` (None: not on a window of this run) for a
    #: checkpoint that recorded the sample places of its epoch used (``StepPlan.position_of_samples``)
    position_of_samples: Callable[[int, int], tuple[int, int] | None] | None = None


@dataclass
class Resume:
    """Resuming one ``train()`` call from the checkpoint at ``path`` (its files as found: ``files``).

    ``epoch`` and ``windows_done`` (the epoch the checkpoint was written in, and the accumulation windows of it
    already trained: where the resumed run continues) are known once :meth:`read_state` has read the checkpoint's
    ``TrainerState``.
    """

    path: str
    files: CheckpointFiles = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    epoch: int = 0
    windows_done: int = 0
    #: the object store the checkpoint came from (``trainwell.checkpoint.store``), None for a local ``output_dir``
    remote: Any = field(default=None, repr=False, compare=False)
    rollback: dict[str, Any] | None = None  #: rollback_on_spike chose this checkpoint: the log_history record of why

    def __post_init__(self) -> None:
        if self.files is None:
            self.files = CheckpointFiles(self.path)

    @classmethod
    def of(cls, hooks: Owner, resume_from_checkpoint: str | bool | None) -> Resume | None:
        """:meth:`find` for a Trainer: its ``output_dir`` and checksum setting, agreed on by all its processes.

        With an object-store ``output_dir`` (``trainwell.checkpoint.store``), ``True`` looks at the checkpoints of
        the store (complete: their manifests are there), newest first, each fetched into the staging folder just
        before it is checked; a checkpoint URL is fetched, then resumed from its staged copy."""
        args, runtime = hooks.args, hooks.runtime
        gather = runtime.all_gather_object if runtime.distributed else None
        remote, run_dir = store.of(args), local_output_dir(args)
        candidates = None
        if is_url(resume_from_checkpoint):
            resume_from_checkpoint = store.fetch_url(resume_from_checkpoint, args, runtime.process_index)
        elif remote is not None and resume_from_checkpoint is True:
            remote.check()
            if not remote.complete():  # the same answer on every process: all raise it
                raise ValueError(f"resume_from_checkpoint=True but {remote.url} holds no complete checkpoint (a "
                                 "checkpoint-N folder with its manifest). Pass a checkpoint, or train from scratch.")
            candidates = lambda: store.candidates(remote, run_dir, runtime.process_index)  # noqa: E731
        if gather is not None and remote is None:  # disks local to each node: those lacking process zero's receive it
            fetch.fetch_missing(resume_from_checkpoint not in (None, False),
                                lambda: _fetch_target(resume_from_checkpoint, args.output_dir),
                                lambda path: _fetched_to(resume_from_checkpoint, args.output_dir, path), gather)
        resume = cls.find(resume_from_checkpoint, run_dir, args.verify_checkpoint_checksums, gather, candidates)
        if resume is not None:
            resume.remote = remote
        return resume

    @classmethod
    def find(cls, resume_from_checkpoint: str | bool | None, output_dir: str, checksums: bool = True,
             gather: Callable[[Any], list[Any]] | None = None,
             candidates: Callable[[], Iterable[tuple[int, Path]]] | None = None) -> Resume | None:
        """The resume of ``train(resume_from_checkpoint=...)``: None to train from scratch.

        ``gather`` (a multi-process run's all-gather) makes it a collective: every process looks on its own disk,
        and all resume the same step or all raise the same error (``trainwell.checkpoint.agreement``).

        ``True`` picks the newest complete checkpoint of ``output_dir`` whose files match its manifest
        (incomplete or damaged ones are skipped with a warning naming the file), else the newest one that can be
        resumed at all. A checkpoint that lacks training-state pieces (the optimizer, the scheduler, the RNG
        states) resumes with a warning saying what will not be exact; a named checkpoint without usable weights
        or state, or whose files differ from its manifest (or that lost the manifest trainwell wrote), raises
        ValueError naming the problem. ``checksums`` False compares only the sizes of the files with the manifest
        (no file is read), and resumes a checkpoint without its manifest with a warning. ``candidates``: where
        ``True`` looks, ``(step, folder)`` newest first (default: ``output_dir``'s checkpoints).
        """
        asked = resume_from_checkpoint is not None and resume_from_checkpoint is not False
        if gather is not None:  # even when this process does not resume: another may, and must not wait alone
            found, common = agreement.agree(asked, lambda: cls.find(resume_from_checkpoint, output_dir, checksums, None,
                                                                      candidates),
                                            lambda path: _resumable_problem(CheckpointFiles(path, checksums),
                                                                            checksums, checkpoint_step(path)), gather)
            return cls(common, CheckpointFiles(common, checksums)) if common is not None else found
        if not asked:
            return None
        if resume_from_checkpoint is True:
            found = newest_resumable(output_dir, checksums,
                                     found=candidates() if candidates is not None else None)
            if found is None:
                raise ValueError(
                    f"resume_from_checkpoint=True but no complete checkpoint was found in output_dir ({output_dir}). "
                    "Pass a checkpoint path, or train from scratch."
                )
            files = found
        else:
            files = CheckpointFiles(str(resume_from_checkpoint), checksums)
            reason = "it is not a folder" if not files.path.is_dir() else _resumable_problem(
                files, checksums, checkpoint_step(files.path))
            if reason is not None:
                raise ValueError(f"Can't resume from {files.path}: {reason}.")
        _warn_uncovered(files, checksums)
        missing = _missing_training_state(files)
        if missing is not None:
            warn_partial(files.path, missing)
        return cls(str(files.path), files)

    @property
    def saved_state(self) -> dict[str, Any]:
        """The checkpoint's ``trainer_state.json``, as parsed when it was found (validated then)."""
        return self.files.json(TRAINER_STATE_NAME)

    def read_state(self, args: Any, plan: RunPlan, samples: Any = None) -> TrainerState:
        """The checkpoint's ``TrainerState`` (a fresh copy each call); sets ``epoch`` and ``windows_done``.

        The step count carries over as it is (a checkpoint past this run's ``max_steps`` is a ValueError naming
        the fix). The data position is where the checkpoint stood in its epoch, in samples (``samples``: its
        ``{"epoch", "samples"}`` record), when that ends on a window of this run: exact whatever global batch
        either run takes (8 processes -> 4 -> 2). Otherwise (an older checkpoint, data without a length, a
        position inside one of this run's windows) it is ``global_step`` windows of *this* run's global batch;
        when the checkpoint's run took another one, a warning says the rest of the epoch will not see exactly the
        same samples.
        """
        data = self.saved_state
        unknown = unknown_fields(data)
        if unknown:
            logger.warning("Ignoring unknown fields %s in %s", unknown, self.files.path / TRAINER_STATE_NAME)
        state = TrainerState.from_dict(copy.deepcopy(data))  # a retried attempt must not see this one's appends
        if state.global_step > plan.max_steps:
            raise ValueError(
                f"Can't resume from {self.path}: it is at step {state.global_step}, past this run's {plan.max_steps} "
                f"steps. To train further, pass max_steps (or num_train_epochs) beyond {state.global_step}; to end "
                "earlier, resume from an earlier checkpoint."
            )
        best = state.best_model_checkpoint
        if best is not None and self.remote is not None:  # the store's: staged here, or fetched when loaded
            mapped = os.path.join(os.path.dirname(self.path), os.path.basename(best))
            if os.path.isdir(mapped) or self.remote.has(os.path.basename(best)):
                state.best_model_checkpoint = best = mapped
        if best is not None and not os.path.isdir(best) and not (self.remote is not None
                                                                 and self.remote.has(os.path.basename(best))):
            logger.warning("The best checkpoint %s recorded in the resumed state no longer exists.", best)
            state.best_model_checkpoint = None
        warn_changed_arguments(self.path, state, args, plan.max_steps, self.files.json_or_none(TRAINING_ARGS_NAME))
        at = _sample_position(samples, plan)
        self.epoch, windows = at or plan.position_at(state.global_step, state.epoch, state.max_steps)
        self.windows_done = 0 if args.ignore_data_skip else windows
        before = checkpoint_global_batch(self.files, state)
        if at is None and before is not None and before != plan.global_batch and not args.ignore_data_skip:
            logger.warning(
                "%s was trained with %d samples per optimizer step; this run takes %d. Training continues at step "
                "%d, with the data position computed from this run's batch, so the rest of the epoch will not see "
                "exactly the samples the interrupted run would have. To continue exactly, keep "
                "per_device_train_batch_size x gradient_accumulation_steps x processes at %d.",
                self.path, before, plan.global_batch, state.global_step, before,
            )  # fmt: skip
        return state


def _fetch_target(resume_from_checkpoint: str | bool, output_dir: str) -> str | None:
    """The checkpoint this process would resume, for the processes that lack it (its newest by the size checks: the
    search that follows checks the checksums and says what it passes over)."""
    if resume_from_checkpoint is True:
        found = newest_resumable(output_dir, checksums=False, quiet=True)
        return str(found.path) if found is not None else None
    return str(resume_from_checkpoint) if os.path.isdir(resume_from_checkpoint) else None


def _fetched_to(resume_from_checkpoint: str | bool, output_dir: str, path: str) -> str:
    """Where this process keeps process zero's checkpoint ``path``: the same name in its own ``output_dir`` when the
    newest is resumed, the same path when one is named."""
    return os.path.join(output_dir, os.path.basename(path)) if resume_from_checkpoint is True else path


def _sample_position(samples: Any, plan: RunPlan) -> tuple[int, int] | None:
    """(epoch, windows) from a checkpoint's ``{"epoch", "samples"}`` record, when it is one and lands on a window."""
    if plan.position_of_samples is None or not isinstance(samples, dict):
        return None
    epoch, used = samples.get("epoch"), samples.get("samples")
    if not (type(epoch) is int and type(used) is int and epoch >= 0 and used >= 0):
        return None  # not a record trainwell wrote: the step count says where the data stands
    return plan.position_of_samples(epoch, used)


def warn_changed_arguments(path: str, saved: TrainerState, args: Any, max_steps: int,
                           saved_args: dict[str, Any] | None = None) -> None:
    """Warn once, naming each one, about the step intervals, batch size and learning-rate schedule values that
    differ from the checkpoint's run (``trainwell.optim.schedule_change``: warmup, total steps, the learning rate
    from the next step on), before and after.

    This run's values apply (as in the reference, whose warning says the opposite but whose loop does this).
    ``saved_args``: the checkpoint's ``training_args.json``, as parsed when it was found (None: unknown).
    """
    from trainwell.optim.schedule_change import schedule_changes, schedule_of

    current = TrainerState()
    current.compute_steps(args, max_steps)
    pairs = {f"{kind}_steps": (getattr(saved, f"{kind}_steps"), getattr(current, f"{kind}_steps"))
             for kind in ("logging", "eval", "save")}
    pairs["per_device_train_batch_size"] = (saved.train_batch_size, args.per_device_train_batch_size)
    changed = [f"{name}: {old} -> {new}" for name, (old, new) in pairs.items() if old is not None and old != new]
    saved_args = saved_args if isinstance(saved_args, dict) else {}
    schedule = schedule_changes(schedule_of(saved_args, saved.max_steps) if saved_args else None,
                                schedule_of(args, max_steps), saved.global_step)
    if schedule:
        changed.append(f"the learning-rate schedule (max_steps {saved.max_steps} -> {max_steps}): "
                       + "; ".join(schedule) + f". To keep the checkpoint's schedule, resume with max_steps="
                       f"{saved.max_steps} and its warmup_steps, lr_scheduler_type and lr_scheduler_kwargs")
    if changed:
        logger.warning("Resuming from %s with arguments that differ from its run (this run's apply): %s.",
                       path, "; ".join(changed))


def checkpoint_global_batch(files: CheckpointFiles, state: TrainerState) -> int | None:
    """Samples per optimizer step of the run that wrote the checkpoint (None when unknown): the per-device batch
    from its state, the accumulation from its arguments, the processes from its RNG files."""
    saved_args = files.json_or_none(TRAINING_ARGS_NAME)
    listed = _manifest_records(files)  # a checkpoint fetched from a store holds this process's RNG file only
    names = listed if isinstance(listed, dict) else files.sizes
    ranks = [name for name in names if name.startswith("rng_state_") and name.endswith(".pth")]
    world = len(ranks) or int(files.has("rng_state.pth"))
    ga = saved_args.get("gradient_accumulation_steps") if isinstance(saved_args, dict) else None
    if not (state.train_batch_size and isinstance(ga, int) and world):
        return None
    return state.train_batch_size * ga * world


# ----------------------------------------------------------------------------------------------- validation
def incomplete_reason(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a complete checkpoint, or ``None`` when it looks complete.

    :func:`unusable_reason`'s checks, then: when ``training_args.json`` says the checkpoint was not
    ``save_only_model``, the required training-state pieces of ``trainwell.checkpoint.contents.CONTENTS`` must be
    there too.
    """
    files = CheckpointFiles(path)
    return _unusable(files, checkpoint_step(path)) or _missing_training_state(files)


def unusable_reason(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be resumed from at all, or ``None``.

    Cheap checks only (no tensor is read, no pickle is opened): every entry of the folder is a regular file or a
    folder (a link, a FIFO or a device is named: nothing reads it), the trainer state parses as a JSON object,
    some model weights exist, every safetensors file is as long as its header says, every ``.pt``/``.pth`` file
    (optimizer, scheduler, RNG states) is a whole zip archive (a truncated one has no end record), and every file
    the checkpoint's manifest lists exists with its recorded size. A checkpoint that passes but lacks
    training-state pieces resumes with a warning saying what is not exact.
    """
    return _unusable(CheckpointFiles(path), checkpoint_step(path))


def _unusable(files: CheckpointFiles, step: int | None) -> str | None:
    if files.others:
        name, kind = sorted(files.others.items())[0]
        return (f"{name} is {kind}, not a regular file: a checkpoint holds regular files and folders only (a link "
                "may point anywhere, a FIFO or a device never ends); replace it with the file itself")
    problem = _state_problem(files, step)
    if problem is not None:
        return problem
    weights = [WEIGHTS_NAME, WEIGHTS_INDEX_NAME, LEGACY_WEIGHTS_NAME]
    weights += [p.file for p in CONTENTS if "model" in p.replaces]  # the sharded forms
    if not (any(files.has(w) for w in weights) or _adapter_files(files)):
        return "no model weights file"
    for name in sorted(n for n in files.sizes if n.endswith(".safetensors")):
        problem = _safetensors_problem(files, name)
        if problem is not None:
            return problem
    pickled = [n for n in files.sizes if n.endswith((".pt", ".pth", ".bin")) and "/" not in n]
    for name in sorted({*pickled, *(n for n in _adapter_files(files) if n.endswith(".bin"))}):
        with open_regular(files.path / name, files.path) as fh:
            if not zipfile.is_zipfile(fh):
                return f"{name} is truncated or not a torch file"
    return _manifest_problem(files, checksums=False)  # sizes only: nothing is read


def _state_problem(files: CheckpointFiles, step: int | None) -> str | None:
    if not files.has(TRAINER_STATE_NAME):
        return f"{TRAINER_STATE_NAME} is missing"
    try:
        state = files.json(TRAINER_STATE_NAME)
    except (OSError, ValueError) as err:
        return str(err).replace(f"{files.path / TRAINER_STATE_NAME}", TRAINER_STATE_NAME)
    if not isinstance(state, dict):
        return f"{TRAINER_STATE_NAME} is not a JSON object"
    problems = state_problems(state)
    if problems:
        return f"{TRAINER_STATE_NAME} is damaged: {problems[0]}"
    if step is not None and "global_step" in state and state["global_step"] != step:
        return (f"{TRAINER_STATE_NAME} says global_step={state['global_step']}, but the folder is the checkpoint of "
                f"step {step} (an edited or copied state)")
    return None


def _adapter_files(files: CheckpointFiles) -> list[str]:
    """A PEFT model's adapter weights (the folder's own, and one subfolder deep for other adapters)."""
    names = (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME)
    return sorted(n for n in files.sizes if n.rsplit("/", 1)[-1] in names and n.count("/") <= 1)


def manifest_problem(path: str | os.PathLike, checksums: bool = True) -> str | None:
    """How checkpoint ``path`` differs from its manifest (``trainwell.checkpoint.manifest``), or None.

    A training-state piece that is gone entirely (``optimizer.pt`` deleted to restart the optimizer) is not a
    difference: the completeness checks warn about it (:func:`warn_partial`); a piece that is there must match.
    Weights stored again in another complete form (``model.safetensors`` re-sharded with an index) are not either:
    resuming them warns that the manifest no longer covers them.
    """
    return _manifest_problem(CheckpointFiles(path), checksums)


def _manifest_problem(files: CheckpointFiles, checksums: bool) -> str | None:
    records = _manifest_records(files)
    if isinstance(records, str):
        return records
    return manifest.problem(files.path, checksums, lambda name: _may_be_missing(files, name), records)


def _manifest_records(files: CheckpointFiles) -> dict[str, Any] | str | None:
    """The manifest's records (its JSON parsed once, with the folder's other files), None without one, or what is
    wrong with it."""
    if manifest.MANIFEST_NAME in files.others:
        return f"{manifest.MANIFEST_NAME} is {files.others[manifest.MANIFEST_NAME]}, not a regular file"
    if not files.has(manifest.MANIFEST_NAME):
        return None
    try:
        return manifest.records_of(files.json(manifest.MANIFEST_NAME))
    except (OSError, ValueError) as err:
        shown = str(err).replace(f"{files.path / manifest.MANIFEST_NAME} ", "", 1)
        return f"{manifest.MANIFEST_NAME} is damaged ({shown})"


def _resumable_problem(files: CheckpointFiles, checksums: bool, step: int | None) -> str | None:
    """Why checkpoint ``step`` cannot be resumed: :func:`_unusable`, its files against its manifest (checksums too
    when ``checksums``), and a manifest gone from a checkpoint trainwell wrote (when ``checksums``: else a
    warning)."""
    problem = _unusable(files, step) or (_manifest_problem(files, True) if checksums else None)
    if problem is None and _lost_manifest(files):
        if checksums:
            return (f"{manifest.MANIFEST_NAME} is missing, though every checkpoint trainwell writes holds one (this one"
                    f" has trainwell's {TRAINING_ARGS_NAME}): without it a changed file cannot be told. Resume from "
                    "another checkpoint, or pass verify_checkpoint_checksums=False to resume it unchecked")
        logger.warning("%s has no %s (verify_checkpoint_checksums=False): its files are resumed unchecked.",
                       files.path, manifest.MANIFEST_NAME)
    return problem


def _lost_manifest(files: CheckpointFiles) -> bool:
    """A checkpoint written by trainwell (its ``training_args.json``: the reference writes ``training_args.bin``)
    whose manifest is gone."""
    return files.has(TRAINING_ARGS_NAME) and not files.has(manifest.MANIFEST_NAME)


def _may_be_missing(files: CheckpointFiles, name: str) -> bool:
    return _optional_piece(files, name) or (_is_weights(name) and _weights_form(files) is not None)


def _is_weights(name: str) -> bool:
    return name in (WEIGHTS_NAME, WEIGHTS_INDEX_NAME, LEGACY_WEIGHTS_NAME) or (
        name.startswith("model-") and name.endswith(".safetensors") and "/" not in name)


def _weights_form(files: CheckpointFiles) -> str | None:
    """The complete, loadable full weights the folder holds (``read_model_weights``'s forms), named; None."""
    if files.has(WEIGHTS_NAME):
        return WEIGHTS_NAME
    if files.has(WEIGHTS_INDEX_NAME):
        try:
            shards = index_shards(files.json(WEIGHTS_INDEX_NAME), WEIGHTS_INDEX_NAME)
        except (OSError, ValueError):
            return None
        if all(files.has(shard) for shard in shards):
            return f"{WEIGHTS_INDEX_NAME} and its {len(shards)} shard{'s' * (len(shards) != 1)}"
        return None
    return LEGACY_WEIGHTS_NAME if files.has(LEGACY_WEIGHTS_NAME) else None


def _warn_uncovered(files: CheckpointFiles, checksums: bool) -> None:
    """The weights the manifest lists were replaced by weights in another form: say they are not checked."""
    listed = _manifest_records(files)
    if not isinstance(listed, dict):
        return
    gone = sorted(name for name in listed if _is_weights(name) and not files.has(name))
    form = _weights_form(files)
    if gone and form is not None:
        logger.warning("%s: the manifest lists %s, now replaced by %s: the weights are loaded, but the manifest no "
                       "longer covers them (their checksums%s are not checked).", files.path, ", ".join(gone), form,
                       "" if checksums else " and sizes")


def _optional_piece(files: CheckpointFiles, name: str) -> bool:
    top = name.split("/", 1)[0]
    if files.has(top) or any(n.startswith(f"{top}/") for n in files.sizes):
        return False
    for piece in CONTENTS:
        if piece.training_state and not {"model"} & set(piece.replaces):
            entry = piece.file.split("/", 1)[0]
            stem, _, suffix = entry.rpartition(".")
            if top == entry or (piece.per_rank and top.startswith(f"{stem}_") and top.endswith(f".{suffix}")):
                return True
    return False


def warn_partial(path: str | os.PathLike, missing: str) -> None:
    """Resuming from a checkpoint without some of its training state: say what will not be exact."""
    effects = {"optimizer": "the optimizer starts with fresh moments", "scheduler": "the learning-rate schedule "
               "restarts from its first step", "rng": "random draws (dropout, a random collator) differ from the "
               "uninterrupted run's", "scaler": "the fp16 loss scale restarts"}
    said = [text for key, text in effects.items() if key in missing] or ["training will not continue exactly"]
    logger.warning("Resuming from %s although %s: %s. The weights, step, epoch and data position are restored.",
                   path, missing, "; ".join(said))


def _missing_training_state(files: CheckpointFiles) -> str | None:
    """The required training-state pieces missing from a checkpoint whose arguments say it should have them."""
    saved_args = files.json_or_none(TRAINING_ARGS_NAME)  # None: the reference's (training_args.bin) or by hand
    if not isinstance(saved_args, dict) or saved_args.get("save_only_model"):
        return None
    missing = []
    for piece in CONTENTS:
        if not (piece.training_state and piece.required):
            continue
        forms = [piece] + [p for p in CONTENTS if piece.name in p.replaces]  # e.g. optimizer.pt or optimizer_0/
        if not any(_present(files, form) for form in forms):
            missing.append(" or ".join(form.file for form in forms) + " is missing")
    return "; ".join(missing) or None


def _present(files: CheckpointFiles, piece: Any) -> bool:
    if files.has(piece.file):
        return True
    stem, _, suffix = piece.file.rpartition(".")  # rng_state_0.pth, rng_state_1.pth, ... with several processes
    return piece.per_rank and any(n.startswith(f"{stem}_") and n.endswith(f".{suffix}") for n in files.sizes)


def _safetensors_problem(files: CheckpointFiles, name: str) -> str | None:
    """Check the safetensors header and that the file is as long as the header says."""
    size = files.sizes[name]
    try:
        with open_regular(files.path / name, files.path) as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            if header_len <= 0 or 8 + header_len > size:
                return f"{name} is truncated"
            header = json.loads(fh.read(header_len))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, UnsafeFileError, RecursionError, TypeError, KeyError, IndexError,
            AttributeError) as err:
        return f"{name} is unreadable ({type(err).__name__}: {err})"
    if not all(isinstance(end, int) for end in ends):
        return f"{name} is unreadable (its header's offsets are not numbers)"
    if 8 + header_len + max(ends, default=0) > size:
        return f"{name} is truncated"
    return None


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """The newest *complete* checkpoint in ``folder``; incomplete ones are skipped with a warning naming them.

    ``folder`` may be an object-store URL (credentials from the environment): the URL of its newest checkpoint
    whose manifest is there, for ``train(resume_from_checkpoint=...)``, which fetches and validates it."""
    if is_url(folder):
        remote = store.open_url(str(folder))
        remote.check()
        done = remote.complete()
        return remote.where(done[-1][1]) if done else None
    for step, path in reversed(checkpoints(folder)):
        files = CheckpointFiles(path)
        reason = _unusable(files, step) or _missing_training_state(files)
        if reason is None:
            return str(path)
        logger.warning("Skipping incomplete checkpoint %s: %s", path, reason)
    return None


def newest_resumable(folder: str | os.PathLike, checksums: bool = True, quiet: bool = False,
                     found: Iterable[tuple[int, Path]] | None = None) -> CheckpointFiles | None:
    """The checkpoint ``resume_from_checkpoint=True`` resumes (its files, listed and parsed once): the newest
    complete one whose files match its manifest, else the newest usable one (partial: some training state
    missing). Each checkpoint passed over is named in a warning with the reason (unless ``quiet``). ``found``: the
    ``(step, folder)`` to look at, newest first (default: ``folder``'s checkpoints)."""
    fallback = None
    warn = logger.debug if quiet else logger.warning
    for step, path in (reversed(checkpoints(folder)) if found is None else found):
        files = CheckpointFiles(path, checksums)
        reason = _resumable_problem(files, checksums, step)
        if reason is not None:
            warn("Skipping damaged checkpoint %s: %s", path, reason)
            continue
        missing = _missing_training_state(files)
        if missing is None:
            return files
        warn("Skipping incomplete checkpoint %s: %s", path, missing)
        fallback = fallback or files
    return fallback


def last_usable_checkpoint(folder: str | os.PathLike) -> str | None:
    """The newest checkpoint that can be resumed at all (weights and state intact), complete or not."""
    for step, path in reversed(checkpoints(folder)):
        if _unusable(CheckpointFiles(path), step) is None:
            return str(path)
    return None
