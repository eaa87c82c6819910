"""Build dataclass instances (``TrainingArguments`` and your own) from a command line, a dict, JSON or YAML.

Owns: :class:`TrainwellArgumentParser` (also exported as ``HfArgumentParser``, the reference's name), the
mapping from a field's type hint to an ``argparse`` argument, and the 4.x alias options on the command line.
Turning the parsed values into canonical ones is left to the dataclass itself (``__post_init__``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from trainwell.args.aliases import ALIASES, AliasInitMeta
from trainwell.args.fields import declared_annotations, string_to_bool
from trainwell.utils.errors import choice_error, did_you_mean

_ALIAS_DEST = "trainwell_alias__"  # namespace prefix of the 4.x option names
_CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def HfArg(  # noqa: N802  (the reference's name)
    *, aliases: str | list[str] | None = None, help: str | None = None, default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING, metadata: dict | None = None, **kwargs: Any,
) -> dataclasses.Field:
    """A dataclass field with command-line ``aliases`` and ``help`` for :class:`HfArgumentParser`."""
    metadata = dict(metadata or {})
    if aliases is not None:
        metadata["aliases"] = aliases
    if help is not None:
        metadata["help"] = help
    return dataclasses.field(metadata=metadata, default=default, default_factory=default_factory, **kwargs)


def _choice_type(name: str, choices: Sequence[Any]) -> Callable[[str], Any]:
    by_text = {str(c): c for c in choices}

    def convert(text: str) -> Any:
        if text in by_text:
            return by_text[text]
        raise argparse.ArgumentTypeError(str(choice_error(name, text, by_text)))

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def _literal_or_str(literals: Sequence[Any]) -> Callable[[str], Any]:
    by_text = {str(v).lower(): v for v in literals}
    return lambda text: by_text.get(text.lower(), text)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({err.msg})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


class _OneOrMany(argparse.Action):
    """``nargs="+"`` for a ``str | list[str]`` field: one value stays a str (``--optim_target_modules all-linear``)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values[0] if len(values) == 1 else list(values))


def _members(hint: Any) -> list[Any]:
    if get_origin(hint) is Union or isinstance(hint, types.UnionType):
        return [m for m in get_args(hint) if m is not type(None)]
    return [hint]


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default.value if isinstance(f.default, Enum) else f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _typed_kwargs(name: str, hint: Any) -> dict[str, Any]:
    """The ``type``/``nargs``/``choices`` part of ``add_argument`` for one type hint."""
    members = _members(hint)
    enums = [m for m in members if isinstance(m, type) and issubclass(m, Enum)]
    literals = [v for m in members if get_origin(m) is Literal for v in get_args(m)]
    if enums:
        choices = [e.value for e in enums[0]]
        return {"type": _choice_type(name, choices), "choices": choices, "metavar": "{" + ",".join(choices) + "}"}
    if literals and len(literals) == len(members):
        return {"type": _choice_type(name, literals), "choices": literals}
    if members == [bool]:
        return {"type": string_to_bool, "nargs": "?", "const": True, "metavar": "BOOL"}
    lists = [m for m in members if get_origin(m) is list]
    if lists:
        item = (get_args(lists[0]) or (str,))[0]
        kwargs: dict[str, Any] = {"nargs": "+", "type": item if item in (int, float) else str}
        return {**kwargs, "action": _OneOrMany} if str in members else kwargs
    if str in members:
        return {"type": _literal_or_str(literals)} if literals else {"type": str}
    if any(m is dict or get_origin(m) is dict for m in members):
        return {"type": _json_object, "metavar": "JSON"}
    simple = [m for m in members if m in (int, float)]
    return {"type": simple[0] if simple else str}


def _field_arguments(f: dataclasses.Field, hint: Any) -> list[tuple[list[str], dict[str, Any]]]:
    """``(option strings, add_argument kwargs)`` for one field: the option, plus ``--no_<name>`` when needed."""
    names = [f"--{f.name}"] + ([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])
    meta = dict(f.metadata)
    aliases = meta.pop("aliases", [])
    names += [aliases] if isinstance(aliases, str) else list(aliases)
    help_text = str(meta.pop("help", "")).replace("%", "%%")  # argparse treats % as formatting
    kwargs = {**_typed_kwargs(f.name, hint), **meta, "help": help_text}
    if "choices" in meta:
        kwargs["type"] = _choice_type(f.name, meta["choices"])
    default = _field_default(f)
    if default is dataclasses.MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = default
    arguments = [(names, kwargs)]
    if default is True and kwargs.get("type") is string_to_bool:
        negated = [f"--no_{f.name}", f"--no-{f.name.replace('_', '-')}"]
        arguments.append((negated, {"action": "store_false", "dest": f.name, "default": argparse.SUPPRESS,
                                    "help": f"Set {f.name} to False."}))
    return arguments


