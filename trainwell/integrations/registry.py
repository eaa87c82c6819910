"""Turning ``report_to`` names into tracker callbacks: the registry entry's class, imported only when named.

The registry itself (names, modules, packages, the ``"all"`` rules) is ``trainwell.args.trackers``; this module
imports a tracker's module when a run names it, and says what to install when its package is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainwell.args.trackers import SWITCHES, TRACKERS
from trainwell.utils.errors import did_you_mean


def tracker_class(name: str) -> type:
    """The callback class for ``name``; ``ValueError`` for an unknown name, ``ImportError`` naming what to
    ``pip install`` when the tracker's package is missing."""
    entry = TRACKERS.get(name)
    if entry is None:
        raise ValueError(
            f"report_to: {name!r} is not a tracker trainwell knows. Use any of "
            f"{', '.join(map(repr, TRACKERS))}, 'all' (the installed ones) or 'none'." + did_you_mean(name, TRACKERS)
        )
    if not entry.installed():
        raise ImportError(
            f"report_to={name!r} needs {' and '.join(entry.pip.split())}, not installed here: pip install {entry.pip}"
        )
    return getattr(importlib.import_module(entry.module), entry.cls)


def reporting_callbacks(report_to: list[str] | None) -> list[Any]:
    """Callback instances for the trackers named in ``report_to`` (an empty list for none), checked all at
    once so a missing package is reported before any work starts. The switches (``"live"``) have none: the fit
    loop writes their files."""
    return [tracker_class(name)() for name in dict.fromkeys(report_to or []) if name not in SWITCHES]


def get_reporting_integration_callbacks(report_to: list[str] | None) -> list[type]:
    """The reference's function of that name: the callback *classes* for ``report_to``."""
    return [tracker_class(name) for name in dict.fromkeys(report_to or []) if name not in SWITCHES]
