"""Resuming a run: which checkpoint, whether it is complete, and the state it was written in.

Owns :class:`Resume`, the one value that carries "which checkpoint is being resumed" through a
``train(resume_from_checkpoint=...)`` call: it is found (``True``: the newest complete checkpoint of
``output_dir``) and validated once, agreed on by every process, and reads the checkpoint's ``TrainerState``
(:meth:`Resume.read_state`), checked against this run's plan. Restoring the checkpoint's pieces, phase by phase,
is the run's checkpointer's (``trainwell.checkpoint.checkpointer.Checkpointer``, which holds this object); where
in the data a step stands is the loop's plan's (``StepPlan.position_at``), handed over in a :class:`RunPlan`.

Also here: :func:`incomplete_reason`, the cheap check that a folder is a loadable checkpoint (no tensor is
read, no pickle opened), and :func:`get_last_checkpoint`, the newest complete checkpoint of a folder.
"""

from __future__ import annotations

import json
import logging
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainwell.checkpoint import manifest
from trainwell.checkpoint.adapters import adapter_weight_files
from trainwell.checkpoint.contents import CONTENTS
from trainwell.checkpoint.layout import (
    LEGACY_WEIGHTS_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    checkpoint_step,
    list_checkpoints,
)
from trainwell.state import TrainerState, state_problems

if TYPE_CHECKING:
    from trainwell.hooks import TrainerHooks

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """What a resume needs of the run's step plan, handed over by the loop (this layer sits below it)."""

    max_steps: int  #: optimizer steps this run trains to
    global_batch: int  #: samples per optimizer step, over all processes
    #: ``(global_step, epoch, saved_max_steps) -> (epoch, windows of it already trained)``: where in the data a
    #: checkpoint's step stands (``trainwell.loop.plan.StepPlan.position_at``)
    position_at: Callable[[int, float | None, int | None], tuple[int, int]]


