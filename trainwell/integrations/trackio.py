"""Trackio: a local-first tracker (a SQLite file per project under ``$TRACKIO_DIR``), with optional Hub sync.

``project`` names the project, ``run_name`` the run; the arguments (and model config) are the run config.
Metrics are logged as ``train/loss``, ``eval/loss``... at the global step. With ``trackio_space_id`` the
run is also sent to that Hugging Face Space (``trackio_bucket_id`` for the storage bucket), and after training
a static snapshot Space is made unless ``trackio_static_space_id=False`` (these need the network and a Hub
login; a failure there is reported and training is unaffected). View local runs with ``trackio show``.
"""

from __future__ import annotations

import logging
from typing import Any

from trainwell.integrations.base import SINGLE_VALUE_KEYS, TrackerCallback, model_config_dict, rewrite_logs

logger = logging.getLogger(__name__)


class TrackioCallback(TrackerCallback):
    """Sends the Trainer's logs to Trackio."""

    name = "trackio"

    def __init__(self) -> None:
        super().__init__()
        import trackio  # imported with the callback, never with trainwell

        self._trackio = trackio
        self._space_id: str | None = None

    def start(self, args: Any, state: Any, model: Any) -> None:
        config = {**(model_config_dict(model) or {}), **args.to_dict()}
        if callable(getattr(model, "num_parameters", None)):
            config["model/num_parameters"] = model.num_parameters()
        self._trackio.init(
            project=args.project, name=args.run_name, space_id=args.trackio_space_id,
            bucket_id=args.trackio_bucket_id, private=args.hub_private_repo, resume="allow", config=config,
            embed=False,
        )
        self._space_id = args.trackio_space_id

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        curves = {k: v for k, v in logs.items() if k not in SINGLE_VALUE_KEYS}
        if curves:
            self._trackio.log({**rewrite_logs(curves), "train/global_step": step}, step=step)

    def finish(self, args: Any, state: Any) -> None:
        self._trackio.finish()
        if self._space_id and args.trackio_static_space_id is not False:
            try:
                self._trackio.freeze(space_id=self._space_id, project=args.project,
                                     new_space_id=args.trackio_static_space_id or None,
                                     private=args.hub_private_repo, bucket_id=args.trackio_bucket_id)
            except Exception as err:  # noqa: BLE001 - the run's data is safe locally; only the snapshot failed
                logger.warning("trackio could not make the static snapshot Space after training: %s", err)
