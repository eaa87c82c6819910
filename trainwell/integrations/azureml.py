"""Azure Machine Learning (``azureml-core``): every numeric Trainer log as a metric of the Azure ML run.

The run is the one Azure ML runs this script in (``Run.get_context()``), or the one passed as
``AzureMLCallback(azureml_run=...)``. Each log entry is sent with ``run.log(name, value)`` under the Trainer's
own name (``loss``, ``eval_loss``...). As in the reference, ``report_to="all"`` picks Azure ML only when MLflow
is not installed (Azure ML workspaces also take MLflow logging, which the ``mlflow`` tracker does).
Tested against a stand-in for ``azureml.core.run.Run``: Azure ML records only inside its service.
"""

from __future__ import annotations

from typing import Any

from trainwell.integrations.base import TrackerCallback, numeric_logs


class AzureMLCallback(TrackerCallback):
    """Sends the Trainer's logs to an Azure ML run."""

    name = "azure_ml"

    def __init__(self, azureml_run: Any = None) -> None:
        super().__init__()
        from azureml.core.run import Run  # imported with the callback, never with trainwell

        self._run_cls = Run
        self.azureml_run = azureml_run

    def start(self, args: Any, state: Any, model: Any) -> None:
        if self.azureml_run is None:
            self.azureml_run = self._run_cls.get_context()

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        for key, value in numeric_logs(logs).items():
            self.azureml_run.log(key, value, description=key)
