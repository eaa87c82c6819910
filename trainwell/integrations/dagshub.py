"""DagsHub: MLflow logging to a DagsHub repository's tracking server, plus the output folder as artifacts.

Everything the ``mlflow`` tracker does (see ``trainwell.integrations.mlflow``), with the tracking server
``MLFLOW_TRACKING_URI`` that ``dagshub.init()`` sets (``https://dagshub.com/<owner>/<repo>.mlflow``); without
it the Trainer is not built. With ``HF_DAGSHUB_LOG_ARTIFACTS=true`` the whole ``output_dir`` is
uploaded to the repository's ``artifacts/`` folder at the end of training, on branch ``$BRANCH`` (default
``main``). Tested with a local MLflow store and a stand-in for ``dagshub.upload.Repo``: uploads need DagsHub.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from trainwell.args.storage import local_output_dir
from trainwell.integrations.mlflow import MLflowCallback
from trainwell.utils.packages import env_flag


def dagshub_repo(tracking_uri: str) -> tuple[str, str]:
    """``(owner, name)`` of the repository a DagsHub MLflow URI points at (``.../<owner>/<name>.mlflow``)."""
    parts = [p for p in urlparse(tracking_uri).path.split("/") if p]
    if len(parts) < 2:
        raise ValueError(
            f"MLFLOW_TRACKING_URI={tracking_uri!r} does not name a DagsHub repository: expected "
            "https://dagshub.com/<owner>/<repo>.mlflow (dagshub.init() sets it)."
        )
    return parts[-2], parts[-1].split(".")[0]


class DagsHubCallback(MLflowCallback):
    """Logs to DagsHub through MLflow, and uploads the output folder when asked."""

    name = "dagshub"

    def __init__(self) -> None:
        super().__init__()
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            raise RuntimeError(
                "report_to='dagshub' needs MLFLOW_TRACKING_URI set to the repository's MLflow server: call "
                "dagshub.init(repo_owner=..., repo_name=..., mlflow=True) first, or set it yourself."
            )
        from dagshub.upload import Repo  # imported with the callback, never with trainwell

        self._repo_cls = Repo
        self.repo: Any = None
        self._log_artifacts = False

    def start(self, args: Any, state: Any, model: Any) -> None:
        owner, name = dagshub_repo(os.environ.get("MLFLOW_TRACKING_URI", ""))
        self._log_artifacts = env_flag("HF_DAGSHUB_LOG_ARTIFACTS")
        self.repo = self._repo_cls(owner=owner, name=name, branch=os.environ.get("BRANCH") or "main")
        super().start(args, state, model)

    def finish(self, args: Any, state: Any) -> None:
        if self._log_artifacts:
            self.repo.directory("artifacts").add_dir(local_output_dir(args))
        super().finish(args, state)
