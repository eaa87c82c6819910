"""Which checkpoint every process of a multi-process run resumes, each reading it on its own disk.

Owns :func:`agree`, the collective behind ``Resume.find`` when a run has several processes. Nodes with their own
disks (``save_on_each_node=True``) can hold different newest checkpoints: a node killed between the others'
publishing of ``checkpoint-N`` and its own lacks it. Then the oldest of the checkpoints found is resumed if every
process has it complete, with a warning (a run resumed through ``Resume.of`` has first sent the processes that
lack world process zero's checkpoint a copy: ``trainwell.checkpoint.fetch``). Otherwise, a process that finds no
checkpoint, cannot read the one named, or was not asked to resume while others were makes every process raise the
same error: never some resuming while others start over or wait. What a checkpoint is and whether it can be resumed
is ``trainwell.checkpoint.resume``'s, handed in as callables.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwell.checkpoint.layout import checkpoint_step

logger = logging.getLogger(__name__)

_NOT_SHARED = ("Every process reads the checkpoint it resumes from its own output_dir; one whose disk lacks it "
               "receives it from world process zero (or the lowest-ranked process that has one) when every process "
               "resumes and the checkpoint has its manifest (checkpoint_manifest.json). Otherwise, on disks local to "
               "each node, train with save_on_each_node=True (each node keeps a complete copy) or copy the checkpoint "
               "folder to every node (torchrun's c10d rendezvous may number the nodes differently after a restart, so "
               "the node that wrote it need not be process 0's again); on a shared file system, check that every node "
               "mounts it at the same path.")


def agree(asked: bool, find: Callable[[], Any], problem: Callable[[str], str | None],
          gather: Callable[[Any], list[Any]]) -> tuple[Any, str | None]:
    """What this process resumes: ``(found, None)`` with what ``find()`` returned here when every process found the
    same checkpoint (or one of the same step), ``(None, path)`` for the older checkpoint every process has complete
    when their newest differ, ``(None, None)`` when no process was asked to resume (``asked``). ``find()`` returns
    an object with a ``path`` or raises ValueError; ``problem(path)`` says why a checkpoint cannot be resumed here.
    A collective: every process calls it; all raise the same ValueError when they cannot agree.
    """
    mine, found = None, (asked, None, None)
    if asked:
        try:
            mine = find()
            found = (True, mine.path, None)
        except ValueError as err:
            found = (True, None, str(err))
    everyone = gather(found)
    if not any(a for a, _, _ in everyone):
        return None, None
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
        return mine, None
    if None in steps:
        raise ValueError(f"The processes found different checkpoints: {_by_rank(everyone)}. {_NOT_SHARED}")
    return None, _oldest_newest(str(found[1]), steps, everyone, problem, gather)


def _oldest_newest(mine: str, steps: set[int], everyone: list, problem: Callable[[str], str | None],
                   gather: Callable) -> str:
    """The newest checkpoints differ between processes: the oldest of them, when every process has it complete."""
    common = str(Path(mine).parent / f"{Path(mine).name.rsplit('-', 1)[0]}-{min(steps)}")
    reason = "it is not there" if not os.path.isdir(common) else problem(common)
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
