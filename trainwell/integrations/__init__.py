"""Experiment trackers, one module per tracker, behind a lazy registry keyed by ``report_to`` names.

``reporting_callbacks(report_to)`` turns the normalized ``args.report_to`` list into callback instances.
No tracker package is imported until a run asks for it.
"""

from __future__ import annotations

from typing import Any


def reporting_callbacks(report_to: list[str] | None) -> list[Any]:
    """Callbacks for the trackers named in ``report_to`` (an empty list for none)."""
    names = list(report_to or [])
    if names:
        raise NotImplementedError(
            f"report_to={names!r}: experiment trackers are not wired up in trainwell yet. "
            "Use report_to='none' for now."
        )
    return []
