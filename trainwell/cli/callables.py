"""Which callables a ``trainwell train`` config may name: the rules ``trainwell.cli.build`` checks at start-up.

A config names code by reference (``package.module:attribute``), so it can name anything importable. Two rules
keep a slip or a borrowed config from calling what it should not, before anything is built:

- **No factory runs programs or code.** A reference to a function of a module that runs commands, evaluates
  code or deletes files (``os:system``, ``subprocess:run``, ``builtins:eval``, ``shutil:rmtree``, ...:
  ``_RUNS_CODE``) is refused in every section; ``json:loads`` as a data factory stays allowed.
- **``compute_metrics`` is a metrics function**: a Python function (or callable object) that can be called with
  one ``EvalPrediction`` (and ``compute_result=`` under ``batch_eval_metrics``), defined outside Python's
  standard library (no stdlib or builtin function computes metrics from an ``EvalPrediction``). With
  ``{factory: ..., kwargs: ...}`` the factory obeys the same origin rule, and what it returns is checked too.

Errors name the config key, the reference and what to write instead.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from trainwell.cli import CliError

# Top-level modules whose functions run programs, evaluate code, load code or delete files.
# (``builtins`` holds eval, exec and __import__; ``io`` open, which truncates a file opened for writing.)
_RUNS_CODE = frozenset(
    {
        "os",
        "posix",
        "nt",
        "subprocess",
        "_posixsubprocess",
        "builtins",
        "io",
        "_io",
        "shutil",
        "pty",
        "runpy",
        "code",
        "codeop",
        "importlib",
        "ctypes",
        "pickle",
        "_pickle",
        "marshal",
        "multiprocessing",
        "webbrowser",
        "pdb",
        "sys",
    }
)
_EXAMPLE = "compute_metrics: ./metrics.py:accuracy (a def accuracy(eval_pred) -> dict of yours)"


def origin(obj: Any) -> str:
    """The top-level module ``obj`` was defined in (a module's: its own name; a bound method's: that of its
    object; a callable object's: that of its class); ``builtins`` when none is recorded."""
    if inspect.ismodule(obj):
        return obj.__name__.partition(".")[0]
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj):
        module = getattr(obj, "__module__", None)
        if module is None and getattr(obj, "__self__", None) is not None:
            return origin(obj.__self__) if not inspect.ismodule(obj.__self__) else obj.__self__.__name__
    else:
        module = type(obj).__module__
    return (module or "builtins").partition(".")[0]


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__


def check_origin(obj: Any, what: str, reference: str) -> None:
    """``CliError`` when ``obj`` is a callable from a module of ``_RUNS_CODE`` (any config section; what is not
    callable fails its own check)."""
    module = origin(obj)
    if callable(obj) and module in _RUNS_CODE:
        raise CliError(
            f"{what}: {reference!r} is {module}.{_name(obj)}, which runs programs, evaluates code or "
            f"changes files: a config's {what} may not name it. Name a function of your own project "
            "(package.module:function or ./file.py:function)."
        )


def check_metrics_origin(obj: Any, what: str, reference: str) -> None:
    """``CliError`` when ``obj`` (a metrics function or its factory) is from Python's standard library or is a
    built-in (C) function: none of them computes metrics from an ``EvalPrediction``."""
    check_origin(obj, what, reference)
    module = origin(obj)
    if module in sys.stdlib_module_names or inspect.isbuiltin(obj):
        kind = "Python's standard library" if module in sys.stdlib_module_names else "a built-in (C) function"
        raise CliError(
            f"{what}: {reference!r} is {module}.{_name(obj)}, from {kind}, not a metrics function. "
            f"Name a function taking an EvalPrediction and returning a dict of numbers, e.g. {_EXAMPLE}."
        )


def check_metrics_function(obj: Any, what: str, reference: str) -> None:
    """``CliError`` unless ``obj`` is a metrics function (see the module docstring): callable, not a class, not
    from the standard library or a builtin, and callable with one positional argument (the ``EvalPrediction``),
    alone or with ``compute_result=``."""
    if not callable(obj):
        raise CliError(
            f"{what}: {reference!r} is a {type(obj).__name__}, not a function. Name a function taking "
            f"an EvalPrediction, e.g. {_EXAMPLE}."
        )
    check_metrics_origin(obj, what, reference)
    if inspect.isclass(obj):
        raise CliError(
            f"{what}: {reference!r} is a class: calling it with an EvalPrediction would build an object, "
            f"not metrics. Name a function, or build one: {{factory: {reference}, kwargs: {{...}}}} "
            "returns an instance with a __call__(eval_pred)."
        )
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return  # a callable whose parameters Python cannot read (a C extension type's instance): the call tells
    if not any(_binds(signature, kwargs) for kwargs in ({}, {"compute_result": True})):
        shown = ", ".join(str(p) for p in signature.parameters.values()) or "no parameters"
        raise CliError(
            f"{what}: {reference!r} takes ({shown}), but a metrics function is called with one "
            "EvalPrediction (and compute_result=True/False under batch_eval_metrics). Wrap it: "
            "def metrics(eval_pred): return {...}."
        )


def _binds(signature: inspect.Signature, kwargs: dict[str, Any]) -> bool:
    try:
        signature.bind(object(), **kwargs)
    except TypeError:
        return False
    return True


__all__ = ["check_metrics_function", "check_metrics_origin", "check_origin", "origin"]
