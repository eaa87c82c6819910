"""Pieces that a callback adds to every checkpoint: the open end of ``trainwell.checkpoint.contents.CONTENTS``.

An object in the Trainer's callbacks (``Trainer(callbacks=[...])``, ``add_callback``) joins every checkpoint of the
runs it is part of when it has:

* ``checkpoint_piece``: a row made by :func:`checkpoint_piece`: its name, its file in ``checkpoint-N/``, when a
  resume hands its state back (:class:`~trainwell.checkpoint.contents.Phase`; by default ``OPTIMIZER``: after the
  model and the optimizer are restored and prepared, before the first step), and whether it is ``sharded`` where
  the engine shards the model (under FSDP2 each process then holds, saves and reads back its own part);
* ``state_dict()``: its state now (None: nothing to save), and ``load_state_dict(state)``: continue from a state an
  earlier run saved.

Such a row is one more row of the table for the checkpointer (``Checkpointer.rows``): written in every synchronous
save, copied to host buffers at save time and written in the background under ``save_async``, checksummed into the
manifest and checked on resume as every other file, and handed back in its phase. Its file is read as a hostile file,
as every checkpoint file is: as a regular file of the folder, a ``.safetensors`` file with safetensors (a flat
``{name: tensor}`` state: weights), a ``.pt``/``.pth`` file with ``weights_only=True`` (tensors and plain
containers); nothing is unpickled. ``trainwell.techniques.ema.EMA`` is one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from trainwell.checkpoint.contents import CONTENTS, Owner, Phase, Piece, Staging, own_file
from trainwell.checkpoint.io import writing
from trainwell.utils.filehash import open_for_write

_SUFFIXES = (".safetensors", ".pt", ".pth")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
#: the phases a callback's piece may be restored in: every resume reaches them, before its first step
_PHASES = (Phase.WEIGHTS, Phase.STATE, Phase.OPTIMIZER, Phase.RNG)


def checkpoint_piece(name: str, file: str, restored: Phase = Phase.OPTIMIZER, *, sharded: bool = False,
                     training_state: bool = True) -> Piece:
    """A row of the checkpoint table for a callback's state (set it as the callback's ``checkpoint_piece``).

    ``name``: the piece's name, unique in a run; ``file``: its file in ``checkpoint-N/``, a plain name ending in
    ``.safetensors`` (the state is a flat ``{str: tensor}``), ``.pt`` or ``.pth`` (tensors and plain containers);
    ``restored``: the phase of a resume that hands the state back to ``load_state_dict`` (``WEIGHTS``, ``STATE``,
    ``OPTIMIZER`` or ``RNG``); ``sharded``: the state is
    this process's part of a model the engine shards (each process writes ``{stem}_{rank}{suffix}`` there, and a
    resume needs the same number of processes); ``training_state``: ``save_only_model`` leaves it out.
    ValueError naming the argument for a name or a file that cannot be one.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"checkpoint_piece(name={name!r}): a piece's name is a word of letters, digits, '_', '-' or "
                         "'.', starting with a letter, e.g. 'ema'.")
    if not isinstance(file, str) or not _NAME.match(file) or not file.endswith(_SUFFIXES):
        raise ValueError(f"checkpoint_piece(file={file!r}): a piece's file is a plain file name in the checkpoint "
                         f"folder (no folder, no '..') ending in one of {list(_SUFFIXES)}, e.g. 'ema.safetensors'.")
    if restored not in _PHASES:
        raise ValueError(f"checkpoint_piece(restored={restored!r}): pass the Phase of a resume that hands the state "
                         f"back, one of {[p.name for p in _PHASES]} (DATA is the data position's: only mid-epoch).")
    weights = file.endswith(".safetensors")
    return Piece(name, file, False, bool(training_state), False, restored, None, None, staged=Staging.HOST,
                 write=_write_safetensors if weights else None, read=_read_safetensors if weights else None,
                 sharded=bool(sharded))


def added(callbacks: Iterable[Any]) -> list[tuple[Piece, Any]]:
    """The rows the ``callbacks`` add (those with a ``checkpoint_piece``), each with its callback (its provider), in
    the callbacks' order. ValueError or TypeError naming the callback for a row that cannot be added: not made by
    :func:`checkpoint_piece`, without ``state_dict``/``load_state_dict``, or a name or file another row has."""
    rows: list[tuple[Piece, Any]] = []
    for callback in callbacks:
        piece = getattr(callback, "checkpoint_piece", None)
        if piece is None:
            continue
        shown = type(callback).__name__
        if not isinstance(piece, Piece) or piece.saved_by is not None or piece.restored_by is not None:
            raise TypeError(f"{shown}.checkpoint_piece is {piece!r}: make it with "
                            "trainwell.checkpoint.pieces.checkpoint_piece(name, file, ...).")
        if not (callable(getattr(callback, "state_dict", None)) and callable(getattr(callback, "load_state_dict",
                                                                                      None))):
            raise TypeError(f"{shown} adds the checkpoint piece {piece.name!r} but has no state_dict() and "
                            "load_state_dict(state): a checkpoint saves what state_dict() returns.")
        for other in (*CONTENTS, *(p for p, _ in rows)):
            if other.name == piece.name or _stem(other.file) == _stem(piece.file):
                raise ValueError(f"{shown} adds the checkpoint piece {piece.name!r} ({piece.file}), but the checkpoint "
                                 f"already holds {other.name!r} ({other.file}): give it another name and file.")
        rows.append((piece, callback))
    return rows


def _stem(file: str) -> str:
    """``model`` for ``model.safetensors``, the folder for a file in one (``optimizer_0/.metadata``)."""
    top = file.split("/", 1)[0]
    return top.rpartition(".")[0] or top


def written_forms(piece: Piece, names: Iterable[str]) -> list[str]:
    """The files of ``piece`` among ``names`` (a checkpoint's), in any of its forms: one file, or one per process."""
    stem, _, suffix = piece.file.rpartition(".")
    form = re.compile(rf"^{re.escape(stem)}(_\d+)?\.{re.escape(suffix)}$")
    return sorted(name for name in names if form.match(name))


def _write_safetensors(owner: Owner, piece: Piece, state: Any, folder: str) -> None:
    """``state`` (``{str: tensor}``) as a safetensors file, fsynced and checksummed as it is written."""
    from safetensors.torch import save

    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise TypeError(f"The checkpoint piece {piece.name!r} is written to {piece.file}, a safetensors file: its "
                        "state_dict() must return a flat {name: tensor} dictionary (use a .pt file for other state).")
    path = Path(folder) / own_file(piece, owner.runtime)
    data = save({name: tensor.detach().contiguous() for name, tensor in state.items()}, metadata={"format": "pt"})
    with writing(path), open_for_write(path) as fh:
        fh.write(data)


def _read_safetensors(path: Path, data: bytes) -> dict[str, torch.Tensor]:
    """A piece's safetensors file from its ``data``, read once by the checkpointer and checked against the manifest."""
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as err:  # safetensors raises its own SafetensorError
        raise ValueError(f"{path} is not a safetensors file ({type(err).__name__}: {err}).") from err
