"""Checkpoint folder layout: names, discovery of complete checkpoints, and rotation.

Owns the file names (compatible with the reference Trainer's ``checkpoint-{step}/`` layout), listing the
``checkpoint-N`` folders of a run, and which of them ``save_total_limit`` deletes. Writing and reading files
is ``trainwell.checkpoint.io``; what a checkpoint holds is ``trainwell.checkpoint.contents``; whether a folder
is a complete checkpoint, and which one to resume from, is ``trainwell.checkpoint.resume``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from trainwell.outputs import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
# A PEFT model's checkpoint holds its adapters instead (peft's names, beside adapter_config.json; a non-default
# adapter in a subfolder of its name).
ADAPTER_SAFE_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_WEIGHTS_NAME = "adapter_model.bin"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.json"
TMP_PREFIX = ".tmp-"

_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def per_rank_name(file: str, process_index: int, num_processes: int) -> str:
    """``file`` for one process: unchanged in a single-process run, ``{stem}_{rank}{suffix}`` otherwise."""
    if num_processes <= 1:
        return file
    stem, dot, suffix = file.rpartition(".")
    return f"{stem}_{process_index}{dot}{suffix}"


def checkpoint_path(output_dir: str | os.PathLike, step: int) -> Path:
    return Path(output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    match = _CHECKPOINT_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Every ``checkpoint-N`` folder in ``output_dir``, oldest step first (complete or not)."""
    return [path for _, path in checkpoints(output_dir)]


def checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``checkpoint-N`` folder in ``output_dir``, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(match, p) for p in root.iterdir() if (match := _CHECKPOINT_RE.match(p.name)) and p.is_dir()]
    return sorted((int(match.group(1)), p) for match, p in found)


def checkpoints_to_delete(
    checkpoints: list[Path], limit: int | None, protected: Iterable[str | os.PathLike | None] = ()
) -> list[Path]:
    """Which of ``checkpoints`` (oldest first) to delete to keep ``limit`` of them.

    The newest checkpoint and every protected one (the best, the one just written) are always kept; when
    they alone exceed ``limit``, more than ``limit`` survive. Order is by step number, not modification time,
    so a copied or touched folder cannot fool it.
    """
    if limit is None or limit <= 0 or len(checkpoints) <= limit:
        return []
    keep_names = {Path(p).resolve() for p in protected if p is not None}
    keep_names.add(checkpoints[-1].resolve())
    budget = max(limit - sum(1 for c in checkpoints if c.resolve() in keep_names), 0)
    deletable = [c for c in checkpoints if c.resolve() not in keep_names]
    survivors = set(deletable[len(deletable) - budget :]) if budget else set()
    return [c for c in deletable if c not in survivors]


def rotate_checkpoints(
    output_dir: str | os.PathLike, limit: int | None, protected: Iterable[str | os.PathLike | None] = ()
) -> list[Path]:
    """Delete old checkpoints beyond ``limit`` (see :func:`checkpoints_to_delete`); returns what was deleted."""
    doomed = checkpoints_to_delete(list_checkpoints(output_dir), limit, protected)
    for path in doomed:
        logger.info("Deleting older checkpoint %s (save_total_limit=%s)", path, limit)
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def keep_only_best(output_dir: str | os.PathLike, best: str | os.PathLike) -> list[Path]:
    """End of training with ``save_total_limit=1``: delete every checkpoint but the best, as the reference does
    (during training the newest one was kept beside it so that a resume stays possible)."""
    best_path = Path(best).resolve()
    doomed = [c for c in list_checkpoints(output_dir) if c.resolve() != best_path]
    for path in doomed:
        logger.info("Deleting checkpoint %s: save_total_limit=1 keeps only the best one", path)
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def clean_temporary(output_dir: str | os.PathLike) -> None:
    """Remove temporary folders left by a save that was interrupted."""
    root = Path(output_dir)
    if root.is_dir():
        for path in root.iterdir():
            if not path.name.startswith(TMP_PREFIX + PREFIX_CHECKPOINT_DIR):
                continue
            if path.is_symlink() or not path.is_dir():  # a link holding the name: the link goes, never its target
                path.unlink(missing_ok=True)
            else:
                shutil.rmtree(path, ignore_errors=True)
