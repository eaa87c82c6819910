"""Sharded model and optimizer states through ``torch.distributed.checkpoint`` (DCP): the checkpoint state of the
engines whose parameters are DTensors (``trainwell.backend.fsdp``, ``trainwell.backend.tensor_parallel``).

Owns reading and writing the two sharded pieces of such a checkpoint, in Accelerate's (and so the reference's)
``SHARDED_STATE_DICT`` layout: ``pytorch_model_fsdp_0/`` holding ``{"model": ...}`` and ``optimizer_0/`` holding
``{"optimizer": ...}``, parameters keyed by their names. Every process writes its own shards; DCP's coordinator
writes ``.metadata`` last, after every process's shards, so a folder without it is an incomplete save.

Loading works at any world size and into a model that is not sharded at all (one process, no process group):
DCP reads each parameter's slices from whichever files hold them. So a checkpoint written by 2 processes
resumes on 1 and vice versa (``trainwell.checkpoint.contents`` reads model shards whatever the engine). Also
here: gathering the full weights of a sharded model (``save_model``), and loading full weights into one
(``load_best_model_at_end`` from a full checkpoint).

Reading never runs code from the folder. torch's own reader unpickles ``.metadata`` with plain ``pickle`` and the
non-tensor entries (optimizer hyperparameters) with ``weights_only=False``, so a crafted file would run whatever it
names. Here ``.metadata`` goes through an unpickler that builds only DCP's own metadata records, torch sizes,
dtypes and layouts (:func:`read_metadata`), every data file it names must lie in the folder, and the non-tensor
entries load with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import io
import os
import pathlib
import pickle
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainwell.utils import filehash
from trainwell.utils.safe_files import open_regular

MODEL_DIR = "pytorch_model_fsdp_0"
OPTIMIZER_DIR = "optimizer_0"
METADATA = ".metadata"


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are sharded (DTensors), as after FSDP2's ``fully_shard``.

    Asked of the parameters, not of the module's class: with ``torch_compile`` Accelerate shards the compiled
    wrapper, so the user's module inside it is not an ``FSDPModule`` although its parameters are sharded.
    """
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5: no public DTensor, and no FSDP2 either
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def has_shards(directory: str | Path, folder: str) -> bool:
    """Whether ``directory/folder`` is a complete DCP save (its ``.metadata`` exists)."""
    return (Path(directory) / folder / METADATA).is_file()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # DCP warns on every call in a process without a process group that it assumes a single process: it does.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_model_shards(model: torch.nn.Module, directory: str | Path) -> None:
    """Every process writes its shards of ``model`` (a collective call)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    with _quiet():
        _save({"model": get_model_state_dict(model)}, Path(directory) / MODEL_DIR)


def save_optimizer_shards(model: torch.nn.Module, optimizer: Any, directory: str | Path) -> None:
    """Every process writes its shards of the optimizer state of ``model`` (a collective call)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with _quiet():
        _save({"optimizer": get_optimizer_state_dict(model, _inner(optimizer))}, Path(directory) / OPTIMIZER_DIR)


