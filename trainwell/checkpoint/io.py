"""Reading and writing checkpoint files safely.

Owns: model weights in safetensors (shared and tied tensors included), ``transformers``-style
``save_pretrained`` when the model has it, loading that never unpickles code (``weights_only=True``), fsync,
and the atomic publish of a checkpoint folder (write into a temporary sibling, then one rename).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainwell.checkpoint.layout import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    LEGACY_WEIGHTS_NAME,
    TMP_PREFIX,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from trainwell.utils.filehash import open_for_write
from trainwell.utils.model import is_peft_model

logger = logging.getLogger(__name__)


def safe_torch_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load`` restricted to tensors and plain containers: a crafted pickle cannot run code."""
    # A multi-process CPU run has device ``cpu:0``, which torch.load cannot map storages to: use plain "cpu".
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        if torch.device(map_location).type == "cpu":
            map_location = "cpu"
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise pickle.UnpicklingError(
            f"Refusing to load {path}: it holds objects other than tensors and plain containers, and unpickling "
            "them could run code from the file (trainwell loads checkpoints with weights_only=True). Only load "
            f"files you trust; to restart without it, delete the file. Details: {err}"
        ) from err
    except (RuntimeError, EOFError) as err:
        raise RuntimeError(f"{path} is corrupted or not a torch file ({type(err).__name__}: {err})") from err


class CheckpointWriteError(OSError):
    """Writing a file of a checkpoint (or of a saved model) failed; the message names the file and the cause."""


# How a full disk shows through torch's zip writer and safetensors, besides errno ENOSPC.
_DISK_FULL = ("No space left on device", "unexpected pos", "file write failed", "Disk quota exceeded")


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn a failed write of ``path`` into a :class:`CheckpointWriteError` that says what failed and what is safe.

    torch reports a full disk as ``unexpected pos 1318528 vs 1318416``: the error names the file, says the disk
    is full when it is, and that a checkpoint being written is not published (earlier ones are intact).
    """
    try:
        yield
    except CheckpointWriteError:
        raise
    except Exception as err:
        # torch raises RuntimeError, safetensors its own SafetensorError, plain writes OSError
        if not isinstance(err, (OSError, RuntimeError)) and type(err).__name__ != "SafetensorError":
            raise
        full = getattr(err, "errno", None) == errno.ENOSPC or any(text in str(err) for text in _DISK_FULL)
        cause = "the disk is full" if full else f"the write failed ({type(err).__name__}: {err})"
        where = Path(path)
        unpublished = any(part.startswith(TMP_PREFIX) for part in where.parts)
        after = ("this checkpoint is not published; the checkpoints saved before it are intact and the run "
                 "resumes from the newest of them (resume_from_checkpoint=True)") if unpublished else (
                 "the file may be incomplete; checkpoints saved before are intact")
        fix = " Free some space (or point output_dir at a larger disk) and resume." if full else ""
        raise CheckpointWriteError(f"Writing {where} failed: {cause}. {after[0].upper()}{after[1:]}.{fix}") from err


def torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` into ``path``, fsynced; checksummed as written when a manifest records its folder."""
    with writing(path), open_for_write(path) as fh:
        torch.save(obj, fh)


