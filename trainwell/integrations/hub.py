"""Uploads to the Hugging Face Hub (``push_to_hub``, ``hub_strategy``) through the real ``huggingface_hub`` client.

Owns a run's Hub repository (created once, on the main process) and its uploads. ``huggingface_hub`` is
imported only when a push is asked for, and its endpoint setting (``HF_ENDPOINT``) is honoured.

What is uploaded matches the reference: after each checkpoint (``hub_strategy`` ``every_save``,
``checkpoint``, ``all_checkpoints``) the checkpoint's model files are copied to ``output_dir``, which is
uploaded without its ``checkpoint-*`` and ``_*`` entries; ``checkpoint`` also uploads the checkpoint folder as
``last-checkpoint`` (resumable from the Hub), ``all_checkpoints`` under its own name; ``end`` uploads only
from ``push_to_hub()`` / ``save_model()``. A checkpoint push is skipped while the previous one is still
running, unless ``hub_always_push``.

Where trainwell is safer: a step waits only for a hard-linked snapshot of the checkpoint (taken once an
asynchronous write is published); copying, uploading and cleaning up run on one background thread, from
snapshots, so a later save or ``save_total_limit`` deleting the checkpoint cannot tear an upload. A failed
background push is logged and training goes on (the files stay in ``output_dir``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

from trainwell.args.storage import local_output_dir
from trainwell.backend.stall import RECORD_FILE as STEP_TIMEOUT_RECORD
from trainwell.checkpoint.adapters import saved_adapters
from trainwell.checkpoint.layout import TMP_PREFIX
from trainwell.checkpoint.lock import LOCK_NAME
from trainwell.loop.live_log import LIVE_LOG_NAME
from trainwell.outputs import PREFIX_CHECKPOINT_DIR, HubStrategy
from trainwell.utils.safe_files import copy_file

logger = logging.getLogger(__name__)

# The reference's (never the checkpoints or private files), and a checkpoint still being written.
IGNORE_PATTERNS = ["_*", f"{PREFIX_CHECKPOINT_DIR}-*", f"{TMP_PREFIX}*"]
_STAGING = "_hub_staging"
# trainwell's own files in output_dir, which the reference does not write: never pushed with the model
_OWN_FILES = frozenset({LOCK_NAME, LIVE_LOG_NAME, STEP_TIMEOUT_RECORD})
_IGNORED = [*IGNORE_PATTERNS, *sorted(_OWN_FILES)]  # what an upload of output_dir leaves out
# A checkpoint's files that make up "the model" in output_dir (plus the shards an index names).
MODEL_FILES = ("config.json", "generation_config.json", "pytorch_model.bin", "model.safetensors",
               "adapter_config.json", "adapter_model.bin", "adapter_model.safetensors")
INDEX_FILES = ("pytorch_model.bin.index.json", "model.safetensors.index.json")


def hub_api() -> Any:
    """A ``huggingface_hub.HfApi`` (its endpoint from ``HF_ENDPOINT``), or an ImportError saying what to install."""
    try:
        from huggingface_hub import HfApi
    except ImportError as err:
        raise ImportError(
            "push_to_hub needs the huggingface_hub package: pip install huggingface_hub "
            "(or pip install 'trainwell[hub]')."
        ) from err
    return HfApi()


class PushInProgress:
    """The uploads started by one checkpoint push (the reference's object of the same name)."""

    def __init__(self, jobs: list[futures.Future] | None = None) -> None:
        self.jobs = [] if jobs is None else jobs

    def is_done(self) -> bool:
        return all(job.done() for job in self.jobs)

    def wait_until_done(self) -> None:
        futures.wait(self.jobs)

    def cancel(self) -> None:
        """Cancel the jobs that have not started; keep the running ones."""
        self.jobs = [job for job in self.jobs if not (job.cancel() or job.done())]


def repo_name(args: Any) -> str:
    """``hub_model_id``, else the name of ``output_dir`` (the reference's default)."""
    return args.hub_model_id or Path(args.output_dir).absolute().name


def create_repo(args: Any, token: str | None, private: bool | None) -> str:
    """Create (or find) the run's repository; returns its full id (``namespace/name``)."""
    url = hub_api().create_repo(repo_name(args), token=token, private=private, exist_ok=True)
    return url.repo_id


def init_repo(args: Any, token: str | None, private: bool | None) -> tuple[str, HubPusher]:
    """``Trainer.init_hf_repo``: the repository's id and the run's uploader (``hub_token`` and
    ``hub_private_repo`` unless given)."""
    token = token if token is not None else args.hub_token
    private = private if private is not None else args.hub_private_repo
    repo_id = create_repo(args, token, private)
    return repo_id, HubPusher(args, repo_id)


def commit_message(args: Any, state: Any) -> str:
    if args.save_strategy == "steps":
        return f"Training in progress, step {state.global_step}"
    return f"Training in progress, epoch {int(state.epoch or 0)}"


class HubPusher:
    """One run's background uploads: a single worker thread, so pushes land on the Hub in order."""

    def __init__(self, args: Any, repo_id: str) -> None:
        self.args, self.repo_id = args, repo_id
        self._executor: futures.ThreadPoolExecutor | None = None
        self._stages = itertools.count()

    def submit(self, job: Callable[[], Any], what: str) -> futures.Future:
        if self._executor is None:
            self._executor = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainwell-hub")
        future = self._executor.submit(job)
        future.add_done_callback(lambda done: _log_failure(done, what, local_output_dir(self.args)))
        return future

    def upload(self, folder: str, message: str | None, token: str | None = None, revision: str | None = None,
               path_in_repo: str | None = None, ignore: list[str] | None = None) -> Any:
        """Upload ``folder`` now (blocking) and return the commit info."""
        return hub_api().upload_folder(
            repo_id=self.repo_id, folder_path=folder, path_in_repo=path_in_repo, commit_message=message,
            token=token if token is not None else self.args.hub_token, ignore_patterns=ignore,
            revision=revision if revision is not None else self.args.hub_revision,
        )

    def stage(self, folder: str, skip_ignored: bool) -> Path:
        """A hard-linked snapshot of ``folder`` (files copied where links are refused) under
        ``output_dir/_hub_staging``: a later save replacing a file, or ``save_total_limit`` deleting the
        checkpoint, cannot tear the upload. ``skip_ignored`` leaves out the top-level entries
        ``IGNORE_PATTERNS`` names (the staging folder among them)."""
        stage = Path(local_output_dir(self.args)) / _STAGING / f"{next(self._stages)}-{Path(folder).name}"
        shutil.rmtree(stage, ignore_errors=True)  # left by a killed run
        for root, dirs, files in os.walk(folder):
            rel = Path(root).relative_to(folder)
            if skip_ignored and rel == Path("."):
                dirs[:] = [d for d in dirs if not _ignored(d)]
                files = [f for f in files if not _ignored(f)]
            (stage / rel).mkdir(parents=True, exist_ok=True)
            for name in files:
                _link_or_copy(os.path.join(root, name), stage / rel / name)
        return stage

    def upload_stage(self, stage: Path, message: str | None, **kwargs: Any) -> Any:
        """Upload a staged snapshot, then remove it (also when the upload fails)."""
        try:
            return self.upload(str(stage), message, **kwargs)
        finally:
            _remove_stage(stage)

    def push_checkpoint(self, checkpoint: str, message: str, save_extras: Callable[[], None],
                        when_published: Callable[[Callable[[], None]], None]) -> list[futures.Future]:
        """Queue the uploads of one checkpoint (see the module docstring); returns their futures.

        The only work before this returns is a hard-linked snapshot of the checkpoint, taken by
        ``when_published(snapshot)``: at once after a synchronous save, on the writer's thread right after an
        asynchronous one is published (before a later save can rotate it away). Copying the model files to
        ``output_dir``, ``save_extras`` (processing class and training arguments) and the uploads run on the
        upload thread.
        """
        strategy = HubStrategy(self.args.hub_strategy)
        with_folder = strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS)
        staged: futures.Future = futures.Future()

        def snapshot() -> None:
            try:
                if not os.path.isdir(checkpoint):
                    raise FileNotFoundError(f"{checkpoint} was not published (its save failed)")
                staged.set_result(self.stage(checkpoint, skip_ignored=False))
            except BaseException as err:  # the upload jobs report it; the save itself is not concerned
                staged.set_exception(err)

        def push_model() -> Any:
            frozen = staged.result()
            try:
                copy_model_files(str(frozen), local_output_dir(self.args))
                save_extras()
            finally:
                if not with_folder:
                    _remove_stage(frozen)
            return self.upload_stage(self.stage(local_output_dir(self.args), skip_ignored=True), message,
                                     ignore=_IGNORED)

        when_published(snapshot)
        jobs = [self.submit(push_model, checkpoint)]
        if with_folder:
            where = "last-checkpoint" if strategy == HubStrategy.CHECKPOINT else Path(checkpoint).name
            jobs.append(self.submit(
                lambda: self.upload_stage(staged.result(), f"{message}, checkpoint", path_in_repo=where),
                f"{checkpoint} (the folder)",
            ))
        return jobs


