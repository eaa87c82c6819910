"""Error-message helpers for values outside a closed set: a did-you-mean hint and the error that uses it.

Owns the wording every user-facing check shares (``TrainingArguments`` fields, the argument parser, the
``trainwell`` command's config and build steps, ``report_to`` tracker names), so they suggest the same way.
Standard library only, and ``difflib`` only once an error is being built: importing this costs nothing, so
any module may use it without an import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def did_you_mean(value: Any, choices: Iterable[Any]) -> str:
    """Return `` Did you mean 'x'?`` for the closest choice, or ``""`` when nothing is close."""
    import difflib  # deferred: only a failing run needs it

    options = [str(c) for c in choices]
    close = difflib.get_close_matches(str(value).lower(), options, n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def choice_error(name: str, value: Any, choices: Iterable[Any]) -> ValueError:
    """The error for a value outside a closed set: names the field, the value, the options and a guess."""
    options = [str(c) for c in choices]
    return ValueError(
        f"{name}={value!r} is not a valid value: choose one of {', '.join(map(repr, options))}."
        + did_you_mean(value, options)
    )


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (error messages name the value they refuse)."""
    try:
        text = " ".join(repr(value).split())
    except Exception:  # a repr that fails is no reason to hide the real error
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
