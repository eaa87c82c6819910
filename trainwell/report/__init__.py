"""Run reports: plots and a summary of a run from its ``trainer_state.json`` (trainwell's or the reference's).

``write_report(run_dir)`` writes ``<run_dir>/report/`` (PNG per figure, ``index.html`` with everything
inlined, ``summary.txt``); ``write_comparison(run_dirs, out)`` writes one plot and page comparing runs.
Plots need matplotlib (``pip install 'trainwell[report]'``); without it the page and summary are still
written, with a note saying what to install. Nothing here is imported by ``import trainwell``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trainwell.report import page
from trainwell.report.history import RunHistory, load_run, summary, summary_text
from trainwell.report.plots import matplotlib_available

__all__ = ["Report", "RunHistory", "load_run", "summary", "summary_text", "write_comparison", "write_report"]

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
                 name: str | None = None) -> Report:
    """Report on one run (a finished or running ``output_dir``, a checkpoint, or a state file).

    ``out_dir`` defaults to ``<run folder>/report``. Files there with the same names are replaced.
    """
    run = load_run(run_dir, name=name)
    out = Path(out_dir) if out_dir is not None else Path(run.run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    images, note = [], None
    if matplotlib_available():
        from trainwell.report.plots import plot_run

        images = plot_run(run, out)
    else:
        note = _NO_MATPLOTLIB
    text = summary_text(run)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    html_path = out / "index.html"
    html_path.write_text(
        page.render(f"trainwell run report: {run.name}", [summary(run)], images, note, run.state["log_history"]),
        encoding="utf-8",
    )
    return Report(out, html_path, images, text, note)


def write_comparison(run_dirs: list[str | os.PathLike[str]], out_dir: str | os.PathLike[str]) -> Report:
    """One comparison plot (``comparison.png``) and page (``index.html``) for several runs, in ``out_dir``.

    Runs are named after their folders; when two folders share a name, their full paths are used.
    """
    paths = [Path(p) for p in run_dirs]
    names = [p.name for p in paths]
    if len(set(names)) < len(names):
        names = [str(p) for p in paths]
    runs = [load_run(p, name=n) for p, n in zip(paths, names)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images, note = [], None
    if matplotlib_available():
        from trainwell.report.plots import plot_comparison

        images = [plot_comparison(runs, out)]
    else:
        note = _NO_MATPLOTLIB
    text = "\n\n".join(summary_text(r) for r in runs)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    html_path = out / "index.html"
    html_path.write_text(page.render("trainwell run comparison", [summary(r) for r in runs], images, note),
                         encoding="utf-8")
    return Report(out, html_path, images, text, note)
