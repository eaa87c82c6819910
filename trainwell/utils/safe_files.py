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
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO


class UnsafePathError(ValueError):
    """A folder to write into is a symbolic link (or not a folder): the message names it and the fix."""


class UnsafeFileError(ValueError):
    """A file to read is not a regular file inside its folder (a link, a FIFO, a device, a folder), or is larger
    than what may be read of it: the message names it."""


# os.replace takes the same dir_fd arguments as os.rename (one implementation), though only rename is listed
_DIR_FD = os.open in os.supports_dir_fd and os.rename in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW")
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

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[BinaryIO]:
        """A binary file to write ``name`` through: a fresh temporary name in the folder, created with ``O_CREAT |
        O_EXCL | O_NOFOLLOW`` (so neither an existing file nor a link), flushed, fsynced and renamed onto ``name``
        when the block ends without an error (a link of that name is replaced, never written through); removed
        otherwise. The writer may close the file itself (after syncing it)."""
        _check_name(name)
        temp = f".{name[:64]}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | getattr(os, "O_BINARY", 0)
        where = {"dir_fd": self._fd} if self._fd is not None else {}
        temp_path = temp if self._fd is not None else os.path.join(self.path, temp)
        fd = os.open(temp_path, flags, 0o666, **where)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.raw.name = os.path.join(self.path, name)  # type: ignore[attr-defined]  # for writers' messages
                yield fh
                if not fh.closed:
                    fh.flush()
                    os.fsync(fh.fileno())
            if self._fd is not None:
                os.replace(temp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            else:
                os.replace(temp_path, os.path.join(self.path, name))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_path, **where)
            raise

    def write_bytes(self, name: str, data: bytes) -> Path:
        """Write ``data`` as ``name`` in the folder (replacing a file or a link of that name); returns its path."""
        with self.open_write(name) as fh:
            fh.write(data)
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


