"""Byte-level language-modelling data: fixed-length blocks of bytes, and the demo's corpus.

Owns ``ByteBlocks`` (a map-style dataset of ``{"input_ids", "labels"}`` blocks cut from a byte string) and
``stdlib_corpus`` (the ``.py`` files of the running Python's standard library, split into train and
validation *by file*, so no validation text was ever seen in training). Nothing is downloaded.
"""

from __future__ import annotations

import os
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

# Folders of the standard library left out of the corpus: tests are huge and repetitive, and in a venv
# site-packages may sit below the stdlib folder (it is not the standard library).
_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


class ByteBlocks(Dataset):
    """Consecutive, non-overlapping blocks of ``block_size`` bytes; ``labels`` equal ``input_ids`` (the model
    shifts them). The trailing bytes that do not fill a block are dropped."""

    def __init__(self, data: bytes | torch.Tensor, block_size: int, max_blocks: int | None = None) -> None:
        if block_size < 2:
            raise ValueError(f"block_size={block_size}: pass at least 2 (one input byte and one target).")
        tensor = data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.data = tensor
        self.block_size = block_size
        count = len(tensor) // block_size
        self._len = count if max_blocks is None else min(count, max_blocks)
        if self._len == 0:
            raise ValueError(f"{len(tensor)} bytes is less than one block of block_size={block_size}.")

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self._len:
            raise IndexError(index)
        start = index * self.block_size
        ids = self.data[start:start + self.block_size].long()
        return {"input_ids": ids, "labels": ids.clone()}


@dataclass
class Corpus:
    """Train and validation bytes, with the files each came from (for the user's information)."""

    train: bytes
    validation: bytes
    root: str
    train_files: int
    validation_files: int


def stdlib_files(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """The ``.py`` files under ``root`` (default: this Python's standard library), sorted, tests left out."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found)


def _is_validation(relative: str, every: int) -> bool:
    # A hash of the path, not of the contents, so the split is the same on every machine with that file.
    return zlib.crc32(relative.encode()) % every == 0


def stdlib_corpus(max_train_bytes: int = 8_000_000, max_validation_bytes: int = 1_000_000,
                  validation_every: int = 10, root: str | os.PathLike[str] | None = None) -> Corpus:
    """Read the standard library's sources: about one file in ``validation_every`` goes to validation.

    Stops reading once both budgets are filled (the budgets bound memory and start-up time, not quality:
    a two-minute demo sees well under a megabyte). Raises ``FileNotFoundError`` if no source is found.
    """
    base = Path(root or sysconfig.get_paths()["stdlib"])
    train: list[bytes] = []
    val: list[bytes] = []
    sizes = [0, 0]
    counts = [0, 0]
    for path in stdlib_files(base):
        which = 1 if _is_validation(path.relative_to(base).as_posix(), validation_every) else 0
        if sizes[which] >= (max_validation_bytes if which else max_train_bytes):
            if sizes[0] >= max_train_bytes and sizes[1] >= max_validation_bytes:
                break
            continue
        try:
            text = path.read_bytes()
        except OSError:  # an unreadable file is simply not part of the corpus
            continue
        (val if which else train).append(text)
        sizes[which] += len(text)
        counts[which] += 1
    if not train or not val:
        raise FileNotFoundError(f"no Python sources found under {base} to build the demo corpus from.")
    return Corpus(b"\n".join(train), b"\n".join(val), str(base), counts[0], counts[1])


def text_blocks(path: str | os.PathLike[str], block_size: int, eval_fraction: float = 0.0
                ) -> tuple[ByteBlocks, ByteBlocks | None]:
    """A plain-text (or any) file as byte blocks; the last ``eval_fraction`` of it becomes the eval set."""
    data = Path(path).read_bytes()
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction={eval_fraction}: pass a number in [0, 1).")
    cut = len(data) - int(len(data) * eval_fraction)
    train = ByteBlocks(data[:cut], block_size)
    return train, (ByteBlocks(data[cut:], block_size) if eval_fraction > 0 else None)
