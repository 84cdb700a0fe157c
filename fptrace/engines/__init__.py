"""Engines: what computes the forward pass fptrace traces, each a folder of its own, found as
commands are.

An engine is the folder fptrace/engines/<name>/; its engine.py defines ENGINE, an Engine:
- its name on the command line (`run --engine NAME`, `diff --engine-b NAME`) and what it runs;
- `takes`: which of the options whose support varies by engine (OPTIONAL) it honours; `run`
  refuses the others when they are given, in one line naming the flag and the engine;
- `trace(request)`: `run`'s trace of one prompt (a Traced: with the loaded model where there is
  one, the page of --html is written from it);
- `compare`, where the engine can be diff's side b: the cheap checks and the file it runs
  (`prepare`), then its pass of the prompt (`run_pass`), an EnginePass that `diff` compares with
  transformers' own, block by block and, with --deep, point by point;
- `emulation`, where its numerics can be reproduced on transformers' side (`diff --emulate`).
The folder may also hold notes.py and examples.py, collected with the command folders'
(fptrace/extensions.py). The default engine (transformers) is the one with order 0.

`run` and `diff` name no engine: they ask this module for the one the user named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from fptrace.models.loading import LoadedModel
    from fptrace.models.prompts import Prompt
    from fptrace.points import Point
    from fptrace.results import Trace

# the options of `run` whose support varies by engine, by flag: an engine's `takes` names those
# it honours (its own settings it always takes, and no other engine does)
OPTIONAL = ("--chat/--system/--messages", "--random-weights", "--tp", "--quantize",
            "--device-map", "--all-positions", "--truncate", "--plot", "--html")


@dataclass(frozen=True)
class Setting:
    """An option an engine adds to the commands that take --engine (cli.options.engine_options):
    a choice among words, reaching the engine in `settings[name]`."""

    name: str  # the parameter's name, e.g. "kv_cache"
    flag: str  # e.g. "--kv-cache"
    choices: tuple[str, ...]
    default: str
    help: str


@dataclass(frozen=True)
class EngineChoice:
    """The engine a command line chose and every engine's settings as given (the default engine
    with the defaults when built empty)."""

    name: str | None = None  # None: the default engine
    settings: Mapping[str, str] = field(default_factory=dict)  # by Setting.name
    given: Mapping[str, bool] = field(default_factory=dict)  # by flag: set to another value

    @property
    def engine(self) -> Engine:
        return default() if self.name is None else engine(self.name)


@dataclass(frozen=True)
class RunRequest:
    """What `run` asks of an engine: the trace of one prompt, with run's options."""

    prompt: str | None
    opts: Any  # cli.options.LoadOptions
    chat: Any  # cli.options.ChatOptions
    top_k: int
    snippet: int
    all_positions: bool
    truncate: bool
    plot: str | None
    html: str | None
    force: bool
    settings: Mapping[str, str]  # every engine's settings (Setting.name -> the word given)


@dataclass(frozen=True)
class Traced:
    """What an engine's trace returns: the Trace, and the model loaded in transformers with the
    prompt it ran, where the engine loaded one the page can be written from."""

    trace: Trace
    lm: LoadedModel | None = None  # models.loading.LoadedModel
    prompt: Prompt | None = None  # the text or ids it ran


@dataclass(frozen=True)
class SideB:
    """What `diff --engine-b NAME` gives the engine to check before anything is loaded."""

    first: str | None
    second: str | None
    opts: Any  # cli.options.LoadOptions of side a
    chat: Any
    settings_b: Mapping[str, Any]  # the -b options given (--model-b names side b's file)


class EnginePass(Protocol):
    """One prompt's pass computed by an engine, as `diff` compares it with transformers'."""

    @property
    def trace(self) -> Any:
        """The core.trace.Trace of the pass (its table, through the checkpoint's lens)."""

    @property
    def points(self) -> frozenset[Point]:
        """The points inside a block the engine's pass names."""

    def block(self, layer: int, n_heads: int, n_kv_heads: int) -> dict[Point, np.ndarray]:
        """Block `layer`'s points in fptrace's shapes: streams (T, d), q (nh, T, hd), k and v
        (nkv, T, hd)."""

    def stream(self, layer: int) -> np.ndarray:
        """Block `layer`'s output (T, d); layer -1: the embedding, block 0's input."""