@dataclass
class Resume:
    """Resuming one ``train()`` call from the checkpoint at ``path``.

    ``epoch`` and ``windows_done`` (the epoch the checkpoint was written in, and the accumulation windows of it
    already trained: where the resumed run continues) are known once :meth:`read_state` has read the checkpoint's
    ``TrainerState``.
    """

    path: str
    epoch: int = 0
    windows_done: int = 0

    @classmethod
    def of(cls, hooks: TrainerHooks, resume_from_checkpoint: str | bool | None) -> Resume | None:
        """:meth:`find` for a Trainer: its ``output_dir`` and checksum setting, agreed on by all its processes."""
        args, runtime = hooks.args, hooks.runtime
        gather = runtime.all_gather_object if runtime.distributed else None
        return cls.find(resume_from_checkpoint, args.output_dir, args.verify_checkpoint_checksums, gather)

    @classmethod
    def find(cls, resume_from_checkpoint: str | bool | None, output_dir: str, checksums: bool = True,
             gather: Callable[[Any], list[Any]] | None = None) -> Resume | None:
        """The resume of ``train(resume_from_checkpoint=...)``: None to train from scratch.

        ``gather`` (a multi-process run's all-gather) makes it a collective: every process looks on its own disk,
        and all resume the same step or all raise the same error (:func:`_agree`).

        ``True`` picks the newest complete checkpoint of ``output_dir`` whose files match its manifest
        (incomplete or damaged ones are skipped with a warning naming the file), else the newest one that can be
        resumed at all. A checkpoint that lacks training-state pieces (the optimizer, the scheduler, the RNG
        states) resumes with a warning saying what will not be exact; a named checkpoint without usable weights
        or state, or whose files differ from its manifest, raises ValueError naming the problem. ``checksums``
        False compares only the sizes of the files with the manifest (no file is read).
        """
        if gather is not None:  # even when this process does not resume: another may, and must not wait alone
            return _agree(cls, resume_from_checkpoint, output_dir, checksums, gather)
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return None
        if resume_from_checkpoint is True:
            path = newest_resumable(output_dir, checksums)
            if path is None:
                raise ValueError(
                    f"resume_from_checkpoint=True but no complete checkpoint was found in output_dir ({output_dir}). "
                    "Pass a checkpoint path, or train from scratch."
                )
        else:
            path = str(resume_from_checkpoint)
            reason = unusable_reason(path) if os.path.isdir(path) else "it is not a folder"
            if reason is None and checksums:
                reason = manifest_problem(path)
            if reason is not None:
                raise ValueError(f"Can't resume from {path}: {reason}.")
        missing = _missing_training_state(Path(path))
        if missing is not None:
            warn_partial(path, missing)
        return cls(path)

    def read_state(self, args: Any, plan: RunPlan) -> TrainerState:
        """The checkpoint's ``TrainerState``; sets ``epoch`` and ``windows_done`` (``plan.position_at``).

        The step count carries over as it is (a checkpoint past this run's ``max_steps`` is a ValueError naming
        the fix). The data position is ``global_step`` windows of *this* run's global batch; when the checkpoint's
        run took another one, a warning says the rest of the epoch will not see exactly the same samples.
        """
        state = TrainerState.load_from_json(os.path.join(self.path, TRAINER_STATE_NAME))
        if state.global_step > plan.max_steps:
            raise ValueError(
                f"Can't resume from {self.path}: it is at step {state.global_step}, past this run's {plan.max_steps} "
                f"steps. To train further, pass max_steps (or num_train_epochs) beyond {state.global_step}; to end "
                "earlier, resume from an earlier checkpoint."
            )
        best = state.best_model_checkpoint
        if best is not None and not os.path.isdir(best):
            logger.warning("The best checkpoint %s recorded in the resumed state no longer exists.", best)
            state.best_model_checkpoint = None
        warn_changed_arguments(self.path, state, args, plan.max_steps)
        self.epoch, windows = plan.position_at(state.global_step, state.epoch, state.max_steps)
        self.windows_done = 0 if args.ignore_data_skip else windows
        before = checkpoint_global_batch(self.path, state)
        if before is not None and before != plan.global_batch and not args.ignore_data_skip:
            logger.warning(
                "%s was trained with %d samples per optimizer step; this run takes %d. Training continues at step "
                "%d, with the data position computed from this run's batch, so the rest of the epoch will not see "
                "exactly the samples the interrupted run would have. To continue exactly, keep "
                "per_device_train_batch_size x gradient_accumulation_steps x processes at %d.",
                self.path, before, plan.global_batch, state.global_step, before,
            )  # fmt: skip
        return state


def _agree(cls: type[Resume], resume_from_checkpoint: str | bool | None, output_dir: str, checksums: bool,
           gather: Callable[[Any], list[Any]]) -> Resume | None:
    """The checkpoint every process of a run resumes, each reading it on its own disk (a collective).

    Nodes with their own disks (``save_on_each_node=True``) can hold different newest checkpoints: a node killed
    between the others' publishing of ``checkpoint-N`` and its own lacks it. Then the oldest of the checkpoints
    found (``True``, or each process's ``get_last_checkpoint(output_dir)``) is resumed if every process has it
    complete, with a warning. Otherwise, a process that finds no checkpoint, cannot read the one named, or was not
    asked to resume while others were makes every process raise the same error: never some resuming while others
    start over or wait.
    """
    asked = resume_from_checkpoint is not None and resume_from_checkpoint is not False
    found: tuple[bool, str | None, str | None] = (asked, None, None)
    if asked:
        try:
            found = (True, cls.find(resume_from_checkpoint, output_dir, checksums).path, None)
        except ValueError as err:
            found = (True, None, str(err))
    everyone = gather(found)
    if not any(a for a, _, _ in everyone):
        return None
    if not all(a for a, _, _ in everyone):
        idle = [rank for rank, (a, _, _) in enumerate(everyone) if not a]
        raise ValueError(
            f"train(resume_from_checkpoint=...) resumes {_by_rank(everyone, missing=False)} but not on {_names(idle)}"
            ": every process must resume the same checkpoint, or none. get_last_checkpoint(output_dir) finds none "
            f"on a node whose disk holds none; pass resume_from_checkpoint=True on every process. {_NOT_SHARED}"
        )
    lacking = [rank for rank, (_, path, _) in enumerate(everyone) if path is None]
    if len(lacking) == len(everyone):
        raise ValueError(everyone[0][2])  # the same for all: nothing to resume anywhere
    if lacking:
        raise ValueError(f"{_names(lacking).capitalize()}: {everyone[lacking[0]][2]} Found: "
                         f"{_by_rank(everyone, missing=False)}. {_NOT_SHARED}")
    steps = {checkpoint_step(path) for _, path, _ in everyone}
    if len({path for _, path, _ in everyone}) == 1 or (len(steps) == 1 and None not in steps):
        return cls(str(found[1]))
    if None in steps:
        raise ValueError(f"The processes found different checkpoints: {_by_rank(everyone)}. {_NOT_SHARED}")
    return cls(_oldest_newest(str(found[1]), steps, everyone, checksums, gather))


