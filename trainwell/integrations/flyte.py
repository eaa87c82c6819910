"""Flyte: checkpoints synced to the Flyte task's checkpoint store, and the log history as a Flyte Deck.

Works inside a Flyte task only (``flytekit.current_context()`` must have a checkpoint). ``sync_checkpoints``
(default on) saves each checkpoint folder with ``current_context().checkpoint.save``, so an interrupted task
can resume from ``current_context().checkpoint.restore()``; ``save_log_history`` (default on) renders
``state.log_history`` as a table in a ``"Log History"`` deck at the end of training (needs
``flytekitplugins-deck-standard`` and ``pandas``: without them it is turned off, with a warning). Not picked by
``report_to="all"``, as in the reference. Tested against stand-ins for flytekit: it runs inside Flyte only.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from trainwell.integrations.base import TrackerCallback

logger = logging.getLogger(__name__)


class FlyteCallback(TrackerCallback):
    """Syncs checkpoints to Flyte and shows the log history as a Flyte Deck."""

    name = "flyte"

    def __init__(self, save_log_history: bool = True, sync_checkpoints: bool = True) -> None:
        super().__init__()
        from flytekit import current_context  # imported with the callback, never with trainwell

        if save_log_history and not all(_found(m) for m in ("flytekitplugins.deck", "pandas")):
            logger.warning(
                "FlyteCallback: the log history deck needs flytekitplugins-deck-standard and pandas "
                "(pip install flytekitplugins-deck-standard pandas); it is turned off."
            )
            save_log_history = False
        self.cp = current_context().checkpoint
        self.save_log_history = save_log_history
        self.sync_checkpoints = sync_checkpoints

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        """Nothing per log: the whole history is rendered once, at the end of training."""

    def checkpoint_saved(self, checkpoint_dir: str, args: Any, state: Any) -> None:
        if self.sync_checkpoints:
            self.cp.save(checkpoint_dir)

    def finish(self, args: Any, state: Any) -> None:
        if self.save_log_history:
            import pandas as pd
            from flytekit import Deck
            from flytekitplugins.deck.renderer import TableRenderer

            Deck("Log History", TableRenderer().to_html(pd.DataFrame(state.log_history)))


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
