"""The resident server: one process that keeps models loaded (models/resident.py) and answers
the command lines that fptrace/serving.py sends it, one at a time, as if each had run in the
client's own process.

For a request the server takes on the client's standard streams (the descriptors came with it:
they are put in place of its own 0, 1 and 2, so the terminal's width, whether it is a terminal,
and every byte written are the client's), its working folder, environment, umask and argv, runs
the command through cli/main.py's `answer` and sends back the exit code; then it puts its own
back. A `C` from the client (its Ctrl-C) interrupts the command the way Ctrl-C does in a process
of its own (`fptrace: error: interrupted`, 130), and the server goes on. Status and stop are
answered at once, never behind a running command, and so is a command the server leaves to its
caller; a stop interrupts the running command (its client: `interrupted (the server was
stopped)`, 130). Requests from another user are refused (SO_PEERCRED). The socket is created
with mode 0600 in a folder that serving.folder_problem accepts, the check every client makes
(created 0700 where it is missing; a folder that exists is never changed); a lock file beside it
lets one server at a time listen there. After `idle` seconds without a request the server ends
and removes its socket.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fptrace import serving
from fptrace.errors import FptraceError

MAIN_THREAD = threading.main_thread().ident or 0  # where the commands run


class ServerRunning(FptraceError):
    """`fptrace serve` where a server already listens on the socket."""

    exit_code = 1


SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path less its terminating NUL)
STOP_GRACE = 10.0  # seconds a stopped server waits for its running request to end
# a cancelled request still running after REPEAT seconds is interrupted again (REPEATS times at
# most): its KeyboardInterrupt may have been swallowed; one held back inside an import is sent
# again every TICK (insist)
REPEAT = 3.0
REPEATS = 5
TICK = 0.1


@dataclass
class Request:
    conn: socket.socket
    header: dict
    fds: list[int]
    cancelled: bool = False
    why: str = ""  # said after `interrupted` where the cancel is not the client's own
    started: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Server:
    path: str
    idle: float  # seconds without a request before it ends; 0: never
    budget: int
    started_at: float = field(default_factory=time.time)
    served: int = 0
    stopping: bool = False
    current: Request | None = None
    pending: queue.Queue = field(default_factory=queue.Queue)
    ended: threading.Event = field(default_factory=threading.Event)
    inode: int = 0  # of the socket this server bound (removed at the end if still there)


def prepare(path: str) -> None:
    """Check the place of the socket before a server listens there: a path a socket can have,
    nothing but a socket there, and a folder that `serving.folder_problem` accepts, the same
    check every client makes. A missing folder is created closed to other users; a folder that
    exists is never changed (it may be the user's home, or /var/tmp)."""
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        raise FptraceError(f"the socket path {path} is {size} bytes long; a Unix socket's path "
                           f"holds at most {SOCKET_PATH_MAX}: set {serving.SOCKET_ENV} to a "
                           "shorter one")
    odd = serving.not_a_socket(path)
    if odd:
        raise FptraceError(odd)
    folder = os.path.dirname(path)
    if not os.path.lexists(folder):
        parent = os.path.dirname(folder)
        if parent != folder:
            os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(folder, 0o700)
            os.chmod(folder, 0o700)  # ours, new: closed whatever the umask left of 0700
        except FileExistsError:  # made since by another server starting: checked below
            pass
    try:
        problem = serving.folder_problem(folder)
    except OSError as e:
        raise FptraceError(f"cannot use {folder} for the server's socket: "
                           f"{e.strerror or e}") from None
    if problem:
        raise FptraceError(f"{problem}: the socket's folder must be closed to other users "
                           f"(chmod 700 it), or set {serving.SOCKET_ENV} to a socket in "
                           "another folder")


def listen(path: str) -> tuple[socket.socket, Any]:
    """Bind the socket at `path` (mode 0600), holding the lock that makes this the one server
    there; a stale socket left by a server that died is replaced. The socket is bound under
    another name and renamed into place once it listens: at `path` there is never a socket that
    refuses connections, which a client would take for a stale one and remove."""
    import fcntl

    prepare(path)
    lock = open(path + ".lock", "a+")  # noqa: SIM115 (held for the server's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise already_there(path) from None
    new = staging(path)
    try:
        for where in (new, path):
            odd = serving.not_a_socket(where)
            if odd:  # put there since prepare() looked
                raise FptraceError(odd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(new)  # left by a server that died as it started
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(new)
        finally:
            os.umask(old)
        os.chmod(new, 0o600)
        sock.listen(16)
        os.rename(new, path)  # over a stale socket: its server is gone, or it would hold the lock
    except BaseException:
        lock.close()
        raise
    return sock, lock


def staging(path: str) -> str:
    """The name beside `path`, as long as it, where the socket is bound before it listens."""
    folder, name = os.path.split(path)
    return os.path.join(folder, ("-" if name.startswith("~") else "~") + name[1:])


def already_there(path: str) -> ServerRunning:
    status = serving.request({"op": "status"}, path)
    pid = f" (pid {status['pid']})" if status else ""
    return ServerRunning(f"a server already listens at {path}{pid}")


def serve(path: str, idle: float, budget: int) -> None:
    """Listen at `path` until stopped or idle."""
    from fptrace import interrupt
    from fptrace.models import resident

    interrupt.defer_imports()  # a cancel never cuts an import short (insist sends it again)
    sock, lock = listen(path)
    import huggingface_hub.constants  # noqa: F401 (read once: the server's own HUB_PLACES)

    server = Server(path, idle, budget)
    server.inode = os.stat(path).st_ino  # the file to remove at the end, if nobody replaced it
    resident.hold(budget)
    signal.signal(signal.SIGTERM, lambda *_: stop_soon(server))
    signal.signal(signal.SIGINT, lambda *_: stop_soon(server))  # foreground: Ctrl-C stops it
    threading.Thread(target=accept, args=(server, sock), daemon=True).start()
    log(f"listening at {path} (pid {os.getpid()}, idle timeout "
        f"{idle:g} s, memory budget {budget} bytes)")
    try:
        while not server.stopping:
            try:
                req = server.pending.get(timeout=idle or None)
            except queue.Empty:
                log(f"idle for {idle:g} s: stopping")
                break
            if req is None:
                break
            answer(server, req)
    finally:
        remove_socket(server)
        sock.close()
        lock.close()
        resident.release()
        server.ended.set()


def remove_socket(server: Server) -> None:
    with contextlib.suppress(OSError):
        if os.stat(server.path).st_ino == server.inode:
            os.unlink(server.path)


def stop(server: Server) -> None:
    """End the server: at once where it is idle; a running request is interrupted first (its
    client gets `fptrace: error: interrupted (the server was stopped)`, exit 130) and, where it
    does not end within STOP_GRACE seconds, the process ends without it (its client: the line
    of a server that stopped while it answered, exit 75)."""
    server.stopping = True
    server.pending.put(None)
    req = server.current
    if req is not None:
        cancel(server, req, "the server was stopped")
        threading.Thread(target=end_anyway, args=(server,), daemon=True).start()


def stop_soon(server: Server) -> None:
    """stop() from a signal handler: in a thread of its own, since the main thread, which the
    handler interrupts, may hold a request's lock."""
    threading.Thread(target=stop, args=(server,), daemon=True).start()


def end_anyway(server: Server) -> None:
    if server.ended.wait(STOP_GRACE):
        return
    log(f"stopped, and the running request did not end within {STOP_GRACE:g} s: leaving it")
    remove_socket(server)
    os._exit(1)


def log(line: str) -> None:
    err = sys.__stderr__
    if err is not None:
        with contextlib.suppress(OSError, ValueError):
            err.write(f"{time.strftime('%H:%M:%S')} {line}\n")
            err.flush()


def accept(server: Server, sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        threading.Thread(target=receive, args=(server, conn), daemon=True).start()


def receive(server: Server, conn: socket.socket) -> None:
    """Read a request's header; answer status and stop at once, queue a command and watch its
    connection for a cancel."""
    fds: list[int] = []
    try:
        if serving.peer_uid(conn) not in (None, os.getuid()):
            conn.close()
            return
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        size = struct.unpack("!I", msg[:4])[0]
        body = msg[4:]
        if len(body) < size:
            body += serving.read_exact(conn, size - len(body))
        if len(body) != size:
            raise OSError("short header")
        header = json.loads(body)
    except (OSError, ValueError, struct.error):
        for fd in fds:  # the caller's streams are not kept open by a request that failed
            os.close(fd)
        conn.close()
        return
    op = header.get("op") if isinstance(header, dict) else None
    if op in ("status", "stop"):
        for fd in fds:
            os.close(fd)
        reply = status(server)
        if op == "stop":
            stop(server)
        with contextlib.suppress(OSError):
            serving.send_header(conn, reply)
        conn.close()
        return
    argv = header.get("argv") if op == "command" else None
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)) or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    if not may_answer(argv) or other_hub(header.get("env")):  # at once: never queued
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall(serving.ELSEWHERE)
        conn.close()
        return
    req = Request(conn, header, list(fds))
    server.pending.put(req)
    watch(server, req)


def watch(server: Server, req: Request) -> None:
    """A `C` from the client, or the client gone: cancel its request (interrupt it where it
    runs, drop it where it waits)."""
    while True:
        try:
            data = req.conn.recv(1)
        except OSError:
            data = b""
        if data == serving.CANCEL or not data:
            cancel(server, req)
            if not data:
                return


def cancel(server: Server, req: Request, why: str = "") -> None:
    """Interrupt `req` where it runs (once: a second SIGINT would end the server), drop it where
    it waits; `why` is said after the client's `interrupted`."""
    from fptrace import interrupt

    with req.lock:
        if req.cancelled:
            return
        req.cancelled = True
        req.why = why
        if req.started and server.current is req:
            interrupt.because(why)
            signal.pthread_kill(MAIN_THREAD, signal.SIGINT)
            threading.Thread(target=insist, args=(server, req), daemon=True).start()


def insist(server: Server, req: Request) -> None:
    """Interrupt a cancelled request again while it still runs: at once while its interrupt is
    held back inside an import (interrupt.defer_imports), and after REPEAT seconds, REPEATS
    times at most, in case its KeyboardInterrupt landed inside a weakref callback or a
    __del__, where Python prints it and goes on (the command would run to its end). Checked and
    sent under the request's lock, which `answer` takes to let the request go: no repeat
    reaches the next request, or the server's own handler."""
    from fptrace import interrupt

    last, repeats = time.monotonic(), 0
    while True:
        time.sleep(TICK)
        with req.lock:
            if server.current is not req:
                return
            if interrupt.deferred():
                signal.pthread_kill(MAIN_THREAD, signal.SIGINT)
                last = time.monotonic()
            elif time.monotonic() - last >= REPEAT and repeats < REPEATS:
                interrupt.again()
                signal.pthread_kill(MAIN_THREAD, signal.SIGINT)
                last, repeats = time.monotonic(), repeats + 1


HUB_PLACES = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HF_ENDPOINT")


def other_hub(env: object) -> bool:
    """Whether a client's environment puts the Hugging Face cache, or the hub, elsewhere than
    the server's: huggingface_hub reads these once, at its import (the server's start), so such
    a command runs in the client's own process, where they apply."""
    env = env if isinstance(env, dict) else {}
    return any(env.get(k) != SERVER_ENV.get(k) for k in HUB_PLACES)


def may_answer(argv: list[str]) -> bool:
    """Whether the server runs this command line (not the server itself, nor the TUI)."""
    from fptrace.cli.main import resident_may_answer

    return resident_may_answer(argv)


def status(server: Server) -> dict:
    from fptrace.models import resident

    return {"pid": os.getpid(), "socket": server.path, "started_at": server.started_at,
            "served": server.served, "idle_timeout": server.idle, "budget": server.budget,
            "rss": rss_bytes(), "held": resident.status(),
            "busy": server.current is not None, "waiting": server.pending.qsize()}


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def answer(server: Server, req: Request) -> None:
    """Run one request in the client's streams, folder and environment; send its exit code."""
    from fptrace import interrupt
    from fptrace.models import resident

    with req.lock:
        if req.cancelled:
            close(req)
            return
        req.started = True
        server.current = req
    rc = 70
    try:
        req.conn.sendall(serving.STARTED)
        with as_client(req):
            rc = run_command(req)
    except FolderGone:
        with contextlib.suppress(OSError):
            os.write(req.fds[2], f"fptrace: error: {serving.GONE_FOLDER}\n".encode())
        rc = 2
    except OSError:
        pass
    finally:
        interrupt.settled()  # a cancel that comes late is ignored, never raised here
        with req.lock:
            server.current = None
        signal.signal(signal.SIGINT, lambda *_: stop(server))
        for name in resident.sweep():
            log(f"{name}: changed by a request, dropped (the next one loads it afresh)")
        server.served += 1
    with contextlib.suppress(OSError):
        req.conn.sendall(serving.DONE + struct.pack("!i", rc))
    close(req)


def close(req: Request) -> None:
    with contextlib.suppress(OSError):
        req.conn.close()
    for fd in req.fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    req.fds = []


def run_command(req: Request) -> int:
    from fptrace import interrupt
    from fptrace.cli.main import answer as run_line

    interrupt.reset()
    if req.cancelled:  # cancelled as it started, before the interrupt was the command's
        interrupt.because(req.why)
        interrupt.say()
        return interrupt.EXIT
    try:
        return run_line(req.header["argv"])
    except KeyboardInterrupt:  # the cancel came between the command's end and its settling
        interrupt.say()
        return interrupt.EXIT
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 (the server must outlive any command)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"fptrace: error: internal error in the server: "
                             f"{type(e).__name__}: {e}\n")
        return 70
    finally:
        interrupt.settled()  # from here a late cancel is ignored (SIGINT set aside)


