"""Reading ``TrainingArguments``' fields: their kinds from the annotations, booleans given as text, unknown keys.

A leaf of ``trainwell.args``: it imports no other module of the package, so normalization, validation, the
argument parser and the alias table all read fields the same way without importing each other.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from trainwell.utils.errors import did_you_mean


def string_to_bool(value: str | bool) -> bool:
    """``argparse`` type for booleans: yes/no, true/false, t/f, y/n, 1/0 (any case)."""
    if isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in ("yes", "true", "t", "y", "1"):
        return True
    if text in ("no", "false", "f", "n", "0"):
        return False
    import argparse  # deferred: constructing TrainingArguments does not import argparse

    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, yes/no, 1/0), got {value!r}")


@functools.cache
def numeric_fields(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name → (int or float, whether None is allowed), read from the annotation text (the module uses
    postponed annotations), which avoids the cost of ``typing.get_type_hints`` on every construction."""
    out: dict[str, tuple[type, bool]] = {}
    for f in dataclasses.fields(cls):
        text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        bare = text.replace("Optional[", "").rstrip("]").replace(" | None", "").replace("None | ", "")
        if bare in ("int", "float"):
            out[f.name] = (int if bare == "int" else float, bare != text)
    return out


@functools.cache
def bool_fields(cls: type) -> tuple[str, ...]:
    """Fields annotated ``bool`` or ``bool | None`` (read from the annotation text, as :func:`numeric_fields`)."""
    bools = ("bool", "bool | None", "None | bool", "Optional[bool]")
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if (f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")) in bools
    )


def coerce_bools(args: Any) -> None:
    """A bool field given a string gets what the argument parser would make of it: "yes"/"true"/"1" -> True,
    "no"/"false"/"0" -> False (any case). Kept as is, "no" would be a truthy string; any other string is an error."""
    for name in bool_fields(type(args)):
        value = getattr(args, name)
        if not isinstance(value, str):
            continue
        import argparse  # deferred, as in string_to_bool: only a string here needs it

        try:
            setattr(args, name, string_to_bool(value))
        except argparse.ArgumentTypeError:
            raise ValueError(
                f"{name}={value!r}: pass True or False (the strings 'true'/'false', 'yes'/'no' and '1'/'0' "
                "are read as such, in any case)."
            ) from None


def check_known_keys(data: Mapping[str, Any], known: set[str], what: str) -> None:
    """Raise ``ValueError`` naming every key of ``data`` not in ``known``, with a guess for the first."""
    unknown = sorted(k for k in data if k not in known)
    if unknown:
        raise ValueError(
            f"{what} got unknown key(s) {', '.join(map(repr, unknown))}.{did_you_mean(unknown[0], known)}"
        )
