"""The report's files: the folder it writes into, a safe, unique file name for each figure, and reading a run's
files as hostile ones (:func:`open_regular`, :func:`read_regular_file`).

A figure is named after its metric, and a metric name is whatever ``compute_metrics`` returned: ``acc/top1``
would be a path, ``..`` a parent folder, a 10,000-character name longer than a file name may be. A name made
of letters, digits and ``_ . + -`` (at most 80 characters, starting with a letter or digit) is used as is
(``eval_accuracy.png``); any other becomes a readable slug plus 8 hex digits of its SHA-1 (``eval_acc_top1-
1b2c3d4e.png``), and a name still taken, compared without case (two metrics differing only in case share a file
on macOS), gets ``-2``, ``-3``... Writing goes through ``trainwell.utils.safe_files``: never through a link.
Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from trainwell.utils.safe_files import SafeFolder, UnsafeFileError, open_fd

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,79}")
_HASHED = re.compile(r"-[0-9a-f]{8}")  # the tail of a hashed name: a plain name ending so is hashed too
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.+-]+")
_SLUG = 48


def _open_checked(path: str | os.PathLike[str]) -> int:
    """One open, relative to a descriptor of the file's folder, checked with ``fstat`` (``safe_files.open_fd``)."""
    try:
        return open_fd(path)
    except UnsafeFileError as err:  # a link, a FIFO, a folder: named
        raise ValueError(str(err)) from None
    except OSError as err:
        raise ValueError(f"{path}: cannot open it ({err.strerror or err}); a symbolic link is not followed") from None


def open_regular(path: str | os.PathLike[str]) -> int | None:
    """A read-only descriptor for ``path`` when it is a regular file reached without a symbolic link; None
    otherwise (missing, a link, a folder, a FIFO: opening never blocks, a FIFO included)."""
    try:
        return _open_checked(path)
    except ValueError:
        return None


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of ``path`` when it is a regular file reached without a link and at most ``limit`` bytes long;
    ``ValueError`` saying why not otherwise."""
    with os.fdopen(_open_checked(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise ValueError(f"{path} is {size} bytes, more than the {limit} a trainer state may be")
        return fh.read(limit + 1)[:limit]


def file_stem(name: str) -> str:
    """The file name (without suffix) for a figure named ``name`` (see the module docstring)."""
    if _PLAIN.fullmatch(name) and not _HASHED.fullmatch(name[-9:]):
        return name
    slug = _UNSAFE_RUN.sub("_", name)[:_SLUG].strip("._-+") or "metric"
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{slug}-{digest}"


def file_names(names: Iterable[str], suffix: str = ".png") -> dict[str, str]:
    """``name -> file name`` for each of ``names``, distinct from each other without regard to case."""
    used: set[str] = set()
    out: dict[str, str] = {}
    for name in names:
        stem = file_stem(name)
        candidate, n = stem + suffix, 2
        while candidate.lower() in used:
            candidate, n = f"{stem}-{n}{suffix}", n + 1
        used.add(candidate.lower())
        out[name] = candidate
    return out


def report_folder(out_dir: str | os.PathLike[str] | SafeFolder, named_by_user: bool) -> SafeFolder:
    """The folder a report writes into, created if needed. One the user named (``--out``) is used as named; the
    default one inside a run (``RUN/report``) is refused when it is a symbolic link, since a link there was put
    by whoever could write into the run, not chosen by the user. ``out_dir`` may already be an open folder."""
    if isinstance(out_dir, SafeFolder):
        return out_dir
    return SafeFolder(Path(out_dir), strict=not named_by_user, what="the report")


__all__ = ["file_names", "file_stem", "report_folder"]
