"""Atomic file writes: a temporary file in the target's folder, then a rename. A failure (a
full disk, an interrupt) leaves the old file, or none, never half of a new one."""

from __future__ import annotations

import os
import tempfile
from typing import Callable


def check_target(path: str, what: str, example: str) -> None:
    """Before any work: the folder exists and is writable, and the path is not a folder."""
    from fptrace.errors import BadInput

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise BadInput(f"{what} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"{what} {path}: the folder {folder} is not writable")
    if os.path.isdir(path):
        raise BadInput(f"{what} {path} is a folder; give a file name such as {path}/{example}")


def write_atomic(path: str, write: Callable[[str], None], suffix: str = "") -> None:
    """Call write(tmp_path) to fill a temporary file, then move it onto `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".fptrace-", suffix=suffix, dir=folder)
    except OSError as e:
        raise _error(path, e) from None
    os.close(fd)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # what a plain open() would have given
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise _error(path, e) from None
        raise


def _error(path: str, e: OSError) -> Exception:
    """A path the user cannot write to is bad input (exit 2); a fault while writing (a full
    disk) is a failed write (exit 74). Either way nothing was written."""
    import errno

    from fptrace.errors import BadInput, WriteFailed

    msg = f"cannot write {path}: {e.strerror or e}; nothing was written"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR,
                   errno.EISDIR):
        return BadInput(msg)
    return WriteFailed(msg)


def write_text_atomic(path: str, text: str, suffix: str = "") -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    write_atomic(path, write, suffix)
