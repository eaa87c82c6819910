"""A callback that records every event it receives, for event-order and counting tests."""

from __future__ import annotations

from collections import Counter

from trainwell.events.callback import TrainerCallback

EVENTS = [
    "on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_substep_end",
    "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log", "on_prediction_step",
    "on_evaluate", "on_predict", "on_save", "on_epoch_end", "on_train_end",
]


class EventRecorder(TrainerCallback):
    def __init__(self):
        self.events: list[str] = []
        self.kwargs: dict[str, set] = {}

    def counts(self) -> Counter:
        return Counter(self.events)


def _make(name):
    def handler(self, args, state, control, **kwargs):
        self.events.append(name)
        self.kwargs.setdefault(name, set(kwargs))

    handler.__name__ = name
    return handler


for _name in EVENTS:
    setattr(EventRecorder, _name, _make(_name))