def write_json(obj: Any, path: str | os.PathLike) -> None:
    with writing(path), open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_model_weights(model: nn.Module, directory: str | os.PathLike, state_dict: dict | None = None) -> None:
    """Write the model into ``directory`` as ``model.safetensors`` (and ``config.json`` for HF models).

    A ``transformers`` model (one with ``save_pretrained``) saves itself, so its config and sharding come out as
    ``from_pretrained`` expects. Any other module is written with safetensors' ``save_model``, which stores
    one copy of tensors that share memory (tied embeddings) and restores the sharing on load. A PEFT model's
    ``save_pretrained`` writes its adapters only (``adapter_model.safetensors``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with writing(directory / (ADAPTER_SAFE_WEIGHTS_NAME if is_peft_model(model) else WEIGHTS_NAME)):
        _write_weights(model, directory, state_dict)


@contextlib.contextmanager
def _gathered_already(model: nn.Module, state_dict: dict | None) -> Iterator[None]:
    """Save a model loaded tensor-parallel (``DistributedConfig`` in its config) from full weights, on one process.

    Its ``save_pretrained`` is otherwise a collective (it gathers the shards and waits for every process),
    while here the weights were gathered already and only the main process writes. The written ``config.json``
    then carries no ``distributed_config``: full weights load on any number of processes.
    """
    config = getattr(model, "config", None)
    distributed = getattr(config, "distributed_config", None)
    if state_dict is None or distributed is None:
        yield
        return
    config.distributed_config = None
    try:
        yield
    finally:
        config.distributed_config = distributed


def _write_weights(model: nn.Module, directory: Path, state_dict: dict | None) -> None:
    if hasattr(model, "save_pretrained") and callable(model.save_pretrained):
        kwargs: dict[str, Any] = {"safe_serialization": True}
        if state_dict is not None:
            kwargs["state_dict"] = state_dict
        with _gathered_already(model, state_dict):
            try:
                model.save_pretrained(str(directory), **kwargs)
            except TypeError:  # a save_pretrained without those keywords (not a transformers model)
                model.save_pretrained(str(directory))
    else:
        from safetensors.torch import save_file, save_model

        if state_dict is None:
            save_model(model, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
        else:
            save_file(_dedupe(state_dict), str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    for file in directory.iterdir():
        if file.is_file():
            fsync_file(file)


def _dedupe(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous copies, one per storage: safetensors refuses tensors that share memory."""
    seen: dict[tuple[int, int], str] = {}
    out = {}
    for name, tensor in state_dict.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen and tensor.numel() > 0:
            continue
        seen[key] = name
        out[name] = tensor.detach().contiguous()
    return out


def load_model_weights(model: nn.Module, directory: str | os.PathLike, strict: bool = True) -> None:
    """Load weights saved by :func:`save_model_weights` (or by the reference Trainer) into ``model``.

    Missing or unexpected keys raise when ``strict`` (naming them), and are warned about otherwise.
    """
    state = read_model_weights(directory)
    result = model.load_state_dict(state, strict=False)
    # Tied weights saved once come back through the tie; they are not really missing.
    missing = [k for k in result.missing_keys if not _is_tied_alias(model, k, state)]
    if missing or result.unexpected_keys:
        message = (
            f"Weights in {directory} do not match the model: missing {missing}, "
            f"unexpected {list(result.unexpected_keys)}."
        )
        if strict:
            raise RuntimeError(message)
        logger.warning(message)


def read_model_weights(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The full weights in ``directory``: ``model.safetensors``, its sharded index, or ``pytorch_model.bin``."""
    directory = Path(directory)
    from safetensors.torch import load_file

    if (directory / WEIGHTS_NAME).is_file():
        state = load_file(str(directory / WEIGHTS_NAME))
    elif (directory / WEIGHTS_INDEX_NAME).is_file():
        index = json.loads((directory / WEIGHTS_INDEX_NAME).read_text())
        state = {}
        for shard in sorted(set(index["weight_map"].values())):
            state.update(load_file(str(directory / shard)))
    elif (directory / LEGACY_WEIGHTS_NAME).is_file():
        state = safe_torch_load(directory / LEGACY_WEIGHTS_NAME)
    else:
        raise FileNotFoundError(
            f"No model weights in {directory}: expected {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} or {LEGACY_WEIGHTS_NAME}."
        )
    return state


def _is_tied_alias(model: nn.Module, key: str, loaded: dict[str, torch.Tensor]) -> bool:
    """True when parameter ``key`` shares storage with a parameter that was loaded."""
    params = dict(model.named_parameters(remove_duplicate=False))
    target = params.get(key)
    if target is None:
        return False
    return any(
        name in loaded and other.data_ptr() == target.data_ptr() for name, other in params.items() if name != key
    )


class AtomicDirectory:
    """Write a folder under a temporary name and publish it with one rename when complete.

    A crash at any instant leaves either the previous state or the complete new folder, never a partial one
    under the final name. The temporary name is deterministic so several processes can write into it; the
    owner (one process) creates it, and publishes it after the caller's barrier.
    """

    def __init__(self, final: str | os.PathLike) -> None:
        self.final = Path(final)
        self.tmp = self.final.parent / f"{TMP_PREFIX}{self.final.name}"

    def create(self) -> Path:
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        return self.tmp

    def publish(self) -> Path:
        """Rename the finished temporary folder into place, replacing an older folder of the same name."""
        fsync_dir(self.tmp)
        if self.final.exists():
            trash = self.final.parent / f"{TMP_PREFIX}{self.final.name}.old"
            shutil.rmtree(trash, ignore_errors=True)
            os.rename(self.final, trash)
            os.rename(self.tmp, self.final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(self.tmp, self.final)
        fsync_dir(self.final.parent)
        return self.final