def _oldest_newest(mine: str, steps: set[int], everyone: list, checksums: bool, gather: Callable) -> str:
    """The newest checkpoints differ between processes: the oldest of them, when every process has it complete."""
    common = str(Path(mine).parent / f"{Path(mine).name.rsplit('-', 1)[0]}-{min(steps)}")
    reason = "it is not there" if not os.path.isdir(common) else unusable_reason(common)
    if reason is None and checksums:
        reason = manifest_problem(common)
    reasons = gather(reason)
    unreadable = [rank for rank, why in enumerate(reasons) if why is not None]
    if unreadable:
        raise ValueError(
            f"The processes' newest checkpoints differ ({_by_rank(everyone)}), and {Path(common).name} cannot be "
            f"resumed on {_names(unreadable)}: {reasons[unreadable[0]]}. {_NOT_SHARED}"
        )
    logger.warning("The processes' newest checkpoints differ (%s): resuming %s, the newest that every process has "
                   "complete.", _by_rank(everyone), Path(common).name)
    return common


_NOT_SHARED = ("Every process reads the checkpoint it resumes from its own output_dir: on disks local to each node, "
               "train with save_on_each_node=True (each node keeps a complete copy) or copy the checkpoint folder to "
               "every node (torchrun's c10d rendezvous may number the nodes differently after a restart, so the "
               "node that wrote it need not be process 0's again); on a shared file system, check that every node "
               "mounts it at the same path.")


def _names(ranks: list[int]) -> str:
    """``process 1`` or ``processes 2, 3``."""
    return ("process " if len(ranks) == 1 else "processes ") + ", ".join(str(rank) for rank in ranks)


def _by_rank(everyone: list[tuple[bool, str | None, str | None]], missing: bool = True) -> str:
    """Process ranks grouped by the checkpoint each found: ``checkpoint-6 on process 0, 1; checkpoint-3 on
    process 2, 3`` (``missing``: with the processes that found none)."""
    groups: dict[str, list[int]] = {}
    for rank, (_, path, _) in enumerate(everyone):
        if path is not None or missing:
            groups.setdefault(str(path) if path else "none", []).append(rank)
    return "; ".join(f"{name} on {_names(ranks)}" for name, ranks in groups.items())


