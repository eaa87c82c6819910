"""System metrics and the run's heartbeat in the live log: CPU, memory and GPU, sampled on a timer thread.

Started with the live log (``trainwell.loop.live_log``: only when ``report_to`` names ``"live"``, on the process
that saves) and stopped when ``train()`` ends, however it ends. Every ``interval`` seconds (10 by default) a
daemon thread appends one line to the live log::

    {"system": {"pid": P, "host": H, "cpu_percent": C, "rss_bytes": M, "gpu_memory_bytes": G,
                "gpu_reserved_bytes": R, "gpu_util_percent": U}, "time": T}

``cpu_percent``: the process's CPU time over the interval (user and system, all its threads; above 100 when it
uses more than one core, as ``top`` shows it); ``rss_bytes``: its resident memory; the ``gpu_*`` keys only when
CUDA is initialised in this process: the caching allocator's counters of the current device (host-side numbers, no
synchronisation) and, where NVML is importable (``pynvml``), the device's utilisation. The first line is written at
start, the last (``"ended": true``, no numbers) at stop: ``trainwell report --watch`` reads ``pid``/``host`` and
the lines' times as the run's heartbeat (a run whose process is gone, or that wrote nothing for a while, "stopped
unexpectedly"). These lines go to the live log only, never into ``log_history``.

Cost: none per step. The thread reads ``os.times()``, ``/proc/self/statm`` and the allocator's counters once per
interval and appends one line (one ``write`` with ``O_APPEND``, like the training thread's log lines, so the two
never interleave inside a line on a local disk). A failure to sample a metric drops that metric; a failure to
write stops the sampler; training never notices either.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import threading
import time
from typing import Any

from trainwell.loop.live_log import LiveLog, _line

logger = logging.getLogger(__name__)

#: seconds between two samples (``TRAINWELL_SYSTEM_INTERVAL`` overrides it, e.g. for a test)
INTERVAL = 10.0


def _interval() -> float:
    """``TRAINWELL_SYSTEM_INTERVAL`` when set (a number of seconds above 0; anything else is an error at the start
    of ``train()``, before any work), else ``INTERVAL``."""
    given = os.environ.get("TRAINWELL_SYSTEM_INTERVAL")
    if not given:
        return INTERVAL
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"TRAINWELL_SYSTEM_INTERVAL={given!r}: pass the seconds between two samples of the live "
                         f"log's system metrics, a number above 0 (e.g. 10, the default), or unset it.")
    return value


def _rss_bytes() -> int | None:
    """The process's resident memory: ``/proc/self/statm`` where there is one, else psutil where installed."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


class _Gpu:
    """The current CUDA device's memory counters and utilisation, once CUDA is initialised in this process."""

    def __init__(self) -> None:
        self.nvml: Any = None
        self.handle: Any = None
        self.tried = False

    def sample(self) -> dict[str, float]:
        torch = sys.modules.get("torch")  # never imported here: a run that has not imported it has no GPU work
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        device = torch.cuda.current_device()
        out: dict[str, float] = {"gpu_memory_bytes": torch.cuda.memory_allocated(device),
                                 "gpu_reserved_bytes": torch.cuda.memory_reserved(device)}
        if not self.tried:
            self.tried = True
            with contextlib.suppress(Exception):  # no NVML (no pynvml, no driver library): no utilisation
                import pynvml

                pynvml.nvmlInit()
                self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(_physical(torch, device))
        if self.handle is not None:
            try:
                out["gpu_util_percent"] = float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            except Exception:  # noqa: BLE001 - a failing NVML drops the metric, never the run
                self.handle = None
        return out


def _physical(torch: Any, device: int) -> int:
    """NVML's index of torch's ``device`` (``CUDA_VISIBLE_DEVICES`` renumbers torch's, not NVML's)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    try:
        return int(visible[device])
    except (ValueError, IndexError):
        return device


class SystemSampler:
    """The timer thread appending system metrics to the live log at ``path``; :meth:`stop` ends it."""

    def __init__(self, path: str, interval: float | None = None) -> None:
        self.path = path
        self.interval = interval if interval is not None else _interval()
        self.ids = {"pid": os.getpid(), "host": socket.gethostname()}
        self._writer = LiveLog(path)
        self._gpu = _Gpu()
        self._stop = threading.Event()
        self._last = (time.monotonic(), _cpu_seconds())
        self._thread = threading.Thread(target=self._run, name="trainwell-system-metrics", daemon=True)

    @classmethod
    def begin(cls, path: str, interval: float | None = None) -> SystemSampler:
        """A started sampler: its first line written now (the heartbeat's pid and host)."""
        sampler = cls(path, interval)
        sampler._write(sampler.sample())
        sampler._thread.start()
        return sampler

    def sample(self) -> dict[str, Any]:
        """One line's numbers: pid and host, CPU % since the last sample, resident memory, the GPU's."""
        now, cpu = time.monotonic(), _cpu_seconds()
        then, cpu_then = self._last
        self._last = (now, cpu)
        out: dict[str, Any] = dict(self.ids)
        if now > then:
            out["cpu_percent"] = round(100.0 * (cpu - cpu_then) / (now - then), 1)
        rss = _rss_bytes()
        if rss is not None:
            out["rss_bytes"] = rss
        try:
            out.update(self._gpu.sample())
        except Exception:  # noqa: BLE001 - a failing GPU query drops the metrics, never the run
            self._gpu = _Gpu()
            self._gpu.tried = True
        return out

    def _write(self, record: dict[str, Any]) -> bool:
        try:
            self._writer._append(_line({"system": record}))  # the live log's own append: O_APPEND, no link
            return True
        except OSError as err:
            logger.warning("Cannot write system metrics to %s (%s): they stop here, training goes on.", self.path,
                           err.strerror or err)
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._write(self.sample()):
                return

    def stop(self) -> None:
        """End the thread and write the last line (``"ended": true``): this process's training ended."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._write({**self.ids, "ended": True})


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


__all__ = ["INTERVAL", "SystemSampler"]
