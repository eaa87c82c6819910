"""Capturing and restoring every random number generator of a process (python, numpy, torch CPU, CUDA).

States are stored as tensors and plain Python values only, so they load with ``weights_only=True``.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch


def get_rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        # numpy's state holds an ndarray, which weights_only loading refuses: store it as a list.
        "numpy": (np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])),
        "cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_rng_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read an RNG state file with ``weights_only=True``, also accepting the reference Trainer's files.

    The reference pickles numpy's state as an ``ndarray``; building one needs exactly three numpy globals
    (``ndarray``, ``dtype``, ``_reconstruct``), allowed here for this file only. Nothing else is, so a crafted
    file still cannot name a function to call.
    """
    allowed: list[Any] = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct
    allowed.append(_reconstruct)
    from trainwell.checkpoint.io import safe_torch_load

    with torch.serialization.safe_globals(allowed):
        return safe_torch_load(path, map_location="cpu")


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the generators ``state`` holds (a partial state, e.g. torch's alone, leaves the others)."""
    if "python" in state:
        python_state = state["python"]
        # weights_only loading returns the inner tuple as a list; random.setstate needs tuples.
        random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    if "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        if isinstance(keys, torch.Tensor):
            keys = keys.numpy()
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if isinstance(cuda_states, torch.Tensor):
            torch.cuda.set_rng_state(cuda_states)
        elif len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
