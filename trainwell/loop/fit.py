"""The training loop: one ``train()`` call, as epochs of accumulation windows with events in between.

Owns the order of a run, and only that:

1. build the loader and the step plan (``get_train_dataloader``, ``set_initial_training_values``);
2. set up ``TrainerState``, fresh or from the checkpoint;
3. create and prepare the optimizer and scheduler, then restore their states when resuming;
4. walk the epochs (``trainwell.loop.epochs``), one optimizer step per window (``trainwell.loop.step``),
   with the log / evaluate / save boundary after each step and each epoch (``trainwell.loop.boundary``);
5. finish: the train metrics, the best model if asked, ``on_train_end``.

It sees the Trainer only through ``trainwell.hooks.TrainerHooks``, so every overridable method a subclass
replaces is the one called. The order of events is written once, on ``trainwell.events.callback``. Checkpoints
are the run's checkpointer's (``trainer.checkpointer``, ``trainwell.checkpoint.checkpointer``): the loop hands it
the step plan and its stateful parts (``FitLoop._register``: the data position, the epoch's loader seed, the batch
read ahead, the log window) and asks it to restore each phase of a resume when the run reaches it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainwell.backend.runtime import gather_loss_sum
from trainwell.checkpoint.contents import Phase
from trainwell.data.train_loader import TrainFeed
from trainwell.loop.epochs import EpochIterator
from trainwell.loop.plan import StepPlan
from trainwell.loop.progress import TrainingRun
from trainwell.loop.rollback import DataSkips
from trainwell.loop.step import OptimizerStep
from trainwell.outputs import TrainOutput
from trainwell.state import TrainerState
from trainwell.utils.metrics import speed_metrics

if TYPE_CHECKING:
    from trainwell.checkpoint.checkpointer import Checkpointer
    from trainwell.hooks import TrainerHooks

logger = logging.getLogger(__name__)


class FitLoop:
    """One ``train()`` call. Created by the Trainer, used once."""

    def __init__(self, hooks: TrainerHooks, trial: Any, ignore_keys: Any,
                 add_memory: Callable[[dict[str, float]], None] | None = None) -> None:
        self.hooks, self.trial, self.ignore_keys = hooks, trial, ignore_keys
        self.add_memory = add_memory  # ends the train stage's memory tracking, adding its metrics to a dict
        self.args = hooks.args
        self.checkpointer: Checkpointer = hooks.checkpointer  # this call's (Trainer.train makes one per call)
        self.resume = self.checkpointer.resume

    def run(self) -> TrainOutput:
        hooks, args, resume, checkpointer = self.hooks, self.args, self.resume, self.checkpointer
        checkpointer.restore(Phase.WEIGHTS)  # before the model is prepared
        checkpointer.begin_run()  # output_dir's placement checked, an interrupted save's folders removed
        loader = hooks.get_train_dataloader()
        plan = StepPlan.of(hooks.set_initial_training_values(args, loader), args.gradient_accumulation_steps)
        checkpointer.use_plan(plan.max_steps, plan.total_train_batch_size, plan.position_at, plan.position_of_samples)
        self._init_state(plan)
        model = self._prepare(plan, loader)
        run = hooks.training_run = TrainingRun(hooks, plan, TrainFeed.of(loader))
        epochs = EpochIterator(hooks, run.feed, plan, checkpointer)
        self._register(run, epochs)
        self.step = OptimizerStep(hooks, model, run)
        self.timing_compile = hooks.runtime.compile_backend is not None  # the first step compiles: say how long
        self.model, self.run = model, run
        try:  # from here on the optimizer carries the guard's found_inf: taken off below, however this ends
            first_epoch, last_epoch = self._begin(plan, model)
            for epoch in range(first_epoch, last_epoch):
                skip_windows = resume.windows_done if resume is not None and epoch == first_epoch else 0
                self._fire("on_epoch_begin")
                self._run_epoch(epochs, epoch, skip_windows)
                if hooks.control.should_training_stop:
                    break
            checkpointer.wait()  # save_async: the last checkpoint is published before the best one is reloaded
        finally:
            checkpointer.finish_quietly()  # training failed: still let a checkpoint in flight reach the disk
            run.close()  # the step applier, and what callbacks opened for this train() call (run.on_close)
        return self._finish()

    def _begin(self, plan: StepPlan, model: Any) -> tuple[int, int]:
        """What happens before the first epoch: the summary, ``on_train_begin``, ``eval_on_start``; returns the
        epochs to run (none when a resumed checkpoint is already at ``max_steps``)."""
        hooks, args, resume = self.hooks, self.args, self.resume
        hooks.model.zero_grad(set_to_none=True)  # the module itself: an engine's zero_grad takes no arguments
        if hooks.runtime.is_main_process:
            self._announce(plan)
        self._fire("on_train_begin")
        self.step.listen()
        self.skips = DataSkips.of(hooks.state)  # rollback_on_spike's skipped steps, as log_history records them
        if args.eval_on_start:
            hooks._evaluate(self.trial, self.ignore_keys, skip_scheduler=True)
        # The whole tree in train mode, as the reference's every step does: a module built around a loaded model
        # (which from_pretrained leaves in eval mode) is training at the top with its dropout still off. Later
        # steps only check the top (training_step): evaluation switches the whole tree at once.
        model.train()
        first_epoch = resume.epoch if resume is not None else 0
        if resume is not None and hooks.state.global_step >= plan.max_steps:
            # A checkpoint of a finished run (the reference takes one step past max_steps here).
            logger.warning(
                "The checkpoint is at step %d and max_steps is %d: nothing is left to train. Raise max_steps "
                "(or num_train_epochs) to train further.", hooks.state.global_step, plan.max_steps,
            )  # fmt: skip
            return first_epoch, first_epoch
        return first_epoch, plan.num_train_epochs

    def _announce(self, plan: StepPlan) -> None:
        """The summary users know from the reference's log, at INFO on the main process."""
        hooks, args, resume = self.hooks, self.args, self.resume
        epochs = plan.num_train_epochs if plan.sized else "unknown (max_steps)"
        logger.info(
            "***** Running training *****\n  Num examples = %s\n  Num Epochs = %s\n  Instantaneous batch size per "
            "device = %d\n  Total train batch size (w. parallel, distributed & accumulation) = %d\n  Gradient "
            "Accumulation steps = %d\n  Total optimization steps = %d\n  Number of trainable parameters = %s",
            f"{plan.num_examples:,}", epochs, args.per_device_train_batch_size, plan.total_train_batch_size,
            args.gradient_accumulation_steps, plan.max_steps, f"{hooks.get_num_trainable_parameters():,}",
        )  # fmt: skip
        if resume is not None:
            logger.info("  Continuing training from checkpoint %s, at step %d (epoch %d)", resume.path,
                        hooks.state.global_step, resume.epoch)

    def _fire(self, event: str) -> None:
        hooks = self.hooks
        hooks.control = getattr(hooks.callback_handler, event)(hooks.args, hooks.state, hooks.control)

    # ------------------------------------------------------------------------------------------- set-up
    def _init_state(self, plan: StepPlan) -> None:
        """A fresh ``TrainerState``, or the checkpoint's (with the callbacks' states when asked)."""
        hooks, args = self.hooks, self.args
        # The callbacks' states as training begins, as the reference records them (save_state() writes these
        # until a checkpoint records newer ones). The process roles are set once, by init_training_references
        # below (a resumed state holds the roles of the process that saved it).
        hooks.state = TrainerState(stateful_callbacks=[*hooks.callback_handler.callbacks, hooks.control])
        self.checkpointer.restore(Phase.STATE)  # resuming: the checkpoint's state, and where its data stands
        state = hooks.state
        if self.resume is not None and self.resume.rollback is not None:  # rollback_on_spike came back here: why
            state.log_history.append(self.resume.rollback)
        state.is_hyper_param_search = self.trial is not None
        state.train_batch_size = plan.total_train_batch_size // (plan.accumulation * hooks.runtime.data_parallel_size)
        state.compute_steps(args, plan.max_steps)
        state.init_training_references(hooks, plan.max_steps, plan.epochs_for(plan.max_steps), self.trial)

    def _prepare(self, plan: StepPlan, loader: Any) -> Any:
        """Create the optimizer and scheduler, prepare them with the model, and restore them when resuming."""
        hooks, runtime = self.hooks, self.hooks.runtime
        if hooks.optimizer is None:
            hooks.create_optimizer()
        hooks.create_scheduler(num_training_steps=plan.max_steps, optimizer=hooks.optimizer)
        model, hooks.optimizer, hooks.lr_scheduler = runtime.prepare(
            hooks.model, hooks.optimizer, hooks.lr_scheduler, plan.max_steps
        )
        hooks.model_wrapped = model
        hooks.deepspeed = runtime.engine.reference_engine(model)  # the reference's attribute: DeepSpeed's engine
        self.checkpointer.restore(Phase.OPTIMIZER)
        handler = hooks.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = hooks.model, hooks.optimizer, hooks.lr_scheduler
        handler.train_dataloader = loader
        return model

    def _register(self, run: TrainingRun, epochs: EpochIterator) -> None:
        """Hand the checkpointer the loop's parts that a checkpoint keeps: the ``CONTENTS`` rows that no Trainer
        method restores (the Trainer's parts are saved and restored by its methods)."""
        checkpointer, feed = self.checkpointer, run.feed
        checkpointer.register("epoch_seed", epochs.seed_provider)
        checkpointer.register("pending_batch", epochs.pending_provider)
        checkpointer.register("epoch_samples", epochs.samples_provider)
        checkpointer.register("log_window", run.log_window)
        checkpointer.register("skipped_steps", run.applier)  # skip_nonfinite_steps' count read at a save
        if feed.position is not None:  # a stateful IterableDataset's position
            checkpointer.register("data_position", feed.position)

    # ------------------------------------------------------------------------------------------- epochs
    def _run_epoch(self, epochs: EpochIterator, epoch: int, skip_windows: int) -> None:
        hooks, plan = self.hooks, self.run.plan
        windows = epochs.start(epoch, skip_windows)
        while not (hooks.control.should_epoch_stop or hooks.control.should_training_stop):
            window = next(windows, None)
            if window is None:
                break
            if hooks.state.global_step >= self.skips.next_from:  # a step rollback_on_spike skips: read, dropped
                self._pass_over(epoch, epochs)
                continue
            started = time.perf_counter() if self.timing_compile else 0.0
            self.step.run_window(window)
            if self.timing_compile:
                self._log_compile_time(time.perf_counter() - started)
            hooks.state.global_step += 1
            hooks.state.epoch = epoch + epochs.consumed / plan.steps_in_epoch
            self._fire("on_step_end")
            self._boundary(epoch)
        if epochs.consumed == 0:
            logger.warning(
                "The training data yielded no batch in epoch %d; stopping at step %d. An IterableDataset shorter "
                "than max_steps × batch size ends training early like this.", epoch, hooks.state.global_step,
            )  # fmt: skip
            hooks.control.should_training_stop = True
        self._fire("on_epoch_end")
        self._boundary(epoch)

    def _pass_over(self, epoch: int, epochs: EpochIterator) -> None:
        """Count a skipped step without training on its batches (no event, no log, no optimizer or scheduler step);
        after the last of a skipped range the log window starts afresh."""
        state = self.hooks.state
        state.global_step += 1
        self.hooks.heartbeat.beats += 1  # step_timeout: a batch read and passed over is progress
        state.epoch = epoch + epochs.consumed / self.run.plan.steps_in_epoch
        if not self.skips.skips(state.global_step + 1):
            self.skips.advance(state.global_step)
            self.run.losses.restart_window(state.global_step)
        if state.global_step >= self.run.plan.max_steps:
            self.hooks.control.should_training_stop = True

    def _log_compile_time(self, seconds: float) -> None:
        self.timing_compile = False
        logger.info("torch.compile (%s backend): the first training step took %.1f s, compilation included.",
                    self.hooks.runtime.compile_backend, seconds)

    def _boundary(self, epoch: int) -> None:
        self.hooks._maybe_log_save_evaluate(
            self.run.losses, self.step.grad_norm, self.model, self.trial, epoch, self.ignore_keys,
            self.run.start_time, learning_rate=self.step.learning_rate,
        )

    # ------------------------------------------------------------------------------------------- finish
    def _finish(self) -> TrainOutput:
        hooks, run, state = self.hooks, self.run, self.hooks.state
        losses = run.losses
        losses.logged_total += gather_loss_sum(hooks.runtime, losses.take())
        steps_this_call = state.global_step - run.initial_global_step
        train_loss = losses.logged_total / max(steps_this_call, 0.001)
        metrics = speed_metrics(
            "train", run.start_time, num_samples=run.plan.num_train_samples * steps_this_call / max(state.max_steps, 1),
            num_steps=steps_this_call,
        )
        hooks.store_flos()
        metrics["total_flos"] = state.total_flos
        metrics["train_loss"] = train_loss
        skipped = run.applier.finish()
        if skipped:  # skip_nonfinite_steps: every step this call did not apply
            metrics["skipped_nonfinite_steps"] = skipped
        if self.args.load_best_model_at_end and state.best_model_checkpoint is not None:
            hooks._load_best_model()
        if self.add_memory is not None:
            self.add_memory(metrics)  # train_mem_* (and init_mem_*) are logged with the train metrics
        hooks.log(metrics)  # adds epoch and the token count: TrainOutput.metrics carries them, as the reference's
        self.checkpointer.end_run(hooks._get_output_dir(self.trial))  # save_total_limit=1: only the best is kept
        self._fire("on_train_end")
        hooks._finish_current_push()  # the last checkpoint's Hub upload lands before train() returns
        return TrainOutput(state.global_step, train_loss, metrics)
