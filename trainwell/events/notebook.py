"""Training progress in a notebook: an HTML progress bar and a table of the logged and evaluation metrics, both
updated in place in the cell's output, as the reference shows them there.

Owns ``NotebookProgressCallback`` (the Trainer's progress display when :func:`in_notebook`; also offered at the
reference's path ``trainwell.utils.notebook``), the bar and table it draws (``NotebookProgressBar``,
``NotebookTrainingTracker``) and :func:`in_notebook`. The console display is ``trainwell.events.progress``.
``IPython.display`` is imported only when something is drawn, so IPython is never a dependency.
"""

from __future__ import annotations

import html
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from trainwell.events.callback import TrainerCallback
from trainwell.state import TrainerControl, TrainerState

# What an evaluation row leaves out: timings and counters, not metrics.
_NOT_SHOWN = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


def in_notebook() -> bool:
    """Whether this process runs a notebook's code: a Jupyter (IPython) kernel or marimo. An IPython shell in a
    terminal is not one (tqdm's bar works there); nor is a Databricks runtime older than 11.0 (no IPython kernel)."""
    if "marimo" in sys.modules:
        return True
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    try:
        kernel = shell is not None and "IPKernelApp" in shell.config
    except (AttributeError, TypeError):
        return False
    runtime = os.environ.get("DATABRICKS_RUNTIME_VERSION")
    return kernel and not (runtime is not None and runtime < "11.0")


def format_time(seconds: float) -> str:
    """``mm:ss``, or ``h:mm:ss`` from an hour on."""
    seconds = int(seconds)
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}:{minutes:02d}:{seconds % 60:02d}" if hours else f"{minutes:02d}:{seconds % 60:02d}"


def html_progress_bar(value: int, total: int, prefix: str, label: str, width: int = 300) -> str:
    return (f"<div>{html.escape(prefix)} <progress value='{value}' max='{total}' style='width:{width}px; "
            f"height:20px; vertical-align: middle;'></progress> {html.escape(label)}</div>")


