"""``trainwell report RUN [RUN ...]``: plots and a summary from ``trainer_state.json`` files.

One run: PNGs, ``index.html`` and ``summary.txt`` in ``RUN/report/`` (or ``--out``). Several runs: one
comparison plot and page in ``--out`` (default ``./trainwell-comparison``). A hyperparameter search's
``output_dir`` (no run of its own, one ``run-*`` folder per trial) compares its trials, in ``OUTPUT_DIR/report/``
by default. The work is done by
``trainwell.report``; this module only parses and prints.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="OUTPUT_DIR",
                        help="a run's output_dir (finished or still running), a checkpoint, or a trainer_state.json")
    parser.add_argument("--out", default=None,
                        help="where to write (default: OUTPUT_DIR/report, or ./trainwell-comparison for several runs)")


def run(ns: argparse.Namespace) -> int:
    import os

    from trainwell.report import write_comparison, write_report
    from trainwell.report.history import expand_search_folders

    runs = expand_search_folders(ns.runs)
    if len(runs) == 1:
        report = write_report(runs[0], ns.out)
    else:
        search = len(ns.runs) == 1  # one folder holding a search's trials: the comparison goes inside it
        default = os.path.join(ns.runs[0], "report") if search else "trainwell-comparison"
        report = write_comparison(runs, ns.out or default)
    print(report.text)
    if report.note:
        print(f"\nnote: {report.note}")
    print(f"\nreport: {report.html}")
    for image in report.images:
        print(f"  plot: {image}")
    return 0
