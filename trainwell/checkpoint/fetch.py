"""Fetching the resumed checkpoint from world process zero, for processes whose disk lacks it.

Owns :func:`fetch_missing`, the collective a multi-process resume runs before it looks for its checkpoint
(``Resume.of``). With node-local disks and ``save_on_each_node=False`` only world process zero's node holds
``checkpoint-N``; a restart used to need a person to copy the folder to every node. Now:

1. every process says which checkpoint it would resume (``resume_from_checkpoint=True``: its newest one that
   passes the size checks; a path: that path) with its manifest; the source is world process zero's (or, when it
   has none, as after a restart that numbered the nodes anew, the lowest-ranked process's that has one);
2. every process says whether its own disk holds that checkpoint: the same manifest, byte for byte, and every file
   it lists at its recorded size. A disk shared with process zero holds it: nothing more happens;
3. the processes that lack it find out which of them share a disk (a file of a fresh name, looked for by the
   others), and one per disk receives the files over the process group: a gloo group of the source and those
   receivers (on CPU whatever the training backend: these are file bytes), each file broadcast in chunks of
   ``CHUNK`` bytes as the source reads it, written into a temporary folder with its checksum computed as it is
   written, compared with the manifest, and published by one rename with the manifest written last (as a save
   publishes). A file whose bytes differ from the manifest is never published: every process raises the same
   error naming it.

Then each process finds the checkpoint on its own disk as usual (``trainwell.checkpoint.agreement``), and
``resume_from_checkpoint=True`` resolves to the source's newest on every node. A checkpoint without a manifest
(the reference's, or trainwell's before manifests) is not fetched: nothing could verify the copy. The whole folder
is fetched (every file the manifest lists, the other processes' RNG states included, a few KiB each), so the copy
is a complete checkpoint that a later resume at another world size can read too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwell.checkpoint import manifest
from trainwell.checkpoint.io import AtomicDirectory, remove_entry
from trainwell.utils import filehash
from trainwell.utils.safe_files import UnsafeFileError, open_regular, read_bytes, write_file

logger = logging.getLogger(__name__)

#: bytes per broadcast: large enough that a collective's latency does not count, small enough for any host
CHUNK = 16 << 20
PROBE_PREFIX = ".trainwell-fetch-"

Gather = Callable[[Any], list[Any]]


def fetch_missing(asked: bool, target: Callable[[], str | None], here: Callable[[str], str],
                  gather: Gather) -> str | None:
    """Give every process that lacks it the checkpoint world process zero resumes; returns its path when one was
    fetched here.

    A collective: every process of the run calls it, in the same order. ``asked``: this process was asked to resume
    (nothing happens unless every process was: ``trainwell.checkpoint.agreement`` then says what is wrong).
    ``target()``: the path of the checkpoint this process would resume, None when it has none. The source is world
    process zero, or when it has none (a restart that numbered the nodes anew: torchrun's c10d rendezvous may) the
    lowest-ranked process that has one. ``here(path)``: where this process keeps the source's ``path`` (the same name
    in its own ``output_dir`` for the newest checkpoint; the same path for a named one). ``gather``: the run's
    all-gather of a small object.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None  # no torch process group to send over (the search then says what each process lacks)
    rank = dist.get_rank()
    everyone = gather((asked, _offer(target) if asked else None))
    offers = [r for r, (_, offer) in enumerate(everyone) if offer is not None]
    if not all(a for a, _ in everyone) or not offers:
        return None
    source = offers[0]  # process zero when it has one
    path, raw = here(everyone[source][1][0]), everyone[source][1][1]
    records = manifest.records_of(json.loads(raw))
    receivers = [r for r, lacks in enumerate(gather(rank != source and not _holds(path, raw, records))) if lacks]
    if not receivers:
        return None
    writers = _one_per_disk(path, rank in receivers, rank == source, gather)
    problem = None
    if writers:
        members = sorted([source, *writers])
        group = dist.new_group(members, backend="gloo")  # every process creates it, even outside it
        if rank in members:
            try:
                if rank == source:
                    logger.warning("Sending %s from process %d to processes %s: their disks lack it.", path, source,
                                   ", ".join(map(str, receivers)))
                    _send(Path(path), records, source, group)
                else:
                    problem = _receive(Path(path), raw, records, source, group)
            finally:
                dist.destroy_process_group(group)
    gather(None)  # every receiving disk has its copy (or its problem) by now
    if problem is None and rank in receivers and not _holds(path, raw, records):
        problem = f"{path} is still incomplete on process {rank} after the fetch."
    found = [p for p in gather(problem) if p is not None]
    if found:
        raise ValueError(f"Fetching the checkpoint {everyone[source][1][0]} from process {source} to the processes "
                         f"whose disks lack it failed: {found[0]} Copy the folder to every node by hand, or put "
                         "output_dir on a disk every node mounts.")
    return path if rank in receivers else None


