"""``trainwell report RUN [RUN ...]``: plots and a summary from ``trainer_state.json`` files.

One run: PNGs, ``index.html`` and ``summary.txt`` in ``RUN/report/`` (or ``--out``). Several runs: one
comparison plot and page in ``--out`` (default ``./trainwell-comparison``). A hyperparameter search's
``output_dir`` (no run of its own, one ``run-*`` folder per trial) compares its trials, in ``OUTPUT_DIR/report/``
by default. ``--x`` picks the x axis (step, epoch, tokens, time) and ``--smooth`` the train loss's smoothing.
The work is done by ``trainwell.report``; this module only parses and prints.
"""

from __future__ import annotations

import argparse

_AXES = ("step", "epoch", "tokens", "time")  # trainwell.report.AXES, without importing it for --help


def _weight(text: str) -> float | None:
    """``--smooth``: ``auto`` (None) or a weight in [0, 1)."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: pass auto, or a number in [0, 1) such as 0.9") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text}: pass a number in [0, 1) (0: no smoothing), or auto")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="OUTPUT_DIR",
                        help="a run's output_dir (finished or still running), a checkpoint, or a trainer_state.json")
    parser.add_argument("--out", default=None,
                        help="where to write (default: OUTPUT_DIR/report, or ./trainwell-comparison for several runs)")
    parser.add_argument("--x", default="step", choices=_AXES,
                        help="x axis of the plots: optimizer step (default), epoch, input tokens seen "
                             "(needs include_num_input_tokens_seen) or training time")
    parser.add_argument("--smooth", default=None, type=_weight, metavar="WEIGHT",
                        help="train loss smoothing: exponential-average weight in [0, 1) drawn over the faint raw "
                             "curve; 0 turns it off (default: auto, from the number of points)")


def run(ns: argparse.Namespace) -> int:
    import os

    from trainwell.cli import CliError
    from trainwell.report import write_comparison, write_report
    from trainwell.report.history import expand_search_folders

    try:
        runs = expand_search_folders(ns.runs)
        if len(runs) == 1:
            report = write_report(runs[0], ns.out, x=ns.x, smoothing=ns.smooth)
        else:
            search = len(ns.runs) == 1  # one folder holding a search's trials: the comparison goes inside it
            default = os.path.join(ns.runs[0], "report") if search else "trainwell-comparison"
            report = write_comparison(runs, ns.out or default, x=ns.x, smoothing=ns.smooth,
                                      default_out=ns.out is None)
    except OSError as err:
        if isinstance(err, FileNotFoundError):
            raise  # already one line, saying where it looked
        where = f" {err.filename}" if err.filename else ""
        raise CliError(f"cannot read or write{where}: {err.strerror or err}. Check the folder's permissions and "
                       "free space, or pass --out to write elsewhere.") from None
    print(report.text)
    if report.note:
        print(f"\nnote: {report.note}")
    print(f"\nreport: {report.html}")
    for image in report.images:
        print(f"  plot: {image}")
    return 0
