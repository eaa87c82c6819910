"""``trainwell report RUN [RUN ...]``: plots and a summary from ``trainer_state.json`` files.

One run: PNGs, ``index.html`` and ``summary.txt`` in ``RUN/report/`` (or ``--out``). Several runs: one
comparison plot and page in ``--out`` (default ``./trainwell-comparison``). A hyperparameter search's
``output_dir`` (no run of its own, one ``run-*`` folder per trial) compares its trials, in ``OUTPUT_DIR/report/``
by default. ``--x`` picks the x axis (step, epoch, tokens, time) and ``--smooth`` the train loss's smoothing.
The work is done by ``trainwell.report``; this module only parses and prints.
"""

from __future__ import annotations

import argparse
import os

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
                             "(needs include_num_input_tokens_seen) or training time (--watch: the page's first "
                             "choice, changed on the page; time is the wall clock of the live log)")
    parser.add_argument("--smooth", default=None, type=_weight, metavar="WEIGHT",
                        help="train loss smoothing: exponential-average weight in [0, 1) drawn over the faint raw "
                             "curve; 0 turns it off (default: auto, from the number of points)")
    parser.add_argument("--watch", action="store_true",
                        help="serve a live page on localhost that follows the runs while they train (reads only "
                             "the run folders; writes nothing); Ctrl-C stops it")
    parser.add_argument("--port", type=int, default=0, metavar="N",
                        help="--watch: the port on 127.0.0.1 (default: a free one, printed)")
    parser.add_argument("--token", default=None, metavar="TOKEN",
                        help="--watch: the token the page and its data require, 16 to 200 letters, digits or . _ ~ - "
                             "(default: a random one, in the printed address; a token given here is visible to "
                             "other accounts in the process list)")


def run(ns: argparse.Namespace) -> int:
    import os

    from trainwell.cli import CliError

    ns.runs = [_local_run(path) for path in ns.runs]
    if ns.watch:
        return _watch(ns)
    if ns.port or ns.token is not None:
        given = f"--port {ns.port}" if ns.port else "--token"
        raise CliError(f"{given} is for --watch (the live page); a written report needs none.")
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


def _local_run(path: str) -> str:
    """A run's folder; for an object-store ``output_dir`` URL, its staging folder here (where the run's logs, live
    log and ``trainer_state.json`` are: the store holds its checkpoints only)."""
    from trainwell.args.storage import is_url, staging_dir_for
    from trainwell.cli import CliError

    if not is_url(path):
        return path
    staging = staging_dir_for(path)
    if os.path.isdir(staging):
        return staging
    raise CliError(f"{path} is an object store: trainwell report reads a run's local folder. A run whose output_dir "
                   "is a URL keeps its logs, live log and trainer_state.json in its staging folder (output_staging_dir;"
                   f" by default {staging} under the folder it ran in): pass that folder.")


def _watch(ns: argparse.Namespace) -> int:
    """Serve the live page until Ctrl-C (``trainwell.report.watch``)."""
    import os
    from pathlib import Path

    from trainwell.cli import CliError
    from trainwell.report.watch import watch_runs

    if ns.out is not None:
        raise CliError("--out is for a written report; the live page (--watch) writes nothing. Drop it, or run "
                       "trainwell report without --watch.")
    if not 0 <= ns.port <= 65535:
        raise CliError(f"--port {ns.port}: pass a port number from 1 to 65535 (or 0 for a free one).")
    if ns.token is not None:
        from trainwell.report.watch_server import check_token

        try:
            check_token(ns.token)
        except ValueError as err:
            raise CliError(str(err)) from None
    for path in ns.runs:
        if not os.path.exists(path):  # named before its run starts: the page waits for the folder
            print(f"{path}: no such folder yet (in {os.getcwd()}): the page waits for it to be created.", flush=True)
    paths = [Path(p) for p in ns.runs]
    names = [p.resolve().name or str(p) for p in paths]
    if len(set(names)) < len(names):
        names = [str(p) for p in paths]
    try:
        server = watch_runs([str(p) for p in paths], names, port=ns.port, smoothing=ns.smooth, token=ns.token,
                            x=ns.x)
    except OSError as err:
        raise CliError(f"cannot listen on 127.0.0.1:{ns.port} ({err.strerror or err}): pass another --port, or "
                       "--port 0 for a free one.") from None
    print(f"watching {', '.join(names)}: open {server.url} in a browser (it follows the run folders; a new log "
          "shows within about two seconds; the address holds the page's token: share it with no one). Ctrl-C stops.",
          flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        print("\nstopped watching.")
    finally:
        server.watcher.stop()
        server.server_close()
    return 0
