"""Seeding: every random number generator a training run touches, in one place.

Owns ``set_seed``, ``enable_full_determinism``, the per-worker seeding of data-loader workers, and capturing and
restoring every generator's state (``get_rng_state`` / ``set_rng_state``: the data position and the checkpoint
read them). Which RNG file a checkpoint holds, and reading it safely, belongs to ``trainwell.checkpoint``.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python ``random``, numpy, torch and every CUDA device with ``seed``.

    With ``deterministic=True`` also switch torch to deterministic algorithms (see
    :func:`enable_full_determinism`).
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy only takes 32-bit seeds
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """Seed everything and make torch pick deterministic kernels.

    Costs speed on GPU (cuDNN autotuning is off, some kernels are slower); on CPU it mostly changes nothing.
    The CUDA environment variables only take effect if set before CUDA initialises, so call this early.
    """
    set_seed(seed)
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int, num_workers: int | None = None, rank: int = 0) -> None:
    """``worker_init_fn`` for data-loader workers: each worker of each rank gets its own, reproducible seed.

    torch gives each worker ``base_seed + worker_id`` for its own RNG, but ``base_seed`` comes from an RNG
    seeded identically on every rank, and python's and numpy's RNGs are forked identical into every worker.
    Mix the rank in and seed all three from the result. Bind ``rank`` with ``functools.partial``
    (``num_workers`` is accepted for the reference's signature and not needed).
    """
    worker_seed = (torch.initial_seed() + rank * 1_000_003) % 2**32
    torch.manual_seed(worker_seed)
    random.seed(worker_seed)
    np.random.seed(worker_seed)


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


def rng_state_problem(state: Any) -> str | None:
    """What keeps ``state`` (a saved :func:`get_rng_state`, trainwell's or the reference's) from being restored by
    :func:`set_rng_state`, checked before any generator is set; None when it can be."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a dictionary of generator states"
    cpu = state.get("cpu")
    size = torch.get_rng_state().numel()
    if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8 or cpu.numel() != size:
        return f"'cpu' is {_shown(cpu)}, not torch's CPU generator state ({size} bytes)"
    python = state.get("python", (3, (0,) * 625, None))
    if not (isinstance(python, (tuple, list)) and len(python) == 3 and _words(python[1], 625)
            and isinstance(python[0], int) and (python[2] is None or isinstance(python[2], float))):
        return f"'python' is {_shown(python)}, not python's random state"
    numpy_state = state.get("numpy", ("MT19937", [0] * 624, 0, 0, 0.0))
    if not (isinstance(numpy_state, (tuple, list)) and len(numpy_state) == 5 and numpy_state[0] == "MT19937"
            and _words(numpy_state[1], 624) and all(_real(v) for v in numpy_state[2:])):
        return f"'numpy' is {_shown(numpy_state)}, not numpy's MT19937 state"
    cuda = state.get("cuda", [])
    cuda_states = [cuda] if isinstance(cuda, torch.Tensor) else cuda
    if not isinstance(cuda_states, (list, tuple)) or not all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda_states):
        return f"'cuda' is {_shown(cuda)}, not CUDA generator states"
    return None


def _words(values: Any, count: int) -> bool:
    """``count`` integers in [0, 2**32): a Mersenne Twister's key (a sequence, an ndarray or a tensor)."""
    if isinstance(values, (torch.Tensor, np.ndarray)):
        values = values.tolist() if values.ndim == 1 else None
    if not isinstance(values, (list, tuple)) or len(values) != count:
        return False
    return all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in values)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    text = type(value).__name__ if isinstance(value, (torch.Tensor, np.ndarray)) else repr(value)
    if isinstance(value, torch.Tensor):
        text += f" of {value.numel()} {str(value.dtype).replace('torch.', '')}"
    return text if len(text) <= 60 else text[:57] + "..."
