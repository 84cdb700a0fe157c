"""The `fptrace` command's front door: hand the command line to a resident server when one runs
for this user, else run it here.

A server (`fptrace serve`, commands/serve/) keeps models loaded in one process. This module is
what every `fptrace` call imports first, so it imports the standard library only (no torch, no
transformers, no Typer: `python -X importtime -c "import fptrace.client"` shows it). It connects
to the server's Unix socket, sends the arguments, the working folder, the environment and its own
standard streams (their file descriptors, so the server writes to this terminal or pipe, at its
width, exactly as this process would have), waits for the exit code and exits with it. Ctrl-C
here cancels the request, not the server.

Where no server answers, the command runs in this process (cli/main.py), as it always did: a
missing server costs nothing; a stale socket, a server of another user or one that died is one
line on stderr, then the same. The server is never used for what must run here: `serve` itself,
the TUI (it owns the terminal), `--tp` (ranks of this command), `--ray`, a process under
torchrun, or with FPTRACE_SERVER=off.

The protocol, one connection a request: the client sends a 4-byte length and a JSON header
({"op": "run" | "status" | "stop", ...}) with its three descriptors attached (SCM_RIGHTS); the
server answers `S` when it starts the command and `X` with a 4-byte exit code when it is done (or
a length and a JSON body for status and stop). The client sends `C` to cancel.
"""

from __future__ import annotations

import os
import sys

SOCKET_ENV = "FPTRACE_SOCKET"  # the socket's path, instead of the one below
SWITCH_ENV = "FPTRACE_SERVER"  # "off": never use a server
KEEP_WARM_ENV = "FPTRACE_KEEP_WARM"  # "1": start a server on first use
KEEP_WARM = "--keep-warm"  # the same, for one call
LOCAL = ("serve", "tui")  # commands that always run in the calling process
LOCAL_OPTIONS = ("--tp", "--ray")
STARTED, DONE, CANCEL = b"S", b"X", b"C"
STALE_EXIT = 75  # the server stopped while it answered: the output may be partial


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


def wants_server(argv: list[str]) -> bool:
    """Whether this command line may be answered by a server."""
    if os.environ.get(SWITCH_ENV, "").lower() in ("off", "0", "no", "false"):
        return False
    if os.environ.get("WORLD_SIZE") or os.environ.get("RANK"):  # a rank under torchrun
        return False
    words = [a for a in argv if not a.startswith("-")]
    if words and words[0] in LOCAL:
        return False
    return not any(a == o or a.startswith(o + "=") for a in argv for o in LOCAL_OPTIONS)


def note(line: str) -> None:
    try:
        sys.stderr.write(f"fptrace: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def connect(path: str) -> object | None:
    """A connection to the server at `path`, or None (with one line where there was something
    to say: a stale socket is removed)."""
    import socket

    try:
        os.lstat(path)
    except OSError:
        return None  # no server: the usual case, nothing to say
    problem = owner_problem(path)
    if problem:
        note(f"not using the server socket {path}: {problem}; running here")
        return None
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


def open_streams() -> list[int] | None:
    """This process's stdin, stdout and stderr descriptors, or None where one is closed (the
    command then runs here, where a closed stream behaves as it always did)."""
    fds = [0, 1, 2]
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            return None
    return fds


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def run_remote(argv: list[str], path: str) -> int | None:
    """The exit code of `argv` answered by the server at `path`; None where none answered
    before starting it (the caller then runs it here)."""
    import _signal
    import struct

    fds = open_streams()
    if fds is None:
        return None
    conn = connect(path)
    if conn is None:
        return None
    header = {"op": "run", "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
              "umask": current_umask(),
              "encoding": [getattr(s, "encoding", None) or "utf-8" for s in
                           (sys.stdin, sys.stdout, sys.stderr)]}
    cancels = {"sent": False}

    def on_sigint(signum: int, frame: object) -> None:
        if cancels["sent"]:  # a second Ctrl-C: leave at once
            note("error: interrupted")
            os._exit(130)
        cancels["sent"] = True
        try:
            conn.sendall(CANCEL)  # type: ignore[attr-defined]
        except OSError:
            pass

    try:
        _signal.signal(_signal.SIGINT, on_sigint)
    except ValueError:
        pass
    started = False
    try:
        send_header(conn, header, fds)
        while True:
            kind = read_exact(conn, 1)
            if kind == STARTED:
                started = True
                continue
            if kind == DONE:
                code = read_exact(conn, 4)
                if len(code) == 4:
                    return struct.unpack("!i", code)[0]
            break
    except OSError:
        pass
    finally:
        conn.close()  # type: ignore[attr-defined]
    if cancels["sent"] and not started:
        note("error: interrupted")
        return 130
    if started:
        note(f"error: the server at {path} stopped while it answered (its output may be "
             f"partial); run again, or with {SWITCH_ENV}=off to run here")
        return STALE_EXIT
    note(f"the server at {path} closed the connection before answering; running here")
    return None


def start_server(path: str) -> bool:
    """Start a server in the background (`fptrace serve`, which returns once it listens);
    whether one answers now."""
    import subprocess

    env = dict(os.environ, **{SOCKET_ENV: path})
    try:
        done = subprocess.run([sys.executable, "-m", "fptrace", "serve"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return False
    if done.returncode != 0:
        line = done.stderr.decode("utf-8", "replace").strip().splitlines()
        note(f"could not start a server ({line[-1] if line else done.returncode}); running here")
        return False
    return True


def main() -> None:
    argv = sys.argv[1:]
    keep_warm = KEEP_WARM in argv or os.environ.get(KEEP_WARM_ENV, "") in ("1", "yes", "true")
    argv = [a for a in argv if a != KEEP_WARM]
    if wants_server(argv):
        path = socket_path()
        rc = run_remote(argv, path)
        if rc is None and keep_warm and not os.path.exists(path) and start_server(path):
            rc = run_remote(argv, path)
        if rc is not None:
            try:
                sys.stdout.flush()
            except (OSError, ValueError):
                pass
            os._exit(rc)
    sys.argv[1:] = argv  # what the command sees of its own line (--tp relaunches it)
    from fptrace.cli.main import main as here

    here(argv)


__all__ = ["KEEP_WARM", "SOCKET_ENV", "SWITCH_ENV", "main", "owner_problem", "request",
           "runtime_folder", "socket_path", "wants_server"]