def copy_model_files(checkpoint: str, output_dir: str) -> None:
    """Copy the checkpoint's model files to ``output_dir`` (each replaced atomically)."""
    names = list(MODEL_FILES)
    for index in INDEX_FILES:
        path = os.path.join(checkpoint, index)
        if os.path.isfile(path):
            from trainwell.checkpoint.io import index_shards
            from trainwell.utils.safe_files import read_json

            names += [index, *index_shards(read_json(path, 64 << 20, root=checkpoint), path)]
    # a PEFT model's adapters other than "default" are in subfolders of their names (the reference leaves them out)
    for name, folder in saved_adapters(checkpoint).items():
        if folder != Path(checkpoint):
            os.makedirs(os.path.join(output_dir, name), exist_ok=True)
            names += [os.path.join(name, file) for file in MODEL_FILES if file.startswith("adapter_")]
    for name in names:
        source = os.path.join(checkpoint, name)
        if os.path.isfile(source):
            copy_file(source, os.path.join(output_dir, name), checkpoint)  # replaced atomically, never through a link


def _remove_stage(stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)
    with contextlib.suppress(OSError):
        stage.parent.rmdir()  # only once no other snapshot waits in it


def _ignored(name: str) -> bool:
    return name in _OWN_FILES or name.startswith(("_", f"{PREFIX_CHECKPOINT_DIR}-", TMP_PREFIX))


