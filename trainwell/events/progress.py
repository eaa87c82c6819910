"""Showing progress and logs on the console.

Owns: ``ProgressCallback`` (a tqdm bar on a terminal, plain lines elsewhere), ``PrinterCallback`` (logs
only), ``format_logs``, the display form of a logs dict they share, and ``apply_log_level`` (``log_level`` /
``log_level_replica`` onto the ``trainwell`` logger). Sending logs to trackers belongs to
``trainwell.integrations``. tqdm is imported only when a bar is actually drawn. Only the world main process
prints, so a distributed run shows one bar and one set of lines.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from trainwell.events.callback import TrainerCallback
from trainwell.state import TrainerControl, TrainerState

# Kept in the Trainer's metrics and log history, but a raw flop count is noise on a console.
_HIDDEN_KEYS = frozenset({"total_flos"})


def format_logs(logs: Mapping[str, Any] | None, max_str_len: int | None = None) -> dict[str, Any]:
    """A new dict for display: floats as ``.4g`` strings, ``total_flos`` left out, and strings longer than
    ``max_str_len`` (when given) replaced by a note of their length. ``logs`` itself is never modified.
    """
    shown: dict[str, Any] = {}
    for key, value in (logs or {}).items():
        if key in _HIDDEN_KEYS:
            continue
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, str) and max_str_len is not None and len(value) > max_str_len:
            value = f"[string of {len(value)} characters > max_str_len={max_str_len}, not shown]"
        shown[key] = value
    return shown


def apply_log_level(args: Any) -> None:
    """Set the ``trainwell`` logger to ``args.log_level`` on a process that logs (``args.should_log``), else to
    ``args.log_level_replica``. ``"passive"`` leaves the level alone (the application's choice stands)."""
    from trainwell.training_args import LOG_LEVELS

    name = args.log_level if args.should_log else args.log_level_replica
    level = LOG_LEVELS.get(name, -1)
    if level != -1:
        logging.getLogger("trainwell").setLevel(level)


def _format_duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _rate_text(rate: float | None) -> str:
    if not rate:
        return ""
    return f"{rate:.3g} step/s" if rate >= 1 else f"{1 / rate:.3g} s/step"


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None


class ProgressCallback(TrainerCallback):
    """Training progress on the world main process.

    On a terminal (``stream.isatty()``, ``stream`` defaulting to ``sys.stderr``): a tqdm bar over
    ``max_steps``, advanced at each step, whose postfix shows the last loss, learning rate and throughput;
    a second bar over the batches of each evaluation or prediction; each ``on_log`` during training is
    written above the bar. Elsewhere (log files, CI, notebooks): no bar redraws; each ``on_log`` during
    training prints one line to stdout, ``[step/max_steps pct% | eta H:MM:SS] {logs}`` (plus the step rate
    when the logs carry no throughput), and when ``plain_interval`` seconds pass without a line, a step
    end prints a progress-only line, so a slow run with rare logs still shows it is alive.

    Logs are shown through ``format_logs`` (strings over ``max_str_len`` replaced by a note), on a copy:
    the dict the Trainer passes in is never modified.
    """

    def __init__(self, max_str_len: int = 100, stream: TextIO | None = None, plain_interval: float = 30.0) -> None:
        self.max_str_len = max_str_len
        self.plain_interval = plain_interval
        self._stream = stream
        # Separate from _clock (which times the run for ETAs): this one only paces the plain lines.
        self._wall = time.monotonic
        self._last_line = 0.0
        self.training_bar: Any = None
        self.prediction_bar: Any = None
        self.current_step = 0
        self._training = False
        self._start_time = 0.0
        self._start_step = 0
        self._clock = time.monotonic

    @property
    def stream(self) -> TextIO:
        """Where bars are drawn; read at each use so redirections of ``sys.stderr`` are honoured."""
        return self._stream if self._stream is not None else sys.stderr

    def _interactive(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        try:
            return bool(isatty and isatty())
        except ValueError:  # a closed stream
            return False

    def _bar(self, **kwargs: Any) -> Any:
        from tqdm import tqdm  # imported on first draw: a Trainer that never shows a bar never pays for it

        return tqdm(file=self.stream, dynamic_ncols=True, **kwargs)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.current_step = state.global_step
        self._start_step = state.global_step
        self._start_time = self._clock()
        self._training = True
        self._last_line = self._wall()
        if state.is_world_process_zero and self._interactive():
            self.training_bar = self._bar(total=state.max_steps, initial=state.global_step)

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
        elif self.plain_interval > 0 and state.is_world_process_zero and not self._interactive():
            now = self._wall()
            if now - self._last_line >= self.plain_interval:
                self._last_line = now
                rate = self._steps_per_second(state)
                print(f"[{self._progress(state, rate)}] {_rate_text(rate)}".rstrip(), flush=True)
        self.current_step = state.global_step

    def on_prediction_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not self._interactive():
            return
        if self.prediction_bar is None:
            total = _length(kwargs.get("eval_dataloader"))
            if total is None:
                return
            self.prediction_bar = self._bar(total=total, leave=self.training_bar is None)
        self.prediction_bar.update(1)

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._close_prediction_bar()

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._close_prediction_bar()

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not (self._training and state.is_world_process_zero):
            return
        logs = kwargs.get("logs") or {}
        shown = format_logs(logs, self.max_str_len)
        if self.training_bar is not None:
            self._update_postfix(logs, state)
            self.training_bar.write(str(shown))
        else:
            self._last_line = self._wall()
            rate = self._steps_per_second(state)  # read the clock once per line
            has_speed = any(key.endswith("_per_second") for key in logs)
            speed = "" if has_speed or not rate else f" ({_rate_text(rate)})"
            print(f"[{self._progress(state, rate)}] {shown}{speed}", flush=True)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._training = False
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None
        self._close_prediction_bar()

    def _close_prediction_bar(self) -> None:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def _steps_per_second(self, state: TrainerState) -> float | None:
        done = state.global_step - self._start_step
        elapsed = self._clock() - self._start_time
        return done / elapsed if done > 0 and elapsed > 0 else None

    def _progress(self, state: TrainerState, rate: float | None) -> str:
        """``step/max_steps pct% | eta H:MM:SS``, the ETA extrapolated from this run's average step rate."""
        total = state.max_steps
        percent = 100.0 * state.global_step / total if total > 0 else 0.0
        remaining = max(total - state.global_step, 0)
        eta = _format_duration(remaining / rate) if rate else "?"
        return f"{state.global_step}/{total} {percent:.0f}% | eta {eta}"

    def _update_postfix(self, logs: Mapping[str, Any], state: TrainerState) -> None:
        postfix: dict[str, str] = {}
        if isinstance(logs.get("loss"), (int, float)):
            postfix["loss"] = f"{logs['loss']:.4g}"
        if isinstance(logs.get("learning_rate"), (int, float)):
            postfix["lr"] = f"{logs['learning_rate']:.3g}"
        if isinstance(logs.get("train_tokens_per_second"), (int, float)):
            postfix["tok/s"] = f"{logs['train_tokens_per_second']:.4g}"
        else:
            rate = self._steps_per_second(state)
            if rate:
                postfix["step/s"] = f"{rate:.3g}"
        if postfix:
            self.training_bar.set_postfix(postfix, refresh=False)


class PrinterCallback(TrainerCallback):
    """Prints each log (floats as ``.4g``, without ``total_flos``) on the world main process.

    The dict it receives is shared with the Trainer (it is the one ``train()`` returns in
    ``TrainOutput.metrics``), so it formats a copy; the reference pops ``total_flos`` from the shared dict.
    The reference prints on every node's local main process; one copy of each log is enough.
    """

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero and state.is_local_process_zero:
            print(format_logs(kwargs.get("logs")), flush=True)
