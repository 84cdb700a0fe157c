"""Where this user's resident server listens, and how to speak to it: shared by the client
(fptrace/client.py, every `fptrace` call) and the server (commands/serve/). Standard library
only: the client imports it before anything else.

The protocol, one connection a request: a 4-byte length and a JSON header ({"op": "command"
| "status" | "stop", ...}), with the client's three standard descriptors attached (SCM_RIGHTS)
for a command. The server answers `S` when it starts the command and `X` with a 4-byte exit code
when it is done, or `L` for a command it leaves to the caller's own process; for status and stop,
a length and a JSON body. The client sends `C` to cancel.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable

from fptrace.errors import FptraceError

SOCKET_ENV = "FPTRACE_SOCKET"  # the socket's path, instead of the one below
SWITCH_ENV = "FPTRACE_SERVER"  # "off": never use a server
STARTED, DONE, CANCEL, ELSEWHERE = b"S", b"X", b"C", b"L"
GONE_FOLDER = "the working folder no longer exists (it was removed): cd to a folder that exists"


def socket_path() -> str:
    """The server's socket: $FPTRACE_SOCKET, else serve.sock in this user's runtime folder
    ($XDG_RUNTIME_DIR/fptrace, or /tmp/fptrace-UID where there is none)."""
    if os.environ.get(SOCKET_ENV):
        return os.path.abspath(os.environ[SOCKET_ENV])
    return os.path.join(runtime_folder(), "serve.sock")


def runtime_folder() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return os.path.join(base, "fptrace")
    return os.path.join("/tmp", f"fptrace-{os.getuid()}")


class Refused(FptraceError):
    """A socket path that is not used: not a socket, someone else's, in a folder open to others,
    or a server of another user at the other end."""


def folder_problem(folder: str) -> str | None:
    """Why `folder` must not hold this user's server socket, or None: the folder itself
    (symlinks followed, as binding and connecting follow them) must belong to this user and be
    closed to others (another user could otherwise put a socket of theirs in its place, and
    answer ours). The one check of the server, which listens there, and of every client."""
    real = os.path.realpath(folder)
    st = os.stat(real)
    shown = folder if real == folder else f"{folder} (that is {real})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{shown} is not a folder"
    if st.st_uid != os.getuid():
        return f"{shown} belongs to user {st.st_uid}, not to this user ({os.getuid()})"
    if st.st_mode & 0o077:
        return f"{shown} is open to other users (mode {st.st_mode & 0o777:o})"
    return None


def kind_of(mode: int) -> str:
    """What a file of this mode is, in words (for a path that should be a socket)."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a named pipe")):
        if test(mode):
            return name
    return "not a socket"


def not_a_socket(path: str) -> str | None:
    """One line where something other than a socket is at `path` (nothing fptrace removes),
    or None (a socket, or nothing)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISSOCK(mode):
        return None
    return f"{path} is not a socket ({kind_of(mode)}); not removed"


def owner_problem(path: str) -> str | None:
    """Why the socket at `path` must not be trusted, or None: it must belong to this user, and
    its folder pass `folder_problem`."""
    st = os.lstat(path)
    if st.st_uid != os.getuid():
        return f"{path} belongs to user {st.st_uid}, not to this user ({os.getuid()})"
    return folder_problem(os.path.dirname(path))


def note(line: str) -> None:
    try:
        sys.stderr.write(f"fptrace: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def connect(path: str, then: str = "", say: Callable[[str], None] = note) -> object | None:
    """A connection to the server at `path`, or None where none answers (a stale socket, which
    is removed, is one line to `say`, ending in `then` where given: what the caller does
    instead). Raises Refused for a path that is not used."""
    try:
        os.lstat(path)
    except OSError:
        return None  # no server: the usual case, nothing to say (nor anything imported)
    try:
        odd = not_a_socket(path)
        problem = owner_problem(path)
    except OSError:  # gone since: a server that stopped on its own
        return None
    if odd:
        raise Refused(odd)
    if problem:
        raise Refused(f"not using the server socket {path}: {problem}")
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tail = f"; {then}" if then else ""
    try:
        conn.connect(path)
    except OSError as e:
        conn.close()
        if isinstance(e, ConnectionRefusedError):
            try:
                if not_a_socket(path) is None:  # still the socket seen above
                    os.unlink(path)
                what = "removed it"
            except OSError:
                what = "left it"
            say(f"no server answers at {path} (a stale socket: {what}){tail}")
        else:
            say(f"the server at {path} cannot be reached ({e.strerror or e}){tail}")
        return None
    if peer_uid(conn) not in (None, os.getuid()):
        conn.close()
        raise Refused(f"the server at {path} runs as another user")
    return conn


def peer_uid(conn: object) -> int | None:
    import socket
    import struct

    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,  # type: ignore[attr-defined]
                                struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[1]


def send_header(conn: object, header: dict, fds: list[int] | None = None) -> None:
    import json
    import socket
    import struct

    body = json.dumps(header).encode("utf-8")
    data = struct.pack("!I", len(body)) + body
    if fds:
        socket.send_fds(conn, [data], fds)  # type: ignore[arg-type]
    else:
        conn.sendall(data)  # type: ignore[attr-defined]


def read_exact(conn: object, n: int) -> bytes:
    """n bytes, or fewer where the other side closed."""
    chunks = b""
    while len(chunks) < n:
        part = conn.recv(n - len(chunks))  # type: ignore[attr-defined]
        if not part:
            break
        chunks += part
    return chunks


def request(header: dict, path: str | None = None) -> dict | None:
    """A status or stop request: the server's JSON answer, or None where no server answers
    (Refused where the socket is not used)."""
    import json
    import struct

    conn = connect(path or socket_path())
    if conn is None:
        return None
    try:
        send_header(conn, header)
        size = read_exact(conn, 4)
        if len(size) < 4:
            return None
        return json.loads(read_exact(conn, struct.unpack("!I", size)[0]))
    except OSError:
        return None
    finally:
        conn.close()  # type: ignore[attr-defined]


__all__ = ["CANCEL", "DONE", "ELSEWHERE", "GONE_FOLDER", "SOCKET_ENV", "STARTED", "SWITCH_ENV",
           "Refused", "connect", "folder_problem", "kind_of", "not_a_socket", "note",
           "owner_problem", "peer_uid", "read_exact", "request", "runtime_folder", "send_header",
           "socket_path"]
