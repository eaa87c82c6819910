"""Callbacks: the event base (whose docstring holds the event order), the dispatcher and the built-ins.

The modules here import neither torch nor accelerate, and tqdm only when a bar is drawn.
"""

from __future__ import annotations

from trainwell.events.callback import EVENTS, TrainerCallback
from trainwell.events.early_stopping import EarlyStoppingCallback
from trainwell.events.flow import DefaultFlowCallback
from trainwell.events.handler import CallbackHandler
from trainwell.events.monitor import MetricMonitor, greater_is_better, is_improvement, metric_key
from trainwell.events.progress import PrinterCallback, ProgressCallback, format_logs

__all__ = [
    "EVENTS",
    "CallbackHandler",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "MetricMonitor",
    "PrinterCallback",
    "ProgressCallback",
    "TrainerCallback",
    "format_logs",
    "greater_is_better",
    "is_improvement",
    "metric_key",
]
