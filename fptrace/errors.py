"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

OPEN, CLOSE = "\ue000", "\ue001"  # private-use characters: no message has them otherwise
MARKED = re.compile(f"{OPEN}([a-z_][a-z0-9_]*){CLOSE}")


def param(name: str) -> str:
    """A parameter named in an error's message by its Python name (`vector`): the Python API's
    caller reads `vector`, the CLI's user reads the flag the command declares for it
    (`--vector`). See `FptraceError.message`."""
    return f"{OPEN}{name}{CLOSE}"


def spelled(text: str, spell: Callable[[str], str]) -> str:
    """`text` with each name marked by `param` spelled by `spell`."""
    return MARKED.sub(lambda m: spell(m.group(1)), text)


# how str(e) spells a marked parameter: the innermost `spelling` in force (a command of the
# CLI running: its flags), else as the Python API's caller named it
SPELLINGS: list[Callable[[str], str]] = []


@contextlib.contextmanager
def spelling(spell: Callable[[str], str]) -> Iterator[None]:
    """While it holds, str(e) (and so f"{e}", an error wrapping another's text, a batch
    record's error) spells each parameter an error names through `param` with `spell`."""
    SPELLINGS.append(spell)
    try:
        yield
    finally:
        SPELLINGS.pop()


class FptraceError(Exception):
    """Base class: the message is shown to the user as it is, on one line. A parameter that
    it names through `param` reads in `str(e)` as its Python name, or, while a command of the
    CLI runs (`spelling`), as that command's flag; `message` spells it as asked."""

    exit_code = 2

    def message(self, spell: Callable[[str], str]) -> str:
        """The message with each parameter named through `param` spelled by `spell`."""
        return spelled(super().__str__(), spell)

    def __str__(self) -> str:
        return self.message(SPELLINGS[-1] if SPELLINGS else as_parameter)


class ModelNotFound(FptraceError):
    """A --model that names nothing fptrace can load."""


class ModelLoadError(FptraceError):
    """A model that was found but could not be read (corrupt file, bad config)."""


class UnsafeModel(FptraceError):
    """Pickle weights or remote code that the user did not explicitly allow."""


class BadInput(FptraceError):
    """A prompt or option value that cannot be traced."""


class PromptTooLong(BadInput):
    """A prompt longer than the model's context: `tokens` of it, `limit` at most. A command
    without --truncate (or reading its prompts from a file) says so in its own words."""

    def __init__(self, message: str, tokens: int, limit: int) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.limit = limit


class UnsupportedModel(FptraceError):
    """An architecture fptrace cannot hook."""


class TraceFailed(FptraceError):
    """The forward pass itself raised; the message names the last block that ran."""

    exit_code = 3


class NonFiniteValues(FptraceError):
    """The trace completed but a layer produced NaN or Inf."""

    exit_code = 4


class Mismatch(FptraceError):
    """A recomputation that does not reproduce the model's own numbers."""

    exit_code = 5


class WriteFailed(FptraceError):
    """An output file could not be written (a full disk, say); what was written before is kept."""

    exit_code = 74  # EX_IOERR


class OutOfMemory(FptraceError):
    """A load or forward pass that needs more memory than the device has."""

    exit_code = 3


def as_parameter(name: str) -> str:
    """How a check outside the CLI names a value: as the Python API's caller passed it
    (`top_k`). A check that takes `named` names each value through it."""
    return name


def as_flag(name: str) -> str:
    """How the CLI names the same value, the `named` it passes: its flag (`top_k` -> `--top-k`)."""
    return "--" + name.replace("_", "-")
