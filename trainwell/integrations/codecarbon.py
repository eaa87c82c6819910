"""CodeCarbon: the energy used and CO2 emitted by training, measured from ``train()``'s start to its end.

One tracker per machine (the local main process of each node measures its node), writing ``emissions.csv`` in
``output_dir``. CodeCarbon's own settings apply (``CODECARBON_*`` variables, ``.codecarbon.config``). By default
it is CodeCarbon's ``EmissionsTracker``, as in the reference, which looks up where the machine is over the
network; with a country given (``CODECARBON_COUNTRY_ISO_CODE=FRA``, or ``country_iso_code=``) it is the
``OfflineEmissionsTracker``, which needs no network. The tracker is ``callback.tracker``; its last measure is
``callback.tracker.final_emissions_data``. Logs are not sent to CodeCarbon: it measures, it does not chart.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trainwell.args.storage import local_output_dir
from trainwell.integrations.base import TrackerCallback


class CodeCarbonCallback(TrackerCallback):
    """Measures the emissions of training with CodeCarbon."""

    name = "codecarbon"

    def __init__(self, country_iso_code: str | None = None, **tracker_kwargs: Any) -> None:
        super().__init__()
        if torch.version.hip:
            raise RuntimeError(
                "report_to='codecarbon': CodeCarbon does not support AMD ROCm GPUs; leave "
                "'codecarbon' out of report_to."
            )
        import codecarbon  # imported with the callback, never with trainwell

        self._codecarbon = codecarbon
        self._country = country_iso_code or os.environ.get("CODECARBON_COUNTRY_ISO_CODE") or None
        self._tracker_kwargs = tracker_kwargs
        self.tracker: Any = None

    def start(self, args: Any, state: Any, model: Any) -> None:
        if self.tracker is None:
            kwargs = {"output_dir": local_output_dir(args), **self._tracker_kwargs}
            os.makedirs(kwargs["output_dir"], exist_ok=True)  # CodeCarbon writes there but does not create it
            if self._country:
                self.tracker = self._codecarbon.OfflineEmissionsTracker(country_iso_code=self._country, **kwargs)
            else:
                self.tracker = self._codecarbon.EmissionsTracker(**kwargs)
        self.tracker.start()

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        """Nothing: CodeCarbon records energy, not the Trainer's metrics."""

    def finish(self, args: Any, state: Any) -> None:
        self.tracker.stop()  # writes emissions.csv

    # One measure per machine, so the local main process of every node runs it (the base: world main only).
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_local_process_zero:
            self._ensure_started(args, state, kwargs.get("model"))

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Logs do not start or feed the tracker (see ``log_metrics``)."""

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Prediction is not measured (the reference measures ``train()`` only)."""

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Checkpoints are not CodeCarbon's concern."""

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_local_process_zero and self._started:
            self._started = False
            self._guard("finishing", self.finish, args, state)
