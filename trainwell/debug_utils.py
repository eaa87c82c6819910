"""The reference's ``transformers.debug_utils`` names, under the same path (re-exported from their owner).

``from trainwell.debug_utils import DebugUnderflowOverflow, DebugOption`` works as it does with the reference;
everything here lives in ``trainwell.techniques.overflow``.
"""

from __future__ import annotations

from trainwell.utils.lazy import lazy_exports

_EXPORTS: dict[str, str] = dict.fromkeys(
    ["DebugUnderflowOverflow", "DebugOption", "get_abs_min_max", "detect_overflow"], "trainwell.techniques.overflow"
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
