"""The tests' hang guards (``tests/common/timing.py``): scaled to the machine's slowdown, so a loaded machine
(a load of 7 to 19 on 2 cores) runs the suite slower but does not fail it; and no test keeps a fixed one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.common import timing

TESTS = Path(__file__).resolve().parent
# Limits that time a feature rather than guard against a hang (a log shows on the page within seconds, a
# step_timeout fires), and the GPU benchmarks' (run on a machine of their own).
NOT_HANG_GUARDS = {"test_step_timeout.py", "test_report_watch.py", "test_benchmarks_gpu.py",
                   "test_benchmarks_gpu_profile.py", "test_timing.py", "timing.py"}


@pytest.fixture
def fresh(monkeypatch):
    timing.slowdown.cache_clear()
    monkeypatch.delenv("TRAINWELL_TEST_SLOWDOWN", raising=False)
    yield monkeypatch
    timing.slowdown.cache_clear()


def test_a_loaded_machine_scales_the_limits_and_a_quiet_one_keeps_them(fresh):
    fresh.setattr(timing.os, "cpu_count", lambda: 2)
    fresh.setattr(timing.os, "getloadavg", lambda: (16.0, 12.0, 8.0))
    fresh.setattr(timing, "_probe", lambda: timing.QUIET_PROBE_SECONDS)
    assert timing.slowdown() == 8.0 and timing.hang_timeout(60) == 480.0  # 16 runnable on 2 cores
    timing.slowdown.cache_clear()
    fresh.setattr(timing.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    fresh.setattr(timing, "_probe", lambda: 5 * timing.QUIET_PROBE_SECONDS)  # slow cores, no load
    assert timing.slowdown() == 5.0
    timing.slowdown.cache_clear()
    fresh.setattr(timing, "_probe", lambda: timing.QUIET_PROBE_SECONDS / 3)  # a faster machine: never tighter
    assert timing.slowdown() == 1.0 and timing.hang_timeout(60) == 60
    timing.slowdown.cache_clear()
    fresh.setenv("TRAINWELL_TEST_SLOWDOWN", "2.5")
    assert timing.hang_timeout(100) == 250.0


def test_the_probe_is_cheap_and_measured_once_per_process(fresh):
    calls = []
    probe = timing._probe
    fresh.setattr(timing, "_probe", lambda: calls.append(1) or probe())
    first = timing.slowdown()
    assert timing.slowdown() == first and len(calls) == 5
    assert 1.0 <= first <= timing.MAX_SLOWDOWN


def test_no_test_guards_a_child_or_a_wait_with_a_fixed_limit():
    fixed = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in NOT_HANG_GUARDS:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            # 10 s and more: a hang guard (a socket's 1 s connect attempt in a retry loop is not one)
            if re.search(r"\btimeout=\d{2,}|\bdeadline = time\.monotonic\(\) \+ \d{2,}", line):
                fixed.append(f"{path.relative_to(TESTS)}:{number}: {line.strip()}")
    assert not fixed, "use tests.common.timing.hang_timeout(SECONDS) for a hang guard:\n" + "\n".join(fixed)
