"""A checkpoint's manifest: each file's size and checksum, written with the checkpoint and checked on resume.

Owns ``checkpoint_manifest.json``: building it at the end of a save from the records each process kept while
writing (``trainwell.utils.filehash``: the optimizer, scheduler, RNG and data-position files, FSDP's shards and
DeepSpeed's partitions are checksummed as they are written; the files written by other libraries, such as the
model's safetensors from ``save_pretrained`` and the tokenizer, are read back once), and :func:`problem`, which
says which file of a checkpoint no longer matches it.

The manifest lists the files of the folder when it was published; files added later (a callback writing into
``checkpoint-N/`` in ``on_save``) are not listed and not checked. Whether a checkpoint must have a manifest (every
one trainwell writes does; the reference's do not) is ``trainwell.checkpoint.resume``'s to say. Every listed file
is read as a regular file of the folder (never through a link) and no further than its recorded size. The file
itself is plain JSON::

    {"format": "trainwell-checkpoint-manifest", "version": 1, "checksum": "xxh3_64",
     "files": {"optimizer.pt": {"size": 1234, "xxh3_64": "0a1b2c3d4e5f6071"}, ...}}
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from trainwell.utils.filehash import ALGORITHM, FileRecord, hash_file, hash_stream
from trainwell.utils.safe_files import UnsafeFileError, kind_of, open_regular, read_json, write_file

#: the most bytes of a manifest read (about 100 bytes a file: a million files)
LIMIT = 128 << 20

MANIFEST_NAME = "checkpoint_manifest.json"
FORMAT = "trainwell-checkpoint-manifest"
VERSION = 1


def local_files(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative POSIX paths, sorted), the manifest itself and symlinks aside."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                found.append(path.relative_to(folder).as_posix())
    return sorted(f for f in found if f != MANIFEST_NAME)


def build(folder: str | os.PathLike, recorded: Iterable[Mapping[str, FileRecord]]) -> dict[str, FileRecord]:
    """The records of every file now in ``folder``: those kept while writing (by any process) when they describe
    the file as it is, the others read back here (in parallel: reading and hashing release the GIL)."""
    folder = Path(folder)
    merged: dict[str, FileRecord] = {}
    for records in recorded:
        merged.update(records)
    files = local_files(folder)
    known = {name: merged[name] for name in files if name in merged and _size(folder / name) == merged[name].size}
    unknown = [name for name in files if name not in known]
    if unknown:
        with ThreadPoolExecutor(max_workers=min(4, len(unknown))) as pool:
            known.update(zip(unknown, pool.map(lambda name: hash_file(folder / name), unknown)))
    return dict(sorted(known.items()))


def write(folder: str | os.PathLike, records: Mapping[str, FileRecord]) -> None:
    """Write ``checkpoint_manifest.json`` into ``folder`` (fsynced)."""
    content = {"format": FORMAT, "version": VERSION, "checksum": ALGORITHM,
               "files": {name: {"size": r.size, ALGORITHM: f"{r.digest:016x}"} for name, r in records.items()}}
    write_file(Path(folder) / MANIFEST_NAME, json.dumps(content, indent=1, sort_keys=True) + "\n")


def read(folder: str | os.PathLike) -> dict[str, FileRecord] | None:
    """The records of ``folder``'s manifest; None when it has none. Raises ValueError when it is damaged (not a
    regular file, too large, nested too deeply, or not a manifest)."""
    path = Path(folder) / MANIFEST_NAME
    if not os.path.lexists(path):
        return None
    try:
        return records_of(read_json(path, LIMIT, root=folder))
    except (OSError, ValueError) as err:
        shown = str(err).replace(f"{path} ", "", 1)  # the file is named once, by this message
        raise ValueError(f"{MANIFEST_NAME} is damaged ({shown})") from err


def records_of(content: Any) -> dict[str, FileRecord]:
    """The records of a parsed manifest; ValueError saying what is wrong with it."""
    try:
        if not isinstance(content, dict) or content.get("format") != FORMAT or content.get("checksum") != ALGORITHM:
            raise ValueError(f"not a {FORMAT} with {ALGORITHM} checksums")
        records = {}
        for name, entry in content["files"].items():
            if not _inside(name):
                raise ValueError(f"it names a file outside the checkpoint ({name!r})")
            size, digest = entry["size"], int(entry[ALGORITHM], 16)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not 0 <= digest < 2**64:
                raise ValueError(f"the entry of {name} is not a size and a checksum")
            records[name] = FileRecord(size, digest)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}") from err
    return records


def problem(folder: str | os.PathLike, checksums: bool = True,
            may_be_missing: Callable[[str], bool] = lambda name: False,
            records: Mapping[str, FileRecord] | None = None) -> str | None:
    """Why the files of checkpoint ``folder`` differ from its manifest, or None when they match (or there is no
    manifest). Sizes are always compared; with ``checksums`` every listed file is read and its checksum compared.

    A listed file that is gone is a problem unless ``may_be_missing(name)``: a piece a user may delete on purpose
    (the optimizer state, to restart it) is left to the checkpoint's completeness checks. A listed name that is
    not a regular file (a link, a FIFO) is a problem, and is never opened. ``records``: the manifest's, when the
    caller parsed it already.
    """
    folder = Path(folder)
    if records is None:
        try:
            records = read(folder)
        except ValueError as err:
            return str(err)
    if records is None:
        return None
    present = {}
    for name, expected in records.items():
        path = folder / name
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = None
        if mode is None:
            if may_be_missing(name):
                continue
            return f"{name} is missing (the manifest lists it)"
        if not stat.S_ISREG(mode):
            return f"{name} is {kind_of(mode)}, not the regular file the manifest lists"
        present[name] = expected
        size = _size(path)
        if size != expected.size:
            return (f"{name} is {size} bytes where the manifest says {expected.size}: the file was truncated or "
                    "replaced after the checkpoint was written")
    if checksums:
        for name, expected in present.items():
            try:
                with open_regular(folder / name, folder) as fh:
                    digest = hash_stream(fh, expected.size).digest
            except (OSError, UnsafeFileError) as err:
                return f"{name} cannot be read ({err})"
            if digest != expected.digest:
                return (f"{name} does not match its checksum in the manifest: its bytes changed after the "
                        "checkpoint was written (a damaged disk, a copy or sync tool, or an edit)")
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _inside(name: Any) -> bool:
    if not isinstance(name, str) or not name or "\\" in name:
        return False
    parts = PurePosixPath(name).parts
    return not PurePosixPath(name).is_absolute() and ".." not in parts and name != MANIFEST_NAME
