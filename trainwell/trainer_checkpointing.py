"""The ``Trainer``'s checkpoints: saving the model and state, resuming, and where resumed data starts.

Owns the Trainer side of ``trainwell.checkpoint``: ``save_model`` / ``save_state`` / ``_save_checkpoint``,
loading a checkpoint for ``train(resume_from_checkpoint=...)``, and the epoch iterator that starts after the
batches a resumed run already consumed. What a checkpoint holds is listed once, in
``trainwell.checkpoint.training_state``.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from torch import nn

from trainwell.checkpoint import layout as ckpt_layout
from trainwell.checkpoint import training_state as ckpt_state
from trainwell.checkpoint.io import load_model_weights, save_model_weights, write_json
from trainwell.checkpoint.layout import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from trainwell.state import TrainerState
from trainwell.utils import model as model_utils

logger = logging.getLogger(__name__)


class CheckpointMixin:
    def _resolve_resume(self, resume_from_checkpoint: str | bool | None) -> str | None:
        """The checkpoint to resume from (True: the newest complete one), with its model weights loaded."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = ckpt_layout.get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"resume_from_checkpoint=True but no complete checkpoint was found in output_dir "
                    f"({self.args.output_dir}). Pass a checkpoint path, or train from scratch."
                )
        if resume_from_checkpoint is not None:
            resume_from_checkpoint = str(resume_from_checkpoint)
            self._load_from_checkpoint(resume_from_checkpoint)
        self._resumed_from = resume_from_checkpoint
        if self.args.should_save:
            ckpt_layout.clean_temporary(self.args.output_dir)
        return resume_from_checkpoint

    def _load_optimizer_and_scheduler(self, checkpoint: str) -> None:
        ckpt_state.load_optimizer_and_scheduler(self, checkpoint)

    def _load_from_checkpoint(self, checkpoint: str) -> None:
        reason = ckpt_layout.incomplete_reason(checkpoint) if os.path.isdir(checkpoint) else "it is not a folder"
        if reason is not None:
            raise ValueError(f"Can't resume from {checkpoint}: {reason}.")
        load_model_weights(model_utils.unwrap(self.model), checkpoint, strict=True)

    def _init_training_state(self, max_steps: int, upe: int, resume: str | None, trial: Any) -> tuple[int, int]:
        """Fresh or restored ``TrainerState``; returns (epochs already done, windows done in the current one)."""
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero()
        )
        epochs_trained, windows_done = 0, 0
        if resume is not None:
            self.state = TrainerState.load_from_json(os.path.join(resume, ckpt_layout.TRAINER_STATE_NAME))
            self.state.is_local_process_zero = self.is_local_process_zero()
            self.state.is_world_process_zero = self.is_world_process_zero()
            best = self.state.best_model_checkpoint
            if best is not None and not os.path.isdir(best):
                logger.warning("The best checkpoint %s recorded in the resumed state no longer exists.", best)
                self.state.best_model_checkpoint = None
            epochs_trained = self.state.global_step // upe
            windows_done = 0 if self.args.ignore_data_skip else self.state.global_step % upe
            position = self._unsized_data_position()
            if position is not None:
                epochs_trained, windows = position
                windows_done = 0 if self.args.ignore_data_skip else windows
            self._resume_epoch = epochs_trained
            if self.args.restore_callback_states_from_checkpoint:
                ckpt_state.restore_callback_states(self)
        self.state.is_hyper_param_search = trial is not None
        self.state.train_batch_size = self._train_batch_size
        self.state.compute_steps(self.args, max_steps)
        self.state.init_training_references(self, max_steps, self._num_train_epochs(max_steps, upe), trial)
        return epochs_trained, windows_done

    def _unsized_data_position(self) -> tuple[int, int] | None:
        """(pass, windows consumed in it) of a resumed run over data without a length; None for sized data.

        Without a length, ``updates_per_epoch`` is ``max_steps``, so ``global_step`` alone cannot say in which
        pass over the data the checkpoint was written. ``state.epoch`` can: the loop sets it to
        ``pass + batches_consumed_in_pass / (max_steps * gradient_accumulation_steps)``, with the ``max_steps`` of
        the run that wrote it. A pass that ended with a short window rounds up, so the replay runs to the end of
        that pass.
        """
        from trainwell.data.loaders import has_length

        dataset = getattr(self, "train_dataset", None)
        epoch = self.state.epoch
        # the scale of the run that wrote the checkpoint (this run may train for longer)
        max_steps = self.state.max_steps or self.args.max_steps
        if dataset is None or has_length(dataset) or epoch is None or max_steps <= 0:
            return None
        ga = self.args.gradient_accumulation_steps
        passes = int(math.floor(epoch))
        consumed = int(round((epoch - passes) * max_steps * ga))
        return passes, -(-consumed // ga)

    def _replay_earlier_passes(self, dataloader: Any, epoch: int) -> None:
        """Iterate the passes before ``epoch`` of an iterable dataset that has no ``set_epoch``.

        Such a dataset's order may depend on how many times it was iterated (a stream, a generator, a shuffle
        drawn per ``__iter__``), so resuming in a later pass reads the earlier ones again, as the uninterrupted
        run did (cost: reading them). A dataset with ``set_epoch`` orders each pass by its epoch number: nothing
        to replay.
        """
        if epoch <= 0 or hasattr(getattr(self, "train_dataset", None), "set_epoch"):
            return
        for _ in range(epoch):
            for _ in dataloader:
                pass

    def _epoch_iterator(self, dataloader: Any, epoch: int, skip_batches: int, resume: str | None) -> Any:
        """An iterator over ``epoch`` that starts after ``skip_batches`` micro-batches.

        Map-style data skips at the sampler (nothing is loaded); iterable data is replayed, unless it can
        restore its own position (``state_dict``/``load_state_dict``, see ``trainwell.checkpoint``).
        """
        resuming_here = resume is not None and epoch == self._resume_epoch
        restored = False
        if skip_batches and resuming_here and not self.args.ignore_data_skip:
            restored = ckpt_state.restore_data_state(self, resume)
            if restored:
                skip_batches = 0  # the dataset resumes at its saved position by itself
        sampler = getattr(self, "_train_sampler", None)
        if resuming_here and sampler is None and not restored and not self.args.ignore_data_skip:
            if self._unsized_data_position() is not None:
                self._replay_earlier_passes(dataloader, epoch)
        if sampler is not None:
            sampler.set_epoch(epoch)
        generator = getattr(self, "_train_generator", None)
        if generator is not None:
            generator.manual_seed(self._data_seed() + epoch)
        # Accelerate's prepared loaders forward set_epoch to their dataset; a plain DataLoader has none.
        target = dataloader if hasattr(dataloader, "set_epoch") else getattr(dataloader, "dataset", None)
        if hasattr(target, "set_epoch") and target is not sampler:
            target.set_epoch(epoch)
        if skip_batches and sampler is not None:
            sampler.skip(skip_batches * self._train_batch_size * self.runtime.num_processes)
            return iter(dataloader)
        iterator = iter(dataloader)
        position = getattr(self, "_data_position", None)
        if position is not None:
            iterator = position.track(iterator)
        for _ in range(skip_batches):  # iterable data: replay (documented cost)
            next(iterator, None)
        return iterator

    def _jit_callback(self) -> Any:
        from trainwell.checkpoint.preemption import JITCheckpointCallback

        return next((cb for cb in self.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback)), None)

    def _end_preemption(self) -> bool:
        """Restore the signal handlers after ``train()``; True when Ctrl-C stopped it (after saving)."""
        callback = self._jit_callback()
        if callback is None:
            return False
        callback.uninstall()
        return callback.interrupted

    def _data_seed(self) -> int:
        return self.args.data_seed if self.args.data_seed is not None else self.args.seed

    def _restore_rng(self, checkpoint: str) -> None:
        ckpt_state.restore_rng(self, checkpoint)

    def _finish_training(self) -> None:
        """End of training: reload the best model when asked."""
        if self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            best = self.state.best_model_checkpoint
            logger.info("Loading best model from %s (score: %s).", best, self.state.best_metric)
            load_model_weights(model_utils.unwrap(self.model), best, strict=False)

    def _get_output_dir(self, trial: Any) -> str:
        return self.args.output_dir

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        self._flush_token_count()
        self.store_flos()
        ckpt_state.save_checkpoint(self, self._get_output_dir(trial))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Write the model (safetensors), processing class and training args to ``output_dir``."""
        self._save(output_dir)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        save_model_weights(model_utils.unwrap(self.model), output_dir, state_dict=state_dict)
        processing = self.processing_class or getattr(self.data_collator, "tokenizer", None)
        if processing is not None and hasattr(processing, "save_pretrained"):
            processing.save_pretrained(output_dir)
        write_json(self.args.to_dict(), os.path.join(output_dir, TRAINING_ARGS_NAME))

    def save_state(self) -> None:
        """Write ``trainer_state.json`` into ``output_dir``."""
        if self.args.should_save:
            self.state.record_callback_states(self.callback_handler.callbacks + [self.control])
            os.makedirs(self.args.output_dir, exist_ok=True)
            self.state.save_to_json(os.path.join(self.args.output_dir, TRAINER_STATE_NAME))
