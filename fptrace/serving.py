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
import sys

SOCKET_ENV = "FPTRACE_SOCKET"  # the socket's path, instead of the one below
SWITCH_ENV = "FPTRACE_SERVER"  # "off": never use a server
STARTED, DONE, CANCEL, ELSEWHERE = b"S", b"X", b"C", b"L"


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


def owner_problem(path: str) -> str | None:
    """Why the socket at `path` (and its folder) must not be trusted, or None: both must belong
    to this user, and the folder be closed to others (another user could otherwise answer in
    our place, or read what we send)."""
    uid = os.getuid()
    folder = os.path.dirname(path)
    for where in (folder, path):
        st = os.lstat(where)
        if st.st_uid != uid:
            return f"{where} belongs to user {st.st_uid}, not to this user ({uid})"
    if os.lstat(folder).st_mode & 0o077:
        return f"{folder} is open to other users (mode {os.lstat(folder).st_mode & 0o777:o})"
    return None


def note(line: str) -> None:
    try:
        sys.stderr.write(f"fptrace: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def connect(path: str) -> object | None:
    """A connection to the server at `path`, or None (with one line where there was something
    to say: a stale socket is removed)."""
    try:
        os.lstat(path)
    except OSError:
        return None  # no server: the usual case, nothing to say (nor anything imported)
    try:
        problem = owner_problem(path)
    except OSError:  # gone since: a server that stopped on its own
        return None
    if problem:
        note(f"not using the server socket {path}: {problem}; running here")
        return None
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as e:
        conn.close()
        if isinstance(e, ConnectionRefusedError):
            try:
                os.unlink(path)
                what = "removed it"
            except OSError:
                what = "left it"
            note(f"no server answers at {path} (a stale socket: {what}); running here")
        else:
            note(f"the server at {path} cannot be reached ({e.strerror or e}); running here")
        return None
    if peer_uid(conn) not in (None, os.getuid()):
        conn.close()
        note(f"the server at {path} runs as another user; running here")
        return None
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
    """A status or stop request: the server's JSON answer, or None where no server answers."""
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


__all__ = ["CANCEL", "DONE", "ELSEWHERE", "SOCKET_ENV", "STARTED", "SWITCH_ENV", "connect", "note",
           "owner_problem", "peer_uid", "read_exact", "request", "runtime_folder", "send_header",
           "socket_path"]
