"""Dispatching events to the Trainer's list of callbacks.

Owns: ``CallbackHandler``, which keeps the callback list, clears the control flags that each event
starts from, and calls every callback with the same keyword arguments. What the callbacks decide is
theirs; when events fire is documented on ``TrainerCallback``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from trainwell.events.callback import TrainerCallback
from trainwell.events.flow import DefaultFlowCallback
from trainwell.state import TrainerControl, TrainerState

logger = logging.getLogger(__name__)


class CallbackHandler(TrainerCallback):
    """Calls a list of callbacks, in order, for each event.

    ``model``, ``processing_class``, ``optimizer``, ``lr_scheduler``, ``train_dataloader`` and
    ``eval_dataloader`` are attributes the Trainer updates as it builds them; each event passes their
    current values to every callback. Each ``on_*`` method first clears the flags that event starts
    from (see ``TrainerCallback``), then returns the control left by the last callback.
    """

    def __init__(
        self,
        callbacks: Iterable[Any],
        model: Any,
        processing_class: Any,
        optimizer: Any,
        lr_scheduler: Any,
    ) -> None:
        self.callbacks: list[TrainerCallback] = []
        for callback in callbacks:
            self.add_callback(callback)
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader: Any = None
        self.eval_dataloader: Any = None
        self._warned_no_flow = False
        self._check_flow()

    # -- the list ------------------------------------------------------------------------------------

    def add_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Append a callback (an instance, or a class instantiated without arguments)."""
        cls = callback if isinstance(callback, type) else type(callback)
        instance = callback() if isinstance(callback, type) else callback
        if any(type(existing) is cls for existing in self.callbacks):
            logger.warning(
                "Adding a second %s (%s) to the Trainer's callbacks; both will run. Current callbacks:\n%s",
                cls.__name__,
                cls,
                self.callback_list,
            )
        self.callbacks.append(instance)

    def pop_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> TrainerCallback | None:
        """Remove and return the first instance of a class, or that very instance; None if absent."""
        for index, existing in enumerate(self.callbacks):
            if _matches(existing, callback):
                return self.callbacks.pop(index)
        return None

    def remove_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        """Remove the first instance of a class, or that very instance; ValueError if absent."""
        if self.pop_callback(callback) is None:
            name = callback.__name__ if isinstance(callback, type) else repr(callback)
            raise ValueError(
                f"Cannot remove callback {name}: it is not among the Trainer's callbacks "
                f"[{', '.join(type(cb).__name__ for cb in self.callbacks)}]"
            )

    @property
    def callback_list(self) -> str:
        """The class names of the callbacks, one per line."""
        return "\n".join(type(cb).__name__ for cb in self.callbacks)

    def _check_flow(self) -> None:
        # Checked at construction and again at train begin (a callback may have been removed since);
        # one warning per handler is enough.
        if self._warned_no_flow or any(isinstance(cb, DefaultFlowCallback) for cb in self.callbacks):
            return
        self._warned_no_flow = True
        logger.warning(
            "No DefaultFlowCallback among the Trainer's callbacks: nothing will set the log/evaluate/save/stop "
            "flags, so training runs without logging, evaluation or checkpoints unless another callback sets "
            "them. Add it back with trainer.add_callback(DefaultFlowCallback). Current callbacks:\n%s",
            self.callback_list,
        )

    # -- events --------------------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        self._check_flow()
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control._new_step()
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_pre_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any = None, **kwargs: Any
    ) -> TrainerControl:
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any = None, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: Any = None, **kwargs: Any
    ) -> TrainerControl:
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        return self.call_event("on_push_begin", args, state, control, **kwargs)

    def call_event(
        self, event: str, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Call ``event`` on every callback in order; a returned TrainerControl replaces ``control``.

        Raises TypeError naming the callback if an event returns anything other than None or a
        TrainerControl (the loop would otherwise fail later, far from the cause).
        """
        listeners = self._listeners(event)
        if not listeners:
            return control  # nobody overrides this event: skip building the keyword arguments (hot path)
        common = {
            "model": self.model,
            "processing_class": self.processing_class,
            "optimizer": self.optimizer,
            "lr_scheduler": self.lr_scheduler,
            "train_dataloader": self.train_dataloader,
            "eval_dataloader": self.eval_dataloader,
        }
        common.update(kwargs)
        for callback in listeners:
            result = getattr(callback, event)(args, state, control, **common)
            if result is None:
                continue
            if not isinstance(result, TrainerControl):
                raise TypeError(
                    f"{type(callback).__name__}.{event} returned a {type(result).__name__}; an event must return "
                    "the TrainerControl it was given (possibly modified) or None"
                )
            control = result
        return control

    def has_listeners(self, event: str) -> bool:
        """Whether any callback implements ``event`` (lets hot loops skip events nobody listens to)."""
        return bool(self._listeners(event))

    def _listeners(self, event: str) -> list[TrainerCallback]:
        """The callbacks that implement ``event`` (the base class's no-op does not count), in order.

        Cached per event, and rebuilt whenever the callback list changes (checked by identity, so editing
        ``handler.callbacks`` directly is fine too).
        """
        signature = tuple(map(id, self.callbacks))
        if signature != getattr(self, "_listener_signature", None):
            self._listener_signature = signature
            self._listener_cache: dict[str, list[TrainerCallback]] = {}
        found = self._listener_cache.get(event)
        if found is None:
            base = getattr(TrainerCallback, event, None)
            found = [cb for cb in self.callbacks if _implementation(cb, event) is not base]
            self._listener_cache[event] = found
        return found


def _implementation(callback: TrainerCallback, event: str) -> Any:
    method = getattr(callback, event, None)
    return getattr(method, "__func__", method)


def _matches(existing: TrainerCallback, wanted: type[TrainerCallback] | TrainerCallback) -> bool:
    # An instance is matched by identity: two equal-looking callbacks are still two callbacks.
    if isinstance(wanted, type):
        return isinstance(existing, wanted)
    return existing is wanted