def write_file(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (text: UTF-8) to ``path`` through :meth:`SafeFolder.open_write`: every whole file trainwell
    writes goes this way (a temporary name, then a rename; never through a link)."""
    target = Path(path)
    with SafeFolder(target.parent) as folder:
        return folder.write_bytes(target.name, data.encode("utf-8", "backslashreplace") if isinstance(data, str)
                                  else data)


@contextlib.contextmanager
def open_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """:meth:`SafeFolder.open_write` for ``path`` (its folder used as named, created if needed): for writers that
    stream (``torch.save``, a CSV writer)."""
    target = Path(path)
    with SafeFolder(target.parent) as folder, folder.open_write(target.name) as fh:
        yield fh


def copy_file(source: str | os.PathLike[str], target: str | os.PathLike[str],
              root: str | os.PathLike[str] | None = None) -> Path:
    """Copy the regular file ``source`` (read as :func:`open_regular` reads, inside ``root`` when given) to
    ``target`` through :func:`open_write` (a temporary name, then a rename: never through a link)."""
    import shutil

    with open_regular(source, root) as src, open_write(target) as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
    return Path(target)


def open_existing(path: str | os.PathLike[str], flags: int) -> int:
    """A descriptor of ``path`` opened in place with ``flags`` (``O_APPEND``, ``O_RDWR | O_CREAT`` for a lock):
    relative to its folder's descriptor, never through a link, never blocking on a FIFO, and only a regular file;
    :class:`UnsafeFileError` naming it otherwise. For the files trainwell appends to (logs) or locks, which a
    rename cannot write."""
    shown = Path(path)
    absolute = Path(os.path.abspath(path))
    folder = os.open(absolute.parent, os.O_RDONLY | _DIRECTORY | _CLOEXEC) if _DIR_FD else None
    where = {"dir_fd": folder} if folder is not None else {}
    name = absolute.name if folder is not None else str(absolute)
    try:
        try:
            fd = os.open(name, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644, **where)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EMLINK):
                raise
            raise not_regular(shown, kind_of(os.stat(name, follow_symlinks=False, **where).st_mode)) from None
    finally:
        if folder is not None:
            os.close(folder)
    return _check_fd(fd, shown)


#: the errors of a folder that cannot be written at all: permissions, a read-only disk (EROFS)
UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def unwritable(output_dir: str | os.PathLike[str], err: OSError) -> PermissionError:
    """The error for ``output_dir``, where writing failed with ``err`` (one of :data:`UNWRITABLE`)."""
    read_only = " (the disk is mounted read-only)" if err.errno == errno.EROFS else ""
    error = PermissionError(f"output_dir {os.fspath(output_dir)!r} cannot be written ({err.strerror}){read_only}: "
                            "the run could save nothing there. Pass an output_dir you can write to, or fix the "
                            "folder's permissions.")
    error.errno = err.errno
    return error


def check_writable(folder: str | os.PathLike[str]) -> None:
    """Create ``folder`` if missing, then create and remove an empty file of a fresh name in it (as
    :meth:`SafeFolder.open_write` creates its temporary files): ``PermissionError`` naming the folder
    (:func:`unwritable`) when it cannot be written, a read-only disk included, so a run that saves stops before its
    first step instead of at its first save."""
    name = os.path.join(folder, f".trainwell-probe.{secrets.token_hex(6)}.tmp")
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
    except OSError as err:
        if err.errno in UNWRITABLE:
            raise unwritable(folder, err) from None
        raise
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def append_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Append ``data`` to the regular file ``path`` (created if missing; :func:`open_existing`): a link, a FIFO or
    a folder there is refused with :class:`UnsafeFileError`, never written through."""
    fd = open_existing(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh, private folder inside ``folder`` for a library that writes files by name (``save_pretrained``):
    what it writes there is moved into ``folder`` by renames when the block ends (a link planted under one of its
    names in ``folder`` is replaced, never written through), and the staging folder is removed either way."""
    import shutil
    import tempfile

    target = make_folder(folder, strict=False)
    stage = Path(tempfile.mkdtemp(prefix=".trainwell-stage-", dir=target))
    try:
        yield stage
        for root, dirs, names in os.walk(stage):
            relative = Path(root).relative_to(stage)
            for name in dirs:
                where = target / relative / name
                if os.path.lexists(where) and not (where.is_dir() and not where.is_symlink()):
                    os.unlink(where)  # a link or a file where a folder goes: the entry itself, not its target
                where.mkdir(exist_ok=True)
            for name in names:
                os.replace(Path(root) / name, target / relative / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


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


def _open_folder(folder: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``folder`` (opened as named: the user chose it), then of each of ``parts`` below it, each
    opened relative to the one above without following a link: a folder swapped for a link meanwhile is refused."""
    fd = os.open(folder, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    where = folder
    try:
        for part in parts:
            where = where / part
            try:
                inner = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=fd)
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK, errno.ENXIO):
                    raise
                try:
                    kind = kind_of(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    kind = "not a folder"
                raise UnsafeFileError(
                    f"{where} is {kind}, not a folder: trainwell reads the files of a checkpoint or run folder "
                    "only inside it, never through a link. Replace it with the folder itself.") from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_fd(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> int:
    """A read-only descriptor of ``path``, opened once, relative to a descriptor of its folder (``O_NOFOLLOW |
    O_NONBLOCK``), and checked with ``fstat`` on that same descriptor: a regular file, or ``UnsafeFileError``
    naming it. With ``root``, every folder between ``root`` and the file is opened the same way (a link there is
    refused). Everything the caller learns of the file (its size, its bytes, a checksum) comes from this one
    descriptor, so a file renamed over the name after the check is never what is read. ``OSError`` (a missing
    file) passes through."""
    shown = Path(path)  # named in messages as the caller named it
    absolute = Path(os.path.abspath(path))
    base = Path(os.path.abspath(root)) if root is not None else absolute.parent
    try:
        parts = absolute.relative_to(base).parts
    except ValueError:
        raise UnsafeFileError(f"{shown} is outside {base}: a file of a folder is read only inside it.") from None
    if not parts:
        raise UnsafeFileError(f"{shown} is the folder itself, not a file of it.")
    if not _DIR_FD:  # pragma: no cover - platforms without dir_fd: by name, not following the last link
        return _check_fd(os.open(absolute, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | getattr(os, "O_BINARY", 0)), shown)
    folder = _open_folder(base, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=folder)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.EMLINK):
                raise not_regular(shown, "a symbolic link") from None
            if err.errno == errno.ENXIO:  # a FIFO or socket nobody writes to (or a link to one)
                mode = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_mode
                raise not_regular(shown, kind_of(mode)) from None
            raise
    finally:
        os.close(folder)
    return _check_fd(fd, shown)


def _check_fd(fd: int, path: Path) -> int:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, kind_of(mode))
    if _NONBLOCK and hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return fd


def open_regular(path: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> BinaryIO:
    """``path`` opened for reading in binary through :func:`open_fd` (one open, relative to its folder's
    descriptor; a regular file, never through a link, never blocking on a FIFO); ``UnsafeFileError`` naming it
    otherwise. ``OSError`` (a missing file) passes through."""
    fd = open_fd(path, root)
    raw = io.FileIO(fd, "rb")
    raw.name = os.fspath(path)  # for readers' messages (torch, zipfile), which name the file by it
    return io.BufferedReader(raw)


def read_bytes(path: str | os.PathLike[str], limit: int, root: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes of the regular file ``path`` (one open: :func:`open_fd`), refused when over ``limit`` bytes (by
    its ``fstat`` size before anything is read, and by what the read found: a file that grows is not read on)."""
    with open_regular(path, root) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise _too_large(path, limit)
        data = fh.read(size + 1)
    if len(data) > size:
        if len(data) > limit:
            raise _too_large(path, limit)
        raise UnsafeFileError(f"{os.fspath(path)} grew while trainwell read it: another process is writing it. "
                              "Read it once that process is done.")
    return data


def _too_large(path: str | os.PathLike[str], limit: int) -> UnsafeFileError:
    return UnsafeFileError(f"{os.fspath(path)} is larger than the {limit:,} bytes trainwell reads of such a file: "
                           "it is not one trainwell wrote.")


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


__all__ = ["UNWRITABLE", "SafeFolder", "UnsafeFileError", "UnsafePathError", "append_bytes", "check_writable",
           "copy_file", "make_folder", "unwritable",
           "open_existing", "open_fd", "open_regular", "open_write", "parse_json", "read_bytes", "read_json", "staged",
           "write_file", "write_text_file"]
