"""The ``trainwell`` command: ``demo``, ``train``, ``predict``, ``report`` and ``env`` subcommands.

Owns the argument parsing of the command line and how errors reach the user (one line naming the problem;
``TRAINWELL_DEBUG=1`` shows the traceback). Each subcommand lives in its own module, imported only when it
runs, so ``trainwell --help`` and ``trainwell env`` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from typing import Any

# subcommand -> (module, one-line help). Each module has add_arguments(parser) and run(namespace) -> int.
_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("trainwell.cli.demo", "train a small byte-level transformer on Python's own sources (no downloads)"),
    "train": ("trainwell.cli.train", "train from a YAML/JSON config: trainwell train CONFIG.yaml [--key value ...]"),
    "predict": ("trainwell.cli.predict", "use a model trained with a task: trainwell predict RUN 'a text' (or "
                                         "--data FILE, or stdin)"),
    "report": ("trainwell.cli.report", "plots and a summary of one run, or a comparison of several"),
    "env": ("trainwell.cli.env", "versions and devices, for bug reports"),
}


class CliError(Exception):
    """A problem with what the user asked for: printed as one line, exit status 2."""


def no_cuda_message(flag: str) -> str:
    """Why ``flag`` (``--device cuda``) cannot be honoured, and the fix: a CPU-only build of torch cannot use a GPU
    at all (install a CUDA build), while a CUDA build that sees no GPU needs a visible device."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (f"{flag}: this torch ({torch.__version__}) is a CPU-only build: it cannot use a GPU. Install a CUDA "
                "build of torch (the command for your CUDA version is on https://pytorch.org/get-started/locally/, "
                "e.g. pip install torch --index-url https://download.pytorch.org/whl/cu128), or use --device cpu.")
    return (f"{flag}: torch {torch.__version__} (built for CUDA {torch.version.cuda or torch.version.hip}) sees no "
            "GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device auto or cpu.")


def own_command() -> str:
    """How to run this ``trainwell`` again, as pasted into a shell (another terminal may not have the venv
    activated): ``trainwell`` when that name on the ``PATH`` is this very program outside an activated venv;
    else the path of the running program, relative to the current folder when inside it (``.venv/bin/trainwell``,
    as the README writes it); ``PYTHON -m trainwell`` when it runs as a module or from Python."""
    program = sys.argv[0] if sys.argv else ""
    if os.path.basename(program) == "trainwell" and os.path.isfile(program):
        found = shutil.which("trainwell")
        if found and os.path.samefile(found, program) and not os.environ.get("VIRTUAL_ENV"):
            return "trainwell"
        return _as_typed(program)
    return f"{_as_typed(sys.executable)} -m trainwell"


def _as_typed(path: str) -> str:
    """``path`` relative to the current folder when inside it (``.venv/bin/x``), else absolute; shell-quoted."""
    full = os.path.abspath(path)
    relative = os.path.relpath(full)
    typed = relative if not relative.startswith(os.pardir) else full
    return shlex.quote(typed if os.sep in typed else os.path.join(os.curdir, typed))


def live_report_to(report_to: Any) -> list[str]:
    """``report_to`` as given (a name, names, "none"), checked, with ``"live"`` added: the runs of ``trainwell
    demo`` and ``trainwell train`` write their live log for ``trainwell report --watch``, which a plain script
    asks for by that name."""
    from trainwell.args.normalize import normalize_report_to
    from trainwell.args.trackers import with_live_log

    return with_live_log(normalize_report_to(report_to))


def interrupted_report(output_dir: str) -> None:
    """Ctrl-C during training: the run's report so far (from its newest checkpoint and its live log), or the
    command that writes it when it cannot be written now."""
    from trainwell.report import write_report

    try:
        report = write_report(output_dir)
    except (OSError, ValueError) as err:
        print(f"the run report was not written ({err}); `{own_command()} report {shlex.quote(str(output_dir))}` writes "
              "it.")
        return
    print(f"the run report so far: {report.html}" + (f" ({report.note})" if report.note else ""))


def compact_console(trainer: Any) -> None:
    """One short line per log on the console (``trainwell.events.progress.compact_log``) for a run the command
    line starts: its progress or printer callback is switched to ``compact``. Only the command line does this; a
    ``Trainer`` made in Python prints the reference's log dicts, as its users expect."""
    from trainwell.events.progress import PrinterCallback, ProgressCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, (ProgressCallback, PrinterCallback)):
            callback.compact = True


def build_parser() -> argparse.ArgumentParser:
    from trainwell import __version__

    parser = argparse.ArgumentParser(
        prog="trainwell", description="trainwell: the Hugging Face Trainer API on torch + accelerate.",
    )
    parser.add_argument("--version", action="version", version=f"trainwell {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in _COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    namespace, unknown = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if unknown:  # a subcommand may say how its arguments go (``train``: the config file comes first)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}" + getattr(namespace, "_usage_hint", ""))
    if namespace.command is None:
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(namespace._module).run(namespace) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `trainwell report ... | head` closed the pipe: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that flushing stdout at exit does not fail again
        return 0
    except (CliError, ValueError, FileNotFoundError, ImportError, NotImplementedError) as err:
        if os.environ.get("TRAINWELL_DEBUG"):
            raise
        print(f"trainwell {namespace.command}: error: {err}", file=sys.stderr)
        print("(set TRAINWELL_DEBUG=1 to see the traceback)", file=sys.stderr)
        return 2


__all__ = ["CliError", "build_parser", "compact_console", "interrupted_report", "main", "no_cuda_message"]