def warn_changed_arguments(path: str, saved: TrainerState, args: Any, max_steps: int) -> None:
    """Warn once, naming each one, about the step intervals, batch size and learning-rate schedule values that
    differ from the checkpoint's run (``trainwell.optim.schedule_change``: warmup, total steps, the learning rate
    from the next step on), before and after.

    This run's values apply (as in the reference, whose warning says the opposite but whose loop does this).
    """
    from trainwell.optim.schedule_change import schedule_changes, schedule_of

    current = TrainerState()
    current.compute_steps(args, max_steps)
    pairs = {f"{kind}_steps": (getattr(saved, f"{kind}_steps"), getattr(current, f"{kind}_steps"))
             for kind in ("logging", "eval", "save")}
    pairs["per_device_train_batch_size"] = (saved.train_batch_size, args.per_device_train_batch_size)
    changed = [f"{name}: {old} -> {new}" for name, (old, new) in pairs.items() if old is not None and old != new]
    saved_args = _saved_arguments(path)
    schedule = schedule_changes(schedule_of(saved_args, saved.max_steps) if saved_args else None,
                                schedule_of(args, max_steps), saved.global_step)
    if schedule:
        changed.append(f"the learning-rate schedule (max_steps {saved.max_steps} -> {max_steps}): "
                       + "; ".join(schedule) + f". To keep the checkpoint's schedule, resume with max_steps="
                       f"{saved.max_steps} and its warmup_steps, lr_scheduler_type and lr_scheduler_kwargs")
    if changed:
        logger.warning("Resuming from %s with arguments that differ from its run (this run's apply): %s.",
                       path, "; ".join(changed))


