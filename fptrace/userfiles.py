"""Files a user names, read in one place: only regular files.

Opening a named pipe (FIFO) for reading waits until something writes to it, forever if nothing
does: a dictionary's cfg.json, a model's config.json or a prompt file that is a FIFO would hang
the command (and, in a resident server, the queue behind it); a character device such as
/dev/zero never ends. Every reader of a user's file opens it through `open_regular` (or calls
`check_regular` just before a library opens the path itself): the file is opened with
O_NONBLOCK, so that opening a FIFO returns at once, and whatever is not a regular file after its
symlinks are followed is refused in one line (a BadInput, exit 2) before a byte is read.
Errors of the open itself (no such file, a symlink loop, no permission) stay the OSError the
caller already turns into its own line.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from fptrace.errors import BadInput

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


class NotRegularFile(BadInput):
    """A path that names a FIFO, a device, a socket or a folder where a file is read."""


def open_regular(path: str | os.PathLike, what: str = "") -> BinaryIO:
    """`path` opened for reading (bytes), refused (NotRegularFile) unless it is a regular file;
    `what` (an option such as "--sae") starts the message."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | \
        getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise NotRegularFile(f"{what + ' ' if what else ''}{os.fspath(path)!r} is {kind}, not "
                                 "a regular file: fptrace reads only regular files")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | os.PathLike, what: str = "") -> None:
    """Refuse `path` unless it is a regular file, for a library that opens the path itself
    (safetensors, numpy); OSError as open() raises it."""
    open_regular(path, what).close()


def read_bytes(path: str | os.PathLike, what: str = "") -> bytes:
    with open_regular(path, what) as f:
        return f.read()


def read_text(path: str | os.PathLike, encoding: str = "utf-8", what: str = "") -> str:
    """The file decoded (UnicodeDecodeError as bytes.decode raises it)."""
    return read_bytes(path, what).decode(encoding)


__all__ = ["NotRegularFile", "check_regular", "open_regular", "read_bytes", "read_text"]
