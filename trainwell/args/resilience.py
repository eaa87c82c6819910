"""The checks of trainwell's three resilience arguments: ``skip_nonfinite_steps``, ``rollback_on_spike`` and
``step_timeout`` (what they do: docs/resilience.md; the code: ``trainwell.loop.guard``, ``trainwell.loop.rollback``
and ``trainwell.backend.stall``).

Owns normalizing ``step_timeout`` (a number of seconds given as text, as a command line or a YAML file gives it,
becomes a float; ``"AUTO"`` becomes ``"auto"``) and refusing values that cannot work, each error naming the value
and the fix. ``skip_nonfinite_steps`` is a bool or None (``trainwell.args.kinds`` checks it); NaN or infinite
``rollback_on_spike`` values are refused with the other floats (``validate._check_finite``).
"""

from __future__ import annotations

import math
from typing import Any

from trainwell.outputs import IntervalStrategy, SaveStrategy, enum_value

#: the rollbacks one run may make before it stops with an error (a spike that comes back after this many skipped
#: windows is not a bad batch)
MAX_ROLLBACKS = 3
#: the shortest ``step_timeout`` in seconds: the watchdog reads the progress counter about four times per timeout,
#: and a shorter one would stop runs for a slow log line
MIN_STEP_TIMEOUT = 1.0


def normalize_step_timeout(value: Any) -> float | str | None:
    """``step_timeout`` as the run reads it: None, ``"auto"``, or seconds as a float (raises ValueError)."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "none", ""):
            return None if text in ("none", "") else "auto"
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"step_timeout={value!r}: pass a number of seconds (e.g. 600), 'auto' (from the median "
                             "step time, with a floor), or None to run without the watchdog.") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"step_timeout={value!r}: pass a number of seconds (e.g. 600), 'auto', or None.")
    if not math.isfinite(value) or value < MIN_STEP_TIMEOUT:
        raise ValueError(f"step_timeout={value!r}: pass at least {MIN_STEP_TIMEOUT:g} second (a finite number, e.g. "
                         "600), 'auto', or None to run without the watchdog.")
    return float(value)


def check_resilience(args: Any) -> None:
    """Normalize ``step_timeout`` and refuse what cannot work (see the module docstring)."""
    args.step_timeout = normalize_step_timeout(args.step_timeout)
    factor = args.rollback_on_spike
    if factor is None:
        return
    if isinstance(factor, bool) or factor <= 1:
        raise ValueError(f"rollback_on_spike={factor!r}: pass a factor above 1 (e.g. 5.0: a logged loss above 5 "
                         "times the median of the recent ones is a spike), or None to turn rollbacks off.")
    if enum_value(args.save_strategy) == SaveStrategy.NO.value:
        raise ValueError(f"rollback_on_spike={factor!r} with save_strategy='no': a rollback reloads the last "
                         "checkpoint before the spike. Set save_strategy='steps' (with save_steps) or 'epoch', or "
                         "rollback_on_spike=None.")
    if enum_value(args.logging_strategy) == IntervalStrategy.NO.value:
        raise ValueError(f"rollback_on_spike={factor!r} with logging_strategy='no': spikes are seen in the logged "
                         "loss. Set logging_strategy='steps' (with logging_steps), or rollback_on_spike=None.")
