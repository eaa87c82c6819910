"""Checkpoints in an object store: a run whose ``output_dir`` is an ``s3://``, ``gs://``, ``az://`` or ``file://`` URL.

Owns :class:`Store`, the few operations the checkpointer needs of where checkpoints are kept beyond the local disk,
and :class:`FsspecStore`, their implementation over ``fsspec`` (``s3fs``, ``gcsfs``, ``adlfs``). A checkpoint is
written as on disk (the same atomic, checksummed layout) into the run's staging folder
(``trainwell.args.storage.local_output_dir``), then :meth:`Store.upload` copies it: every file first, its
``checkpoint_manifest.json`` last. The manifest is what makes a folder of the store a checkpoint: one without it
(an upload cut short) is never resumed and is removed by :meth:`Store.clean`. :meth:`Store.fetch` brings the files
a process reads of a checkpoint into the same staging path (each checked against the manifest's size and checksum,
a file already there and matching is not downloaded again), the manifest last; :meth:`Store.delete` removes the
manifest first, so a deletion cut short leaves an incomplete folder, never a damaged checkpoint.

Every failure of the store is a :class:`StoreError` naming the URL, the cause and what to do; credentials
(``storage_options``, the environment, profiles) go to fsspec only and are never part of a message.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from trainwell.args.storage import is_url, local_output_dir, staging_dir_for
from trainwell.checkpoint import manifest
from trainwell.checkpoint.layout import checkpoint_step, checkpoints_to_delete
from trainwell.utils.filehash import hash_file
from trainwell.utils.safe_files import write_file

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_PER_RANK = re.compile(r"^(rng_state|data_state)_(\d+)\.pth$")  # files only their own process reads


class StoreError(OSError):
    """The object store failed (credentials, bucket, network); the message names the URL and what to do."""


class Store(Protocol):
    """Where a run's checkpoints are kept beyond the staging folder; names are ``checkpoint-N``."""

    url: str

    def check(self) -> None:
        """Raise :class:`StoreError` when the store cannot be reached or written (before any step)."""

    def complete(self) -> list[tuple[int, str]]:
        """``(step, name)`` of every checkpoint whose manifest is in the store, oldest step first."""

    def upload(self, folder: Path, name: str) -> None:
        """Copy the local checkpoint ``folder`` to ``name``: every file, then its manifest."""

    def fetch(self, name: str, folder: Path, wanted: Callable[[str], bool]) -> None:
        """Bring the files of ``name`` that ``wanted`` accepts into ``folder``, checked, then its manifest."""

    def upload_files(self, folder: Path) -> None:
        """The regular files at the top of ``folder`` (the final ``save_model()``: weights, config, tokenizer,
        arguments; the run's ``trainer_state.json`` and metrics), uploaded to the store's root; not the checkpoints,
        the logs or hidden files."""

    def delete(self, name: str) -> None:
        """Remove the checkpoint ``name``: its manifest first."""

    def clean(self) -> list[str]:
        """Remove the folders of the store that have no manifest (uploads cut short); returns their names."""


def wanted_by(process_index: int) -> Callable[[str], bool]:
    """The files of a checkpoint process ``process_index`` reads on a resume: all but the other processes' own
    (their RNG states and data positions)."""
    def wanted(name: str) -> bool:
        match = _PER_RANK.match(name)
        return match is None or int(match.group(2)) == process_index
    return wanted


_opened: dict[tuple[str, str], FsspecStore] = {}
_opened_lock = threading.Lock()


def of(args: Any, run_dir: str | os.PathLike | None = None) -> FsspecStore | None:
    """The store of a run with ``args`` (None when ``output_dir`` is a local folder): for ``run_dir``, a folder of
    the staging folder (a search trial's), the same place under the URL. One object per URL and process."""
    url = getattr(args, "output_dir", None)
    if not is_url(url):
        return None
    if run_dir is not None:
        relative = os.path.relpath(os.fspath(run_dir), local_output_dir(args))
        if relative != "." and not relative.startswith(".."):
            url = url.rstrip("/") + "/" + Path(relative).as_posix()
    return open_url(url, getattr(args, "storage_options", None))


def open_url(url: str, storage_options: dict[str, Any] | None = None) -> FsspecStore:
    key = (url.rstrip("/"), repr(sorted((storage_options or {}).items())))
    with _opened_lock:
        if key not in _opened:
            _opened[key] = FsspecStore(url, storage_options)
        return _opened[key]


