"""Writing files by name into one folder, never through a symbolic link: what the run report and the model card use.

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
import os
import secrets
from pathlib import Path
from types import TracebackType


class UnsafePathError(ValueError):
    """A folder to write into is a symbolic link (or not a folder): the message names it and the fix."""


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


__all__ = ["SafeFolder", "UnsafePathError", "make_folder", "write_text_file"]
