"""Atomic file writes: a temporary file in the target's folder, then a rename. A failure (a
full disk, an interrupt) leaves the old file, or none, never half of a new one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable


def check_target(path: str, what: str, example: str, force: bool = False) -> None:
    """Before any work, the one output policy: the folder exists and is writable, the path is
    not a folder, and an existing file is replaced only if fptrace wrote it (`written_by_us`)
    or the user said --force. Every output option (--plot, --save-vector, --save-scales, the
    --out of report and stats) goes through here; batch's --out, appended to rather than
    replaced, applies the same rule to its records (commands/batch/core.py)."""
    from fptrace.errors import BadInput, param

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise BadInput(f"{what} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"{what} {path}: the folder {folder} is not writable")
    if os.path.isdir(path):
        raise BadInput(f"{what} {path} is a folder; give a file name such as {path}/{example}")
    if os.path.exists(path) and not os.path.isfile(path):
        raise BadInput(f"{what} {path} exists and is not a regular file")
    if os.path.exists(path) and not force and not written_by_us(path):
        raise BadInput(f"{what} {path} exists and is not a file fptrace wrote; refusing to "
                       f"replace it: choose another path, or pass {param('force')} to replace it")


MARK = "fptrace"  # how fptrace signs the files it writes, where their format has room for it
_HEAD = 1 << 16


def written_by_us(path: str) -> bool:
    """Whether an existing file is fptrace's own output, by its content: JSON with fptrace's
    `kind` and `schema_version`, an HTML report, a figure or a safetensors/GGUF file signed
    with MARK, or an empty file. A .npy, .jpg or .webp has no room for a signature: it is
    never assumed to be ours."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(_HEAD)
            if size > _HEAD:
                f.seek(max(_HEAD, size - _HEAD))
            tail = f.read(_HEAD) if size > _HEAD else head
    except OSError:
        return False
    if size == 0:
        return True
    ext = os.path.splitext(path)[1].lower()
    sign = MARK.encode()
    if ext in (".json", ".jsonl"):
        return _our_json(path, head, size)
    if ext in (".html", ".htm"):
        return b'<meta name="generator" content="fptrace' in head
    if ext == ".png":  # a tEXt chunk: keyword, NUL, text
        return head.startswith(b"\x89PNG") and b"Software\x00" + sign in head
    if ext == ".svg":
        return b"<dc:creator>" in head and b"<dc:title>" + sign + b"</dc:title>" in head
    if ext == ".pdf":  # the document information dictionary is written last
        return head.startswith(b"%PDF") and b"/Creator (" + sign + b")" in tail
    if ext == ".safetensors":
        return _our_safetensors(head)
    if ext == ".gguf":
        return head.startswith(b"GGUF") and b"fptrace.producer" in head
    return False


def _our_json(path: str, head: bytes, size: int) -> bool:
    from fptrace.jsontext import loads

    first = head.split(b"\n", 1)[0] if path.lower().endswith(".jsonl") or head.startswith(b"{\"") \
        else None
    try:
        if first is not None and (len(first) < len(head) or size <= _HEAD):
            doc = loads(first)
        else:
            with open(path, "rb") as f:
                doc = loads(f.read())
    except (ValueError, UnicodeDecodeError, OSError):
        return False
    return isinstance(doc, dict) and "kind" in doc and "schema_version" in doc


def _our_safetensors(head: bytes) -> bool:
    import json
    import struct

    if len(head) < 8:
        return False
    n = struct.unpack("<Q", head[:8])[0]
    try:
        header = json.loads(head[8:8 + n]) if 8 + n <= len(head) else None
    except (ValueError, UnicodeDecodeError):
        return False
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(meta, dict) and str(meta.get("producer", "")).startswith(MARK)


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
