"""TensorBoard: event files under the run's logging dir, readable by ``tensorboard --logdir``.

Writes scalars as ``train/loss``, ``eval/loss``... at the global step, strings as text, and the arguments
(and model config, when the model has one) as text at the start. The folder is ``$TENSORBOARD_LOGGING_DIR``,
else ``args.logging_dir``, else ``{output_dir}/runs/{run_name or date_host}``. Uses torch's SummaryWriter
(needs the ``tensorboard`` package), else ``tensorboardX``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from trainwell.integrations.base import TrackerCallback, model_config_dict, resolve_logging_dir, rewrite_logs

logger = logging.getLogger(__name__)


def _summary_writer_class() -> type:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from tensorboardX import SummaryWriter
    return SummaryWriter


class TensorBoardCallback(TrackerCallback):
    """Sends the Trainer's logs to TensorBoard. Pass ``tb_writer`` to reuse a writer you own."""

    name = "tensorboard"

    def __init__(self, tb_writer: Any = None) -> None:
        super().__init__()
        self.tb_writer = tb_writer
        self.logging_dir: str | None = None

    def start(self, args: Any, state: Any, model: Any) -> None:
        if self.tb_writer is None:
            # The folder is chosen once: a writer reopened after train() (e.g. by evaluate()) continues there.
            self.logging_dir = self.logging_dir or resolve_logging_dir(args, "TENSORBOARD_LOGGING_DIR")
            self.tb_writer = _summary_writer_class()(log_dir=self.logging_dir)
        self.tb_writer.add_text("args", args.to_json_string())
        config = model_config_dict(model)
        if config is not None:
            self.tb_writer.add_text("model_config", json.dumps(config, indent=2, sort_keys=True, default=str))

    def log_metrics(self, logs: dict[str, Any], step: int, args: Any, state: Any) -> None:
        for key, value in rewrite_logs(logs).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.tb_writer.add_scalar(key, value, step)
            elif isinstance(value, str):
                self.tb_writer.add_text(key, value, step)
            else:
                logger.warning("tensorboard: %r=%r is neither a number nor a string; it was not logged.", key, value)
        self.tb_writer.flush()

    def finish(self, args: Any, state: Any) -> None:
        if self.tb_writer is not None:
            self.tb_writer.close()
            self.tb_writer = None