def _offer(target: Callable[[], str | None]) -> tuple[str, bytes] | None:
    """(path, its manifest's bytes) of the checkpoint this process would resume; None without one (or its manifest)."""
    try:
        path = target()
    except (OSError, ValueError):
        return None  # nothing to resume here (or unreadable): the search raises its error on every process
    if path is None:
        return None
    try:
        raw = read_bytes(Path(path) / manifest.MANIFEST_NAME, manifest.LIMIT, root=path)
        manifest.records_of(json.loads(raw))
    except (OSError, ValueError, UnsafeFileError):
        return None  # no manifest (or a damaged one): nothing could verify a copy; the search says the rest
    return str(path), raw


def _holds(path: str, raw: bytes, records: dict[str, filehash.FileRecord]) -> bool:
    """Whether this process's disk holds the checkpoint at ``path``: that manifest, and its files at their sizes."""
    try:
        mine = read_bytes(Path(path) / manifest.MANIFEST_NAME, manifest.LIMIT, root=path)
    except (OSError, UnsafeFileError):
        return False
    return mine == raw and manifest.problem(path, checksums=False, records=records) is None


def _one_per_disk(path: str, receiving: bool, sending: bool, gather: Gather) -> list[int]:
    """The lowest-ranked receiver of each disk (processes that see each other's fresh file share a disk). A receiver
    that sees the source's file shares its disk: it writes nothing (its check afterwards says what is wrong)."""
    parent = Path(path).parent
    token = None
    if receiving or sending:
        token = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            os.makedirs(parent, exist_ok=True)
            write_file(parent / token, b"")
        except OSError:  # a folder it cannot write to: it receives nothing, and its check afterwards says so
            token = None
    tokens = gather((token, sending))  # a collective on every process, so none may raise before it
    source = next(r for r, (_, s) in enumerate(tokens) if s)
    seen = [r for r, (name, _) in enumerate(tokens) if name is not None and (parent / name).exists()] if receiving \
        else []
    sees = gather(seen)
    if token is not None:
        remove_entry(parent / token)
    return sorted({min(s) for s in sees if s and source not in s})


def _chunks(size: int) -> list[int]:
    return [min(CHUNK, size - start) for start in range(0, size, CHUNK)]


def _send(folder: Path, records: dict[str, filehash.FileRecord], source: int, group: Any) -> None:
    """Broadcast every listed file of ``folder``, in the manifest's order, exactly as many bytes as it lists (a file
    that changed since is padded with zeros: the receivers' checksums then name it, and the collectives stay in
    step)."""
    buffer = torch.empty(CHUNK, dtype=torch.uint8)
    for name, record in records.items():
        try:
            fh = open_regular(folder / name, folder)
        except (OSError, UnsafeFileError):
            fh = None  # gone or replaced since the manifest was read: zeros, which the receivers' checksums name
        try:
            for count in _chunks(record.size):
                view = buffer[:count]
                got = _read_into(fh, view)
                if got < count:
                    view[got:] = 0
                dist.broadcast(view, src=source, group=group)
        finally:
            if fh is not None:
                fh.close()


def _read_into(fh: Any, view: torch.Tensor) -> int:
    """Bytes of ``fh`` read into ``view`` (0 without a file or on a read error)."""
    if fh is None:
        return 0
    try:
        return fh.readinto(memoryview(view.numpy())) or 0
    except OSError:
        return 0


def _receive_file(target: Path, size: int, buffer: torch.Tensor, source: int, group: Any) -> OSError | None:
    """Receive one file of ``size`` bytes into ``target``, checksummed as written; the error of a failed write
    (every chunk is still received: process zero and the other receivers go on broadcasting)."""
    error: OSError | None = None
    try:
        with contextlib.ExitStack() as stack:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fh = stack.enter_context(filehash.open_for_write(target))
            except OSError as err:
                error = err
            for count in _chunks(size):
                view = buffer[:count]
                dist.broadcast(view, src=source, group=group)
                if error is None:
                    try:
                        fh.write(memoryview(view.numpy()))
                    except OSError as err:
                        error = err
    except OSError as err:  # the flush and fsync as the file closes
        error = error or err
    return error


def _receive(final: Path, raw: bytes, records: dict[str, filehash.FileRecord], source: int,
             group: Any) -> str | None:
    """Write the broadcast files into a temporary folder and publish it as ``final`` when every checksum matches the
    manifest (written last); the problem otherwise (the temporary folder is removed)."""
    atomic = AtomicDirectory(final)
    buffer = torch.empty(CHUNK, dtype=torch.uint8)
    failed: OSError | None = None
    try:
        tmp = atomic.create()
    except OSError as err:
        tmp, failed = atomic.tmp, err
    with filehash.recording(tmp) as recorder:
        for name in records:
            failed = _receive_file(tmp / name, records[name].size, buffer, source, group) or failed
        written = recorder.snapshot()
    wrong = [name for name, record in records.items() if written.get(name, filehash.FileRecord(0, 0)) != record]
    if failed is not None or wrong:
        remove_entry(tmp)
        return f"writing {final} failed ({failed})." if failed is not None else (
            f"{wrong[0]} arrived with other bytes than its checksum in the manifest: it changed on the sending "
            "process's disk after the checkpoint was written.")
    try:
        write_file(tmp / manifest.MANIFEST_NAME, raw)  # last: what makes the folder a checkpoint (fsynced, renamed)
        atomic.publish()
    except OSError as err:
        remove_entry(tmp)
        return f"writing {final} failed ({err})."
    return None