_FRESH: dict[str, int] = {}


def fresh_torch() -> None:
    """torch with as many threads as a new process of the client's would have: its
    OMP_NUM_THREADS, else torch's own default. It changes numbers: a sum split over other
    threads rounds otherwise in its last digits. (torch's global random generator starts at a
    random seed in every process: no command depends on it.)"""
    torch = sys.modules.get("torch")
    if torch is None:  # imported by the command, in the client's environment
        return
    if not _FRESH:
        _FRESH["threads"] = default_threads(torch)
    from fptrace.numbers import is_int

    want = os.environ.get("OMP_NUM_THREADS", "").strip()
    threads = int(want) if is_int(want) and int(want) > 0 else _FRESH["threads"]
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def default_threads(torch: Any) -> int:
    """The threads torch gives a process whose environment does not set them: its own count
    where the server's environment did not set OMP_NUM_THREADS, else this machine's cores
    available to it."""
    if "OMP_NUM_THREADS" not in SERVER_ENV:
        return torch.get_num_threads()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


SERVER_ENV = dict(os.environ)  # the server's own environment, before any request's


@contextlib.contextmanager
def as_client(req: Request):
    """The process as the client's for the time of one command: its descriptors 0-2, the
    Python streams over them, its working folder, environment, umask and argv."""
    header = req.header
    saved_fds = [os.dup(i) for i in range(3)]
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_argv = sys.argv[:]
    saved_umask = os.umask(int(header.get("umask", 0o022)))
    enc = (header.get("encoding") or ["utf-8"] * 3) + ["utf-8"] * 3
    try:
        for i, fd in enumerate(req.fds):
            os.dup2(fd, i)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=enc[0])
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=enc[1],
                                      line_buffering=os.isatty(1), write_through=False)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=enc[2],
                                      errors="backslashreplace", line_buffering=True)
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in header.get("env", {}).items()})
        try:
            os.chdir(header.get("cwd") or "/")
        except OSError:
            raise FolderGone from None
        sys.argv = ["fptrace", *header["argv"]]
        fresh_torch()
        hub_offline(os.environ)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        for i, fd in enumerate(saved_fds):
            os.dup2(fd, i)
            os.close(fd)
        os.environ.clear()
        os.environ.update(saved_env)
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.umask(saved_umask)
        hub_offline(os.environ)


