"""Sharded model and optimizer states through ``torch.distributed.checkpoint`` (DCP), for FSDP runs.

Owns reading and writing the two sharded pieces of an FSDP checkpoint, in Accelerate's (and so the reference's)
``SHARDED_STATE_DICT`` layout: ``pytorch_model_fsdp_0/`` holding ``{"model": ...}`` and ``optimizer_0/`` holding
``{"optimizer": ...}``, parameters keyed by their names. Every process writes its own shards; DCP's coordinator
writes ``.metadata`` last, after every process's shards, so a folder without it is an incomplete save.

Loading works at any world size and into a model that is not sharded at all (one process, no process group):
DCP reads each parameter's slices from whichever files hold them. So a checkpoint written by 2 processes
resumes on 1 and vice versa. Also here: gathering the full weights of a sharded model (``save_model``), and
loading full weights into one (``load_best_model_at_end`` from a full checkpoint).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

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
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    with _quiet():
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=Path(directory) / MODEL_DIR)


def save_optimizer_shards(model: torch.nn.Module, optimizer: Any, directory: str | Path) -> None:
    """Every process writes its shards of the optimizer state of ``model`` (a collective call)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with _quiet():
        state = get_optimizer_state_dict(model, _inner(optimizer))
        dcp.save({"optimizer": state}, checkpoint_id=Path(directory) / OPTIMIZER_DIR)


def load_model_shards(model: torch.nn.Module, directory: str | Path) -> None:
    """Load ``pytorch_model_fsdp_0/`` into ``model``, sharded or not, whatever world size wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    with _quiet():
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=Path(directory) / MODEL_DIR)
        set_model_state_dict(model, state["model"])


def load_optimizer_shards(model: torch.nn.Module, optimizer: Any, directory: str | Path) -> None:
    """Load ``optimizer_0/`` into the optimizer of ``model``, whatever world size wrote it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    inner = _inner(optimizer)
    with _quiet():
        state = {"optimizer": get_optimizer_state_dict(model, inner)}
        dcp.load(state, checkpoint_id=Path(directory) / OPTIMIZER_DIR)
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
