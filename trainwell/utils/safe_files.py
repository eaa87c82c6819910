"""Files by name in one folder, never through a symbolic link: written (the run report, the model card) and read
(checkpoints, run folders, ``output_dir``: every file trainwell opens there).

Reading (:func:`open_regular`, :func:`read_bytes`, :func:`read_json`): a file is opened with ``O_NOFOLLOW |
O_NONBLOCK`` and used only when ``fstat`` says it is a regular file, so a link (to ``/dev/zero``, to a file outside
the folder), a FIFO (whose open would block), a device or a folder is refused with :class:`UnsafeFileError` naming
it and what it is; with ``root``, no folder between ``root`` and the file may be a link either. Reads are bounded
(a file larger than the limit is refused, never read to its end), and JSON nested too deeply to parse is an error
naming the file, not a ``RecursionError``.

Writing:

A file is written to a fresh temporary name in the same folder (created with ``O_EXCL | O_NOFOLLOW``, so it can
be neither an existing file nor a link) and renamed onto its final name with ``os.replace``. A rename replaces a
link of that name rather than following it, so whatever a link planted in a run folder points to is never
touched, and a reader never sees half a file. Names are plain file names: no folder separator, no ``..``.

Where the platform allows it (Linux, macOS), the folder is opened once (``O_DIRECTORY | O_NOFOLLOW``) and every
file is created and renamed relative to that descriptor, so a folder swapped for a link after it was checked
still receives nothing. ``strict=True`` also refuses a folder that is itself a link (a folder whose name the
program chose inside a run, such as ``report/``); a folder the user named is used as named. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import secrets
import stat
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO


class UnsafePathError(ValueError):
    """A folder to write into is a symbolic link (or not a folder): the message names it and the fix."""


class UnsafeFileError(ValueError):
    """A file to read is not a regular file inside its folder (a link, a FIFO, a device, a folder), or is larger
    than what may be read of it: the message names it."""


_DIR_FD = os.open in os.supports_dir_fd and os.replace in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _check_name(name: str) -> None:
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or os.sep in name
        or (os.altsep and os.altsep in name)
        or "\0" in name
    ):
        raise ValueError(f"{name!r} is not a plain file name (no folders, no '..'): pass one such as 'index.html'")


def _link_error(path: Path, what: str) -> UnsafePathError:
    try:
        target = f" (to {os.readlink(path)!r})"
    except OSError:
        target = ""
    return UnsafePathError(
        f"{path} is a symbolic link{target}: {what} is written only into a real folder, never "
        "through a link. Remove the link, or name another folder."
    )


def make_folder(path: str | os.PathLike[str], strict: bool, what: str = "the output") -> Path:
    """Create ``path`` (and its parents) if needed; ``UnsafePathError`` when it is a file, or, with ``strict``,
    a symbolic link (even one to a folder)."""
    folder = Path(path)
    if strict and folder.is_symlink():
        raise _link_error(folder, what)
    if not folder.is_dir():
        if folder.is_symlink() or folder.exists():  # a file, or a link to nothing
            raise UnsafePathError(
                f"{folder} exists and is not a folder: {what} needs a folder there. Move it "
                "away, or name another folder."
            )
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process: checked again when opened
            folder.mkdir()
    return folder


class SafeFolder:
    """A folder that files are written into by name, atomically and never through a link (see the module
    docstring). Use as a context manager, or call ``close``."""

    def __init__(self, path: str | os.PathLike[str], strict: bool = False, what: str = "the output") -> None:
        self.path = make_folder(path, strict, what)
        self._what = what
        self._fd: int | None = None
        if _DIR_FD:
            flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC | (_NOFOLLOW if strict else 0)
            try:
                self._fd = os.open(self.path, flags)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR) and self.path.is_symlink():
                    raise _link_error(self.path, what) from None
                raise

    def __enter__(self) -> SafeFolder:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write ``data`` as ``name`` in the folder (replacing a file or a link of that name); returns its path."""
        _check_name(name)
        temp = f".{name[:64]}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0)
        where = {"dir_fd": self._fd} if self._fd is not None else {}
        temp_path = temp if self._fd is not None else os.path.join(self.path, temp)
        fd = os.open(temp_path, flags, 0o666, **where)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            if self._fd is not None:
                os.replace(temp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            else:
                os.replace(temp_path, os.path.join(self.path, name))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_path, **where)
            raise
        return self.path / name

    def write_text(self, name: str, text: str) -> Path:
        """``write_bytes`` of ``text`` encoded as UTF-8 (a lone surrogate, which UTF-8 cannot hold, written as its
        ``\\udXXX`` escape)."""
        return self.write_bytes(name, text.encode("utf-8", "backslashreplace"))


