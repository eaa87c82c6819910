"""Run reports: plots and a summary of a run from its ``trainer_state.json`` (trainwell's or the reference's).

``write_report(run_dir)`` writes ``<run_dir>/report/`` (PNG per figure, ``index.html`` with everything
inlined, ``summary.txt``); ``write_comparison(run_dirs, out)`` writes one plot and page comparing runs.
A report writes only into its own folder and never through a symbolic link (``trainwell.report.files``): each
file is written to a temporary name beside it and renamed into place, which replaces a link of that name instead
of following it, and a default ``report/`` folder that is itself a link is refused (``UnsafePathError``).
Plots need matplotlib (``pip install 'trainwell[report]'``); without it the page and summary are still
written, with a note saying what to install. Nothing here is imported by ``import trainwell``.

The parts: ``history`` reads a run (``sessions`` tells the ``train()`` calls of a resumed run apart,
``run_info`` finds its hyperparameters), ``curves`` computes x axes and smoothing, ``tables`` the rows of the
tables, ``plots`` draws and ``page`` writes the HTML.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trainwell.report import page
from trainwell.report.curves import AXES, AxisError, build_axis, shared_axes
from trainwell.report.files import report_folder
from trainwell.report.history import RunHistory, load_run, summary, summary_text
from trainwell.report.incidents import incidents
from trainwell.report.plots import matplotlib_available
from trainwell.report.tables import comparison_rows, info_rows, session_rows, text_table
from trainwell.utils.safe_files import UnsafePathError

__all__ = ["AXES", "AxisError", "Report", "RunHistory", "UnsafePathError", "load_run", "summary", "summary_text",
           "write_comparison", "write_report"]

_NO_MATPLOTLIB = "Plots were skipped: matplotlib is not installed (pip install 'trainwell[report]')."


@dataclass
class Report:
    """What a report wrote: the folder, the HTML page, the PNGs, the text summary and any note."""

    out_dir: Path
    html: Path
    images: list[Path] = field(default_factory=list)
    text: str = ""
    note: str | None = None


def write_report(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None,
                 name: str | None = None, x: str = "step", smoothing: float | None = None) -> Report:
    """Report on one run (a finished or running ``output_dir``, a checkpoint, or a state file).

    ``out_dir`` defaults to ``<run folder>/report``, which must not be a symbolic link (``UnsafePathError``, a
    ``ValueError``); an ``out_dir`` passed here is used as named. Files there with the same names are replaced,
    a link among them replaced by the file, never followed. ``x`` is the plots' x axis (``step``, ``epoch``,
    ``tokens`` or ``time``): ``AxisError`` (a ``ValueError`` saying what the history lacks) before anything is
    written when the run cannot give it. ``smoothing`` is the train loss's exponential-average weight in
    [0, 1) (None: chosen from the number of points; 0: none).
    """
    run = load_run(run_dir, name=name)
    build_axis(run, x)  # fail before writing anything
    target = out_dir if out_dir is not None else Path(run.run_dir) / "report"
    with report_folder(target, named_by_user=out_dir is not None) as out:
        images, note = [], None
        if matplotlib_available():
            from trainwell.report.plots import plot_run

            images = plot_run(run, out, x=x, smoothing=smoothing)
        else:
            note = _NO_MATPLOTLIB
        head = summary(run)
        text = summary_text(run, head)
        out.write_text("summary.txt", text + "\n")
        tables = [("Sessions", page.rows_table(session_rows(run)) if len(run.sessions) > 1 or incidents(run)
                   else ""),
                  ("Hyperparameters", page.key_value_table(run.info) if run.info else "")]
        html_path = out.write_text("index.html", page.render(
            f"trainwell run report: {run.name}", [head], images, note, run.log, tables=tables))
    return Report(out.path, html_path, images, text, note)


def write_comparison(run_dirs: list[str | os.PathLike[str]], out_dir: str | os.PathLike[str], x: str = "step",
                     smoothing: float | None = None, default_out: bool = False) -> Report:
    """One comparison plot (``comparison.png``) and page (``index.html``) for several runs, in ``out_dir``:
    the runs' curves on shared axes, a table of final and best metrics per run, their hyperparameters side by
    side (the differing ones marked), then each run's summary. ``x`` and ``smoothing`` as in ``write_report``.
    ``default_out``: ``out_dir`` is a default the caller chose (the command line's ``SEARCH/report``), so it
    must not be a symbolic link, as ``write_report``'s default; files are written as there.

    Runs are named after their folders; when two folders share a name, their full paths are used.
    """
    paths = [Path(p) for p in run_dirs]
    names = [p.name for p in paths]
    if len(set(names)) < len(names):
        names = [str(p) for p in paths]
    runs = [load_run(p, name=n) for p, n in zip(paths, names)]
    shared_axes(runs, x)  # fail before writing anything
    with report_folder(out_dir, named_by_user=not default_out) as out:
        images, note = [], None
        if matplotlib_available():
            from trainwell.report.plots import plot_comparison

            images = [plot_comparison(runs, out, x=x, smoothing=smoothing)]
        else:
            note = _NO_MATPLOTLIB
        rows, (params, differing) = comparison_rows(runs), info_rows(runs)
        text = "runs:\n" + text_table(rows)
        if params:
            text += "\n\nhyperparameters:\n" + text_table(params)
        heads = [summary(r) for r in runs]
        text += "".join(f"\n\n{summary_text(r, head)}" for r, head in zip(runs, heads))
        out.write_text("summary.txt", text + "\n")
        tables = [("Final and best metrics", page.rows_table(rows)),
                  ("Hyperparameters", page.rows_table(params, highlight=differing))]
        details = [(f"Run: {r.name}", page.key_value_table(head)) for r, head in zip(runs, heads)]
        html_path = out.write_text("index.html", page.render("trainwell run comparison", [], images, note,
                                                             tables=tables, details=details))
    return Report(out.path, html_path, images, text, note)