def _link_or_copy(source: str, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        copy_file(source, target)


def _log_failure(done: futures.Future, what: str, output_dir: str) -> None:
    if done.cancelled() or done.exception() is None:
        return
    err = done.exception()
    logger.warning("The push of %s to the Hub failed (%s: %s); training goes on and the files stay in %s.",
                   what, type(err).__name__, err, output_dir)


# ------------------------------------------------------------------------------------------ the Trainer's side
def push_to_hub(trainer: Any, pusher: HubPusher | None, message: str | None, blocking: bool, token: str | None,
                revision: str | None, private: bool | None, card: dict[str, Any]) -> Any:
    """``Trainer.push_to_hub``: save the model and a model card to ``output_dir``, then upload it.

    Returns the commit info (``blocking``) or a ``Future`` of it; None on processes other than the main one.
    """
    args = trainer.args
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    model_name = card.pop("model_name", None)
    if model_name is None and args.should_save:
        model_name = Path(args.output_dir).name if args.hub_model_id is None else args.hub_model_id.split("/")[-1]
    token = token if token is not None else args.hub_token
    if trainer.hub_model_id is None:  # push_to_hub=False in the arguments: the repository is made now
        trainer.init_hf_repo(token=token, private=private)
        pusher = None
    trainer.save_model(_internal_call=True)
    if not trainer.is_world_process_zero():
        return None
    model_tags = getattr(trainer.model, "model_tags", None)
    if model_tags is not None:  # the model's own tags join the ones asked for
        tags = card.get("tags") or []
        tags = [tags] if isinstance(tags, str) else list(tags)
        card["tags"] = tags + [tag for tag in model_tags if tag not in tags]
    trainer.create_model_card(model_name=model_name, **card)
    trainer._finish_current_push()
    pusher = pusher if pusher is not None else HubPusher(args, trainer.hub_model_id)
    upload = dict(token=token, revision=revision, ignore=_IGNORED)
    if blocking:
        return pusher.upload(local_output_dir(args), message, **upload)
    stage = pusher.stage(local_output_dir(args), skip_ignored=True)
    return pusher.submit(lambda: pusher.upload_stage(stage, message, **upload), local_output_dir(args))


def push_from_checkpoint(trainer: Any, pusher: HubPusher | None, checkpoint: str,
                         save_extras: Callable[[], None]) -> None:
    """``Trainer._push_from_checkpoint``: queue the uploads of a checkpoint just saved (main process only)."""
    args = trainer.args
    if pusher is None or not trainer.is_world_process_zero() or HubStrategy(args.hub_strategy) == HubStrategy.END:
        return
    running = trainer.push_in_progress
    if running is not None and not running.is_done() and not args.hub_always_push:
        logger.info("The previous Hub push is still running: %s is not pushed (hub_always_push=True pushes every "
                    "checkpoint).", checkpoint)
        return
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    writer = trainer.checkpointer.writer if args.save_async else None
    when_published = writer.then if writer is not None else (lambda prepare: prepare())
    jobs = pusher.push_checkpoint(checkpoint, commit_message(args, trainer.state), save_extras, when_published)
    if running is None or running.is_done():
        trainer.push_in_progress = PushInProgress(jobs)
    else:
        running.jobs.extend(jobs)


def finish_current_push(trainer: Any) -> None:
    """Wait for the checkpoint upload in progress, if any (``Trainer._finish_current_push``)."""
    if trainer.push_in_progress is not None and not trainer.push_in_progress.is_done():
        logger.info("Waiting for the Hub upload of the last checkpoint to finish.")
        trainer.push_in_progress.wait_until_done()
