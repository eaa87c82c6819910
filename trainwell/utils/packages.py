"""Which optional packages are installed, and on/off environment switches: checks that import nothing.

Owns the low-level answers several layers need (the argument checks, the tracker registry, the search
backends): whether a module can be imported, found on disk without importing it, and how an environment
variable reads as a flag.
"""

from __future__ import annotations

import importlib.util
import os


def installed(module: str) -> bool:
    """Whether ``module`` (a dotted name: its parents are imported, so name a light one) can be imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a half-installed package, a missing parent, or a module with no __spec__
        return False


def env_flag(name: str, default: bool = False) -> bool:
    """An on/off environment variable (``1``/``true``/``yes``/``on``, any case); ``default`` when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value.upper() in ("1", "TRUE", "YES", "ON") if value else default


def is_optuna_available() -> bool:
    return installed("optuna")


def is_ray_tune_available() -> bool:
    return installed("ray") and installed("ray.tune")


is_ray_available = is_ray_tune_available