def text_to_html_table(rows: list[list[Any]]) -> str:
    """``rows[0]`` as the header, the others as cells (floats to 6 decimals)."""
    head = "".join(f"<th>{html.escape(str(name))}</th>" for name in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{_cell(value)}</td>" for value in row) + "</tr>" for row in rows[1:])
    return (f'<table border="1" class="dataframe"><thead><tr style="text-align: left;">{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _cell(value: Any) -> str:
    return f"{value:.6f}" if isinstance(value, float) else html.escape(str(value))


class _Output:
    """One display area of the cell's output, drawn once and then updated in place."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, html_code: str) -> None:
        from IPython import display  # deferred: only a notebook draws

        if self._handle is None:
            self._handle = display.display(display.HTML(html_code), display_id=True)
        else:
            self._handle.update(display.HTML(html_code))


class NotebookProgressBar:
    """A progress bar to ``total``: ``update(value)`` redraws it, at most every ``update_every`` seconds after the
    first ``warmup`` updates (drawing costs more than a tiny step), with the elapsed and remaining time and the
    rate. A bar with a ``parent`` is drawn by the parent, under its table."""

    warmup = 5
    update_every = 0.2

    def __init__(self, total: int, prefix: str | None = None, leave: bool = True, parent: Any = None,
                 width: int = 300) -> None:
        self.total, self.prefix, self.leave, self.parent, self.width = total, prefix or "", leave, parent, width
        self.value: int | None = None
        self.comment: str | None = None
        self.html_code = ""
        self._output = _Output()
        self._start: float | None = None
        self._drawn_at = 0.0
        self._draws = 0
        if "VSCODE_PID" in os.environ:
            self.update_every = 0.5  # VS Code renders HTML slowly

    def update(self, value: int, force_update: bool = False, comment: str | None = None) -> None:
        """Move to ``value`` (redrawn now if ``force_update``, else when it is time to)."""
        if comment is not None:
            self.comment = comment
        now = time.monotonic()
        if self._start is None:
            self._start, self._start_value = now, value
        elif value == self.value and not force_update:
            return
        self.value = min(value, self.total)
        due = force_update or self._draws < self.warmup or now - self._drawn_at >= self.update_every
        if due or self.value >= self.total:
            self._drawn_at, self._draws = now, self._draws + 1
            self.html_code = html_progress_bar(self.value, self.total, self.prefix, self._label(now), self.width)
            self.display()
            if self.value >= self.total and not self.leave:
                self.close()

    def _label(self, now: float) -> str:
        shown = f"{self.value:>{len(str(self.total))}}/{self.total}"
        done = self.value - self._start_value
        elapsed = now - self._start
        if done <= 0 or elapsed <= 0:
            text = f"[{shown} {format_time(elapsed)} < :"
        else:
            rate = done / elapsed
            remaining = "" if self.value >= self.total else f" < {format_time((self.total - self.value) / rate)}"
            text = f"[{shown} {format_time(elapsed)}{remaining}, {rate:.2f} it/s"
        return text + (f", {self.comment}]" if self.comment else "]")

    def display(self) -> None:
        if self.parent is not None:
            self.parent.display()
        else:
            self._output.show(self.html_code)

    def close(self) -> None:
        """Remove the bar from the output."""
        if self.parent is None and self._output._handle is not None:
            self._output.show("")


class NotebookTrainingTracker(NotebookProgressBar):
    """The training bar, the table of metrics under it (one row per step or epoch logged), and the evaluation's
    bar under the table while one runs."""

    def __init__(self, num_steps: int, column_names: list[str] | None = None) -> None:
        super().__init__(num_steps)
        self.inner_table: list[list[Any]] | None = None if column_names is None else [list(column_names)]
        self.child_bar: NotebookProgressBar | None = None

    def display(self) -> None:
        code = self.html_code
        if self.inner_table is not None and len(self.inner_table) > 1:
            code += text_to_html_table(self.inner_table)
        if self.child_bar is not None:
            code += self.child_bar.html_code
        self._output.show(code)

    def write_line(self, values: Mapping[str, Any]) -> None:
        """A row of ``values`` (keyed by column; a new key adds a column); a row for the same step (or epoch) as the
        last one completes that row instead."""
        if self.inner_table is None:
            self.inner_table = [list(values)]
        columns = self.inner_table[0]
        columns += [key for key in values if key not in columns]
        for row in self.inner_table[1:]:
            row += ["No log"] * (len(columns) - len(row))
        last = self.inner_table[-1] if len(self.inner_table) > 1 else None
        if last is not None and last[0] == values.get(columns[0]):
            self.inner_table[-1] = [values.get(name, old) for name, old in zip(columns, last)]
        else:
            self.inner_table.append([values.get(name, "No log") for name in columns])
        self.display()

    def add_child(self, total: int, prefix: str | None = None, width: int = 300) -> NotebookProgressBar:
        """A bar drawn under the table (the evaluation's)."""
        self.child_bar = NotebookProgressBar(total, prefix=prefix, parent=self, width=width)
        return self.child_bar

    def remove_child(self) -> None:
        self.child_bar = None
        self.display()


class NotebookProgressCallback(TrainerCallback):
    """Progress in a Jupyter notebook, Colab or marimo: a bar with the step, the time left and the epoch, and a
    table with a row per evaluation (training loss, validation loss, every metric) or, without evaluation, per
    logged training loss; an evaluation's own bar under the table while it runs. The Trainer uses it in place of
    ``ProgressCallback`` when :func:`in_notebook` (``disable_tqdm=True`` still prints plain logs instead).

    The metrics handed to ``on_evaluate`` are read, never changed (the reference removes the timings from the
    dict ``evaluate()`` then returns)."""

    def __init__(self) -> None:
        self.training_tracker: NotebookTrainingTracker | None = None
        self.prediction_bar: NotebookProgressBar | None = None
        self._force_next_update = False
        self._row_per_log = False

    def _first_column(self, args: Any) -> str:
        return "Epoch" if str(args.eval_strategy) in ("epoch", "IntervalStrategy.EPOCH") else "Step"

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        columns = [self._first_column(args), "Training Loss"]
        # without evaluations each logged training loss is a row; with them, their rows carry it
        self._row_per_log = str(args.eval_strategy) in ("no", "IntervalStrategy.NO")
        if not self._row_per_log:
            columns.append("Validation Loss")
        self.training_tracker = NotebookTrainingTracker(state.max_steps, columns)

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.training_tracker is None:
            return
        self.training_tracker.update(state.global_step, force_update=self._force_next_update,
                                     comment=f"Epoch {_epoch(state.epoch)}/{state.num_train_epochs}")
        self._force_next_update = False

    def on_prediction_step(self, args: Any, state: TrainerState, control: TrainerControl, eval_dataloader: Any = None,
                           **kwargs: Any) -> None:
        if not state.is_world_process_zero or not _has_length(eval_dataloader):
            return
        if self.prediction_bar is None:
            tracker = self.training_tracker
            self.prediction_bar = (tracker.add_child(len(eval_dataloader)) if tracker is not None
                                   else NotebookProgressBar(len(eval_dataloader)))
            self.prediction_bar.update(1)
        else:
            self.prediction_bar.update((self.prediction_bar.value or 0) + 1)

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
        self.prediction_bar = None

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        if self.training_tracker is not None and self._row_per_log and logs and "loss" in logs:
            self.training_tracker.write_line({"Step": state.global_step, "Training Loss": logs["loss"]})

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl,
                    metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        first = self._first_column(args)
        last_loss = next((entry["loss"] for entry in reversed(state.log_history) if "loss" in entry), "No log")
        values: dict[str, Any] = {first: int(state.epoch or 0) if first == "Epoch" else state.global_step,
                                  "Training Loss": last_loss, "Validation Loss": "No log"}
        values.update(_metric_columns(metrics or {}))
        if self.training_tracker is not None:
            self.training_tracker.write_line(values)
            self.training_tracker.remove_child()
            self._force_next_update = True  # an evaluation takes a while: redraw the bar at the next step
        else:
            _Output().show(text_to_html_table([list(values), list(values.values())]))
        self.prediction_bar = None

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.training_tracker is None:
            return
        self.training_tracker.update(state.global_step, force_update=True,
                                     comment=f"Epoch {_epoch(state.epoch)}/{state.num_train_epochs}")
        self.training_tracker = None


def _metric_columns(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``eval_loss`` -> "Validation Loss", ``eval_f1_macro`` -> "F1 Macro" (the prefix dropped); timings left out."""
    prefix = next((key[:-len("_loss")] for key in metrics if key.endswith("_loss")), "eval")
    out = {}
    for key, value in metrics.items():
        if key in ("epoch", "total_flos") or any(key == prefix + suffix for suffix in _NOT_SHOWN):
            continue
        name = " ".join(part.capitalize() for part in key.split("_")[1:])
        out["Validation Loss" if name == "Loss" else name] = value
    return out


def _epoch(epoch: float | None) -> str:
    epoch = epoch or 0.0
    return str(int(epoch)) if int(epoch) == epoch else f"{epoch:.2f}"


def _has_length(loader: Any) -> bool:
    try:
        return loader is not None and len(loader) >= 0
    except TypeError:
        return False
