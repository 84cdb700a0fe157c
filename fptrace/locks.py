"""One writer per output file: an exclusive advisory lock (flock), refused at once rather than
waited for, so that two runs writing one output never both believe they succeeded.

`batch` appends to its --out and locks that file itself (`lock`). `stats` replaces its --out
atomically (a new file renamed over the old one, so the old one's lock would not carry over): it
locks a hidden file beside it instead (`exclusive`), removed when the run ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from fptrace.errors import BadInput


def lock(fd: int, path: str, who: str, what: str = "--out") -> None:
    """Take the lock on an open file, or refuse: another `fptrace <who>` holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory lock; a second writer is not detected
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        raise BadInput(f"another fptrace {who} is writing {path}; wait for it or choose "
                       f"another {what}") from e


def lock_path(path: str) -> str:
    """The hidden file beside `path` whose lock stands for it."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.fptrace-lock")


@contextlib.contextmanager
def exclusive(path: str, who: str, what: str = "--out") -> Iterator[None]:
    """Hold the lock that stands for `path` while the block runs (see lock_path)."""
    side = lock_path(path)
    while True:
        try:
            fd = os.open(side, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise BadInput(f"cannot lock {what} {path}: {e.strerror or e}") from None
        try:
            lock(fd, path, who, what)
            # the run before may have removed the file between our open and our lock: then the
            # lock is on a file nobody else can find; take the one that is there now
            same = os.path.exists(side) and os.stat(side).st_ino == os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(side)  # still holding the lock: nobody can be between open and lock
        os.close(fd)


__all__ = ["exclusive", "lock", "lock_path"]