def write_text_file(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically, replacing a link at ``path`` instead of following it (the folder
    holding it is used as named and created if needed)."""
    target = Path(path)
    with SafeFolder(target.parent) as folder:
        return folder.write_text(target.name, text)


# ----------------------------------------------------------------------------------------------- reading
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a FIFO", "a folder", ...)."""
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def not_regular(path: str | os.PathLike[str], kind: str) -> UnsafeFileError:
    """The error for ``path``, which is ``kind`` (:func:`kind_of`) where a regular file was expected."""
    target = ""
    if kind == "a symbolic link":
        with contextlib.suppress(OSError):
            target = f" to {os.readlink(path)!r}"
    return UnsafeFileError(f"{os.fspath(path)} is {kind}{target}, not a regular file: trainwell reads only regular "
                           "files in a checkpoint or run folder, never through a link. Replace it with the file "
                           "itself (or remove it).")


def _check_parents(path: Path, root: Path) -> None:
    """No folder between ``root`` and ``path`` is a link (``root`` itself is used as named)."""
    try:
        parts = path.relative_to(root).parts[:-1]
    except ValueError:
        raise UnsafeFileError(f"{path} is outside {root}: a file of a folder is read only inside it.") from None
    where = root
    for part in parts:
        where = where / part
        try:
            mode = os.lstat(where).st_mode
        except OSError:
            return  # missing: the open says so
        if not stat.S_ISDIR(mode):
            raise UnsafeFileError(
                f"{where} is {kind_of(mode)}, not a folder: trainwell reads the files of a checkpoint or run folder "
                "only inside it, never through a link. Replace it with the folder itself.")


def open_regular(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file (not followed when it is a link, never
    blocking on a FIFO); ``UnsafeFileError`` naming it otherwise. With ``root``, the folders between ``root`` and
    the file must be real folders too. ``OSError`` (a missing file) passes through."""
    path = Path(path)
    if root is not None:
        _check_parents(Path(os.path.abspath(path)), Path(os.path.abspath(root)))
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC | getattr(os, "O_BINARY", 0))
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK) or (err.errno == errno.ENXIO and path.is_symlink()):
            raise not_regular(path, "a symbolic link") from None
        if err.errno == errno.ENXIO:  # a FIFO or socket nobody writes to
            raise not_regular(path, kind_of(os.lstat(path).st_mode)) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, kind_of(mode))
    if _NONBLOCK and hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    raw = io.FileIO(fd, "rb")
    raw.name = os.fspath(path)  # for readers' messages (torch, zipfile), which name the file by it
    return io.BufferedReader(raw)


def read_bytes(path: str | os.PathLike[str], limit: int, root: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes of the regular file ``path`` (see :func:`open_regular`), refused when over ``limit`` bytes."""
    with open_regular(path, root) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFileError(f"{os.fspath(path)} is larger than the {limit:,} bytes trainwell reads of such a file: "
                              "it is not one trainwell wrote.")
    return data


def parse_json(data: bytes | str, name: str | os.PathLike[str]) -> Any:
    """``data`` parsed as JSON; ``ValueError`` naming ``name`` when it is not JSON, not UTF-8, or nested too
    deeply to parse (instead of a ``RecursionError``)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{os.fspath(name)} is nested too deeply to be read (a crafted file, not one trainwell "
                         "wrote)") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{os.fspath(name)} is not valid JSON ({err})") from None


def read_json(path: str | os.PathLike[str], limit: int, root: str | os.PathLike[str] | None = None) -> Any:
    """The JSON value of the regular file ``path`` (at most ``limit`` bytes); errors name the file."""
    return parse_json(read_bytes(path, limit, root), path)


__all__ = ["SafeFolder", "UnsafeFileError", "UnsafePathError", "make_folder", "open_regular", "parse_json",
           "read_bytes", "read_json", "write_text_file"]
