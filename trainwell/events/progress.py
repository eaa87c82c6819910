"""Showing progress and logs on the console.

Owns: ``ProgressCallback`` (a tqdm bar on a terminal, plain lines elsewhere), ``PrinterCallback`` (logs
only), ``StepPace`` (the smoothed seconds per step their ETAs come from), ``format_logs``, the display form of
a logs dict they share (the reference's), ``compact_log``, the one-short-line form the command line uses, and
``apply_log_level`` (``log_level`` / ``log_level_replica`` onto the ``trainwell`` logger). Sending logs to
trackers belongs to ``trainwell.integrations``. tqdm is imported only when a bar is actually drawn. Only the
world main process prints, so a distributed run shows one bar and one set of lines.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from trainwell.events.above_bar import LogsAboveBar
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


# The compact line (``compact_log``): shorter names, and keys left out of it (still in the history and trackers).
_SHORT_NAMES = {"learning_rate": "lr", "train_tokens_per_second": "tok/s", "train_samples_per_second": "samples/s",
                "train_steps_per_second": "steps/s"}
_COMPACT_HIDDEN = frozenset({"total_flos", "num_input_tokens_seen"})


def compact_number(value: Any) -> str:
    """A logged number as the compact line shows it: an int as is; a float to 4 significant digits (``2.345``,
    ``0.001963``), whole from 1e4 on (``12346``), with a short exponent where it needs one (``2e-5``)."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if 1e4 <= abs(value) < 1e9:
        return f"{value:.0f}"
    text = f"{value:.4g}"
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else text


def compact_log(logs: Mapping[str, Any], max_str_len: int | None = None) -> tuple[str, str]:
    """``(kind, text)``: a logs dict as one short line, numbers unquoted, two spaces between ``name value`` pairs.

    ``kind`` is ``"train"`` (a training log: ``loss 2.345  grad_norm 0.84  lr 0.00196  epoch 0.42``), ``"eval"``
    (an evaluation, found by its ``PREFIX_runtime``: the prefix dropped from the names, its rates left out and
    its runtime last, ``loss 2.101  perplexity 8.17  (3.1 s)``) or ``"done"`` (the end-of-``train()`` summary,
    its runtime and rates last). ``total_flos``, ``num_input_tokens_seen`` and a training log's clock
    (``train_runtime``) are left out; strings longer than ``max_str_len`` are replaced as in ``format_logs``.
    """
    kind, prefix = _kind_of(logs)
    pairs, tail = [], []
    for key, value in format_logs(logs, max_str_len).items():
        value = logs[key] if isinstance(logs[key], float) else value  # the number, not format_logs' string
        if key in _COMPACT_HIDDEN or key == "epoch" and kind != "train":
            continue
        if kind == "train" and key == "train_runtime":
            continue
        if kind == "eval" and key.startswith(f"{prefix}_"):
            name = key[len(prefix) + 1:]
            if name == "runtime":
                tail.append(f"({compact_number(value)} s)")
            elif not name.endswith("_per_second"):
                pairs.append(f"{name} {compact_number(value)}")
            continue
        if kind == "done" and key == "train_runtime":
            tail.insert(0, f"({compact_number(value)} s)")
        elif key.endswith("_per_second"):
            (tail if kind == "done" else pairs).append(f"{compact_number(value)} {_SHORT_NAMES.get(key, key)}")
        else:
            pairs.append(f"{_SHORT_NAMES.get(key, key)} {compact_number(value)}")
    return kind, "  ".join(pairs + tail)