class FsspecStore:
    """:class:`Store` over an fsspec file system (``fsspec.core.url_to_fs``)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        import fsspec

        self.url = url.rstrip("/")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))
        except (ImportError, ValueError, TypeError) as err:
            raise StoreError(f"Cannot open the object store {self.url}: {type(err).__name__}: {err}") from None
        self.root = self.root.rstrip("/")
        self._checked = False

    def where(self, name: str = "") -> str:
        """The URL of ``name`` in the store (for messages)."""
        return f"{self.url}/{name}" if name else self.url

    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def _fail(self, doing: str, err: BaseException, name: str = "", staged: Path | None = None) -> StoreError:
        return StoreError(failure(self.where(name), doing, err, staged, checkpoint=bool(name)))

    # ------------------------------------------------------------------------------------------- reading
    def check(self) -> None:
        if self._checked:
            return
        bucket = self.root.split("/", 1)[0]
        local = "file" in ((self.fs.protocol,) if isinstance(self.fs.protocol, str) else self.fs.protocol)
        try:
            if local:
                self.fs.makedirs(self.root, exist_ok=True)
            else:  # one request (S3's HeadBucket): a missing bucket and refused credentials differ here
                try:
                    self.fs.info(bucket)
                except FileNotFoundError:
                    raise FileNotFoundError(f"the bucket {bucket!r} does not exist") from None
        except Exception as err:  # noqa: BLE001 - every client's errors differ; each is named in the message
            raise self._fail("reach the store", err) from None
        self._checked = True

    def _folders(self) -> dict[str, bool]:
        """``checkpoint-N`` folder -> whether its manifest is there (listed fresh: other processes write too)."""
        self.fs.invalidate_cache()
        try:
            if not self.fs.exists(self.root):
                return {}
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
            manifests = self.fs.glob(self._path("checkpoint-*", manifest.MANIFEST_NAME))
        except Exception as err:  # noqa: BLE001
            raise self._fail("list the checkpoints", err) from None
        done = {p.rstrip("/").rsplit("/", 2)[-2] for p in manifests}
        return {name: name in done for name in names if _CHECKPOINT.match(name)}

    def complete(self) -> list[tuple[int, str]]:
        return sorted((checkpoint_step(name), name) for name, done in self._folders().items() if done)

    def has(self, name: str) -> bool:
        """Whether ``name`` is a complete checkpoint of the store."""
        return self._folders().get(name, False)

    # ------------------------------------------------------------------------------------------- writing
    def upload(self, folder: Path, name: str) -> None:
        folder = Path(folder)
        files = manifest.local_files(folder)  # every file but the manifest, which goes last
        try:
            if self.fs.exists(self._path(name)):  # the same step saved again: unpublish it, then replace it
                self.delete(name)
            self.fs.makedirs(self._path(name), exist_ok=True)  # a local file system needs the folders (s3: no-op)
            for sub in sorted({f.rsplit("/", 1)[0] for f in files if "/" in f}):
                self.fs.makedirs(self._path(name, sub), exist_ok=True)
            if files:
                self.fs.put([str(folder / f) for f in files], [self._path(name, f) for f in files])
            self.fs.put_file(str(folder / manifest.MANIFEST_NAME), self._path(name, manifest.MANIFEST_NAME))
        except StoreError:
            raise
        except Exception as err:  # noqa: BLE001
            raise self._fail("upload the checkpoint", err, name, staged=folder) from None
        finally:
            self.fs.invalidate_cache()

    def upload_files(self, folder: Path) -> None:
        """The regular files at the top of ``folder`` (the final ``save_model()``: weights, config, tokenizer,
        arguments; the run's ``trainer_state.json`` and metrics), uploaded to the store's root; not the checkpoints,
        the logs or hidden files."""
        files = sorted(p.name for p in Path(folder).iterdir()
                       if p.is_file() and not p.is_symlink() and not p.name.startswith("."))
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            if files:
                self.fs.put([str(Path(folder) / f) for f in files], [self._path(f) for f in files])
        except Exception as err:  # noqa: BLE001
            raise self._fail("upload the model", err, staged=Path(folder)) from None
        finally:
            self.fs.invalidate_cache()

    def delete(self, name: str) -> None:
        try:
            target = self._path(name, manifest.MANIFEST_NAME)
            if self.fs.exists(target):
                self.fs.rm_file(target)
            if self.fs.exists(self._path(name)):
                self.fs.rm(self._path(name), recursive=True)
        except Exception as err:  # noqa: BLE001
            raise self._fail("delete the checkpoint", err, name) from None
        finally:
            self.fs.invalidate_cache()

    def clean(self) -> list[str]:
        doomed = [name for name, done in self._folders().items() if not done]
        for name in doomed:
            logger.warning("Removing %s: a checkpoint folder without its %s (an upload cut short); it is never "
                           "resumed.", self.where(name), manifest.MANIFEST_NAME)
            self.delete(name)
        return doomed

    # ------------------------------------------------------------------------------------------- downloading
    def fetch(self, name: str, folder: Path, wanted: Callable[[str], bool] = lambda name: True) -> None:
        folder = Path(folder)
        try:
            remote = self._path(name, manifest.MANIFEST_NAME)
            if self.fs.size(remote) > manifest.LIMIT:  # bounded before it is read
                raise ValueError(f"{manifest.MANIFEST_NAME} is larger than {manifest.LIMIT} bytes")
            raw = self.fs.cat_file(remote)
            records = manifest.records_of(json.loads(raw))
            for file, record in records.items():
                if wanted(file) and not _matches(folder / file, record):
                    _download(self.fs, self._path(name, file), folder / file)
            _write_atomically(folder / manifest.MANIFEST_NAME, raw)  # last: the local copy is complete
        except Exception as err:  # noqa: BLE001
            raise self._fail("download the checkpoint", err, name) from None


def _matches(path: Path, record: Any) -> bool:
    """Whether the local ``path`` is a regular file of the record's size and checksum (then not downloaded)."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size != record.size:
            return False
        return hash_file(path).digest == record.digest
    except OSError:
        return False


def _download(fs: Any, remote: str, path: Path) -> None:
    """``remote`` into ``path`` through a fresh name and a rename: a download cut short leaves no partial file under
    the final name (processes of one node fetching the same file each write their own, identical, copy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        fs.get_file(remote, str(part))
        os.replace(part, path)
    finally:
        if os.path.lexists(part):
            os.unlink(part)


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, data)  # a fresh name, fsynced, then renamed: never through a link planted at ``path``


def failure(where: str, doing: str, err: BaseException, staged: Path | None = None, checkpoint: bool = True) -> str:
    """The message of a store that failed: the URL, the cause in words, what to do, and the staged copy kept."""
    text = f"{type(err).__name__}: {err}"
    lowered = text.lower()
    if any(k in lowered for k in ("credential", "accessdenied", "access denied", "forbidden", "403",
                                  "invalidaccesskeyid", "signature", "permissionerror", "unauthorized", "401")):
        cause, fix = "the credentials were refused or missing", (
            "set them where the store's client looks (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile for s3, "
            "GOOGLE_APPLICATION_CREDENTIALS for gs, AZURE_STORAGE_* for az) or pass storage_options")
    elif any(k in lowered for k in ("nosuchbucket", "bucket", "does not exist", "not found", "404",
                                    "filenotfounderror")):
        cause, fix = "the bucket or path does not exist", "create the bucket (or correct output_dir)"
    elif any(k in lowered for k in ("connect", "timeout", "timed out", "endpoint", "network", "unreachable",
                                    "connection", "reset", "broken pipe", "dns", "resolve")):
        cause, fix = "the store could not be reached", (
            "check the network and the endpoint (AWS_ENDPOINT_URL or storage_options['endpoint_url'])")
    else:
        cause, fix = "the store failed", "check the store and its settings"
    message = f"Could not {doing} {where}: {cause} ({text}). To go on, {fix}"
    if staged is not None:
        resume = f"resume from it (resume_from_checkpoint='{staged}') or " if checkpoint else ""
        message += (f". The files are kept locally at {staged}: {resume}copy them to {where} by hand; the "
                    "checkpoints already in the store are intact")
    return message + "."


def candidates(store: FsspecStore, run_dir: str | os.PathLike, process_index: int
               ) -> Iterable[tuple[int, Path]]:
    """The store's complete checkpoints, newest first, each fetched into ``run_dir`` (this process's files) just
    before it is offered: a resume that takes the newest downloads nothing else."""
    for step, name in reversed(store.complete()):
        local = Path(run_dir) / name
        store.fetch(name, local, wanted_by(process_index))
        yield step, local


def fetch_url(url: str, args: Any, process_index: int) -> str:
    """``resume_from_checkpoint`` given as a checkpoint's URL: its files (this process's) fetched into the staging
    folder of its run (``output_dir``'s when it is the same run); returns that local folder. ValueError when the
    URL holds no complete checkpoint."""
    parent, _, name = url.rstrip("/").rpartition("/")
    own = is_url(args.output_dir) and parent == args.output_dir.rstrip("/")
    run_dir = local_output_dir(args) if own else staging_dir_for(parent)
    remote = open_url(parent, getattr(args, "storage_options", None))
    remote.check()
    if not remote.has(name):
        raise ValueError(f"Can't resume from {url}: it is not a complete checkpoint of the store (no "
                         f"{manifest.MANIFEST_NAME} there: an upload cut short, or no such checkpoint). Pass "
                         f"resume_from_checkpoint=True to resume the newest complete one of {args.output_dir}.")
    local = Path(run_dir) / name
    remote.fetch(name, local, wanted_by(process_index))
    return str(local)


def rotate(remote: FsspecStore, run_dir: str | os.PathLike, limit: int | None,
           protected: Iterable[str | os.PathLike | None]) -> list[str]:
    """``save_total_limit`` in the store, as on disk (``layout.checkpoints_to_delete``: the newest, the best and
    the resumed checkpoints are kept); ``protected`` are paths of the staging folder ``run_dir``."""
    if limit is None or limit <= 0:
        return []
    mirror = [Path(run_dir) / name for _, name in remote.complete()]
    doomed = [path.name for path in checkpoints_to_delete(mirror, limit, protected)]
    for name in doomed:
        logger.info("Deleting older checkpoint %s (save_total_limit=%s)", remote.where(name), limit)
        remote.delete(name)
    return doomed


def keep_only(remote: FsspecStore, best: str) -> None:
    """The end of a run with ``save_total_limit=1``: every checkpoint of the store but ``best`` is deleted."""
    for _, name in remote.complete():
        if name != best:
            logger.info("Deleting checkpoint %s: save_total_limit=1 keeps only the best one", remote.where(name))
            remote.delete(name)
