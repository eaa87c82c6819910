"""The callback base class, and the one place where the order of events is written down.

Owns: ``TrainerCallback`` (16 no-op events) and ``EVENTS`` (their names). Dispatching events to a list of
callbacks belongs to ``handler.py``; turning strategies into control flags belongs to ``flow.py``; firing
the events at the right moments belongs to the fit and evaluation loops, which follow the pseudocode below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from trainwell.state import TrainerControl, TrainerState


class TrainerCallback:
    """Base class for objects that watch the training loop and steer it through ``TrainerControl``.

    Every event is called as ``event(args, state, control, **kwargs)``: ``args`` is the
    ``TrainingArguments``, ``state`` the ``TrainerState``, ``control`` the ``TrainerControl``. The keyword
    arguments are always ``model, processing_class, optimizer, lr_scheduler, train_dataloader,
    eval_dataloader`` (None when not built yet), plus ``logs`` for ``on_log`` and ``metrics`` for
    ``on_evaluate``/``on_predict``. Take what you need by name and swallow the rest with ``**kwargs``.

    An event may mutate ``control`` in place or return a ``TrainerControl``, which then replaces it for the
    following callbacks and the loop; returning None keeps the current one. Callbacks run in the order they
    were added; ``DefaultFlowCallback`` comes first in a Trainer, so later callbacks see its decisions.

    When the events fire (the single source of truth for their order; "log", "evaluate" and "save" are the
    blocks defined at the bottom)::

        Trainer.__init__:
            on_init_end
        train():
            on_train_begin                      # control.should_training_stop = False first
            if args.eval_on_start: evaluate
            for each epoch:
                on_epoch_begin                  # control.should_epoch_stop = False first
                for each optimizer step (a window of gradient_accumulation_steps micro-batches):
                    on_step_begin               # before the first micro-batch; clears should_log/evaluate/save
                    for each micro-batch:
                        forward + backward
                        if it is not the last of the window: on_substep_end
                    clip gradients
                    on_pre_optimizer_step
                    optimizer.step()
                    on_optimizer_step           # gradients are still there
                    scheduler.step(); zero_grad(); state.global_step += 1
                    on_step_end                 # DefaultFlowCallback sets the flags here
                    log if control.should_log; evaluate if control.should_evaluate; save if control.should_save
                    stop the epoch if control.should_epoch_stop or control.should_training_stop
                on_epoch_end                    # DefaultFlowCallback sets the epoch-strategy flags here
                log / evaluate / save, as after a step
                stop if control.should_training_stop
            log (the final train metrics)
            on_train_end
        evaluate():
            on_prediction_step                  # after each batch
            log (the eval metrics)
            on_evaluate(metrics=...)            # clears should_evaluate first
        predict():
            on_prediction_step                  # after each batch
            on_predict(metrics=...)
        log:
            on_log(logs=...)                    # clears should_log first
        save:
            write the checkpoint
            on_save                             # clears should_save first
        on_push_begin                           # never fired by trainwell: it has no Hub push

    The flags are reset by the handler before the callbacks run, so a callback sees (and may set) the flag
    for the current moment only.
    """

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """At the end of ``Trainer.__init__``."""

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Before the first epoch, once the model, optimizer and data are ready."""

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After the last step and the final train-metrics log."""

    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """At the start of each epoch."""

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """At the end of each epoch, before its log/evaluate/save."""

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Before the first micro-batch of an optimizer step."""

    def on_pre_optimizer_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After gradient clipping, before ``optimizer.step()``: the place to inspect clipped gradients."""

    def on_optimizer_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After ``optimizer.step()``, before the gradients are zeroed."""

    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After each micro-batch of an accumulation window except the last."""

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After an optimizer step, once ``state.global_step`` counts it; before log/evaluate/save."""

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """At the end of ``evaluate()``; ``metrics`` holds the prefixed eval metrics."""

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """At the end of ``predict()``; ``metrics`` holds the prefixed test metrics."""

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After a checkpoint has been written."""

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After ``logs`` (a dict shared with the Trainer: do not mutate it) was appended to the history."""

    def on_prediction_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """After each batch of ``evaluate()`` or ``predict()``."""

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Before a push to the Hub. Kept for API compatibility; trainwell never fires it."""


# Declaration order, not firing order: the firing order is the pseudocode above.
EVENTS: tuple[str, ...] = tuple(name for name in vars(TrainerCallback) if name.startswith("on_"))