def _saved_arguments(path: str) -> dict[str, Any]:
    """The checkpoint's ``training_args.json`` ({} when it cannot be read)."""
    try:
        saved = json.loads((Path(path) / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def checkpoint_global_batch(path: str, state: TrainerState) -> int | None:
    """Samples per optimizer step of the run that wrote the checkpoint at ``path`` (None when unknown): the
    per-device batch from its state, the accumulation from its arguments, the processes from its RNG files."""
    try:
        saved_args = json.loads((Path(path) / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return None
    world = len(list(Path(path).glob("rng_state_*.pth"))) or int((Path(path) / "rng_state.pth").is_file())
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
    return unusable_reason(path) or _missing_training_state(Path(path))


def unusable_reason(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be resumed from at all, or ``None``.

    Cheap checks only (no tensor is read, no pickle is opened): the trainer state parses as a JSON object,
    some model weights exist, every safetensors file is as long as its header says, every ``.pt``/``.pth``
    file (optimizer, scheduler, RNG states) is a whole zip archive (a truncated one has no end record), and every
    file the checkpoint's manifest lists exists with its recorded size. A checkpoint that passes but lacks
    training-state pieces resumes with a warning saying what is not exact.
    """
    path = Path(path)
    state_file = path / TRAINER_STATE_NAME
    if not state_file.is_file():
        return f"{TRAINER_STATE_NAME} is missing"
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as err:
        return f"{TRAINER_STATE_NAME} is not valid JSON ({err})"
    if not isinstance(state, dict):
        return f"{TRAINER_STATE_NAME} is not a JSON object"
    problems = state_problems(state)
    if problems:
        return f"{TRAINER_STATE_NAME} is damaged: {problems[0]}"
    step = checkpoint_step(path)
    if step is not None and "global_step" in state and state["global_step"] != step:
        return (f"{TRAINER_STATE_NAME} says global_step={state['global_step']}, but the folder is the checkpoint of "
                f"step {step} (an edited or copied state)")
    weights = [path / WEIGHTS_NAME, path / WEIGHTS_INDEX_NAME, path / LEGACY_WEIGHTS_NAME]
    weights += [path / p.file for p in CONTENTS if "model" in p.replaces]  # the sharded forms
    adapter_files = adapter_weight_files(path)  # a PEFT model's checkpoint: its adapters (some in subfolders)
    if not (any(w.is_file() for w in weights) or adapter_files):
        return "no model weights file"
    for file in sorted({*path.glob("*.safetensors"), *(f for f in adapter_files if f.suffix == ".safetensors")}):
        problem = _safetensors_problem(file, str(file.relative_to(path)))
        if problem is not None:
            return problem
    pickled = [*path.glob("*.pt"), *path.glob("*.pth"), *path.glob(LEGACY_WEIGHTS_NAME)]
    for file in sorted({*pickled, *(f for f in adapter_files if f.suffix == ".bin")}):
        if not zipfile.is_zipfile(file):
            return f"{file.relative_to(path)} is truncated or not a torch file"
    return manifest_problem(path, checksums=False)  # sizes only: nothing is read


def manifest_problem(path: str | os.PathLike, checksums: bool = True) -> str | None:
    """How checkpoint ``path`` differs from its manifest (``trainwell.checkpoint.manifest``), or None.

    A training-state piece that is gone entirely (``optimizer.pt`` deleted to restart the optimizer) is not a
    difference: the completeness checks warn about it (:func:`warn_partial`); a piece that is there must match.
    """
    path = Path(path)
    return manifest.problem(path, checksums, lambda name: _optional_piece(path, name))


def _optional_piece(path: Path, name: str) -> bool:
    top = name.split("/", 1)[0]
    if (path / top).exists():
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


def _missing_training_state(path: Path) -> str | None:
    """The required training-state pieces missing from a checkpoint whose arguments say it should have them."""
    try:
        saved_args = json.loads((path / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return None  # written by the reference (training_args.bin) or by hand: nothing to check against
    if not isinstance(saved_args, dict) or saved_args.get("save_only_model"):
        return None
    missing = []
    for piece in CONTENTS:
        if not (piece.training_state and piece.required):
            continue
        forms = [piece] + [p for p in CONTENTS if piece.name in p.replaces]  # e.g. optimizer.pt or optimizer_0/
        if not any(_present(path, form) for form in forms):
            missing.append(" or ".join(form.file for form in forms) + " is missing")
    return "; ".join(missing) or None


def _present(path: Path, piece: Any) -> bool:
    if (path / piece.file).is_file():
        return True
    stem, _, suffix = piece.file.rpartition(".")  # rng_state_0.pth, rng_state_1.pth, ... with several processes
    return piece.per_rank and any(path.glob(f"{stem}_*.{suffix}"))


def _safetensors_problem(file: Path, shown: str) -> str | None:
    """Check the safetensors header and that the file is as long as the header says (``shown``: its name in the
    message)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            if header_len <= 0 or 8 + header_len > size:
                return f"{shown} is truncated"
            header = json.loads(fh.read(header_len))
    except (OSError, ValueError) as err:
        return f"{shown} is unreadable ({err})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if 8 + header_len + max(ends, default=0) > size:
        return f"{shown} is truncated"
    return None


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """The newest *complete* checkpoint in ``folder``; incomplete ones are skipped with a warning naming them."""
    for path in reversed(list_checkpoints(folder)):
        reason = incomplete_reason(path)
        if reason is None:
            return str(path)
        logger.warning("Skipping incomplete checkpoint %s: %s", path, reason)
    return None


def newest_resumable(folder: str | os.PathLike, checksums: bool = True) -> str | None:
    """The checkpoint ``resume_from_checkpoint=True`` resumes: the newest complete one whose files match its
    manifest, else the newest usable one (partial: some training state missing). Each checkpoint passed over is
    named in a warning with the reason."""
    fallback = None
    for path in reversed(list_checkpoints(folder)):
        reason = unusable_reason(path) or (manifest_problem(path) if checksums else None)
        if reason is not None:
            logger.warning("Skipping damaged checkpoint %s: %s", path, reason)
            continue
        missing = _missing_training_state(path)
        if missing is None:
            return str(path)
        logger.warning("Skipping incomplete checkpoint %s: %s", path, missing)
        fallback = fallback or str(path)
    return fallback


def last_usable_checkpoint(folder: str | os.PathLike) -> str | None:
    """The newest checkpoint that can be resumed at all (weights and state intact), complete or not."""
    for path in reversed(list_checkpoints(folder)):
        if unusable_reason(path) is None:
            return str(path)
    return None
