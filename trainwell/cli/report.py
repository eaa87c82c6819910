"""``trainwell report RUN [RUN ...]``: plots and a summary from ``trainer_state.json`` files.

One run: PNGs, ``index.html`` and ``summary.txt`` in ``RUN/report/`` (or ``--out``). Several runs: one
comparison plot and page in ``--out`` (default ``./trainwell-comparison``). The work is done by
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
    from trainwell.report import write_comparison, write_report

    if len(ns.runs) == 1:
        report = write_report(ns.runs[0], ns.out)
    else:
        report = write_comparison(ns.runs, ns.out or "trainwell-comparison")
    print(report.text)
    if report.note:
        print(f"\nnote: {report.note}")
    print(f"\nreport: {report.html}")
    for image in report.images:
        print(f"  plot: {image}")
    return 0