class FolderGone(Exception):
    """The client's working folder no longer exists (removed since the client started)."""


def hub_offline(env: Mapping[str, str]) -> None:
    """huggingface_hub's offline switch as `env` sets it. The library reads HF_HUB_OFFLINE (and
    TRANSFORMERS_OFFLINE) once, when it is imported, and transformers asks it: without this the
    server's environment at that import would decide for every client."""
    constants: Any = sys.modules.get("huggingface_hub.constants")
    if constants is None:  # imported later, by the command, in the client's environment
        return
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE")
    constants.HF_HUB_OFFLINE = (value or "").upper() in ("1", "ON", "YES", "TRUE")


def budget_bytes(text: str | None) -> int:
    """--memory-budget as bytes (at least one); by default half of this machine's memory."""
    if text is None:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    from fptrace.models.devices import parse_size

    return parse_size(text, "--memory-budget")


def start_background(path: str, idle: float, budget: int, wait: float = 300.0) -> int:
    """Start `fptrace serve --foreground` as a process of its own session (its log beside the
    socket) and return its pid once it answers; a server already there is one line and its
    pid."""
    import subprocess

    running = serving.request({"op": "status"}, path)
    if running is not None:
        raise ServerRunning(f"a server already listens at {path} (pid {running['pid']})")
    prepare(path)
    log_path = path + ".log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fptrace", "serve", "--foreground", "--idle-timeout",
             str(int(idle)), "--memory-budget", f"{budget}B"],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
            env=dict(os.environ, **{serving.SOCKET_ENV: path, serving.SWITCH_ENV: "off"}),
            start_new_session=True, cwd="/")
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if proc.returncode == ServerRunning.exit_code:  # another one started first
                raise already_there(path)
            raise FptraceError(f"the server stopped at its start (exit {proc.returncode}): "
                               f"{last_line(log_path)}")
        answer = serving.request({"op": "status"}, path)
        if answer is not None and answer.get("pid") == proc.pid:
            return proc.pid
        time.sleep(0.05)
    proc.terminate()
    raise FptraceError(f"the server did not answer within {wait:g} s (log: {log_path})")


