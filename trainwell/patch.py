"""``python -m trainwell.patch -m MODULE [ARGS ...]``: a library's own command-line script, run on trainwell.

A packaged script such as TRL's ``trl.scripts.sft`` imports the library, which subclasses the reference's Trainer
as it is imported; the user cannot add ``trainwell.patch_transformers()`` before that import without editing the
library. This runner calls it first, then runs the module as ``__main__`` with the arguments that follow, exactly
as ``python -m MODULE ARGS ...`` would (``sys.argv``, ``sys.path`` and ``__main__`` as Python sets them)::

    python -m trainwell.patch -m trl.scripts.sft --model_name_or_path ... --use_peft ...
    python -m trainwell.patch train.py --output_dir out ...        # a script file
    torchrun --nproc-per-node 2 -m trainwell.patch -m trl.scripts.dpo ...

Exit status: the script's own, or 2 when the module or script does not exist (with a line that says so).
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys

USAGE = """usage: python -m trainwell.patch -m MODULE [ARGS ...]
       python -m trainwell.patch SCRIPT.py [ARGS ...]

Runs a script written for transformers' Trainer (a library's packaged command line such as trl.scripts.sft, or
your own file) with trainwell.patch_transformers() called first, so every Trainer, TrainingArguments and
callback the script and its libraries build is trainwell's. ARGS go to the script unchanged."""


def main(argv: list[str] | None = None) -> int:
    """Run the script ``argv`` names (``sys.argv[1:]`` by default) on trainwell; the script's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    target, rest, as_module = _target(argv)
    if target is None:
        print(f"trainwell.patch: -m needs a module name.\n{USAGE}", file=sys.stderr)
        return 2
    # a script, or a module whose top-level package is not even there, is checked without importing anything (the
    # patch imports the reference's Trainer: seconds); a module's own lookup waits for the patch (below)
    missing = _missing(target.split(".")[0], True, report=target) if as_module else _missing(target, as_module)
    if missing is None:
        from trainwell.integrations.underneath import patch_transformers

        # first: before the script, or looking the module up (which imports its parent packages), imports the library
        patch_transformers()
        missing = _missing(target, as_module)
    if missing:
        print(f"trainwell.patch: {missing}", file=sys.stderr)
        return 2
    sys.argv = [target, *rest]  # run_module replaces argv[0] with the module's file, as `python -m` does
    if as_module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python SCRIPT.py` sets it
        runpy.run_path(target, run_name="__main__")
    return 0


def _target(argv: list[str]) -> tuple[str | None, list[str], bool]:
    """(module or script, its arguments, whether a module), from ``-m MODULE ...``, ``-mMODULE ...`` or ``FILE ...``."""
    first = argv[0]
    if first == "-m":
        return (argv[1], argv[2:], True) if len(argv) > 1 else (None, [], True)
    if first.startswith("-m"):
        return first[2:], argv[1:], True
    return first, argv[1:], False


def _missing(target: str, as_module: bool, report: str | None = None) -> str | None:
    """Why ``target`` cannot be run (None when it can); the message names ``report`` (default: ``target``). A
    top-level module name is looked up without importing anything; a dotted one imports its parent packages."""
    if not as_module:
        return None if os.path.isfile(target) else f"no such script: {target!r} (pass -m MODULE for a module)."
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        found = None
    if found is None:
        return f"no module named {report or target!r}: is its package installed in this Python ({sys.executable})?"
    return None


if __name__ == "__main__":
    sys.exit(main())
