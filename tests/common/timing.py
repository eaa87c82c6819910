"""Time limits that guard the tests against hangs, scaled to how fast this machine runs now.

A limit such as ``subprocess.run(..., timeout=300)`` is there to stop a hung child, not to time a healthy one.
On a loaded machine (a load of 7 to 19 on 2 cores, other jobs beside the suite) a healthy child runs several
times slower, and a fixed limit failed tests that passed when rerun alone. ``hang_timeout(300)`` is 300 s times
``slowdown()``: how much slower than a quiet machine this one runs, measured once per process (each pytest-xdist
worker) from the larger of

* a probe: a fixed pure-Python loop (a few milliseconds on a quiet core), its median time over five runs, against
  ``QUIET_PROBE_SECONDS``;
* the load: the 1-minute load average per core (a process gets about ``cores / load`` of a core).

It is never below 1 (a limit is never tightened) and at most ``MAX_SLOWDOWN``; ``TRAINWELL_TEST_SLOWDOWN=F`` sets
it (e.g. 1 to keep the limits as written). A limit that measures a feature (a page shows a log within 2 s, a
step_timeout fires after 1 s) is not a hang guard and is not scaled.
"""

from __future__ import annotations

import functools
import os
import statistics
import time

#: the probe's time on an idle core of this project's 2-core machine, Python 3.11: derived from its time there at a
#: load of 15 (0.12 s) over the load per core (7.5), not measured idle (the machine was never idle when written)
QUIET_PROBE_SECONDS = 0.016
MAX_SLOWDOWN = 30.0


def _probe() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(200_000):
        total += i * i
    return time.perf_counter() - started


@functools.cache
def slowdown() -> float:
    """How many times slower than a quiet machine this one runs now (at least 1; see the module docstring)."""
    given = os.environ.get("TRAINWELL_TEST_SLOWDOWN")
    if given:
        return max(float(given), 1.0)
    measured = statistics.median(_probe() for _ in range(5)) / QUIET_PROBE_SECONDS
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this system
        load = 1.0
    return min(max(measured, load, 1.0), MAX_SLOWDOWN)


def hang_timeout(seconds: float) -> float:
    """``seconds`` (the limit a quiet machine needs, with room) scaled by ``slowdown()``: a limit only a hang
    reaches, however loaded the machine."""
    return seconds * slowdown()