def load_model_shards(model: torch.nn.Module, directory: str | Path) -> None:
    """Load ``pytorch_model_fsdp_0/`` into ``model``, sharded or not, whatever world size wrote it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    with _quiet():
        state = {"model": get_model_state_dict(model)}
        _load(state, Path(directory) / MODEL_DIR)
        set_model_state_dict(model, state["model"])


def load_optimizer_shards(model: torch.nn.Module, optimizer: Any, directory: str | Path) -> None:
    """Load ``optimizer_0/`` into the optimizer of ``model``, whatever world size wrote it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    inner = _inner(optimizer)
    with _quiet():
        state = {"optimizer": get_optimizer_state_dict(model, inner)}
        _load(state, Path(directory) / OPTIMIZER_DIR)
        set_optimizer_state_dict(model, inner, state["optimizer"])


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of a sharded model on process 0, in CPU memory; ``{}`` on the others (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load full weights (every process has them) into a sharded model: each process keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def _inner(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's wrapper (DCP reads its parameter groups and states)."""
    return getattr(optimizer, "optimizer", optimizer)


def _save(state: dict[str, Any], folder: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, storage_writer=_dcp_classes()[2](folder))


def _load(state: dict[str, Any], folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    read_metadata(folder / METADATA)  # refused here with a plain error (inside dcp.load it is wrapped)
    reader, planner, _ = _dcp_classes()
    try:
        dcp.load(state, storage_reader=reader(folder), planner=planner())
    except CheckpointException as err:  # a BaseException holding each rank's error: a refusal is raised as itself
        refused = [exc for exc, _ in err.failures.values() if isinstance(exc, pickle.UnpicklingError)]
        if refused:
            raise refused[0] from None
        raise


# ----------------------------------------------------------------------------------------------- safe reading
class RefusedFile(pickle.UnpicklingError):
    """A checkpoint file that is not what it claims, refused before anything in it could run."""


def _refuse(file: Path, what: str) -> RefusedFile:
    return RefusedFile(
        f"Refusing to load {file}: {what}. A sharded checkpoint's metadata holds only DCP's records, so this file "
        "was not written by torch.distributed.checkpoint, and unpickling it could run code from it. Only load "
        "checkpoints you trust; to resume anyway, delete this checkpoint folder and resume from an earlier one."
    )


def _layout(name: str) -> torch.layout:
    layout = getattr(torch, str(name).rpartition(".")[2], None)
    if not isinstance(layout, torch.layout):
        raise pickle.UnpicklingError(f"{name!r} is not a torch layout")
    return layout


_PATHS = {"PosixPath": pathlib.PurePosixPath, "PurePosixPath": pathlib.PurePosixPath,
          "WindowsPath": pathlib.PureWindowsPath, "PureWindowsPath": pathlib.PureWindowsPath}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata records and nothing else: any other global in the pickle is refused."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        from torch.distributed.checkpoint import metadata
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        found: Any = None
        if module == "torch":
            value = getattr(torch, name, None)
            found = value if isinstance(value, torch.dtype) or value is torch.Size else None
        elif module == "torch.serialization" and name == "_get_layout":
            found = _layout
        elif module == metadata.__name__:  # a record class defined there: a dataclass or an enum
            value = getattr(metadata, name, None)
            ours = isinstance(value, type) and value.__module__ == metadata.__name__
            found = value if ours and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)) else None
        elif (module, name) == (_StorageInfo.__module__, "_StorageInfo"):
            found = _StorageInfo
        elif module == "pathlib":
            found = _PATHS.get(name)
        elif (module, name) == ("collections", "OrderedDict"):
            found = OrderedDict
        if found is None:
            raise _refuse(self.path, f"it names {module}.{name}, which is not part of a DCP checkpoint's metadata")
        return found


def read_metadata(path: Path) -> Any:
    """DCP's ``Metadata`` in the file at ``path``, read without running code; refuses data files outside its folder."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    with open_regular(path, Path(path).parent.parent) as fh:  # never through a link, never a FIFO
        try:
            metadata = _MetadataUnpickler(fh, path).load()
        except RefusedFile:
            raise
        except Exception as err:  # a damaged file: pickle raises many kinds
            raise _refuse(path, f"it is not a readable DCP metadata file ({type(err).__name__}: {err})") from err
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise _refuse(path, f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not (isinstance(info, _StorageInfo) and isinstance(name, str) and name == Path(name).name
                and name not in ("", ".", "..")):
            raise _refuse(path, f"it points at a data file outside its folder ({name!r})")
    return metadata


def _load_entry(read_item: Any, value: io.BytesIO) -> io.BytesIO:
    """A non-tensor entry (an optimizer hyperparameter), read ``weights_only`` and written again: what torch's
    planner then unpickles is only what was read safely."""
    try:
        obj = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as err:
        raise pickle.UnpicklingError(
            f"Refusing to load the entry {read_item.dest_index.fqn} of a sharded checkpoint: it holds objects other "
            f"than tensors and plain values, and unpickling them could run code. Only load checkpoints you trust. "
            f"Details: {err}"
        ) from err
    clean = io.BytesIO()
    torch.save(obj, clean)
    clean.seek(0)
    return clean


@functools.cache
def _dcp_classes() -> tuple[type, type, type]:
    """torch's file-system reader, load planner and writer: the reader reads ``.metadata`` with
    :func:`read_metadata` and the planner the non-tensor entries with :func:`_load_entry` (torch reads both with
    unrestricted pickle); the writer checksums each file as it writes it (``trainwell.utils.filehash``), for the
    checkpoint's manifest. Built on first use: the DCP modules take most of a second to import."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystem
    from torch.distributed.checkpoint.metadata import StorageMeta

    class HashingFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
            if "w" not in mode:
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with filehash.open_for_write(path) as stream:
                yield stream

    class HashingWriter(FileSystemWriter):
        def __init__(self, path: str | os.PathLike) -> None:
            super().__init__(path)
            self.fs = HashingFileSystem()

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            super().load_bytes(read_item, _load_entry(read_item, value))

    return SafeReader, SafePlanner, HashingWriter
