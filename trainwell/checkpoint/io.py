"""Reading and writing checkpoint files safely.

Owns: model weights in safetensors (shared and tied tensors included), ``transformers``-style
``save_pretrained`` when the model has it, loading that never unpickles code (``weights_only=True``), fsync,
and the atomic publish of a checkpoint folder (write into a temporary sibling, then one rename).

Reading treats every file as hostile (``trainwell.utils.safe_files``): :class:`CheckpointFiles` lists a checkpoint
folder once (its regular files and sizes, and what else is there: links, FIFOs, devices, which nothing reads), and
reads and parses each of its JSON files once, bounded; the torch files are opened as regular files, never through
a link, and loaded weights-only; weights of another dtype than the model's are named in a warning.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import pickle
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainwell.checkpoint import manifest
from trainwell.checkpoint.layout import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    LEGACY_WEIGHTS_NAME,
    TMP_PREFIX,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)
from trainwell.utils.filehash import FileRecord, open_for_write, record_of
from trainwell.utils.model import is_peft_model
from trainwell.utils.safe_files import kind_of, not_regular, parse_json, read_bytes, staged, write_file

logger = logging.getLogger(__name__)


#: the most bytes read of a checkpoint's JSON files (arguments, index, manifest); ``trainer_state.json`` may be larger
JSON_LIMIT = 64 << 20
_STATE_LIMIT = 1 << 30
#: the most bytes read of a tensor file (weights, optimizer state): far above any one file a checkpoint holds
TENSOR_LIMIT = 1 << 40


def safe_torch_load(path: str | os.PathLike, map_location: Any = "cpu", root: str | os.PathLike | None = None,
                    data: bytes | None = None) -> Any:
    """``torch.load`` restricted to tensors and plain containers: a crafted pickle cannot run code. It loads
    ``data`` (the file's bytes, read once by :meth:`CheckpointFiles.read`, and checked there), else the bytes of
    ``path`` read through one descriptor (a regular file, never a link, a FIFO or a device; with ``root``, inside
    it: ``trainwell.utils.safe_files``): the name is never opened again by the loader."""
    # A multi-process CPU run has device ``cpu:0``, which torch.load cannot map storages to: use plain "cpu".
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        if torch.device(map_location).type == "cpu":
            map_location = "cpu"
    if data is None:
        data = read_bytes(path, TENSOR_LIMIT, root)
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise pickle.UnpicklingError(
            f"Refusing to load {path}: it holds objects other than tensors and plain containers, and unpickling "
            "them could run code from the file (trainwell loads checkpoints with weights_only=True). Only load "
            f"files you trust; to restart without it, delete the file. Details: {err}"
        ) from err
    except (RuntimeError, EOFError) as err:
        raise RuntimeError(f"{path} is corrupted or not a torch file ({type(err).__name__}: {err})") from err


def load_rng_file(path: str | os.PathLike, data: bytes | None = None) -> dict[str, Any]:
    """Read an RNG state file with ``weights_only=True``, also accepting the reference Trainer's files.

    The reference pickles numpy's state as an ``ndarray``; building one needs exactly three numpy globals
    (``ndarray``, ``dtype``, ``_reconstruct``), allowed here for this file only. Nothing else is, so a crafted
    file still cannot name a function to call. ValueError naming the file when it does not hold a dictionary.
    """
    allowed: list[Any] = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct
    allowed.append(_reconstruct)
    with torch.serialization.safe_globals(allowed):
        saved = safe_torch_load(path, map_location="cpu", data=data)
    if not isinstance(saved, dict):
        raise ValueError(f"{path} holds a {type(saved).__name__}, not the dictionary of RNG states trainwell and the "
                         "reference write. Delete it to resume without the RNG states (random draws then differ).")
    return saved


class CheckpointFiles:
    """A checkpoint folder, listed once: its regular files (relative POSIX names, with their sizes, subfolders
    included), the other entries (links, FIFOs, devices: :attr:`others`, which nothing reads), and its JSON files,
    each read (bounded, as a regular file inside the folder) and parsed once, whoever asks.

    Every file is read by :meth:`read`: opened once, relative to a descriptor of its folder, and its bytes checked
    against the folder's manifest (size; checksum too when ``checksums``) before anyone parses or loads them. What
    is loaded is what was checked: a file swapped for another (a link, a same-size file) between a check and a load
    cannot be loaded, since there is no second open. ``checksums`` None: the bytes are not compared with the
    manifest (a folder listed only to look at it)."""

    def __init__(self, path: str | os.PathLike, checksums: bool | None = True) -> None:
        self.path = Path(path)
        self.checksums = checksums
        self.sizes: dict[str, int] = {}
        self.others: dict[str, str] = {}  #: name -> what it is ("a symbolic link", "a FIFO", ...)
        self._parsed: dict[str, Any] = {}
        self._records: dict[str, FileRecord] | None = None
        if self.path.is_dir():
            self._scan(self.path, "")

    def _scan(self, folder: Path, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for entry in entries:
                name, mode = prefix + entry.name, entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(mode.st_mode):
                    self._scan(Path(entry.path), f"{name}/")
                elif stat.S_ISREG(mode.st_mode):
                    self.sizes[name] = mode.st_size
                else:
                    self.others[name] = kind_of(mode.st_mode)

    def has(self, name: str) -> bool:
        """Whether ``name`` is a regular file of the folder."""
        return name in self.sizes

    def read(self, name: str, limit: int = TENSOR_LIMIT) -> bytes:
        """The bytes of the regular file ``name`` (a relative POSIX name), read through one descriptor opened
        relative to the folder's (``trainwell.utils.safe_files.open_fd``), at most ``limit`` bytes; when the
        manifest lists it, those bytes are compared with its record (size, and checksum unless ``checksums`` is
        False). ValueError naming the file when it is not a regular file, too large, or not what the manifest
        recorded; OSError (a missing file) passes through."""
        path = self.path / name
        if name in self.others:
            raise not_regular(path, self.others[name])
        expected = self._manifest_records().get(name) if self.checksums is not None else None
        data = read_bytes(path, limit if expected is None else min(limit, expected.size), self.path)
        if expected is not None and len(data) != expected.size:
            raise ValueError(f"{path} is {len(data)} bytes where the checkpoint's manifest says {expected.size}: the "
                             "file was truncated or replaced after the checkpoint was written.")
        if expected is not None and self.checksums and record_of(data).digest != expected.digest:
            raise ValueError(f"{path} does not match its checksum in the checkpoint's manifest: its bytes changed "
                             "after the checkpoint was written (a damaged disk, a copy or sync tool, an edit, or a "
                             "file swapped in). Resume from another checkpoint.")
        return data

    def _manifest_records(self) -> dict[str, FileRecord]:
        """The manifest's records, read once (empty without a usable manifest: what is wrong with it is
        ``trainwell.checkpoint.resume``'s to say)."""
        if self._records is None:
            self._records = {}
            if self.has(manifest.MANIFEST_NAME):
                try:
                    self._records = manifest.records_of(self.json(manifest.MANIFEST_NAME))
                except (OSError, ValueError):
                    pass
        return self._records

    def json(self, name: str) -> Any:
        """The parsed content of the JSON file ``name`` (read by :meth:`read`); ValueError (or OSError) naming it,
        the same each time."""
        if name not in self._parsed:
            limit = _STATE_LIMIT if name == "trainer_state.json" else JSON_LIMIT
            try:
                self._parsed[name] = parse_json(self.read(name, limit), self.path / name)
            except (OSError, ValueError) as err:
                self._parsed[name] = err
        value = self._parsed[name]
        if isinstance(value, BaseException):
            raise value
        return value

    def json_or_none(self, name: str) -> Any:
        """:meth:`json`, or None when the file is missing or unreadable (for optional facts: the run's arguments)."""
        try:
            return self.json(name) if self.has(name) else None
        except (OSError, ValueError):
            return None


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
    """``obj`` as indented JSON in ``path`` (``trainwell.utils.safe_files.write_file``: fsynced, renamed into
    place, never written through a link)."""
    with writing(path):
        write_file(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


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
    # written into a fresh private folder, then renamed into place (``safe_files.staged``): the libraries write by
    # name, and would write through a link planted under one of their names
    with writing(directory / (ADAPTER_SAFE_WEIGHTS_NAME if is_peft_model(model) else WEIGHTS_NAME)):
        with staged(directory) as stage:
            _write_weights(model, stage, state_dict)
        fsync_dir(directory)


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


def load_model_weights(model: nn.Module, directory: str | os.PathLike, strict: bool = True,
                       files: CheckpointFiles | None = None) -> None:
    """Load weights saved by :func:`save_model_weights` (or by the reference Trainer) into ``model``.

    Missing or unexpected keys raise when ``strict`` (naming them), and are warned about otherwise. Weights of
    another dtype than the model's are cast, as the reference casts them, but named in a warning (the reference
    says nothing): a float16 checkpoint resumed into a float32 model has lost precision already.
    """
    state = read_model_weights(directory, files)
    warn_other_dtypes(model, state, directory)
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


def warn_other_dtypes(model: nn.Module, state: dict[str, torch.Tensor], source: str | os.PathLike) -> None:
    """Warn, naming ``source`` and the dtypes, when tensors of ``state`` differ in dtype from the model's."""
    own = model.state_dict()
    differ: dict[tuple[str, str], list[str]] = {}
    for key, tensor in state.items():
        mine = own.get(key)
        if isinstance(tensor, torch.Tensor) and mine is not None and mine.dtype != tensor.dtype:
            differ.setdefault((_dtype(tensor), _dtype(mine)), []).append(key)
    for (saved, wanted), keys in differ.items():
        keys = sorted(keys)
        shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
        logger.warning("The weights in %s hold %s where the model has %s (%s): they are cast to %s as they load. "
                       "Resume with the dtype that wrote them to continue exactly.", source, saved, wanted, shown,
                       wanted)


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


def read_model_weights(directory: str | os.PathLike, files: CheckpointFiles | None = None) -> dict[str, torch.Tensor]:
    """The full weights in ``directory``: ``model.safetensors``, its sharded index, or ``pytorch_model.bin``; each
    file read once, as a regular file of the folder, checked against the folder's manifest when it has one, and
    loaded from those bytes (:meth:`CheckpointFiles.read`; an index naming a file outside it is refused).
    ``files``: the folder as listed already (a resume's)."""
    directory = Path(directory)
    files = files if files is not None else CheckpointFiles(directory)

    def there(name: str) -> bool:  # a link or a FIFO is there too, to be refused by name
        return files.has(name) or name in files.others

    if there(WEIGHTS_NAME):
        return load_safetensors(files.read(WEIGHTS_NAME), directory / WEIGHTS_NAME)
    if there(WEIGHTS_INDEX_NAME):
        state = {}
        for shard in index_shards(files.json(WEIGHTS_INDEX_NAME), directory / WEIGHTS_INDEX_NAME):
            state.update(load_safetensors(files.read(shard), directory / shard))
        return state
    if there(LEGACY_WEIGHTS_NAME):
        return safe_torch_load(directory / LEGACY_WEIGHTS_NAME, data=files.read(LEGACY_WEIGHTS_NAME))
    raise FileNotFoundError(
        f"No model weights in {directory}: expected {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} or {LEGACY_WEIGHTS_NAME}."
    )


def index_shards(index: Any, shown: str | os.PathLike) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` (parsed) names, sorted; ValueError naming ``shown``
    when it is not an index or names a file outside its folder."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{shown} is not a weights index: it needs a 'weight_map' object of parameter -> file.")
    shards = sorted(set(weight_map.values()))
    outside = [name for name in shards if not name or "/" in name or "\\" in name or name in (".", "..")]
    if outside:
        raise ValueError(f"{shown} names {outside[0]!r}, not a file of its folder: an index lists shard files beside "
                         "it only.")
    return shards


def load_safetensors(data: bytes, shown: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file from its bytes (read once by the caller: no name is opened here);
    ValueError naming ``shown`` when they are not a safetensors file."""
    from safetensors.torch import load

    try:
        views = load(data)
    except Exception as err:  # safetensors raises its own SafetensorError, and others on crafted headers
        raise ValueError(f"{shown} is not a readable safetensors file ({type(err).__name__}: {err})") from err
    # load's tensors view immutable bytes objects: each is copied into memory of its own, its view freed as it goes.
    # In name order: load's order is a hash map's, not the same in every process, and FSDP broadcasts full weights
    # key by key in the dict's order (two orders: mismatched broadcasts, an abort in gloo)
    return {name: views.pop(name).clone() for name in sorted(views)}


def _is_tied_alias(model: nn.Module, key: str, loaded: dict[str, torch.Tensor]) -> bool:
    """True when parameter ``key`` shares storage with a parameter that was loaded."""
    params = dict(model.named_parameters(remove_duplicate=False))
    target = params.get(key)
    if target is None:
        return False
    return any(
        name in loaded and other.data_ptr() == target.data_ptr() for name, other in params.items() if name != key
    )


def remove_entry(path: Path) -> None:
    """Remove ``path`` if it is there: a folder with what it holds, a link or a file as the entry itself (what a link
    points to is never touched)."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


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
        """The temporary folder, empty. Whatever holds its name (left by an interrupted save, or planted there) is
        removed first: a folder with what it holds, a link or a file as the entry itself (what a link points to is
        never touched)."""
        if self.tmp.is_symlink() or (os.path.lexists(self.tmp) and not self.tmp.is_dir()):
            logger.warning("Removing %s, %s where trainwell writes a checkpoint before publishing it.", self.tmp,
                           kind_of(os.lstat(self.tmp).st_mode))
            self.tmp.unlink()
        elif self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)
        return self.tmp

    def publish(self) -> Path:
        """Rename the finished temporary folder into place, replacing an older folder of the same name."""
        fsync_dir(self.tmp)
        if os.path.lexists(self.final):
            trash = self.final.parent / f"{TMP_PREFIX}{self.final.name}.old"
            remove_entry(trash)
            os.rename(self.final, trash)
            os.rename(self.tmp, self.final)
            remove_entry(trash)
        else:
            os.rename(self.tmp, self.final)
        fsync_dir(self.final.parent)
        return self.final
