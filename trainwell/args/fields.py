"""Reading ``TrainingArguments``' fields: their kinds from the declarations, booleans given as text, unknown keys.

A leaf of ``trainwell.args``: it imports no other module of the package, so normalization, validation, the
argument parser and the alias table all read fields the same way without importing each other.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
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
def declared_annotations(cls: type) -> dict[str, Any]:
    """Field name -> its annotation as written in the class body that declares it last (the nearest in the MRO).

    Read from the classes' own annotations, never from ``dataclasses.Field.type``: the reference's argument parser
    (``transformers.HfArgumentParser``, and the copy TRL ships) rewrites ``Field.type`` in place, ``float | None``
    becoming ``float``, so what a field accepts would change with whichever parser ran first in the process. The
    annotations are text under postponed evaluation (trainwell's modules) or objects (a library's subclass)."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        out.update(inspect.get_annotations(klass))
    return {f.name: out.get(f.name, f.type) for f in dataclasses.fields(cls)}


@functools.cache
def field_terms(cls: type) -> dict[str, frozenset[str]]:
    """Field name -> the members of its declared annotation's union, as names: ``float | None`` and
    ``Optional[float]`` both give ``{"float", "None"}``, ``str | None | Literal[False]`` gives
    ``{"str", "None", "Literal[False]"}``. Text is split rather than evaluated, which avoids the cost of
    ``typing.get_type_hints`` on every construction.

    Only the Trainer API's fields: those a trainwell class in ``cls``'s MRO declares (with the annotation of the
    nearest declaration, so a library redeclaring ``bf16: bool | None`` allows None). A library's own fields are
    the library's to check: their annotations are not always what they accept (TRL's ``scale_rewards: str``
    takes True and False)."""
    ours = {name for klass in cls.__mro__ if klass.__module__.partition(".")[0] == "trainwell"
            for name in inspect.get_annotations(klass)}
    return {name: frozenset(_terms(annotation)) for name, annotation in declared_annotations(cls).items()
            if name in ours}


def _terms(annotation: Any) -> list[str]:
    if isinstance(annotation, str):
        return _text_terms(annotation)
    if annotation is None or annotation is type(None):
        return ["None"]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return [term for arg in typing.get_args(annotation) for term in _terms(arg)]
    if origin is typing.Literal:
        return [f"Literal[{', '.join(map(repr, typing.get_args(annotation)))}]"]
    if isinstance(annotation, type) and origin is None:
        return [annotation.__name__]
    return [str(annotation).replace("typing.", "")]


def _text_terms(text: str) -> list[str]:
    out = []
    for part in _split_top(text.replace("typing.", ""), "|"):
        if part.startswith("Optional[") and part.endswith("]"):
            out += [*_text_terms(part[len("Optional["):-1]), "None"]
        elif part.startswith("Union[") and part.endswith("]"):
            out += [term for arg in _split_top(part[len("Union["):-1], ",") for term in _text_terms(arg)]
        else:
            out.append("None" if part == "NoneType" else part)
    return out


def _split_top(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside brackets: "dict[str, Any] | None" -> ["dict[str, Any]", "None"]."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if char == separator and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [part for part in parts if part]


@functools.cache
def numeric_fields(cls: type) -> dict[str, tuple[type, bool]]:
    """Field name -> (int or float, whether None is allowed), for the fields declared ``int``/``float``, optionally
    ``| None`` (see :func:`declared_annotations` for why the declaration, not ``Field.type``)."""
    out: dict[str, tuple[type, bool]] = {}
    for name, terms in field_terms(cls).items():
        bare = terms - {"None"}
        if bare in ({"int"}, {"float"}):
            out[name] = (int if bare == {"int"} else float, "None" in terms)
    return out


@functools.cache
def bool_fields(cls: type) -> tuple[str, ...]:
    """Fields declared ``bool`` or ``bool | None``."""
    return tuple(name for name, terms in field_terms(cls).items() if terms - {"None"} == {"bool"})


@functools.cache
def text_fields(cls: type) -> dict[str, tuple[bool, bool]]:
    """Fields declared ``str``, optionally ``| None`` and ``| Literal[False]`` -> (None allowed, False allowed)."""
    return {name: ("None" in terms, "Literal[False]" in terms) for name, terms in field_terms(cls).items()
            if terms - {"None", "Literal[False]"} == {"str"}}


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
