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
line on stderr, then the same. What must run here runs here: a command that the server
leaves to its caller (the server itself, the TUI, which owns the terminal: it answers so), `--tp`
(ranks of this command), `--ray`, a process under torchrun, or any with FPTRACE_SERVER=off.

The socket and the protocol: fptrace/serving.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

from fptrace.serving import (
    CANCEL,
    DONE,
    ELSEWHERE,
    GONE_FOLDER,
    SOCKET_ENV,
    STARTED,
    SWITCH_ENV,
    Refused,
    connect,
    note,
    read_exact,
    send_header,
    socket_path,
)

KEEP_WARM_ENV = "FPTRACE_KEEP_WARM"  # "1": start a server on first use
KEEP_WARM = "--keep-warm"  # the same, for one call
LOCAL_OPTIONS = ("--tp", "--ray")
STALE_EXIT = 75  # the server stopped while it answered: the output may be partial


def wants_server(argv: list[str]) -> bool:
    """Whether this command line may be answered by a server."""
    if os.environ.get(SWITCH_ENV, "").lower() in ("off", "0", "no", "false"):
        return False
    if os.environ.get("WORLD_SIZE") or os.environ.get("RANK"):  # a rank under torchrun
        return False
    return not any(a == o or a.startswith(o + "=") for a in argv for o in LOCAL_OPTIONS)


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


def run_remote(argv: list[str], path: str, say: Callable[[str], None] = note) -> int | None:
    """The exit code of `argv` answered by the server at `path`; None where none answered
    before starting it (the caller then runs it here, and `say` has what to tell of why)."""
    import _signal
    import struct

    fds = open_streams()
    if fds is None:
        return None
    try:
        conn = connect(path, then="running here", say=say)
    except Refused as e:
        say(f"{e}; running here")
        return None
    if conn is None:
        return None
    header = {"op": "command", "argv": argv, "cwd": working_folder(), "env": dict(os.environ),
              "umask": current_umask(),
              "encoding": [getattr(s, "encoding", None) or "utf-8" for s in
                           (sys.stdin, sys.stdout, sys.stderr)]}
    cancels = {"sent": False}

    def on_sigint(signum: int, frame: object) -> None:
        if cancels["sent"]:  # a second Ctrl-C: leave at once
            note("error: interrupted")
            os._exit(130)
        cancels["sent"] = True
        with contextlib.suppress(OSError):
            conn.sendall(CANCEL)  # type: ignore[attr-defined]

    previous = None
    with contextlib.suppress(ValueError):  # not the main thread
        previous = _signal.signal(_signal.SIGINT, on_sigint)
    started = False
    try:
        send_header(conn, header, fds)
        while True:
            kind = read_exact(conn, 1)
            if kind == STARTED:
                started = True
                continue
            if kind == ELSEWHERE:  # a command the server leaves to its caller
                return None
            if kind == DONE:
                code = read_exact(conn, 4)
                if len(code) == 4:
                    return struct.unpack("!i", code)[0]
            break
    except OSError:
        pass
    finally:
        conn.close()  # type: ignore[attr-defined]
        if previous is not None:  # run here after all: Ctrl-C is the command's again
            _signal.signal(_signal.SIGINT, previous)
    if cancels["sent"] and not started:
        note("error: interrupted")
        return 130
    if started:
        note(f"error: the server at {path} stopped while it answered (its output may be "
             f"partial); run again, or with {SWITCH_ENV}=off to run here")
        return STALE_EXIT
    say(f"the server at {path} closed the connection before answering; running here")
    return None


def start_server(path: str) -> str | None:
    """Start a server in the background (`fptrace serve`, which returns once it listens):
    None, or why it did not start (a server that another call started first among them)."""
    import subprocess

    env = dict(os.environ, **{SOCKET_ENV: path})
    try:
        done = subprocess.run([sys.executable, "-m", "fptrace", "serve"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        line = lines[-1] if lines else f"exit {done.returncode}"
        return line.removeprefix("fptrace: ").removeprefix("error: ")
    return None


def working_folder() -> str:
    """This process's working folder; one line and exit 2 where it was removed (a command
    could not read or write a relative path, here or in a server)."""
    try:
        return os.getcwd()
    except OSError:
        note(f"error: {GONE_FOLDER}")
        sys.exit(2)


def main() -> None:
    if sys.stdout is None:  # started with its standard output closed (`>&-`)
        print("fptrace: error: standard output is closed: fptrace writes its tables and JSON "
              "there; redirect it (> FILE, or > /dev/null) instead of closing it",
              file=sys.stderr)
        raise SystemExit(2)
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):  # from the packages' metadata: nothing to import
        from fptrace.version import describe

        print(describe())
        return
    keep_warm = KEEP_WARM in argv or os.environ.get(KEEP_WARM_ENV, "") in ("1", "yes", "true")
    argv = [a for a in argv if a != KEEP_WARM]
    working_folder()
    said: list[str] = []  # why no server answered: told where the command could have used one
    if wants_server(argv):
        path = socket_path()
        rc = run_remote(argv, path, said.append)
        if rc is None and keep_warm and not os.path.lexists(path):
            why = start_server(path)
            said.clear()
            rc = run_remote(argv, path, said.append)  # also where another call's server won
            if rc is None and why:
                said.append(f"could not start a server ({why}); running here")
        if rc is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
            os._exit(rc)
    sys.argv[1:] = argv  # what the command sees of its own line (--tp relaunches it)
    from fptrace.cli.main import main as here
    from fptrace.cli.main import resident_may_answer

    if resident_may_answer(argv):  # not `serve` itself, which speaks of its socket in its words
        for line in said:
            note(line)
    here(argv)


__all__ = ["KEEP_WARM", "main", "run_remote", "start_server", "wants_server", "working_folder"]