def last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].removeprefix("fptrace: error: ") if lines else "no log"


def wait_gone(path: str, wait: float = STOP_GRACE + 20) -> bool:
    """Whether the server at `path` stopped answering within `wait` seconds (a request it runs
    is interrupted first)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and os.path.exists(path):
        time.sleep(0.05)
    return not os.path.exists(path)


def describe(answer: dict) -> str:
    """A status answer as lines to read."""
    from fptrace.models.memory import human_bytes

    up = int(time.time() - answer["started_at"])
    idle = answer["idle_timeout"]
    lines = [f"server   pid {answer['pid']}, listening at {answer['socket']}",
             f"uptime   {up // 3600}:{up // 60 % 60:02d}:{up % 60:02d}, {answer['served']} "
             f"requests answered{', one running' if answer['busy'] else ''}"
             f"{', ' + str(answer['waiting']) + ' waiting' if answer['waiting'] else ''}; "
             f"idle timeout {f'{idle:g} s' if idle else 'none'}",
             f"memory   {human_bytes(answer['rss']) if answer['rss'] else '?'} resident; "
             f"weights held {human_bytes(sum(m['bytes'] for m in answer['held']))} of a "
             f"budget of {human_bytes(answer['budget'])}"]
    if not answer["held"]:
        lines.append("held     no model yet (the first command that loads one keeps it)")
    for i, m in enumerate(answer["held"]):
        opts = m["options"]
        how = ", ".join(f"{k} {v}" for k, v in opts.items()
                        if (v not in (None, False, "auto") and k != "seed")
                        or (k == "seed" and opts.get("random_weights")))
        lines.append(f"{'held' if i == 0 else '':8} {m['model']}{f' ({how})' if how else ''}"
                     f": {human_bytes(m['bytes'])}, loaded in {m['load_seconds']:g} s, used "
                     f"{m['uses']} time{'s' if m['uses'] != 1 else ''}")
    return "\n".join(lines)


__all__ = ["HUB_PLACES", "Request", "Server", "ServerRunning", "budget_bytes", "cancel",
           "describe", "hub_offline", "listen", "other_hub", "prepare", "rss_bytes", "serve",
           "start_background", "status", "stop", "wait_gone"]
