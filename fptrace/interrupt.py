"""Ctrl-C at any moment of a command: one line (`fptrace: error: interrupted`) and exit 130.

Two phases. While the command line starts (its imports: typer, rich, the command modules)
nothing has been written, so an interrupt there ends the process at once with the line; the
handler for that phase is installed by `fptrace/__init__.py`, the first of fptrace to run, and
only when the process is the `fptrace` command (never for a program that imports fptrace).
Once `main()` runs a command, an interrupt raises KeyboardInterrupt as usual, so the commands
stop cleanly (a batch keeps its records, an atomic write leaves no half file); the handler
remembers that it fired, and a run whose KeyboardInterrupt was swallowed on the way (a library
that catches it) still ends 130, never 0. A second Ctrl-C while the first is being handled ends
the process at once. Standard library only, and `_signal` rather than `signal` (whose enum
classes take longer to build than the first tenth of a second on a loaded machine).
"""

from __future__ import annotations

import _signal
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

LINE = "fptrace: error: interrupted"
EXIT = 130

_state = {"phase": "", "seen": False, "said": False, "why": "", "again": False,
          "defer": False, "deferred": False}


def _on_sigint(signum: int, frame: object) -> None:
    if _state["phase"] == "starting" or (_state["seen"] and not _state["again"]):
        say()  # nothing to clean up / stuck: leave
        os._exit(EXIT)
    if _state["defer"] and _importing(frame):
        _state["deferred"] = True  # the server sends it again once the import is done
        return
    _state["seen"] = True
    _state["again"] = _state["deferred"] = False
    raise KeyboardInterrupt


def _importing(frame: Any) -> bool:
    """Whether the interrupted code is inside an import (importlib's frames on the stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def defer_imports() -> None:
    """A resident server: an interrupt that lands inside an import is held back (deferred()
    says so, and the server sends it again): a module whose import is cut short stays broken
    for every later request of the process (transformers keeps the failure of a lazy import)."""
    _state["defer"] = True


def deferred() -> bool:
    """Whether the last SIGINT was held back because it landed inside an import."""
    return bool(_state["deferred"])


def again() -> None:
    """The next SIGINT raises KeyboardInterrupt once more instead of ending the process: a
    resident server repeating a cancel whose KeyboardInterrupt was swallowed (raised inside a
    weakref callback or a __del__, where Python prints it and goes on; commands/serve/)."""
    _state["again"] = True


def _unraisable(info: Any) -> None:
    """sys.unraisablehook while fptrace handles Ctrl-C: a KeyboardInterrupt that Python could
    not raise (it landed inside a weakref callback or a __del__, where Python reports it as
    "Exception ignored in ..." with a traceback on stderr, and goes on) is the interrupt this
    module already noted: the run still ends with the one line and 130 (or a resident server
    interrupts it again: commands/serve/), so nothing is printed for it. Any other exception is
    reported as Python would."""
    if _state["seen"] and info.exc_type is not None and \
            issubclass(info.exc_type, KeyboardInterrupt):
        return
    sys.__unraisablehook__(info)


def _take(phase: str) -> None:
    try:
        current = _signal.getsignal(_signal.SIGINT)
        if current is _signal.default_int_handler or current is _on_sigint:
            _signal.signal(_signal.SIGINT, _on_sigint)
            _state["phase"] = phase
            if sys.unraisablehook is sys.__unraisablehook__:
                sys.unraisablehook = _unraisable
    except ValueError:  # not the main thread: signals are not ours to handle there
        pass


def is_cli() -> bool:
    """Whether this process is the `fptrace` command (its console script or `python -m
    fptrace`), not a program that imports fptrace."""
    if os.path.basename(sys.argv[0] if sys.argv else "") == "fptrace":
        return True
    orig = getattr(sys, "orig_argv", [])
    return "-m" in orig and orig.index("-m") + 1 < len(orig) and \
        orig[orig.index("-m") + 1] == "fptrace"


def starting() -> None:
    """At the very start of the command: an interrupt during the imports is the line, exit 130."""
    if is_cli():
        _take("starting")


def running() -> None:
    """main() runs a command: an interrupt from now on raises KeyboardInterrupt."""
    _take("running")


def seen() -> bool:
    """Whether a SIGINT arrived while a command ran."""
    return bool(_state["seen"])


def said() -> None:
    """The interrupted line was printed (by the CLI's one-line error): never print it twice."""
    _state["said"] = True


def because(why: str) -> None:
    """Why the coming interrupt comes, where it is not the user's Ctrl-C (a resident server
    that is stopped): said in brackets after `interrupted`."""
    _state["why"] = why


def with_reason(text: str) -> str:
    """`text` (an interrupted line) with the reason given to `because`, if any, after its
    first `interrupted`."""
    why = _state["why"]
    if not why:
        return text
    return text.replace("interrupted", f"interrupted ({why})", 1) if "interrupted" in text \
        else f"{text} ({why})"


def say(line: str = LINE) -> None:
    """Print the line once, however many paths lead here."""
    if not _state["said"]:
        _state["said"] = True
        try:
            sys.stderr.write(with_reason(line) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed stderr: the exit code still says it
            pass


def settled() -> None:
    """The outcome is decided: a Ctrl-C from now on changes nothing (the run already finished
    or already failed), so it is ignored while the process exits."""
    if _state["phase"]:
        try:
            _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
        except ValueError:
            pass


def reset() -> None:
    """A resident server's next command (commands/serve/): nothing seen, nothing said, and
    the handler of a running command installed again (settled() had set SIGINT aside)."""
    _state.update(phase="", seen=False, said=False, why="", again=False, deferred=False)
    try:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    except ValueError:
        return
    running()


def leave() -> None:
    """End an interrupted run with 130. Not through the interpreter's own exit: CPython remembers
    a KeyboardInterrupt that once escaped code run by PyRun_String (pybind11 extensions do that
    while torch imports) and then ends the process by SIGINT (-2), whatever exit code was given.
    The exit functions still run first, and the streams are flushed."""
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(EXIT)


__all__ = ["EXIT", "LINE", "because", "is_cli", "leave", "reset", "running", "said", "say", "seen",
           "settled", "starting", "with_reason"]