def _alias_arguments(taken: Iterable[str]) -> list[tuple[list[str], dict[str, Any]]]:
    """Hidden options for the 4.x names; their values go to the dataclass, which maps them."""
    out = []
    for alias in ALIASES:
        option = f"--{alias.old}"
        if option in taken:
            continue
        kwargs: dict[str, Any] = {"dest": _ALIAS_DEST + alias.old, "default": argparse.SUPPRESS,
                                  "help": argparse.SUPPRESS}
        if alias.cli is bool:
            kwargs.update(type=string_to_bool, nargs="?", const=True)
        else:
            kwargs["type"] = alias.cli
        out.append(([option, option.replace("_", "-")], kwargs))
    return out


def _resolve_hints(dtype: type) -> dict[str, Any]:
    try:
        return get_type_hints(dtype)
    except NameError:
        # A dataclass declared inside a function under `from __future__ import annotations` cannot be
        # resolved; its fields still parse, as plain strings, rather than failing the whole parser.
        # Read from the declarations, not Field.type, which the reference's parser rewrites in place.
        return {name: str if isinstance(annotation, str) else annotation
                for name, annotation in declared_annotations(dtype).items()}


class TrainwellArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose options come from the fields of one or more dataclasses.

    Each field becomes ``--name`` (and ``--kebab-name``); bools accept ``--flag``, ``--flag true/false`` and,
    when they default to True, ``--no_flag``; enums and ``Literal`` become choices; lists take several values;
    dict fields take a JSON object. For a class built on ``TrainingArguments`` the 4.x names
    (``--evaluation_strategy``, ``--warmup_ratio``, ...) are accepted too.
    """

    def __init__(self, dataclass_types: type | Iterable[type] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(**kwargs)
        if dataclass_types is None:
            dataclass_types = []
        elif isinstance(dataclass_types, type):
            dataclass_types = [dataclass_types]
        self.dataclass_types: list[type] = list(dataclass_types)
        self._alias_owner: type | None = None
        for dtype in self.dataclass_types:
            self._add_dataclass_arguments(dtype)

    def _add_dataclass_arguments(self, dtype: type) -> None:
        if not dataclasses.is_dataclass(dtype):
            raise TypeError(f"{dtype!r} is not a dataclass type; pass dataclass classes to the parser.")
        group = self.add_argument_group(dtype._argument_group_name) if hasattr(dtype, "_argument_group_name") else self
        hints = _resolve_hints(dtype)
        for f in dataclasses.fields(dtype):
            if f.init:
                for names, kwargs in _field_arguments(f, hints.get(f.name, str)):
                    group.add_argument(*names, **kwargs)
        if self._alias_owner is None and isinstance(dtype, AliasInitMeta):
            self._alias_owner = dtype
            for names, kwargs in _alias_arguments(self._option_string_actions):
                group.add_argument(*names, **kwargs)

    # --- building instances ---

    def _accepted_keys(self, dtype: type) -> set[str]:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        if dtype is self._alias_owner:
            keys |= {a.old for a in ALIASES}
        return keys

    def _instantiate(self, values: dict[str, Any]) -> tuple[list[Any], set[str]]:
        outputs, used = [], set()
        for dtype in self.dataclass_types:
            keys = self._accepted_keys(dtype)
            inputs = {k: v for k, v in values.items() if k in keys}
            used |= inputs.keys()
            outputs.append(dtype(**inputs))
        return outputs, used

    def parse_dict(self, args: dict[str, Any], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Instantiate every dataclass from one flat dict; an unknown key raises ``ValueError`` (did-you-mean)."""
        if not isinstance(args, dict):
            raise ValueError(f"expected a mapping of argument names to values, got {type(args).__name__}")
        if not allow_extra_keys:
            known = set().union(*(self._accepted_keys(d) for d in self.dataclass_types))
            unknown = sorted(k for k in args if k not in known)
            if unknown:
                raise ValueError(
                    f"unknown argument(s) {', '.join(map(repr, unknown))}: no dataclass of this parser has such a "
                    f"field.{did_you_mean(unknown[0], known)} Pass allow_extra_keys=True to ignore them."
                )
        return tuple(self._instantiate(args)[0])

    def parse_json_file(self, json_file: str | os.PathLike[str], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Instantiate every dataclass from a JSON file holding one object."""
        try:
            data = json.loads(Path(json_file).read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{os.fspath(json_file)!r} is not valid JSON: {err}") from None
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)

    def parse_yaml_file(self, yaml_file: str | os.PathLike[str], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Instantiate every dataclass from a YAML file holding one mapping (needs PyYAML). Aliases are bounded
        before anything expands them (``trainwell.utils.safe_yaml``: ``ValueError`` naming the file and key)."""
        try:
            import yaml  # noqa: F401  # deferred: only YAML users pay for it
        except ImportError:
            raise ImportError(f"reading {os.fspath(yaml_file)!r} needs PyYAML: pip install pyyaml") from None
        from trainwell.utils.safe_yaml import load_yaml

        data = load_yaml(Path(yaml_file).read_text(encoding="utf-8"), os.fspath(yaml_file))
        return self.parse_dict({} if data is None else data, allow_extra_keys=allow_extra_keys)

    def parse_config_file(self, path: str | os.PathLike[str], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """:meth:`parse_json_file` or :meth:`parse_yaml_file`, by the file's suffix."""
        if str(path).lower().endswith(".json"):
            return self.parse_json_file(path, allow_extra_keys=allow_extra_keys)
        return self.parse_yaml_file(path, allow_extra_keys=allow_extra_keys)

    # --- the command line ---

    def _read_args_files(self, args: list[str] | None, look_for_args_file: bool, args_filename: Any,
                         args_file_flag: str | None) -> list[str]:
        """Prepend options read from ``.args`` files; the command line comes last, so it wins."""
        argv = list(sys.argv[1:] if args is None else args)
        files: list[Path] = []
        if args_filename:
            files.append(Path(args_filename))
        elif look_for_args_file and sys.argv and sys.argv[0]:
            files.append(Path(sys.argv[0]).with_suffix(".args"))
        if args_file_flag:
            flag_parser = argparse.ArgumentParser(add_help=False)
            flag_parser.add_argument(args_file_flag, type=str, action="append")
            found, argv = flag_parser.parse_known_args(argv)
            files += [Path(p) for p in getattr(found, args_file_flag.lstrip("-").replace("-", "_")) or []]
        from_files = [token for path in files if path.is_file() for token in path.read_text().split()]
        return from_files + argv

    def _split_namespace(self, namespace: argparse.Namespace) -> dict[str, Any]:
        values = vars(namespace)
        out = {k: values.pop(k) for k in list(values) if any(k in self._accepted_keys(d) for d in self.dataclass_types)}
        out.update({k[len(_ALIAS_DEST):]: values.pop(k) for k in list(values) if k.startswith(_ALIAS_DEST)})
        return out

    def parse_args_into_dataclasses(
        self,
        args: Sequence[str] | None = None,
        return_remaining_strings: bool = False,
        look_for_args_file: bool = True,
        args_filename: str | os.PathLike[str] | None = None,
        args_file_flag: str | None = None,
    ) -> tuple[Any, ...]:
        """Parse a command line (default ``sys.argv[1:]``) into one instance per dataclass.

        A command line that is a single ``.json``/``.yaml``/``.yml`` path reads that file instead. Options
        from ``<script>.args``, ``args_filename`` or files named by ``args_file_flag`` come before the command
        line. Returns the instances, then a namespace of any non-dataclass options added to the parser, then
        (if ``return_remaining_strings``) the unparsed strings; otherwise unparsed strings raise ``ValueError``.
        """
        argv = list(sys.argv[1:] if args is None else args)
        if len(argv) == 1 and argv[0].lower().endswith(_CONFIG_SUFFIXES) and not argv[0].startswith("-"):
            outputs = self.parse_config_file(argv[0])
            return (*outputs, []) if return_remaining_strings else outputs
        if look_for_args_file or args_filename or args_file_flag:
            argv = self._read_args_files(argv, look_for_args_file, args_filename, args_file_flag)
        namespace, remaining = self.parse_known_args(args=argv)
        outputs, _ = self._instantiate(self._split_namespace(namespace))
        if vars(namespace):
            outputs.append(namespace)
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ValueError(self._unused_message(remaining))
        return tuple(outputs)

    def _unused_message(self, remaining: list[str]) -> str:
        options = [s for s in self._option_string_actions if s.startswith("--")]
        hints = "".join(did_you_mean(r.split("=")[0], options) for r in remaining if r.startswith("--"))
        return f"some command-line arguments were not recognized by the parser: {remaining}.{hints}"


HfArgumentParser = TrainwellArgumentParser
