"""trainwell's version, in the lowest layer so that any module may report it (kept equal to pyproject.toml's)."""

__version__ = "0.1.0"
