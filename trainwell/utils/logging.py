"""The library's verbosity, under the reference's names (``transformers.utils.logging``).

Scripts written for the reference set the library's verbosity with these functions
(``set_verbosity_info()``, ``enable_default_handler()``, ``enable_explicit_format()``) before they read
``TrainingArguments.get_process_log_level()``; after ``transformers`` -> ``trainwell`` they act on the ``trainwell``
logger. trainwell's messages propagate to the root logger unless the default handler is enabled: then, as in the
reference, they go to stderr through that handler only (so a script's ``logging.basicConfig`` does not print them
twice).
"""

from __future__ import annotations

import logging
import sys
from logging import CRITICAL, DEBUG, ERROR, FATAL, INFO, NOTSET, WARN, WARNING  # noqa: F401  (the reference's)

_LIBRARY = "trainwell"
_handler: logging.Handler | None = None
_EXPLICIT = "[%(levelname)s|%(filename)s:%(lineno)s] %(asctime)s >> %(message)s"


def _root() -> logging.Logger:
    return logging.getLogger(_LIBRARY)


def get_logger(name: str | None = None) -> logging.Logger:
    """The logger ``name`` (the library's own logger when None)."""
    return logging.getLogger(name or _LIBRARY)


def get_verbosity() -> int:
    """The library's effective logging level."""
    return _root().getEffectiveLevel()


def set_verbosity(verbosity: int) -> None:
    """Set the library's logging level (``logging.INFO``, ``logging.WARNING``, ...)."""
    _root().setLevel(verbosity)


def set_verbosity_debug() -> None:
    set_verbosity(DEBUG)


def set_verbosity_info() -> None:
    set_verbosity(INFO)


def set_verbosity_warning() -> None:
    set_verbosity(WARNING)


def set_verbosity_error() -> None:
    set_verbosity(ERROR)


def enable_default_handler() -> None:
    """Print the library's messages to stderr through its own handler (and stop propagating them)."""
    global _handler
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
    root = _root()
    if _handler not in root.handlers:
        root.addHandler(_handler)
    root.propagate = False


def disable_default_handler() -> None:
    """Remove the library's handler: its messages propagate to the root logger again."""
    root = _root()
    if _handler is not None and _handler in root.handlers:
        root.removeHandler(_handler)
    root.propagate = True


def enable_propagation() -> None:
    _root().propagate = True


def disable_propagation() -> None:
    _root().propagate = False


def enable_explicit_format() -> None:
    """``[LEVEL|file:line] time >> message`` on the library's handlers."""
    for handler in _root().handlers:
        handler.setFormatter(logging.Formatter(_EXPLICIT))


def reset_format() -> None:
    for handler in _root().handlers:
        handler.setFormatter(None)


def passive_level() -> int:
    """What ``log_level="passive"`` means, as in the reference: the library's verbosity. That is the ``trainwell``
    logger's effective level, or ``transformers``' verbosity when the script imported it and asked it for more
    than warnings (an example script that switched only its Trainer imports still calls
    ``transformers.utils.logging.set_verbosity_info()`` and expects INFO)."""
    level = get_verbosity()
    reference = sys.modules.get("transformers.utils.logging")
    if reference is not None and hasattr(reference, "get_verbosity"):
        asked = reference.get_verbosity()
        if asked < min(level, WARNING):
            level = asked
    return level