def _kind_of(logs: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(kind, prefix)``: ``"done"`` (the end-of-``train()`` summary), ``"eval"`` (an evaluation, found by its
    ``PREFIX_runtime``, with that prefix) or ``"train"`` (a training log: ``loss``, ``learning_rate``...)."""
    prefix = next((k[:-len("_runtime")] for k in logs if k.endswith("_runtime") and k != "train_runtime"), None)
    if "train_loss" in logs or "train_samples_per_second" in logs:
        return "done", prefix
    return ("eval" if prefix is not None else "train"), prefix


def _compact_head(kind: str, state: TrainerState) -> str:
    if kind == "train":
        return f"step {state.global_step}/{state.max_steps}" if state.max_steps > 0 else f"step {state.global_step}"
    return f"{kind} at step {state.global_step}"


def apply_log_level(args: Any) -> None:
    """Set the ``trainwell`` logger to ``args.get_process_log_level()``: ``log_level`` on a process that logs
    (``args.should_log``), else ``log_level_replica``; ``"passive"`` keeps the library's verbosity (the
    application's choice stands, or ``transformers``' when a script raised it). The Trainer calls this once,
    when it is built (``trainwell.wiring.set_up_process``)."""
    ours, level = logging.getLogger("trainwell"), args.get_process_log_level()
    if ours.level != level:  # setLevel clears the cache of every logger of the process, even to the same level
        ours.setLevel(level)


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


def _say(line: str) -> None:
    """Write one line to stdout, flushed, without ``print``.

    Ray Train (V2) replaces ``print`` on its workers with one that logs each line to the root logger, whose
    console handler shows it, and, because Ray wraps ``sys.stdout``, also writes it there: every line reached the
    driver twice. A direct write reaches it once, wherever ``print`` was replaced.
    """
    stream = sys.stdout
    stream.write(line + "\n")
    stream.flush()


class StepPace:
    """Seconds per optimizer step, smoothed so that an ETA built on it holds still.

    tqdm's own rate is an average over its last few redraws, so one checkpoint save or evaluation between two
    steps swings the remaining time by minutes (11:43 -> 2:10 -> 9:44 within 45 s). Here:

    * only the time between consecutive step ends is timed, and ``pause`` drops the time since the last one:
      the progress display calls it after an evaluation and after a save, so their time is never a step's
      (the ETA is the training time left; evaluations and saves still to come add theirs);
    * the estimate is the running mean of the first ``1 / smoothing`` samples (a steady start needs no
      warm-up), then an exponential moving average with weight ``smoothing``;
    * a sample is capped at ``outlier`` times the estimate before it counts, so a single slow step (a
      collection pause, a slow batch) moves the estimate by at most ``smoothing * (outlier - 1)``
      (6 % with the defaults), while a lasting slowdown still shows within a few dozen steps.

    Pure arithmetic on the timestamps it is given: the caller reads the clock, once per step.
    """

    def __init__(self, smoothing: float = 0.03, outlier: float = 3.0) -> None:
        if not 0.0 < smoothing <= 1.0 or outlier < 1.0:
            raise ValueError(f"StepPace(smoothing={smoothing}, outlier={outlier}): pass 0 < smoothing <= 1 "
                             "and outlier >= 1.")
        self.smoothing = smoothing
        self.outlier = outlier
        self.seconds_per_step: float | None = None
        self.last_time = 0.0
        self._last_step = 0
        self._samples = 0

    def start(self, now: float, step: int) -> None:
        """Training (re)starts at ``step``: the next step end is timed from ``now``; the estimate is kept."""
        self.last_time, self._last_step = now, step

    def pause(self, now: float) -> None:
        """The time since the last step end was not spent in a step (an evaluation, a save): drop it."""
        self.last_time = now

    def step(self, now: float, step: int) -> None:
        """A step ended at ``now`` with ``state.global_step == step`` (several steps at once are averaged)."""
        done = step - self._last_step
        if done <= 0:
            return
        sample = (now - self.last_time) / done
        self.last_time, self._last_step = now, step
        estimate = self.seconds_per_step
        self._samples += 1
        if estimate is None:
            self.seconds_per_step = sample
            return
        weight = max(1.0 / self._samples, self.smoothing)
        self.seconds_per_step = estimate + weight * (min(sample, self.outlier * estimate) - estimate)

    def rate(self) -> float | None:
        """Steps per second, or ``None`` before the first timed step (or when steps take no time at all)."""
        spent = self.seconds_per_step
        return 1.0 / spent if spent else None


@functools.lru_cache(maxsize=1)
def _paced_bar_class() -> type:
    """A tqdm subclass whose rate, and so the remaining time tqdm derives from it, come from a ``StepPace``."""
    from tqdm import tqdm  # imported on first draw: a Trainer that never shows a bar never pays for it

    class PacedBar(tqdm):
        pace: StepPace | None = None

        @property
        def format_dict(self) -> dict[str, Any]:
            info = super().format_dict
            rate = self.pace.rate() if self.pace is not None else None
            if rate:  # tqdm's own windowed rate only until the first step has been timed
                info["rate"] = rate
            return info

    return PacedBar


class ProgressCallback(TrainerCallback):
    """Training progress on the world main process.

    On a terminal (``stream.isatty()``, ``stream`` defaulting to ``sys.stderr``): a tqdm bar over
    ``max_steps``, advanced at each step, whose postfix shows the last loss, learning rate and throughput;
    a second bar over the batches of each evaluation or prediction; each ``on_log`` during training is
    written above the bar. Elsewhere (log files, CI, notebooks): no bar redraws; each ``on_log`` during
    training prints one line to stdout, ``[step/max_steps pct% | eta H:MM:SS] {logs}`` (plus the step rate
    when the logs carry no throughput), and when ``plain_interval`` seconds pass without a line, a step
    end prints a progress-only line, so a slow run with rare logs still shows it is alive.

    The step rate and the remaining time, in the bar and in the lines, come from a ``StepPace``: a smoothed
    seconds-per-step that leaves out the time spent evaluating and saving, so they do not jump after each
    checkpoint. Cost per step: one ``time.perf_counter()`` read and a few float operations.

    Logs are shown through ``format_logs`` (strings over ``max_str_len`` replaced by a note), on a copy:
    the dict the Trainer passes in is never modified. With ``compact`` (``trainwell demo`` and ``trainwell
    train`` set it; the default prints the reference's dicts), each log is one short line instead
    (``compact_log``): ``step 100/1000  loss 2.345  grad_norm 0.84  lr 0.00196  epoch 0.42  12346 tok/s``, an
    evaluation as ``eval at step 200  loss 2.101  perplexity 8.17  (3.1 s)``.
    """

    def __init__(self, max_str_len: int = 100, stream: TextIO | None = None, plain_interval: float = 30.0,
                 compact: bool = False) -> None:
        self.max_str_len = max_str_len
        self.plain_interval = plain_interval
        self.compact = compact
        self._stream = stream
        # The one clock: times the steps for the ETA and paces the plain lines (tests replace it).
        self._clock = time.perf_counter
        self._last_line = 0.0
        self._plain = False  # plain progress lines at step ends: decided once per run, not per step
        self.pace = StepPace()
        self.training_bar: Any = None
        self.prediction_bar: Any = None
        self.current_step = 0
        self._training = False
        self._above_bar: LogsAboveBar | None = None

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

    def _bar(self, pace: StepPace | None = None, **kwargs: Any) -> Any:
        bar = _paced_bar_class()(file=self.stream, dynamic_ncols=True, **kwargs)
        bar.pace = pace
        return bar

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # an earlier train() that ended without on_train_end (it raised; rollback_on_spike trains again): its bar
        # is closed and the log routing undone before this one's are made
        self._close_training_bar()
        now = self._clock()
        self.current_step = state.global_step
        self.pace.start(now, state.global_step)
        self._training = True
        self._last_line = now
        interactive = state.is_world_process_zero and self._interactive()
        self._plain = self.plain_interval > 0 and state.is_world_process_zero and not interactive
        if interactive:
            self.training_bar = self._bar(pace=self.pace, total=state.max_steps, initial=state.global_step)
            # messages logged meanwhile (Ctrl-C's "Received SIGINT") start on a line of their own, above the bar
            self._above_bar = LogsAboveBar(type(self.training_bar))
            self._above_bar.install()

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        now = self._clock()
        self.pace.step(now, state.global_step)
        if self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
        elif self._plain and now - self._last_line >= self.plain_interval:
            self._last_line = now
            rate = self.pace.rate()
            _say(f"[{self._progress(state, rate)}] {_rate_text(rate)}".rstrip())
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
        self.pace.pause(self._clock())  # the evaluation's time is not the next step's

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.pace.pause(self._clock())  # nor is the checkpoint's

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._close_prediction_bar()

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not (self._training and state.is_world_process_zero):
            return
        logs = kwargs.get("logs") or {}
        if self.compact:
            kind, shown = compact_log(logs, self.max_str_len)
        else:
            kind, shown = "", str(format_logs(logs, self.max_str_len))
        if self.training_bar is not None:
            if _kind_of(logs)[0] == "train":  # an evaluation's or the summary's keys would replace the loss
                self._update_postfix(logs)
            self.training_bar.write(f"{_compact_head(kind, state)}  {shown}" if kind else shown)
        else:
            # A log follows a step end: its time stands for now, without another clock read.
            self._last_line = self.pace.last_time
            rate = self.pace.rate()
            has_speed = any(key.endswith("_per_second") for key in logs)
            speed = "" if has_speed or not rate else f" ({_rate_text(rate)})"
            marker = f"{kind}: " if kind in ("eval", "done") else ""
            _say(f"[{self._progress(state, rate)}] {marker}{shown}{speed}")

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._training = False
        self._close_training_bar()
        self._close_prediction_bar()

    def _close_training_bar(self) -> None:
        if self._above_bar is not None:
            self._above_bar.uninstall()
            self._above_bar = None
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None

    def _close_prediction_bar(self) -> None:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def _progress(self, state: TrainerState, rate: float | None) -> str:
        """``step/max_steps pct% | eta H:MM:SS``, the ETA extrapolated from the smoothed step rate."""
        total = state.max_steps
        percent = 100.0 * state.global_step / total if total > 0 else 0.0
        remaining = max(total - state.global_step, 0)
        eta = _format_duration(remaining / rate) if rate else "?"
        return f"{state.global_step}/{total} {percent:.0f}% | eta {eta}"

    def _update_postfix(self, logs: Mapping[str, Any]) -> None:
        postfix: dict[str, str] = {}
        if isinstance(logs.get("loss"), (int, float)):
            postfix["loss"] = f"{logs['loss']:.4g}"
        if isinstance(logs.get("learning_rate"), (int, float)):
            postfix["lr"] = f"{logs['learning_rate']:.3g}"
        window_rate = logs.get("tokens_per_second")  # log_throughput: this window's, where the other is cumulative
        rate_key = "tokens_per_second" if isinstance(window_rate, (int, float)) else "train_tokens_per_second"
        if isinstance(logs.get(rate_key), (int, float)):
            postfix["tok/s"] = f"{logs[rate_key]:.4g}"
            if isinstance(logs.get("mfu"), (int, float)):
                postfix["mfu"] = f"{100 * logs['mfu']:.1f}%"
        else:
            rate = self.pace.rate()
            if rate:
                postfix["step/s"] = f"{rate:.3g}"
        if postfix:
            self.training_bar.set_postfix(postfix, refresh=False)


class PrinterCallback(TrainerCallback):
    """Prints each log (floats as ``.4g``, without ``total_flos``) on the world main process.

    The dict it receives is shared with the Trainer (it is the one ``train()`` returns in
    ``TrainOutput.metrics``), so it formats a copy; the reference pops ``total_flos`` from the shared dict.
    The reference prints on every node's local main process; one copy of each log is enough. ``compact``:
    one short line per log, as ``ProgressCallback(compact=True)`` writes them.
    """

    def __init__(self, compact: bool = False) -> None:
        self.compact = compact

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not (state.is_world_process_zero and state.is_local_process_zero):
            return
        if self.compact:
            kind, shown = compact_log(kwargs.get("logs") or {})
            _say(f"{_compact_head(kind, state)}  {shown}")
        else:
            _say(str(format_logs(kwargs.get("logs"))))
