"""What the live page says of a run besides its curves: its state from the heartbeat, its system metrics, and the
x axes other than the step (epoch, input tokens, wall time).

Run state. A run that logs to the live log with this version also writes a heartbeat there
(``trainwell.loop.system_sampler``: a line every 10 s with the process's ``pid`` and host, and a last line when its
``train()`` ends). From it, a run that has not finished is

* ``stopped unexpectedly at step N``: on this machine (same host name), its process is gone (no such pid, or a
  zombie); on another machine, no line for ``STALE_AFTER`` seconds (at least; three gaps between its samples when
  those are longer) by this machine's clock, so the two clocks are assumed to agree within seconds;
* ``train() ended at step N without finishing``: its last line says the sampler stopped (an exception, or
  ``should_training_stop`` without the end-of-training summary: a call that returns writes the summary);
* ``training``: otherwise;

with the newest ``checkpoint-N`` of the folder to resume from. A run without a heartbeat (an older version, or no
live log) is ``training, or stopped before its end``, as before. A pid reused by another process after the run died
reads as alive: rare, and the next look at a run on a machine that restarts pids is wrong only until it logs again.
"""

from __future__ import annotations

import math
import os
import re
import socket
from pathlib import Path
from typing import Any

from trainwell.report.curves import downsample
from trainwell.report.history import RunHistory
from trainwell.report.live_reader import LiveHistory

#: seconds without a heartbeat after which a run on another machine is taken as stopped
STALE_AFTER = 120.0
#: the system metrics drawn, with their figure titles
SYSTEM_METRICS = {"cpu_percent": "CPU % (process)", "rss_bytes": "process memory (bytes)",
                  "gpu_memory_bytes": "GPU memory allocated (bytes)",
                  "gpu_reserved_bytes": "GPU memory reserved (bytes)", "gpu_util_percent": "GPU utilisation %"}
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_POINTS = 400


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie does not: it is dead, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    except OSError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def last_checkpoint(folder: Path) -> str | None:
    """The newest ``checkpoint-N`` folder of ``folder`` (not a link), or None."""
    try:
        steps = [(int(m.group(1)), e.name) for e in os.scandir(folder)
                 if (m := _CHECKPOINT.match(e.name)) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    return max(steps)[1] if steps else None


def run_state(folder: Path, live: LiveHistory | None, step: Any, finished: bool, now: float) -> dict[str, Any]:
    """``{"state", "text", "checkpoint"}``: what the page says of the run (the module docstring tells how)."""
    if finished:
        return {"state": "finished", "text": None, "checkpoint": None}
    process = live.process if live is not None else None
    if process is None:
        return {"state": "unknown", "text": "training, or stopped before its end", "checkpoint": None}
    checkpoint = last_checkpoint(folder)
    resume = f"; resume from {checkpoint}" if checkpoint else "; no checkpoint to resume from"
    if process["ended"]:
        return {"state": "ended", "text": f"train() ended at step {step} without finishing{resume}",
                "checkpoint": checkpoint}
    pid, when = process.get("pid"), live.last_time if live is not None else None  # any line is a heartbeat
    if process.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0:
        gone, why = not _alive(pid), f"process {pid} is gone"
    else:
        limit = max(STALE_AFTER, 3 * _gap(live))
        age = now - when if isinstance(when, float) else math.inf
        gone, why = age > limit, f"no heartbeat for {age:.0f} s"
    if gone:
        return {"state": "stopped", "text": f"stopped unexpectedly at step {step} ({why}){resume}",
                "checkpoint": checkpoint}
    return {"state": "training", "text": "training", "checkpoint": checkpoint}


def _gap(live: LiveHistory | None) -> float:
    times = [s["time"] for s in (live.system[-2:] if live is not None else [])]
    return times[1] - times[0] if len(times) == 2 else 0.0


def _origin(live: LiveHistory | None) -> float | None:
    """The time the wall-time axis counts from: the live log's first system sample or log, whichever is earlier."""
    if live is None:
        return None
    times = [live.system[0]["time"]] if live.system else []
    times += [min(live.step_times.values())] if live.step_times else []
    return min(times) if times else None


def _finite(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _thin(points: list[tuple[float, float]]) -> list[list[float]]:
    return [[x, y] for x, y in downsample(points, _POINTS)]


def system_series(live: LiveHistory | None) -> dict[str, list[list[float]]]:
    """Each system metric as ``[seconds since the run's start, value]`` points (cut to a few hundred)."""
    origin = _origin(live)
    if live is None or origin is None:
        return {}
    out: dict[str, list[tuple[float, float]]] = {}
    for sample in live.system:
        for key in SYSTEM_METRICS:
            value = _finite(sample.get(key))
            if value is not None:
                out.setdefault(key, []).append((round(sample["time"] - origin, 3), value))
    return {k: _thin(v) for k, v in out.items()}


def step_axes(run: RunHistory, live: LiveHistory | None) -> dict[str, list[list[float]]]:
    """The x axes besides the step, each as ``[step, x]`` pairs in step order: ``epoch`` and ``tokens``
    (``num_input_tokens_seen``) where the log entries carry them, ``time`` (seconds since the run's start, the
    wall clock of the live log's lines) where the live log has them."""
    axes: dict[str, dict[int, float]] = {"epoch": {}, "tokens": {}, "time": {}}
    for _, entry in run.entries:
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        for name, key in (("epoch", "epoch"), ("tokens", "num_input_tokens_seen")):
            value = _finite(entry.get(key))
            if value is not None:
                axes[name][step] = value
    origin = _origin(live)
    if live is not None and origin is not None:
        axes["time"] = {step: round(when - origin, 3) for step, when in live.step_times.items()}
    return {name: _thin(sorted((float(s), x) for s, x in values.items())) for name, values in axes.items() if values}


__all__ = ["STALE_AFTER", "SYSTEM_METRICS", "last_checkpoint", "run_state", "step_axes", "system_series"]
