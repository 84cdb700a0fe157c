"""The typed examples a command folder offers in its examples.py, and what the harness that
runs them lends them.

A command's examples.py may define, each optional:

    VIEWS       a tuple of View: its terminal views, rendered at 80, 120 and 200 columns into
                tests/golden/ (tests/golden.py collects them)
    bad_inputs  a function of a Setup returning Cases: the bad inputs of docs/bad-inputs.md
                (scripts/bad_inputs.py collects them and makes the files they read)
    NOTE_CASES  a tuple of NoteCase: for each of its notes, a run where the note's condition does
                not hold (tests/test_notes.py collects them)

The types live here, in a leaf of the package, rather than in tests/: examples.py files are
package modules and may not import from tests/, and both tests/ and scripts/ import the
package. The heavy lifting the tests own (building a family's tiny model, the tiny GPT-2 folder,
temporary folders) is lent through Bench, so an example needs no test helper by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import RenderableType

    from fptrace.models.loading import LoadedModel


class Bench(Protocol):
    """What the test harness lends an example."""

    def tiny(self, family: str) -> Any:
        """A family's tiny random-weight torch model (seed 0, norms and biases perturbed)."""

    def lm(self, family: str, random_weights: bool = True) -> LoadedModel:
        """That model, ready to trace (named tiny-<family>; prompts as token ids)."""

    def gpt2_folder(self) -> str:
        """A folder holding a tiny GPT-2 with the real GPT-2 tokenizer."""

    def tmp(self, name: str) -> Path:
        """A new empty temporary folder."""


# a view: from the golden model (a seeded tiny GPT-2) and the bench, a function of the width
# (None: every column) returning the renderable
Render = Callable[[int | None], "RenderableType"]
MakeView = Callable[["LoadedModel", Bench], Render]


@dataclass(frozen=True)
class View:
    """One golden view of a command: tests/golden/test_view[<name>-<width>].txt."""

    name: str
    make: MakeView


@dataclass(frozen=True)
class Setup:
    """Where the bad-input cases run: the script's temporary folder (the files every case may
    read are made there first: see scripts/bad_inputs.py) and the tiny GPT-2 saved in it."""

    tmp: str
    folder: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.tmp, *parts)

    @property
    def model(self) -> tuple[str, str]:
        """The options that load the tiny GPT-2."""
        return ("-m", self.folder)


@dataclass(frozen=True)
class Case:
    """One bad input: what is wrong, the arguments after `fptrace`, and its row in its folder's
    table of docs/bad-inputs.md (a folder numbers its own cases from 1; a new case takes the
    folder's next free number)."""

    row: int
    what: str
    argv: tuple[str | bytes, ...]


# what a note's case returns: the sentences of the run where the note is absent, and of the one
# where it is present (None where no cheap run exists)
Said = tuple[Sequence[str], Sequence[str] | None]


@dataclass(frozen=True)
class NoteCase:
    """For one note: the sentences of a run where its condition does not hold, and of one where
    it holds (None where no cheap run exists)."""

    key: str
    run: Callable[[Bench], Said]