@dataclass(frozen=True)
class Compare:
    """How an engine serves as diff's side b."""

    # the checks that cost nothing (the combination, the prompt, the files, the library): the
    # file side b runs; BadInput when the request cannot be served
    prepare: Callable[[SideB], str]
    # (loaded model of side a, side b's file, the prompt or its ids, settings): its pass
    run_pass: Callable[[Any, str, Any, Mapping[str, str]], EnginePass]


@dataclass(frozen=True)
class Emulation:
    """An engine's numerics reproduced on transformers' side, step by step."""

    # the steps a user wrote (--emulate TEXT), checked, in ladder order
    parse: Callable[[str], tuple[str, ...]]
    # the rungs: no step, then each added in turn
    ladder: Callable[[Sequence[str]], tuple[tuple[str, ...], ...]]
    # (lm, side b's file, steps, settings): the model computing so while inside; yields the
    # attention implementation set, or None
    emulating: Callable[[Any, str, Sequence[str], Mapping[str, str]],
                        AbstractContextManager[str | None]]
    # the settings the result names: (K/V cache type, attention kernel)
    described: Callable[[Mapping[str, str]], tuple[str, str]]
    help: str = ""  # diff --emulate's help: with which --engine-b, and the steps


@dataclass(frozen=True)
class Engine:
    """One engine, as its folder declares it."""

    name: str  # the value of --engine / --engine-b
    help: str  # what it runs, one clause, for --help and the docs
    order: int  # its place among the choices; 0: the default
    takes: frozenset[str]  # of OPTIONAL, the flags it honours
    trace: Callable[[RunRequest], Traced]
    settings: tuple[Setting, ...] = ()  # the options it adds (--flash-attn, --kv-cache)
    compare: Compare | None = None
    help_b: str = ""  # as diff's side b: what it compares, one clause
    emulation: Emulation | None = None

    def __post_init__(self) -> None:
        unknown = sorted(self.takes - set(OPTIONAL))
        if unknown:
            raise ValueError(f"engine {self.name!r} takes {unknown}, which are not among the "
                             f"options whose support varies by engine: {OPTIONAL}")

    @property
    def default(self) -> bool:
        return self.order == 0

    def refused(self, given: Mapping[str, object]) -> str | None:
        """The first flag given (a true value in `given`, by flag) this engine takes neither as
        one of OPTIONAL nor as a setting of its own."""
        own = self.takes | {s.flag for s in self.settings}
        return next((flag for flag, value in given.items() if value and flag not in own), None)


def engines() -> tuple[Engine, ...]:
    """Every engine folder's ENGINE, the default first, then by order and name."""
    from fptrace.extensions import ENGINES, declared

    found: list[Engine] = []
    for folder, e in declared("engine", "ENGINE", package=ENGINES):
        if not isinstance(e, Engine):
            raise ValueError(f"fptrace/engines/{folder}/engine.py: ENGINE is no Engine")
        found.append(e)
    found.sort(key=lambda e: (e.order, e.name))
    names = [e.name for e in found]
    flags = [s.flag for e in found for s in e.settings]
    if len(set(names)) != len(names) or sum(e.default for e in found) != 1 or \
            len(set(flags)) != len(flags):
        raise ValueError(f"the engine folders must declare distinct names, one default (order "
                         f"0) and settings of distinct flags: {[(e.name, e.order) for e in found]}"
                         f", {flags}")
    return tuple(found)


def engine(name: str) -> Engine:
    """The engine named `name` (the value of --engine), or ValueError listing those there are."""
    for e in engines():
        if e.name == name:
            return e
    raise ValueError(f"no engine is named {name!r}; there are: "
                     + ", ".join(e.name for e in engines()))


def default() -> Engine:
    return engines()[0]


def names() -> Iterator[str]:
    return (e.name for e in engines())


__all__ = ["OPTIONAL", "Compare", "Emulation", "Engine", "EngineChoice", "EnginePass",
           "RunRequest", "Setting", "SideB", "Traced", "default", "engine", "engines", "names"]
