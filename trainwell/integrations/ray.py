"""Ray Train as the cluster engine: each checkpoint reported to Ray, and a restarted worker resuming Ray's.

A ``ray.train.torch.TorchTrainer`` starts the workers and sets up their process group; the training function
builds the ``Trainer`` as in any script, and Accelerate joins that group. This module adds what makes Ray's
failure handling work with it:

- :class:`RayTrainReportCallback` reports every checkpoint the Trainer saves, with the latest logged metrics, to
  ``ray.train.report`` (Ray keeps it in ``RunConfig(storage_path=...)``);
- :func:`latest_checkpoint` is the trainwell checkpoint inside the checkpoint Ray holds for the run (``None`` on a
  first start), for ``trainer.train(resume_from_checkpoint=latest_checkpoint())``: when
  ``FailureConfig(max_failures=...)`` restarts the workers, they continue from the last checkpoint Ray registered,
  bit for bit.

The Ray checkpoint has the layout of ``ray.train.huggingface.transformers.RayTrainReportCallback`` (the trainwell
checkpoint in a ``checkpoint/`` folder), so code written for that callback reads it unchanged, and
:func:`latest_checkpoint` reads what that callback reports. Only world process zero hands Ray a checkpoint (the
others report ``None``, as Ray's contract allows: every worker calls ``report`` the same number of times); its
``checkpoint-N`` holds every process's RNG state (and every shard under FSDP or DeepSpeed, whose ``output_dir`` is
on a shared file system), so no two processes upload the same file. Tested with Ray 2.60's Ray Train (V2, the
default there).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

from trainwell.args.storage import local_output_dir
from trainwell.checkpoint.layout import TMP_PREFIX, TRAINER_STATE_NAME, checkpoint_path
from trainwell.events.callback import TrainerCallback
from trainwell.outputs import PREFIX_CHECKPOINT_DIR
from trainwell.utils.safe_files import copy_file

logger = logging.getLogger(__name__)

#: the folder of a reported Ray checkpoint that holds the trainwell checkpoint (the name Ray's own callback uses)
CHECKPOINT_NAME = "checkpoint"


def _ray_train(what: str) -> Any:
    """``ray.train``, or an ImportError saying how to install it."""
    try:
        import ray.train
    except ImportError as err:
        raise ImportError(
            f"{what} reports to Ray Train, which is not installed ({err}): pip install 'ray[train]'"
        ) from None
    return ray.train


def _require_worker(train: Any, what: str) -> None:
    """A RuntimeError naming the fix unless this process is a worker of a Ray Train run."""
    try:
        train.get_context()  # RuntimeError outside the workers of trainer.fit(); DeprecationWarning in a Tune trial
    except (RuntimeError, DeprecationWarning):
        raise RuntimeError(
            f"{what} runs inside a Ray Train worker, and this process is not one. Call it in the training function "
            "that ray.train.torch.TorchTrainer(train_func, ...).fit() runs on each worker (see docs/scaling.md); "
            "outside Ray Train, leave the callback out and resume with resume_from_checkpoint=True "
            "(hyperparameter_search on Ray Tune reports its trials' checkpoints by itself)."
        ) from None


class RayTrainReportCallback(TrainerCallback):
    """Reports each checkpoint the Trainer saves, with the latest logged metrics, to Ray Train.

    At every save, every process calls ``ray.train.report(metrics, checkpoint=...)`` once (Ray requires it of
    all workers); world process zero passes the checkpoint, the others ``None``. The metrics are the newest value
    of every key logged so far (``loss``, ``eval_loss``, ...) with ``step`` and ``epoch`` of the checkpoint; Ray
    attaches world process zero's to the checkpoint (``result.metrics``, ``CheckpointConfig``'s
    ``checkpoint_score_attribute``). The Ray checkpoint holds the trainwell checkpoint in ``checkpoint/``
    (:data:`CHECKPOINT_NAME`); its files are hard links to ``output_dir/checkpoint-N`` while Ray copies them (a
    copy where the file system has no hard links).

    Raises RuntimeError when training starts outside a Ray Train worker, or with ``save_async=True`` (its
    checkpoint is published after ``on_save``, too late to report).
    """

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(self) -> None:
        _ray_train("RayTrainReportCallback")  # installed? (the module itself is looked up when used: picklable)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if getattr(args, "save_async", False):
            raise RuntimeError(
                "RayTrainReportCallback reports each checkpoint to Ray when it is saved, and save_async=True "
                "publishes it later, in the background: set save_async=False when training on Ray Train."
            )
        _require_worker(_ray_train("RayTrainReportCallback"), "RayTrainReportCallback")
        if args.save_strategy == "no":  # a str enum once TrainingArguments normalized it
            logger.warning(
                "RayTrainReportCallback reports checkpoints, and save_strategy='no' saves none: Ray Train gets "
                "nothing to restart a failed worker from. Set save_strategy='steps' (with save_steps) or 'epoch'."
            )

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        train, metrics = _ray_train("RayTrainReportCallback"), latest_metrics(state)
        if not state.is_world_process_zero:
            train.report(metrics, checkpoint=None)
            return
        source = checkpoint_path(local_output_dir(args), state.global_step)
        # Staged beside the checkpoint (same file system: links, not copies) and removed once Ray has copied it;
        # the name is one of a save's temporary folders, which the next train() clears if this process dies here.
        stage = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{PREFIX_CHECKPOINT_DIR}-ray-", dir=local_output_dir(args))
        try:
            shutil.copytree(source, os.path.join(stage, CHECKPOINT_NAME), copy_function=_link_or_copy)
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(stage))
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def latest_metrics(state: Any) -> dict[str, Any]:
    """The newest value of every key in ``state.log_history``, then ``step`` and ``epoch`` of ``state``."""
    metrics: dict[str, Any] = {}
    for entry in state.log_history:
        metrics.update(entry)
    metrics.update(step=state.global_step, epoch=state.epoch)
    return metrics


def _link_or_copy(source: str, target: str) -> str:
    try:
        os.link(source, target)
    except OSError:  # no hard links on this file system (or across devices): copy
        copy_file(source, target)
    return target


def latest_checkpoint() -> str | None:
    """The trainwell checkpoint of the latest checkpoint Ray Train holds for this run; None when it holds none.

    For ``trainer.train(resume_from_checkpoint=latest_checkpoint())`` in the training function: the first
    start trains from scratch, a restart (``FailureConfig(max_failures=...)``, or ``fit()`` again on the same
    ``RunConfig(name=..., storage_path=...)``) continues from the last checkpoint Ray registered. Reads the layout of
    :class:`RayTrainReportCallback` and of ``ray.train.huggingface.transformers.RayTrainReportCallback``
    (``checkpoint/`` inside), or a Ray checkpoint that is itself a trainwell checkpoint. On a local or shared
    ``storage_path`` the folder is Ray's own (nothing is copied); on cloud storage it is downloaded once per node
    into a temporary folder that is left in place (Ray's ``Checkpoint.to_directory``; not tried here).

    Raises RuntimeError outside a Ray Train worker, and ValueError when Ray's checkpoint holds no trainwell
    checkpoint.
    """
    train = _ray_train("latest_checkpoint()")
    _require_worker(train, "trainwell.integrations.ray.latest_checkpoint()")
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        return None
    import pyarrow.fs  # a dependency of ray[train]

    local = isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem)
    folder = checkpoint.path if local else checkpoint.to_directory()
    for candidate in (os.path.join(folder, CHECKPOINT_NAME), folder):
        if os.path.isfile(os.path.join(candidate, TRAINER_STATE_NAME)):
            return candidate
    raise ValueError(
        f"Ray Train's latest checkpoint {folder} holds no trainwell checkpoint (no {TRAINER_STATE_NAME} in it or in "
        f"its {CHECKPOINT_NAME}/ folder): it was reported by something other than RayTrainReportCallback. Report "
        "checkpoints with trainwell.integrations.ray.RayTrainReportCallback, or pass the checkpoint folder to "
        "resume_from_checkpoint yourself."
    )
