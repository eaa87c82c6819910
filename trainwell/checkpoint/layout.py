"""Checkpoint folder layout: names, discovery of complete checkpoints, and rotation.

Owns the file names (compatible with the reference Trainer's ``checkpoint-{step}/`` layout), deciding whether
a folder is a *complete* checkpoint, and which checkpoints ``save_total_limit`` deletes. Writing and reading
the files is ``trainwell.checkpoint.io``; what goes into them is ``trainwell.checkpoint.training_state``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Iterable

from trainwell.outputs import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
LEGACY_WEIGHTS_NAME = "pytorch_model.bin"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.json"
TMP_PREFIX = ".tmp-"

_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def rng_file_name(process_index: int, num_processes: int) -> str:
    return "rng_state.pth" if num_processes <= 1 else f"rng_state_{process_index}.pth"


def data_state_file_name(process_index: int, num_processes: int) -> str:
    """The position of a stateful ``IterableDataset`` (its ``state_dict()``), one file per process."""
    return "data_state.pth" if num_processes <= 1 else f"data_state_{process_index}.pth"


def checkpoint_path(output_dir: str | os.PathLike, step: int) -> Path:
    return Path(output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    match = _CHECKPOINT_RE.match(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Every ``checkpoint-N`` folder in ``output_dir``, oldest step first (complete or not)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [(checkpoint_step(p), p) for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return [p for _, p in sorted(found)]


def incomplete_reason(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a loadable checkpoint, or ``None`` when it looks complete.

    Cheap checks only (no tensor is read, no pickle is opened): the trainer state parses as a JSON object,
    some model weights exist, every safetensors file is as long as its header says, and every ``.pt``/``.pth``
    file (optimizer, scheduler, RNG states) is a whole zip archive (a truncated one has no end record). When
    ``training_args.json`` says the checkpoint was not ``save_only_model``, the optimizer, scheduler and RNG
    files must be there too.
    """
    path = Path(path)
    state_file = path / TRAINER_STATE_NAME
    if not state_file.is_file():
        return f"{TRAINER_STATE_NAME} is missing"
    try:
        if not isinstance(json.loads(state_file.read_text()), dict):
            return f"{TRAINER_STATE_NAME} is not a JSON object"
    except (OSError, ValueError) as err:
        return f"{TRAINER_STATE_NAME} is not valid JSON ({err})"
    weights = [path / WEIGHTS_NAME, path / WEIGHTS_INDEX_NAME, path / LEGACY_WEIGHTS_NAME]
    if not any(w.is_file() for w in weights):
        return "no model weights file"
    for file in sorted(path.glob("*.safetensors")):
        problem = _safetensors_problem(file)
        if problem is not None:
            return problem
    for file in sorted([*path.glob("*.pt"), *path.glob("*.pth"), *path.glob(LEGACY_WEIGHTS_NAME)]):
        if not zipfile.is_zipfile(file):
            return f"{file.name} is truncated or not a torch file"
    return _missing_training_state(path)


def _missing_training_state(path: Path) -> str | None:
    """The optimizer, scheduler or RNG file missing from a checkpoint whose arguments say it should have them."""
    try:
        saved_args = json.loads((path / TRAINING_ARGS_NAME).read_text())
    except (OSError, ValueError):
        return None  # written by the reference (training_args.bin) or by hand: nothing to check against
    if not isinstance(saved_args, dict) or saved_args.get("save_only_model"):
        return None
    for name in (OPTIMIZER_NAME, SCHEDULER_NAME):
        if not (path / name).is_file():
            return f"{name} is missing"
    if not any(path.glob("rng_state*.pth")):
        return "rng_state.pth is missing"
    return None


def _safetensors_problem(file: Path) -> str | None:
    """Check the safetensors header and that the file is as long as the header says."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            if header_len <= 0 or 8 + header_len > size:
                return f"{file.name} is truncated"
            header = json.loads(fh.read(header_len))
    except (OSError, ValueError) as err:
        return f"{file.name} is unreadable ({err})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if 8 + header_len + max(ends, default=0) > size:
        return f"{file.name} is truncated"
    return None


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """The newest *complete* checkpoint in ``folder``; incomplete ones are skipped with a warning naming them."""
    for path in reversed(list_checkpoints(folder)):
        reason = incomplete_reason(path)
        if reason is None:
            return str(path)
        logger.warning("Skipping incomplete checkpoint %s: %s", path, reason)
    return None


def checkpoints_to_delete(
    checkpoints: list[Path], limit: int | None, protected: Iterable[str | os.PathLike | None] = ()
) -> list[Path]:
    """Which of ``checkpoints`` (oldest first) to delete to keep ``limit`` of them.

    The newest checkpoint and every protected one (the best, the one being resumed from) are always kept; when
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


def clean_temporary(output_dir: str | os.PathLike) -> None:
    """Remove temporary folders left by a save that was interrupted."""
    root = Path(output_dir)
    if root.is_dir():
        for path in root.iterdir():
            if path.is_dir() and path.name.startswith(TMP_PREFIX + PREFIX_CHECKPOINT_DIR):
                shutil.rmtree(path, ignore_errors=True)
