"""Seeding: every random number generator a training run touches, in one place.

Owns ``set_seed``, ``enable_full_determinism`` and the per-worker seeding of data-loader workers.
Saving and restoring RNG *states* for resume belongs to ``trainwell.checkpoint``.
"""

from __future__ import annotations

import os
import random

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
