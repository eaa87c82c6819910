"""Reading a checkpoint's RNG file: trainwell's and the reference Trainer's, with ``weights_only=True``.

Capturing and restoring the generators themselves (python, numpy, torch CPU, CUDA) is
``trainwell.utils.seed``'s; its states hold tensors and plain Python values only, so they load weights-only.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from trainwell.utils.seed import get_rng_state, set_rng_state  # noqa: F401  (re-exported)


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
