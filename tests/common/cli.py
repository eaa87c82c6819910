"""Running the ``trainwell`` command in-process for the CLI tests."""

from __future__ import annotations

from typing import Any


def run_cli(capsys: Any, *argv: Any) -> tuple[int, str, str]:
    """``trainwell ARGV...`` through ``trainwell.cli.main``: (exit code, stdout, stderr)."""
    from trainwell.cli import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
