"""Kubeflow Trainer: progress, time left and the latest metrics, posted to the TrainJob's status endpoint.

Inside a Kubeflow TrainJob with the ``TrainJobRuntimeStatus`` feature, the controller sets
``KUBEFLOW_TRAINER_SERVER_URL`` (where to POST), ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a file holding the bearer
token, re-read every 5 minutes) and ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` (the CA to verify it with); trainwell
then adds ``kubeflow`` to ``report_to`` by itself, as the reference does (``DISABLE_KUBEFLOW_INTEGRATION=true``
turns that off). The world main process posts ``{"trainerStatus": {...}}`` with ``progressPercentage`` (0 at
the start, at most 99 while training, 100 at the end), ``estimatedRemainingSeconds`` and ``metrics`` (the last
value of every numeric log, the step and epoch), at most once every 5 seconds; a post that fails is logged at
debug level and training goes on. Needs no package: the standard library's ``urllib`` sends it.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.request
from datetime import datetime, timezone
from typing import Any

from trainwell.integrations.base import TrackerCallback, numeric_logs

logger = logging.getLogger(__name__)

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"


class KubeflowCallback(TrackerCallback):
    """Reports training progress to the Kubeflow Trainer controller."""

    name = "kubeflow"
    min_interval_s = 5.0  # the controller's rate: progress posts closer together than this are skipped
    token_cache_s = 300.0

    def __init__(self) -> None:
        super().__init__()
        if not os.environ.get(URL_ENV):
            raise RuntimeError(
                f"report_to='kubeflow' reports to a Kubeflow TrainJob, which sets {URL_ENV}; it is "
                "not set here. Run inside a TrainJob with TrainJobRuntimeStatus, or leave it out."
            )
        self._metrics: dict[str, float] = {}
        self._started_at = 0.0
        self._last_post = float("-inf")
        self._token: tuple[str, float] | None = None  # (token, when read)
        self.posts_failed = 0

    # --- transport -----------------------------------------------------------------------------------------------
    def _read_token(self) -> str | None:
        now = time.monotonic()
        if self._token and now - self._token[1] < self.token_cache_s:
            return self._token[0]
        path = os.environ.get(TOKEN_ENV)
        if not path or not os.path.isfile(path):
            logger.debug("kubeflow: no token file at %r; nothing posted", path)
            return None
        with open(path, encoding="utf-8") as f:
            self._token = (f.read().strip(), now)
        return self._token[0]

    def _post(self, status: dict[str, Any], force: bool = False) -> bool:
        """POST the status; False when skipped (too soon, no token) or failed. Never raises."""
        now = time.monotonic()
        if not force and now - self._last_post < self.min_interval_s:
            return False
        self._last_post = now
        try:
            token = self._read_token()
            if token is None:
                return False
            status = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat(), **status}
            request = urllib.request.Request(
                os.environ[URL_ENV],
                data=json.dumps({"trainerStatus": status}).encode(),
                method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            ca_file = os.environ.get(CA_ENV)
            context = ssl.create_default_context(cafile=ca_file) if ca_file else None
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return response.status == 200
        except (OSError, ValueError, ssl.SSLError) as err:  # the controller may be briefly away: keep training
            self.posts_failed += 1
            logger.debug("kubeflow: the status post failed: %s", err)
            return False

    @staticmethod
    def _named(metrics: dict[str, Any]) -> list[dict[str, str]]:
        return [{"name": str(k), "value": str(v)} for k, v in metrics.items()]

    # --- tracker hooks -------------------------------------------------------------------------------------------
    def start(self, args: Any, state: Any, model: Any) -> None:
        self._started_at, self._metrics = time.time(), {}
        status: dict[str, Any] = {"progressPercentage": 0}
        if state.max_steps:
            status["metrics"] = self._named({"total_steps": state.max_steps})
        self._post(status, force=True)

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        self._metrics.update(numeric_logs(logs))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not (state.is_world_process_zero and self._started and state.max_steps and state.global_step > 0):
            return
        elapsed = time.time() - self._started_at
        remaining = elapsed / state.global_step * (state.max_steps - state.global_step)
        metrics = {**self._metrics, "current_step": state.global_step, "total_steps": state.max_steps}
        if state.epoch is not None:
            metrics["current_epoch"] = round(state.epoch, 2)
        self._post(
            {
                "progressPercentage": min(99, max(0, state.global_step * 100 // state.max_steps)),
                "estimatedRemainingSeconds": max(0, int(remaining)),
                "metrics": self._named(metrics),
            }
        )

    def finish(self, args: Any, state: Any) -> None:
        status: dict[str, Any] = {"progressPercentage": 100, "estimatedRemainingSeconds": 0}
        if self._metrics:
            status["metrics"] = self._named(self._metrics)
        self._post(status, force=True)
